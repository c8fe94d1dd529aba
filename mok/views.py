"""Zero-copy views over routed-expert weights, ready for a MoE megakernel: the view types and
what the grouped (mok.grouped) and per-expert (mok.per_expert) paths share.

Payloads are views of TE's own buffers (same data pointers). Block scales (MXFP8, NVFP4) are
brought to the tcgen05 layout into buffers this module owns, and refreshed in place
(``cached=``) so kernels captured in a CUDA graph keep valid addresses. Scales TE already
swizzled (TE 2.12+) are never converted again: aligned ones are exposed as they are, others copied.
The planning is mok.plan's; a refresh of weights whose storage TE did not reassign reruns the
prepared launch after a bulk identity check.

Everything read off a TE object comes through te_compat: this module names no TE attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any

import torch

from mok.checks import check_int, check_sequence, describe
from mok.errors import ExpertWeightError, RefreshError
from mok.formats import Direction
from mok.plan import RefreshPlan, ScaleSlots, ScaleSource, plan_scales
from mok.swizzle import ScaleWork


@dataclass(frozen=True, eq=False)
class GroupedExpertWeights:
    """Views over one grouped Parameter of shape ``(E, rows, columns)``.

    ``row_scales`` is the layout of the rowwise scales ``[E*Rp/128, Cp/4, 32, 16]`` with
    ``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/block, 4)``; ``col_scales`` the layout of
    the ``[columns, rows/block]`` columnwise scales. BF16 views have only ``row_data``. NVFP4
    payloads are packed uint8 (columnwise: TE's transposed ``[E, columns, rows/2]``) and
    ``row_amax``/``col_amax`` are TE's per-expert amax tensors.
    """

    num_experts: int
    rows: int
    columns: int
    use_mxfp8: bool
    row_data: torch.Tensor
    row_scales: torch.Tensor | None = None
    col_data: torch.Tensor | None = None
    col_scales: torch.Tensor | None = None
    row_scales_zero_copy: bool = False  # row_scales is TE's own swizzled buffer
    col_scales_zero_copy: bool = False
    format: str = "mxfp8"
    row_amax: torch.Tensor | None = None
    col_amax: torch.Tensor | None = None
    refresh_plan: RefreshPlan = field(default_factory=RefreshPlan, repr=False)


@dataclass(frozen=True, eq=False)
class SplitExpertWeights:
    """Views over one Parameter per expert, with device pointer tables for a kernel.

    ``*_ptrs`` are int64 tensors on the weights' device holding each expert's address;
    ``row_scales[e]``/``col_scales[e]`` are each expert's scales in the layout.
    """

    num_experts: int
    rows: int
    columns: int
    use_mxfp8: bool
    row_data: tuple[torch.Tensor, ...]
    row_data_ptrs: torch.Tensor
    row_scales: tuple[torch.Tensor, ...] | None = None
    row_scale_ptrs: torch.Tensor | None = None
    col_data: tuple[torch.Tensor, ...] | None = None
    col_data_ptrs: torch.Tensor | None = None
    col_scales: tuple[torch.Tensor, ...] | None = None
    col_scale_ptrs: torch.Tensor | None = None
    row_scales_zero_copy: bool = False
    col_scales_zero_copy: bool = False
    format: str = "mxfp8"
    row_amax: tuple[torch.Tensor, ...] | None = None
    row_amax_ptrs: torch.Tensor | None = None
    col_amax: tuple[torch.Tensor, ...] | None = None
    col_amax_ptrs: torch.Tensor | None = None
    row_format: str | None = None  # each direction's own format (they differ only for "hybrid")
    col_format: str | None = None
    refresh_plan: RefreshPlan = field(default_factory=RefreshPlan, repr=False)


ExpertWeights = GroupedExpertWeights | SplitExpertWeights


@dataclass(frozen=True)
class Side:
    """One direction of a view as read off TE: payload views, scale sources, amax tensors."""

    direction: Direction
    format: str  # the format this direction is stored in
    data: tuple[torch.Tensor, ...]
    sources: tuple[ScaleSource, ...]
    amax: tuple[torch.Tensor, ...] | None


def _view_shape(shape: object) -> tuple[int, ...]:
    """``shape`` checked: a sequence of ints >= 0 (a -1 would let torch infer, not check, a size)."""
    dims = check_sequence("shape", shape, "ints (the view's sizes)")
    return tuple(check_int(f"shape[{i}]", d) for i, d in enumerate(dims))


def storage_view(storage: torch.Tensor, shape: Sequence[int], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A dense view of ``storage`` as ``shape``/``dtype`` sharing its memory (uint8 may be
    reinterpreted as a 1-byte float8 dtype). Raises, naming ``name``, rather than copying.
    The view is detached: kernels read it by address, outside autograd."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str naming the storage; found {describe(name)}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: dtype: expected a torch.dtype; found {describe(dtype)}")
    shape = _view_shape(shape)
    if not isinstance(storage, torch.Tensor):
        raise ExpertWeightError(f"{name}: expected a torch.Tensor; found {type(storage).__name__}")
    if storage.dtype != dtype and not (storage.dtype == torch.uint8 and dtype.itemsize == 1):
        raise ExpertWeightError(
            f"{name}: expected dtype {dtype}"
            + (" (or uint8 to reinterpret)" if dtype.itemsize == 1 else "")
            + f"; found {storage.dtype}"
        )
    if not storage.is_contiguous():
        raise ExpertWeightError(
            f"{name}: expected contiguous storage for a zero-copy view; found shape "
            f"{tuple(storage.shape)} with strides {storage.stride()}"
        )
    count = math.prod(shape)
    if storage.numel() != count:
        raise ExpertWeightError(
            f"{name}: expected {count} elements for shape {tuple(shape)}; found {storage.numel()} "
            f"(shape {tuple(storage.shape)})"
        )
    view = storage.detach() if storage.requires_grad else storage
    if storage.dtype != dtype:
        view = view.view(dtype)
    return view if tuple(view.shape) == tuple(shape) else view.view(tuple(shape))


_dtype, _shape, _requires_grad = attrgetter("dtype"), attrgetter("shape"), attrgetter("requires_grad")


def storage_views(
    storages: Sequence[object], shape: tuple[int, ...], *, dtype: torch.dtype, name: Callable[[int], str]
) -> tuple[torch.Tensor, ...]:
    """:func:`storage_view` of many storages (one per expert, ``name(e)`` naming each), checked
    in bulk: the checks run per distinct dtype and numel, not per expert. Any storage the bulk
    checks do not pass goes through storage_view, which raises naming it."""
    if not all(isinstance(t, torch.Tensor) for t in storages):
        return tuple(storage_view(t, shape, dtype=dtype, name=name(e)) for e, t in enumerate(storages))  # type: ignore[arg-type]
    tensors: Sequence[torch.Tensor] = storages  # type: ignore[assignment]
    dtypes = set(map(_dtype, tensors))
    fine = (
        dtypes <= {dtype, torch.uint8}
        and (dtypes == {dtype} or dtype.itemsize == 1)
        and set(map(torch.Tensor.numel, tensors)) == {math.prod(shape)}
        and all(map(torch.Tensor.is_contiguous, tensors))
        and not any(map(_requires_grad, tensors))
    )
    if not fine:
        return tuple(storage_view(t, shape, dtype=dtype, name=name(e)) for e, t in enumerate(tensors))
    views: Any = tensors
    if dtypes != {dtype}:
        views = map(methodcaller("view", dtype), views)
    if set(map(_shape, tensors)) != {shape}:
        views = map(methodcaller("view", shape), views)
    return tuple(views)


def _moved(name: str, old: torch.Tensor | None, new: torch.Tensor | None) -> str:
    def addr(t: torch.Tensor | None) -> str:
        return "none" if t is None else hex(t.data_ptr())

    return (
        f"{name} moved from {addr(old)} to {addr(new)} since the cached view was built; its pointer "
        "tables would be stale. Build a new view (without cached=)"
    )


def _check_not_moved(what: str, old: tuple[torch.Tensor, ...] | None, new: tuple[torch.Tensor, ...]) -> None:
    if old is None or len(old) != len(new):
        raise RefreshError(f"{what}: the cached view has no such data for {len(new)} experts; build a new view")
    for e, (a, b) in enumerate(zip(old, new, strict=True)):
        if a.data_ptr() != b.data_ptr():
            raise RefreshError(_moved(f"{what}" if len(new) == 1 else f"expert {e} {what}", a, b))


def ptr_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


def check_cached(cached: object, cls: type, fmt: str, dims: tuple[int, int, int]) -> None:
    if not isinstance(cached, cls):
        raise RefreshError(f"cached: expected a {cls.__name__} from an earlier call; found {type(cached).__name__}")
    if cached.format != fmt:  # type: ignore[attr-defined]
        raise RefreshError(f"cached view is a {cached.format} view; asked for {fmt}")  # type: ignore[attr-defined]
    got = (cached.num_experts, cached.rows, cached.columns)  # type: ignore[attr-defined]
    if got != dims:
        raise RefreshError(f"cached view was built for (experts, rows, columns) = {got}; asked for {dims}")


def _as_tuple(value: torch.Tensor | tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, ...] | None:
    return (value,) if isinstance(value, torch.Tensor) else value


def plan_sides(
    sides: Sequence[Side], cached: ExpertWeights | None, what: str
) -> tuple[list[ScaleSlots], list[ScaleWork]]:
    """Plan every side's scales into the cached view's buffers (or new ones), after checking
    that no payload a cached view exposes has moved. The one place views plan kernel work."""
    all_slots: list[ScaleSlots] = []
    work: list[ScaleWork] = []
    for side in sides:
        prefix = "row" if side.direction.name == "rowwise" else "col"
        old = None
        if cached is not None:
            _check_not_moved(
                f"{what}{side.direction.name} data", _as_tuple(getattr(cached, f"{prefix}_data")), side.data
            )
            if side.amax is not None:  # kernels hold these addresses too (pointer tables)
                _check_not_moved(
                    f"{what}{side.direction.name} amax", _as_tuple(getattr(cached, f"{prefix}_amax")), side.amax
                )
            tensors = _as_tuple(getattr(cached, f"{prefix}_scales"))
            old = ScaleSlots(tensors or (), getattr(cached, f"{prefix}_scales_zero_copy"))
        slots, items = plan_scales(side.sources, old, f"{what}{side.direction.name} scales")
        all_slots.append(slots)
        work.extend(items)
    if cached is not None and len(sides) < 2 and cached.col_data is not None:
        raise RefreshError(f"{what}the cached view has columnwise data; the weights no longer do")
    return all_slots, work


def check_sizes(**values: object) -> tuple[int, ...]:
    return tuple(check_int(name, value, minimum=1) for name, value in values.items())


def same_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    device = tensors[0].device
    for e, t in enumerate(tensors):
        if t.device != device:
            raise ExpertWeightError(f"expert {e} is on {t.device}; expected every expert on {device}")
    return device


def param_list(params: object) -> list[object]:
    params = list(check_sequence("params", params, "expert parameters (tensors)", item_type=torch.Tensor))
    if not params:
        raise ExpertWeightError("split_weight_view: expected at least one expert parameter; found none")
    return list(params)
