"""The one scale planner: which layout buffers a view exposes and what fills them, and the
prepared refresh that reruns that work while TE reassigned nothing.

Views describe their scales as :class:`ScaleSource` items (TE's buffer, the logical matrices to
convert, TE's swizzled flag) and call :func:`plan_scales`; none of them plans kernel work itself.
A :class:`RefreshPlan` owns the prepared launch of a view (or of a layer) and the
:class:`StorageGuard` it may rerun under.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import is_
from typing import Any, NamedTuple

import torch

from mok.errors import LayoutError, RefreshError
from mok.layout import Geometry, check_out, empty_layout, layout_shape, logical_view, padded_shape
from mok.overlap import check_no_overlap
from mok.swizzle import PreparedWork, ScaleWork
from te_compat import storage_reader, storage_values


class ScaleSource(NamedTuple):
    """Scales of ``E`` experts to bring into the layout: the logical ``[E, R, C]`` matrices are
    ``geometry`` (sizes, strides in bytes) over uint8 ``te_buffer`` from its own offset. A
    geometry, not a strided view: a view of 256 experts would make 512 tensors it never needs on
    the CUDA path. When TE already ``swizzled`` them, ``te_buffer`` holds the layout itself and
    is copied or exposed, never converted a second time."""

    name: str
    te_buffer: torch.Tensor
    geometry: Geometry
    swizzled: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.geometry[0]

    @property
    def logical(self) -> torch.Tensor:
        """The logical ``[E, R, C]`` view itself (for checks and the torch reference)."""
        return logical_view(self.te_buffer, self.geometry)


@dataclass(frozen=True)
class ScaleSlots:
    """The layout buffers of one direction of a view, one per source. ``zero_copy``: they are
    TE's own swizzled buffers (aligned shapes), so a refresh has nothing to convert."""

    tensors: tuple[torch.Tensor, ...]
    zero_copy: bool


def _te_layout(source: ScaleSource, shape: tuple[int, ...]) -> torch.Tensor:
    buf = source.te_buffer
    if buf.numel() != math.prod(shape) or not buf.is_contiguous():
        raise LayoutError(
            f"{source.name}: TE marks these scales swizzled, so its buffer should be exactly the layout "
            f"{shape}; found shape {tuple(buf.shape)}, strides {buf.stride()}"
        )
    return buf.view(shape)


def _allocate(sources: Sequence[ScaleSource], r: int, c: int) -> tuple[torch.Tensor, ...]:
    """One buffer for every source's layout, split per source (expert-major)."""
    counts = [s.shape[0] for s in sources]
    whole = empty_layout(r, c, sum(counts), sources[0].te_buffer.device, sources[0].name)
    per_expert_tiles = layout_shape(r, c)[0]
    return tuple(torch.split(whole, [n * per_expert_tiles for n in counts]))


def plan_scales(
    sources: Sequence[ScaleSource], slots: ScaleSlots | None, what: str
) -> tuple[ScaleSlots, list[ScaleWork]]:
    """The layout buffers for ``sources`` (``slots`` to refresh in place, else new ones or TE's
    own), and the work that fills them. Every source has the same logical ``[R, C]``."""
    _, r, c = sources[0].shape
    aligned = (r, c) == padded_shape(r, c)
    if slots is None:
        if aligned and all(s.swizzled for s in sources):
            return ScaleSlots(tuple(_te_layout(s, layout_shape(r, c, s.shape[0])) for s in sources), True), []
        outs, checked = _allocate(sources, r, c), True
    else:
        if len(slots.tensors) != len(sources):
            raise RefreshError(f"{what}: the cached view has {len(slots.tensors)} scale buffers; found {len(sources)}")
        if slots.zero_copy and not all(s.swizzled for s in sources):
            bad = next(s.name for s in sources if not s.swizzled)
            raise RefreshError(
                f"{bad}: the cached view exposes TE's own swizzled scale buffers, but TE now holds unswizzled "
                "scales; writing the layout there would overwrite TE's storage. Build a new view (without cached=)"
            )
        outs, checked = slots.tensors, False
    work: list[ScaleWork] = []
    for source, out in zip(sources, outs, strict=True):
        if source.swizzled:
            if out.data_ptr() != source.te_buffer.data_ptr():
                work.append(ScaleWork(_te_layout(source, tuple(out.shape)), out, copy=True))
            continue
        if not checked:
            check_out(out, source.logical, source.name)
        work.append(ScaleWork(source.te_buffer, out, geometry=source.geometry))
    if not checked:  # a cached view's buffers: never over TE's scales, nor over each other
        check_no_overlap([w.dst for w in work], [w.src for w in work], what, out_label="cached buffers")
    return slots if slots is not None else ScaleSlots(outs, False), work


