"""The one planner: which layout buffers a view exposes, what fills them, and the view itself.

The readers of TE (mok.per_expert, mok.grouped) describe each direction of the weights as a
:class:`DirectionSource` (payload views, the scales as :class:`ScaleSource` items: TE's buffer,
the logical matrices to convert, TE's swizzled flag; amax) and hand them to :func:`plan_view`,
which plans the buffers and the work, builds (or refreshes) the view and prepares its launch.
Nothing else plans kernel work. The path of a first view: the reader, then plan_view, then
mok.refresh (the guard and the prepared launch), mok.work and the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import torch

from mok.errors import RefreshError
from mok.formats import Direction, Format
from mok.layout import (
    Geometry,
    check_out,
    empty_layout,
    layout_shape,
    logical_view,
    padded_shape,
    te_swizzled_layout,
)
from mok.overlap import check_no_overlap
from mok.views import ExpertWeights, SplitExpertWeights, ViewDirection, ptr_table
from mok.work import ScaleWork

View = TypeVar("View", bound=ExpertWeights)


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
    return te_swizzled_layout(source.te_buffer, shape, source.name)


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


@dataclass(frozen=True)
class DirectionSource:
    """One direction of the weights as read off TE: how TE stores it, its format, the payload
    views (one per expert, or one over all), the scales to bring into the layout, TE's amax."""

    direction: Direction
    format: Format
    data: tuple[torch.Tensor, ...]
    sources: tuple[ScaleSource, ...]
    amax: tuple[torch.Tensor, ...] | None


def _check_not_moved(what: str, old: tuple[torch.Tensor, ...] | None, new: tuple[torch.Tensor, ...]) -> None:
    """Kernels hold these addresses (pointer tables, captured graphs): a refresh cannot follow a move."""
    if old is None or len(old) != len(new):
        raise RefreshError(f"{what}: the cached view has no such data for {len(new)} experts; build a new view")
    for e, (a, b) in enumerate(zip(old, new, strict=True)):
        if a.data_ptr() != b.data_ptr():
            name = what if len(new) == 1 else f"expert {e} {what}"
            raise RefreshError(
                f"{name} moved from {hex(a.data_ptr())} to {hex(b.data_ptr())} since the cached view was built; "
                "its pointer tables would be stale. Build a new view (without cached=)"
            )


def _cached_direction(cached: ExpertWeights, source: DirectionSource, what: str) -> ScaleSlots:
    """The cached view's buffers for ``source``'s direction, after checking that no payload or
    amax it exposes has moved."""
    name = source.direction.name
    old = cached.rowwise if name == "rowwise" else cached.columnwise
    _check_not_moved(f"{what}{name} data", None if old is None else old.data, source.data)
    assert old is not None
    if source.amax is not None:
        _check_not_moved(f"{what}{name} amax", old.amax, source.amax)
    return ScaleSlots(old.scales or (), old.scales_zero_copy)


def plan_directions(
    sources: Sequence[DirectionSource], cached: ExpertWeights | None, what: str
) -> tuple[list[ScaleSlots], list[ScaleWork]]:
    """Every direction's scale buffers (the cached view's, or new ones) and the work filling them."""
    all_slots: list[ScaleSlots] = []
    work: list[ScaleWork] = []
    for source in sources:
        old = None if cached is None else _cached_direction(cached, source, what)
        slots, items = plan_scales(source.sources, old, f"{what}{source.direction.name} scales")
        all_slots.append(slots)
        work.extend(items)
    if cached is not None and len(sources) < 2 and cached.columnwise is not None:
        raise RefreshError(f"{what}the cached view has columnwise data; the weights no longer do")
    return all_slots, work


def _view_direction(source: DirectionSource, slots: ScaleSlots, tables: bool) -> ViewDirection:
    if not tables:
        return ViewDirection(source.format, source.data, None, slots.tensors, None, slots.zero_copy, source.amax)
    device = source.data[0].device
    return ViewDirection(
        source.format,
        source.data,
        ptr_table(source.data, device),
        slots.tensors,
        ptr_table(slots.tensors, device),
        slots.zero_copy,
        source.amax,
        None if source.amax is None else ptr_table(source.amax, device),
    )


def check_cached(cached: object, cls: type[ExpertWeights], fmt: Format, dims: tuple[int, int, int]) -> ExpertWeights:
    """``cached`` as an earlier view of the same class, format, experts and shape."""
    if not isinstance(cached, cls):
        raise RefreshError(f"cached: expected a {cls.__name__} from an earlier call; found {type(cached).__name__}")
    if cached.format is not fmt:
        raise RefreshError(f"cached view is a {cached.format} view; asked for {fmt}")
    got = (cached.num_experts, cached.rows, cached.columns)
    if got != dims:
        raise RefreshError(f"cached view was built for (experts, rows, columns) = {got}; asked for {dims}")
    return cached


class ViewRequest(NamedTuple):
    """What a view is planned for, and what its refresh must find unchanged."""

    dims: tuple[int, int, int]  # experts, rows, columns
    format: Format
    weights: Sequence[object]  # what the refresh guard watches
    key: tuple[Any, ...]  # what else a rerun must match (shapes, format, backend)
    names: tuple[str, ...] | None  # the storage names the guard reads (None: every one)
    backend: str | None


def plan_view(cls: type[View], request: ViewRequest, sources: Sequence[DirectionSource], cached: View | None) -> View:
    """The view of ``sources`` (``cached`` refreshed in place, or a new ``cls``), its scales
    converted, its launch prepared for reruns (per-expert views get pointer tables)."""
    tables = issubclass(cls, SplitExpertWeights)  # per-expert tensors: kernels find them through tables
    what = "" if tables else "grouped "
    slots, work = plan_directions(sources, cached, what)
    view = cached
    if view is None:
        rowwise, *columnwise = (_view_direction(s, slot, tables) for s, slot in zip(sources, slots, strict=True))
        view = cls(*request.dims, request.format, rowwise, columnwise[0] if columnwise else None)
    view.refresh_plan.prepare(request.weights, request.key, work, request.backend, request.names)
    return view
