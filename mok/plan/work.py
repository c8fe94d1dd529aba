"""The one place that runs conversions: :class:`ScaleWork` items (convert logical scales into a
layout buffer, copy scales TE already swizzled, or bring a layout back into logical scales), in
ONE kernel launch on CUDA tensors with the ``cuda`` backend (``mok.kernels``), otherwise with the
torch reference; :class:`QuantizeWork` items (BF16 weights quantised to MXFP8, both
directions, scales in the layout), one launch of the quantize kernel each; and
:class:`CallerWork` items, a caller's own conversion (mok.weights' ``_swizzle_mxfp8_scale``
replaced), called once per item in the order planned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import torch

from mok.backend import Backend, backend_for
from mok.errors import LayoutError
from mok.kernels.jobs import MIXED_DIRECTIONS
from mok.kernels.quantize import QuantizeOutputs, prepare
from mok.layout import Geometry, logical_view, swizzle_reference, unswizzle_reference
from mok.quantize_reference import ReciprocalRule, installed_rule


class ScaleWork(NamedTuple):
    """Convert ``src`` (logical ``[E, R, C]``) into layout ``dst``, or, with ``copy``, copy the
    already-swizzled bytes ``src`` into ``dst`` (same size), or, with ``inverse``, bring layout
    ``src`` back into logical ``dst`` (``[E, R, C]``, any strides; the padding dropped). With
    ``geometry`` (sizes, strides), the logical side (``src``, or an inverse's ``dst``) is the uint8
    buffer the logical matrices are that geometry of (from its offset). A named tuple: a view of
    256 experts makes 512 of them."""

    src: torch.Tensor
    dst: torch.Tensor
    copy: bool = False
    geometry: Geometry | None = None
    inverse: bool = False

    def logical(self) -> torch.Tensor:
        """The logical ``[E, R, C]`` side (a strided view when given as a geometry)."""
        side = self.dst if self.inverse else self.src
        return side if self.geometry is None else logical_view(side, self.geometry)


class QuantizeWork(NamedTuple):
    """Quantise BF16 ``src`` (one ``[E, R, C]`` tensor, or E ``[R, C]`` ones) into ``out``, both
    directions, scales in the layout, by TE's MXFP8 rule (``rule``: mok.quantize_reference; by
    default the installed TE release's, so the bytes are the ones that release's quantizer gives)."""

    src: torch.Tensor | tuple[torch.Tensor, ...]
    out: QuantizeOutputs
    rule: ReciprocalRule | None = None

    def prepared(self, backend: Backend) -> Callable[[], None]:
        """The launch (the kernel on the cuda backend) that quantises again at every call."""
        rule = installed_rule() if self.rule is None else self.rule
        return prepare(self.src, self.out, use_kernel=backend is Backend.CUDA, rule=rule)


class CallerWork:
    """One call of a caller's conversion: ``convert(src, rows=, columns=)``, with ``out=`` where
    ``keyword_out`` (the buffer to fill, or None for the caller's function to allocate one).
    ``result`` is what the last run returned: the view's layout buffer."""

    __slots__ = ("columns", "convert", "keyword_out", "out", "result", "rows", "src")

    def __init__(
        self, convert: Callable[..., Any], src: Any, rows: int, columns: int, out: Any, keyword_out: bool
    ) -> None:
        self.convert, self.src, self.rows, self.columns = convert, src, rows, columns
        self.out, self.keyword_out = out, keyword_out
        self.result: Any = None

    def run(self) -> None:
        if self.keyword_out:
            self.result = self.convert(self.src, rows=self.rows, columns=self.columns, out=self.out)
        else:
            self.result = self.convert(self.src, rows=self.rows, columns=self.columns)


Work = ScaleWork | QuantizeWork | CallerWork
_is_cuda, _device = attrgetter("is_cuda"), attrgetter("device")
_src, _dst, _inverse = attrgetter("src"), attrgetter("dst"), attrgetter("inverse")


def _refuse_devices(work: Sequence[ScaleWork], device: torch.device) -> None:
    """Raise naming the first item with a tensor off ``device``."""
    for i, item in enumerate(work):
        if item.src.device != device or item.dst.device != device:
            raise LayoutError(
                f"scale work item {i} has tensors on {item.src.device} and {item.dst.device}; "
                f"expected every tensor on {device}"
            )


class PreparedWork:
    """A list of work items bound to a backend, ready to run again and again (a refresh of
    unchanged buffers runs its prepared work without planning anything)."""

    def __init__(self, work: Sequence[Work], backend: Backend | str | None = None) -> None:
        """``backend``: a resolved :class:`Backend` (a view's), or a request to resolve here."""
        self._launch: Callable[[], None] | None = None
        self._calls: list[Callable[[], None]] = []
        self.work: list[ScaleWork]
        quantize: list[QuantizeWork]
        if set(map(type, work)) <= {ScaleWork}:  # the usual case: one C-level pass
            self.work, quantize = list(work), []  # type: ignore[arg-type]  # every item is a ScaleWork
        else:
            self.work = [item for item in work if isinstance(item, ScaleWork)]
            quantize = [item for item in work if isinstance(item, QuantizeWork)]
            # a caller's conversions run as the caller's module calls them, each in its place among them
            self._calls = [item.run for item in work if isinstance(item, CallerWork)]
        if quantize:
            device = quantize[0].out.row_data.device
            resolved = backend if isinstance(backend, Backend) else backend_for(device, backend)
            self._calls += [item.prepared(resolved) for item in quantize]
        if not self.work:
            return
        directions = set(map(_inverse, self.work))
        if len(directions) > 1:  # one kernel a launch; the reference keeps the same rule
            raise LayoutError(f"scale work mixes inverse items with conversions or copies: {MIXED_DIRECTIONS}")
        device = self.work[0].dst.device
        tensors = [*map(_src, self.work), *map(_dst, self.work)]
        if len(set(map(torch.Tensor.get_device, tensors))) != 1 or not all(map(_is_cuda, tensors)):
            # off CUDA (or mixed) the index says too little: compare the devices themselves
            if set(map(_device, tensors)) != {device}:
                _refuse_devices(self.work, device)
        if not isinstance(backend, Backend):
            backend = backend_for(device, backend)
        elif backend is Backend.CUDA and device.type != "cuda":
            raise LayoutError(f"backend 'cuda' needs CUDA tensors; found scales on {device}")
        if backend is Backend.CUDA:
            from mok.kernels.jobs import jobs_of
            from mok.kernels.launch import Launch

            self._launch = Launch(jobs_of(self.work), device)

    def run(self) -> None:
        """Run the work: a caller's conversions and the quantize launches, then the one scale
        launch (or the reference)."""
        launch = self._launch
        if launch is not None and not self._calls:  # a refresh's usual rerun: one launch, nothing else
            launch()
            return
        for call in self._calls:
            call()
        if launch is not None:
            launch()
            return
        for item in self.work:
            if item.copy:
                item.dst.copy_(item.src.view(item.dst.shape))
            elif item.inverse:
                unswizzle_reference(item.src, item.logical())
            else:
                swizzle_reference(item.logical(), item.dst)


def run_work(work: Sequence[Work], backend: str | None = None) -> None:
    """Run every item of ``work`` (one launch on the cuda backend)."""
    PreparedWork(work, backend).run()