def _same(a: object, b: object) -> bool:
    """Equal storage values: the same object, or equal plain values (counts, flags, shape lists)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return isinstance(a, (int, float, str, type(None))) and a == b


class StorageGuard:
    """What a prepared refresh must see unchanged: the same weight objects, every storage tensor
    they hold at the same address, every flag the same. TE re-quantising in place keeps all of
    it; reassigning a buffer or flag, or pointing a tensor at new memory under the same object
    (TE's own ``clear()``: ``t.data = _empty_tensor()``), does not.

    Host cost is what a checked refresh pays, so the common case (weights of one class) is read
    in bulk: one C-level ``attrgetter`` of the tensor names per weight, its results fed straight
    into ``Tensor.data_ptr``, and one of the flags; nothing else per weight.
    """

    def __init__(self, weights: Sequence[object], names: tuple[str, ...] | None = None) -> None:
        """``names``: the logical storage names the refresh depends on (default: all of them)."""
        self.weights = list(weights)
        self.names = names
        self._tensor_reader: Callable[[object], tuple[Any, ...]] | None = None
        self._value_reader: Callable[[object], Any] = _no_values
        self._one_value = False
        if len({type(w) for w in self.weights}) == 1 and self._read_in_bulk(names):
            return
        # mixed classes (hybrid sub-storages), storage kept on .data only, or a tensor one weight
        # has where another has None: read name by name, check every tensor found
        self._tensor_reader = None
        self.tensors, self.values = self._read_by_name(self.weights)
        self.addresses = list(map(_data_ptr, self.tensors))
        self.storages = list(map(torch.Tensor.untyped_storage, self.tensors))

    def _read_in_bulk(self, names: tuple[str, ...] | None) -> bool:
        """Split the names (per class) into tensors, checked by address, and the rest (flags),
        checked by identity or value; False where that split does not hold for every weight."""
        first = self.weights[0]
        reader = storage_reader(first, names)
        try:
            values = reader.read(first)
        except AttributeError:  # storage kept on .data only
            return False
        tensor_names = tuple(n for n, v in zip(reader.names, values, strict=True) if isinstance(v, torch.Tensor))
        self._tensor_reader = storage_reader(first, tensor_names).read
        value_reader = storage_reader(first, tuple(n for n in reader.names if n not in tensor_names))
        self._value_reader = value_reader.read_one or value_reader.read
        self._one_value = value_reader.read_one is not None
        try:
            self.tensors = list(chain.from_iterable(map(self._tensor_reader, self.weights)))
            self.values = self._bulk_values(self.weights)
            self.addresses = list(map(_data_ptr, self.tensors))
        except (AttributeError, TypeError):
            return False
        # the memory itself kept alive (TE's clear() swaps a tensor's storage under the same
        # object): an equal address is then always the old memory, never a reuse of it
        self.storages = list(map(torch.Tensor.untyped_storage, self.tensors))
        return not any(issubclass(t, torch.Tensor) for t in set(map(type, self.values)))

    def _bulk_values(self, weights: Sequence[object]) -> list[Any]:
        if self._one_value:  # the usual case: TE's swizzled flag alone
            return list(map(self._value_reader, weights))
        return list(chain.from_iterable(map(self._value_reader, weights)))

    def _read_by_name(self, weights: Sequence[object]) -> tuple[list[torch.Tensor], list[Any]]:
        """(every tensor, every other value) of ``weights``, read weight by weight."""
        state = [v for w in weights for v in self._values(w)]
        return [v for v in state if isinstance(v, torch.Tensor)], [v for v in state if not isinstance(v, torch.Tensor)]

    def _values(self, weight: object) -> tuple[Any, ...]:
        reader = storage_reader(weight, self.names)
        try:
            return reader.read(weight)
        except AttributeError:
            return tuple(storage_values(weight, self.names).values())

    def unchanged(self, weights: Sequence[object]) -> bool:
        """Same weights, every watched tensor at the same address, every flag the same."""
        if len(weights) != len(self.weights) or not all(map(is_, weights, self.weights)):
            return False
        try:
            tensors: Any
            if self._tensor_reader is None:
                tensors, values = self._read_by_name(weights)
            else:
                tensors = chain.from_iterable(map(self._tensor_reader, weights))
                values = self._bulk_values(weights)
            if list(map(_data_ptr, tensors)) != self.addresses:
                return False
        except (AttributeError, TypeError):  # an attribute left, a tensor became None: plan again
            return False
        if len(values) != len(self.values):
            return False
        return all(map(is_, values, self.values)) or all(map(_same, values, self.values))


_data_ptr = torch.Tensor.data_ptr


def _no_values(weight: object) -> tuple[()]:
    return ()


class RefreshPlan:
    """The prepared refresh of one view or one layer: the launch that rewrites its layout
    buffers, the guard under which it may simply run again, and how often it was planned."""

    def __init__(self) -> None:
        self.guard: StorageGuard | None = None
        self.work: PreparedWork | None = None
        self.key: tuple[Any, ...] = ()
        self.plans = 0

    def rerun(self, weights: Sequence[object], key: tuple[Any, ...]) -> bool:
        """Run the prepared work again if ``key`` matches and the guard sees nothing changed."""
        if self.work is None or self.guard is None or key != self.key or not self.guard.unchanged(weights):
            return False
        self.work.run()
        return True

    def prepare(
        self,
        weights: Sequence[object],
        key: tuple[Any, ...],
        work: Sequence[ScaleWork],
        backend: str | None,
        names: tuple[str, ...] | None = None,
    ) -> None:
        """Bind and run freshly planned ``work``; remember it for reruns under a new guard of
        ``names`` (see StorageGuard). ``key`` holds what else a rerun must match (shapes, format,
        backend)."""
        guard = StorageGuard(weights, names)  # before any write: a guard that cannot read raises first
        prepared = PreparedWork(work, backend)
        prepared.run()
        self.guard, self.work, self.key = guard, prepared, key
        self.plans += 1

    def run_unchecked(self) -> None:
        """Run the prepared launch again WITHOUT checking TE's storage (a few microseconds of
        host time). Only for callers who know TE reassigned no buffer and set no flag since the
        view was built or last refreshed (TE re-quantising in place); otherwise the result is
        silently stale. The checked refresh (``cached=``) is the default for that reason."""
        if self.work is None:
            raise RefreshError("run_unchecked: nothing prepared yet; build the view (or refresh it) first")
        self.work.run()
