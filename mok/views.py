"""The view types of mok and what the grouped (mok.grouped) and per-expert (mok.split)
paths share: zero-copy payload views and device pointer tables.

A view is a weight's shape and format and one :class:`ViewDirection` per direction TE stores
(rowwise: scales along the columns, for the forward GEMM; columnwise: along the rows, for the
backward ones). Payloads are views of TE's own buffers (same data pointers). Block scales
(MXFP8, NVFP4) are in the tcgen05 layout, in buffers the view owns (or TE's own, when TE wrote
them swizzled and aligned), refreshed in place (``cached=``) so kernels captured in a CUDA graph
keep valid addresses. Data only: reading, planning and launching are mok.plan.pipeline's. This module
names no TE attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import torch

from mok.checks import check_int, check_sequence, describe
from mok.deprecation import deprecated
from mok.errors import ExpertWeightError, RefreshError
from mok.formats import Format

T = TypeVar("T")


class Shape(NamedTuple):
    """What every view is the size of: ``experts`` weights of ``(rows, columns)`` each (a view
    of one Parameter per expert counts its Parameters)."""

    experts: int
    rows: int
    columns: int


def _brief(value: object) -> str:
    """``value`` for a repr without printing a tensor's values (nor calling a TE tensor's repr,
    which would dequantize it): dtype, shape and device; per-expert tuples by count; other
    containers as :func:`describe` names them."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)} {value.device}"
    if isinstance(value, Format):
        return value.value
    if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
        shapes = sorted({_brief(v) for v in value})
        return f"{len(value)} x {shapes[0]}" if len(shapes) == 1 else f"{len(value)} tensors ({', '.join(shapes)})"
    if value is None or isinstance(value, (bool, int, float, str, ViewDirection)):
        return repr(value)  # a view's own direction prints as this module prints it
    return describe(value)  # anything else (a tuple mixing tensors and None, say) without its repr


def _repr(obj: object) -> str:
    fields_ = getattr(obj, "__dataclass_fields__", {})
    parts = ", ".join(f"{n}={_brief(getattr(obj, n))}" for n, f in fields_.items() if f.repr)
    return f"{type(obj).__name__}({parts})"


class _Runs(Protocol):
    def run(self) -> None: ...


class Prepared(Protocol):
    """A prepared refresh (mok.plan.pipeline.PreparedRefresh): its ``work`` runs the launch again."""

    @property
    def work(self) -> _Runs: ...


class RefreshPlan:
    """The prepared refresh of one view or one layer, as mok.plan.pipeline leaves it: ``prepared``
    (the launch, its guard and backend: one object, replaced whole when planned again) and how
    often it was planned."""

    def __init__(self) -> None:
        self.prepared: Prepared | None = None
        self.plans = 0

    def run_unchecked(self) -> None:
        """Run the prepared launch again WITHOUT checking TE's storage (a few microseconds of
        host time). Only for callers who know TE reassigned no buffer and set no flag since the
        view was built or last refreshed (TE re-quantising in place); otherwise the result is
        silently stale. The checked refresh (``cached=``) is the default for that reason."""
        prepared = self.prepared
        if prepared is None:
            raise RefreshError("run_unchecked: nothing prepared yet; build the view (or refresh it) first")
        prepared.work.run()


