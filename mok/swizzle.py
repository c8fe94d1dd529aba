"""Public entry points of the MXFP8 scale conversion, and the one place that runs it.

Every conversion is a :class:`ScaleWork` item (convert logical scales into a layout buffer, or
copy scales TE already swizzled). :func:`run_work` runs a list of them: on CUDA tensors with the
``cuda`` backend in ONE kernel launch (``mok.kernels``), otherwise with the torch reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import NamedTuple

import torch

from mok.backend import backend_for
from mok.checks import check_sequence
from mok.errors import LayoutError
from mok.layout import (
    Geometry,
    as_batch,
    check_out,
    empty_layout,
    logical_view,
    swizzle_reference,
    unswizzle_reference,
)
from mok.overlap import check_no_overlap


class ScaleWork(NamedTuple):
    """Convert ``src`` (logical ``[E, R, C]``) into layout ``dst``, or, with ``copy``, copy the
    already-swizzled bytes ``src`` into ``dst`` (same size), or, with ``inverse``, bring layout
    ``src`` back into logical ``dst`` (``[E, R, C]``, any strides; the padding dropped). With
    ``geometry`` (sizes, strides), ``src`` is the uint8 buffer the logical matrices are that
    geometry of (from its offset). A named tuple: a view of 256 experts makes 512 of them."""

    src: torch.Tensor
    dst: torch.Tensor
    copy: bool = False
    geometry: Geometry | None = None
    inverse: bool = False

    def logical(self) -> torch.Tensor:
        """The logical ``[E, R, C]`` source (a strided view when given as a geometry)."""
        return self.src if self.geometry is None else logical_view(self.src, self.geometry)


_is_cuda = attrgetter("is_cuda")


class PreparedWork:
    """A list of work items bound to a backend, ready to run again and again (a refresh of
    unchanged buffers runs its prepared work without planning anything)."""

    def __init__(self, work: Sequence[ScaleWork], backend: str | None = None) -> None:
        self.work = list(work)
        self.backend = backend
        self._launch: Callable[[], None] | None = None
        if not self.work:
            return
        device = self.work[0].dst.device
        tensors = [t for item in self.work for t in item[:2]]  # src and dst
        if len(set(map(torch.Tensor.get_device, tensors))) != 1 or not all(map(_is_cuda, tensors)):
            # off CUDA (or mixed) the index says too little: compare the devices themselves
            for i, item in enumerate(self.work):
                if item.src.device != device or item.dst.device != device:
                    raise LayoutError(
                        f"scale work item {i} has tensors on {item.src.device} and {item.dst.device}; "
                        f"expected every tensor on {device}"
                    )
        if backend_for(device, backend) == "cuda":
            from mok.kernels.jobs import jobs_of
            from mok.kernels.launch import Launch

            self._launch = Launch(jobs_of(self.work), device)

    def run(self) -> None:
        if self._launch is not None:
            self._launch()
            return
        for item in self.work:
            if item.copy:
                item.dst.copy_(item.src.view(item.dst.shape))
            elif item.inverse:
                unswizzle_reference(item.src, item.dst)
            else:
                swizzle_reference(item.logical(), item.dst)


def run_work(work: Sequence[ScaleWork], backend: str | None = None) -> None:
    """Run every item of ``work`` (one launch on the cuda backend)."""
    PreparedWork(work, backend).run()


def swizzle_mxfp8_scales(
    scales: torch.Tensor, *, out: torch.Tensor | None = None, backend: str | None = None
) -> torch.Tensor:
    """Convert logical MXFP8 scales ``[R, C]`` or ``[E, R, C]`` (any strides) to the layout.

    Returns uint8 ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(R,128)``, ``Cp = roundup(C,4)``),
    each expert padded on its own with zero bytes. With ``out`` the result is written there
    (same address: CUDA-graph safe) and ``out`` is returned. ``backend``: "auto" (default),
    "cuda" or "torch" (see mok.kernel_backend).
    """
    batch = as_batch(scales)
    if out is None:
        experts, rows, cols = batch.shape
        out = empty_layout(rows, cols, experts, batch.device, "swizzle_mxfp8_scales")
    else:
        check_out(out, batch)
        check_no_overlap([out], [batch], "swizzle_mxfp8_scales", out_label="out", input_label="scales")
    run_work([ScaleWork(batch, out)], backend)
    return out


def swizzle_mxfp8_scales_many(
    scales: Sequence[torch.Tensor],
    *,
    outs: Sequence[torch.Tensor] | None = None,
    backend: str | None = None,
) -> list[torch.Tensor]:
    """Convert separate per-expert logical scales ``[R_i, C_i]`` (one launch on CUDA, any number
    of experts). ``outs[i]`` must be the layout buffer of ``scales[i]``; without ``outs`` they
    are allocated."""
    scales = check_sequence("scales", scales, "logical scale matrices [R, C]", item_type=torch.Tensor)
    if len(scales) == 0:
        raise LayoutError("swizzle_mxfp8_scales_many: expected at least one scale matrix; found none")
    batches = []
    for i, s in enumerate(scales):
        batch = as_batch(s, f"scales[{i}]")
        if batch.shape[0] != 1:
            raise LayoutError(f"scales[{i}]: expected a 2-D [R, C] matrix; found {tuple(s.shape)}")
        batches.append(batch)
    device = batches[0].device
    for i, b in enumerate(batches):
        if b.device != device:
            raise LayoutError(f"scales[{i}] is on {b.device}; expected every matrix on {device}")
    if outs is None:
        outs = [empty_layout(b.shape[1], b.shape[2], 1, device, f"scales[{i}]") for i, b in enumerate(batches)]
    else:
        outs = check_sequence("outs", outs, "layout buffers", item_type=torch.Tensor)
        if len(outs) != len(batches):
            raise LayoutError(f"expected {len(batches)} output buffers, one per scale matrix; found {len(outs)}")
        for i, (b, o) in enumerate(zip(batches, outs, strict=True)):
            check_out(o, b, f"outs[{i}]")
        check_no_overlap(outs, batches, "swizzle_mxfp8_scales_many", input_label="scales")
    run_work([ScaleWork(b, o) for b, o in zip(batches, outs, strict=True)], backend)
    return list(outs)
