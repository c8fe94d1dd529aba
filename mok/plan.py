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
from operator import is_, itemgetter
from typing import Any, NamedTuple

import torch

from mok.errors import LayoutError, RefreshError
from mok.layout import check_no_overlap, check_out, layout_shape, padded_shape
from mok.swizzle import PreparedWork, ScaleWork
from te_compat import storage_reader, storage_values


class ScaleSource(NamedTuple):
    """Scales of ``E`` experts to bring into the layout. ``logical`` is ``[E, R, C]`` uint8 (any
    strides, a view of ``te_buffer``); when TE already ``swizzled`` them, ``te_buffer`` holds the
    layout itself and is copied or exposed, never converted a second time."""

    name: str
    te_buffer: torch.Tensor
    logical: torch.Tensor
    swizzled: bool


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
    counts = [s.logical.shape[0] for s in sources]
    whole = torch.empty(layout_shape(r, c, sum(counts)), dtype=torch.uint8, device=sources[0].logical.device)
    per_expert_tiles = layout_shape(r, c)[0]
    return tuple(torch.split(whole, [n * per_expert_tiles for n in counts]))


def plan_scales(
    sources: Sequence[ScaleSource], slots: ScaleSlots | None, what: str
) -> tuple[ScaleSlots, list[ScaleWork]]:
    """The layout buffers for ``sources`` (``slots`` to refresh in place, else new ones or TE's
    own), and the work that fills them. Every source has the same logical ``[R, C]``."""
    _, r, c = sources[0].logical.shape
    aligned = (r, c) == padded_shape(r, c)
    if slots is None:
        if aligned and all(s.swizzled for s in sources):
            return ScaleSlots(tuple(_te_layout(s, layout_shape(r, c, s.logical.shape[0])) for s in sources), True), []
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
        work.append(ScaleWork(source.logical, out))
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
    they hold at the same address, every flag the same (read in bulk through te_compat's
    storage_reader). TE re-quantising in place keeps all of it; reassigning a buffer or flag, or
    pointing a tensor at new memory under the same object, does not."""

    def __init__(self, weights: Sequence[object], names: tuple[str, ...] | None = None) -> None:
        """``names``: the logical storage names the refresh depends on (default: all of them)."""
        self.weights = tuple(weights)
        self.names = names
        if len({type(w) for w in self.weights}) == 1:
            self._read = self._bulk_reader(storage_reader(self.weights[0], names).read)
        else:
            self._read = self._mixed
        try:
            state = self._read(self.weights)
        except AttributeError:  # storage kept on .data only: read it name by name, each time
            self._read = self._by_field
            state = self._read(self.weights)
        self.state = tuple(state)
        self._tensors = _picker([i for i, v in enumerate(self.state) if isinstance(v, torch.Tensor)])
        self._others = _picker([i for i, v in enumerate(self.state) if not isinstance(v, torch.Tensor)])
        self.addresses = list(map(torch.Tensor.data_ptr, self._tensors(self.state)))
        self.others = self._others(self.state)

    @staticmethod
    def _bulk_reader(read: Callable[[object], tuple[Any, ...]]) -> Callable[[Sequence[object]], list[Any]]:
        return lambda weights: list(chain.from_iterable(map(read, weights)))

    def _mixed(self, weights: Sequence[object]) -> list[Any]:
        return [v for w in weights for v in storage_reader(w, self.names).read(w)]

    def _by_field(self, weights: Sequence[object]) -> list[Any]:
        return [v for w in weights for v in storage_values(w, self.names).values()]

    def unchanged(self, weights: Sequence[object]) -> bool:
        """Same weights, every watched tensor at the same address, every flag the same. The guard
        keeps the old tensors alive, so an equal address is the old memory, never a reuse of it."""
        if len(weights) != len(self.weights) or not all(map(is_, weights, self.weights)):
            return False
        try:
            state = self._read(weights)
            if (
                len(state) != len(self.state)
                or list(map(torch.Tensor.data_ptr, self._tensors(state))) != self.addresses
            ):
                return False
        except (AttributeError, TypeError):  # an attribute left, a tensor became None: plan again
            return False
        others = self._others(state)
        return all(map(is_, others, self.others)) or all(map(_same, others, self.others))


def _picker(positions: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``operator.itemgetter`` of ``positions`` that always returns a tuple."""
    if len(positions) > 1:
        return itemgetter(*positions)
    return lambda items: tuple(items[i] for i in positions)


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