@dataclass(frozen=True, eq=False, repr=False)
class ViewDirection:
    """One direction of a view: what a kernel reads for one GEMM operand.

    ``data`` holds the payload views: one per expert (split views) or one ``[E, ...]`` tensor
    (grouped views); ``scales`` the layout buffer of each (``[E*Rp/128, Cp/4, 32, 16]`` uint8);
    ``amax`` TE's amax tensors (NVFP4). The ``*_ptrs`` are int64 device pointer tables of those
    (split views; None for grouped ones). ``scales_zero_copy``: the scales are TE's own
    swizzled buffers, so a refresh has nothing to convert.
    """

    format: Format  # BF16, MXFP8 or NVFP4: how this direction is stored
    data: tuple[torch.Tensor, ...]
    data_ptrs: torch.Tensor | None = None
    scales: tuple[torch.Tensor, ...] | None = None
    scale_ptrs: torch.Tensor | None = None
    scales_zero_copy: bool = False
    amax: tuple[torch.Tensor, ...] | None = None
    amax_ptrs: torch.Tensor | None = None

    __repr__ = _repr


Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True, eq=False, repr=False)
class ExpertWeights:
    """What both view types are: ``num_experts`` weights ``(rows, columns)`` of ``format`` and
    their directions (``columnwise`` None where TE keeps none). ``refresh_plan`` reruns the
    conversion of the scales while TE reassigns nothing (``cached=``). ``quantized_on_the_fly``:
    the weights are BF16 and mok quantises them to MXFP8 into buffers the view owns (payloads
    too), again at every refresh."""

    num_experts: int
    rows: int
    columns: int
    format: Format
    rowwise: ViewDirection
    columnwise: ViewDirection | None = None
    quantized_on_the_fly: bool = False
    refresh_plan: RefreshPlan = field(default_factory=RefreshPlan, repr=False)

    __repr__ = _repr

    @property
    def use_mxfp8(self) -> bool:
        """Deprecated: ``format is Format.MXFP8`` (``use_mxfp8`` is Megatron's flag, mok.weights' alone)."""
        deprecated("ExpertWeights.use_mxfp8", "ExpertWeights.format (format is mok.Format.MXFP8)")
        return self.format is Format.MXFP8

    @property
    def directions(self) -> tuple[ViewDirection, ...]:
        return (self.rowwise,) if self.columnwise is None else (self.rowwise, self.columnwise)


@dataclass(frozen=True, eq=False, repr=False)
class GroupedExpertWeights(ExpertWeights):
    """Views over one grouped Parameter of shape ``(E, rows, columns)``: each direction's
    ``data``, ``scales`` and ``amax`` hold one tensor over every expert.

    ``rowwise.scales[0]`` is the layout of the rowwise scales ``[E*Rp/128, Cp/4, 32, 16]`` with
    ``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/block, 4)``; ``columnwise.scales[0]`` the
    layout of the ``[columns, rows/block]`` columnwise scales. NVFP4 payloads are packed uint8
    (columnwise: TE's transposed ``[E, columns, rows/2]``).
    """


@dataclass(frozen=True, eq=False, repr=False)
class SplitExpertWeights(ExpertWeights):
    """Views over one Parameter per expert, with device pointer tables for a kernel: each
    direction's ``data``, ``scales`` and ``amax`` hold one tensor per expert, and ``data_ptrs``,
    ``scale_ptrs`` and ``amax_ptrs`` int64 tables of their addresses on the weights' device. For
    hybrid weights each direction has its own ``format``."""


def _view_shape(shape: object) -> tuple[int, ...]:
    """``shape`` checked: a sequence of ints >= 0 (a -1 would let torch infer, not check, a size)."""
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):  # the usual case, checked at C speed
        return shape
    dims = check_sequence("shape", shape, "ints (the view's sizes)")
    return tuple(check_int(f"shape[{i}]", d) for i, d in enumerate(dims))


def storage_view(storage: torch.Tensor, shape: Sequence[int], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A dense view of ``storage`` as ``shape``/``dtype`` sharing its memory (uint8 may be
    reinterpreted as any 1-byte dtype: float8, int8). Raises, naming ``name``, rather than copying.
    The view is detached: kernels read it by address, outside autograd. It is always a new tensor
    object, never ``storage`` itself."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str naming the storage; found {describe(name)}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: dtype: expected a torch.dtype; found {describe(dtype)}")
    shape = _view_shape(shape)
    if not isinstance(storage, torch.Tensor):
        raise ExpertWeightError(f"{name}: expected a torch.Tensor; found {describe(storage)}")
    found = storage.dtype
    if found != dtype and not (found == torch.uint8 and dtype.itemsize == 1):
        raise ExpertWeightError(
            f"{name}: expected dtype {dtype}"
            + (" (or uint8 to reinterpret)" if dtype.itemsize == 1 else "")
            + f"; found {found}"
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
    # the view's own tensor, outside autograd (a refresh may re-point it): a dtype view of a tensor
    # that requires no grad is already a new tensor with no history; anything else is detached first
    view = storage if found != dtype and not storage.requires_grad else storage.detach()
    if found != dtype:
        view = view.view(dtype)
    return view if view.shape == shape else view.view(shape)


_dtype, _shape = attrgetter("dtype"), attrgetter("shape")
_device, _data_ptr = attrgetter("device"), methodcaller("data_ptr")
_is_tensor = torch.Tensor.__instancecheck__


def storage_views(
    storages: Sequence[object], shape: tuple[int, ...], *, dtype: torch.dtype, name: Callable[[int], str]
) -> tuple[torch.Tensor, ...]:
    """:func:`storage_view` of many storages (one per expert, ``name(e)`` naming each), checked
    in bulk: the checks run per distinct dtype and numel, not per expert. Any storage the bulk
    checks do not pass goes through storage_view, which raises naming it."""
    if not all(map(_is_tensor, storages)):
        return tuple(storage_view(t, shape, dtype=dtype, name=name(e)) for e, t in enumerate(storages))  # type: ignore[arg-type]
    tensors: Sequence[torch.Tensor] = storages  # type: ignore[assignment]
    dtypes = set(map(_dtype, tensors))
    shaped = set(map(_shape, tensors)) == {shape}  # then every numel is prod(shape) too
    fine = (
        dtypes <= {dtype, torch.uint8}
        and (dtypes == {dtype} or dtype.itemsize == 1)
        and (shaped or set(map(torch.Tensor.numel, tensors)) == {math.prod(shape)})
        and all(map(torch.Tensor.is_contiguous, tensors))
    )
    if not fine:
        return tuple(storage_view(t, shape, dtype=dtype, name=name(e)) for e, t in enumerate(tensors))
    # the view's own tensors (a refresh may re-point them): a dtype view of TE's 1-byte buffers, which
    # never require grad, else a detached alias (weights may come to require grad later)
    views: Any = map(methodcaller("view", dtype), tensors) if dtypes != {dtype} else map(torch.Tensor.detach, tensors)
    return tuple(views if shaped else map(methodcaller("view", shape), views))


def ptr_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The int64 device pointer table of ``tensors`` (one address each), on ``device``."""
    return torch.tensor(list(map(_data_ptr, tensors)), dtype=torch.int64, device=device)


def check_sizes(**values: object) -> tuple[int, ...]:
    """``values`` as ints >= 1, each checked (named) unless all are plain ints >= 1 (a refresh
    passes here every call: one C-level pass, no call per value)."""
    found = tuple(values.values())
    if set(map(type, found)) == {int}:
        ints = cast("tuple[int, ...]", found)
        if min(ints) >= 1:
            return ints
    return tuple(check_int(name, value, minimum=1) for name, value in values.items())


def same_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    device = tensors[0].device
    if len(set(map(_device, tensors))) == 1:  # the usual case: one pass in C
        return device
    for e, t in enumerate(tensors):
        if t.device != device:
            raise ExpertWeightError(f"expert {e} is on {t.device}; expected every expert on {device}")
    return device


def param_list(params: object, *, tensors: bool = True) -> list[object]:
    """``params`` as a list of expert parameters: a non-empty sequence, each a tensor (naming the
    index of one that is not). ``tensors=False`` leaves the items to a later check: a refresh
    whose weights are the very objects its view was built from needs none."""
    what = "expert parameters (tensors)"
    items = check_sequence("params", params, what, item_type=torch.Tensor if tensors else None)
    if not items:
        raise ExpertWeightError("split_weight_view: expected at least one expert parameter; found none")
    return list(items)
