"""Typed snapshots of a TE tensor's storage: the buffers, as they are now, by logical name.

A snapshot holds references to TE's own buffers (no copy). Take a new one after TE may have
reassigned them (an in-place swizzle or re-quantisation reassigns attributes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from te_compat.errors import StorageNotFoundError, UnsupportedTensorError
from te_compat.probe import _class_path, resolve, storage_attr, storage_field, tensor_kind
from te_compat.table import TensorKind

if TYPE_CHECKING:
    import torch


def _need(obj: object, value: Any, name: str) -> Any:
    if value is not None:
        return value
    res = resolve(type(obj), name)
    attrs = " or ".join(repr(a) for a in res.candidates) or "(none in this release)"
    raise StorageNotFoundError(
        f"{_class_path(type(obj))} holds no {name} (attribute {attrs} is None or absent; "
        f"TE {res.release}, {res.kind} row {res.row.span if res.row else 'newest'})"
    )


def _expect_kind(obj: object, expected: tuple[TensorKind, ...], what: str) -> TensorKind:
    kind = tensor_kind(obj)
    if kind not in expected:
        raise UnsupportedTensorError(
            f"{what} expects a TE {' or '.join(k.value for k in expected)} tensor; "
            f"found {_class_path(type(obj))} (kind {kind})"
        )
    return kind


def _logical_shape(obj: object, *fallbacks: torch.Tensor | None) -> tuple[int, ...]:
    shape = getattr(obj, "shape", None)
    if shape is not None and not callable(shape):
        return tuple(int(d) for d in shape)
    for t in fallbacks:
        if t is not None:
            return tuple(int(d) for d in t.shape)
    raise StorageNotFoundError(f"{_class_path(type(obj))}: no shape and no data to take it from")


@dataclass(frozen=True)
class MXFP8Storage:
    """The buffers of one MXFP8 tensor. Payloads are uint8 ``[M, K]`` (columnwise too, not
    transposed); scales are uint8 and padded by TE (see ``docs``/the layout spec)."""

    owner: object
    shape: tuple[int, ...]
    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    scales_swizzled: bool  # TE 2.12+: scales already in GEMM layout; always False before

    def need(self, name: str) -> Any:
        """The named buffer, or an error naming the attribute, class and TE release."""
        return _need(self.owner, getattr(self, name), name)


@dataclass(frozen=True)
class Float8Storage:
    """The buffers of one Float8 (per-tensor scaled) tensor."""

    owner: object
    shape: tuple[int, ...]
    data: torch.Tensor | None
    transpose: torch.Tensor | None  # shape [K] + shape[:-1], when TE cached it
    scale_inv: torch.Tensor | None  # fp32 [1]

    def need(self, name: str) -> Any:
        return _need(self.owner, getattr(self, name), name)


@dataclass(frozen=True)
class GroupedStorage:
    """The buffers of one GroupedTensor (all experts in flat 1-D buffers)."""

    owner: object
    num_tensors: int
    tensor_shapes: tuple[tuple[int, ...], ...]
    rowwise_data: torch.Tensor | None  # 2.13 "data", 2.14+ "rowwise_data"
    columnwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None  # "scale_inv"
    columnwise_scale_inv: torch.Tensor | None
    rowwise_scale_inv_offsets: tuple[int, ...] | None
    columnwise_scale_inv_offsets: tuple[int, ...] | None
    members: tuple[object, ...] | None  # the per-expert quantized tensors TE made, if any
    quantized: bool  # False for a BF16/FP32 grouped tensor
    scales_swizzled: bool

    def need(self, name: str) -> Any:
        return _need(self.owner, getattr(self, name), name)


def _swizzled_flag(obj: object) -> bool:
    flag = storage_field(obj, "scales_swizzled")
    return bool(flag) if flag is not None else False


def mxfp8_storage(param: object) -> MXFP8Storage:
    """Snapshot of an MXFP8 tensor or Parameter. Raises if it holds neither usage."""
    _expect_kind(param, (TensorKind.MXFP8,), "mxfp8_storage")
    row = storage_attr(param, "rowwise_data")
    col = storage_attr(param, "columnwise_data")
    if row is None and col is None:
        _need(param, None, "rowwise_data")
    return MXFP8Storage(
        owner=param,
        shape=_logical_shape(param, row, col),
        rowwise_data=row,
        rowwise_scale_inv=storage_attr(param, "rowwise_scale_inv"),
        columnwise_data=col,
        columnwise_scale_inv=storage_attr(param, "columnwise_scale_inv"),
        scales_swizzled=_swizzled_flag(param),
    )


def float8_storage(param: object) -> Float8Storage:
    """Snapshot of a Float8 tensor or Parameter (1.x ``_fp8_attrs`` and 2.x layouts)."""
    _expect_kind(param, (TensorKind.FLOAT8,), "float8_storage")
    data = storage_attr(param, "data")
    transpose = storage_attr(param, "transpose")
    if data is None and transpose is None:
        _need(param, None, "data")
    return Float8Storage(
        owner=param,
        shape=_logical_shape(param, data),
        data=data,
        transpose=transpose,
        scale_inv=storage_attr(param, "scale_inv"),
    )


def _offsets(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    return tuple(int(v) for v in value)


def grouped_storage(param: object) -> GroupedStorage:
    """Snapshot of a GroupedTensor (2.13 plain class, 2.14+ tensor/Parameter)."""
    _expect_kind(param, (TensorKind.GROUPED,), "grouped_storage")
    num = storage_field(param, "num_tensors")
    shapes = storage_field(param, "tensor_shapes")
    members = storage_field(param, "quantized_tensors")
    row = storage_attr(param, "rowwise_data")
    col = storage_attr(param, "columnwise_data")
    if row is None and col is None:
        _need(param, None, "rowwise_data")
    if num is None:
        _need(param, None, "num_tensors")
    if shapes is None:
        _need(param, None, "tensor_shapes")
    member_tuple = tuple(members) if members is not None else None
    quantized = storage_field(param, "quantizer") is not None
    flag = storage_field(param, "scales_swizzled")
    swizzled = bool(flag)
    if flag is None and quantized and member_tuple:
        # 2.13 keeps no flag on the group; its MXFP8 members (2.12+) carry their own.
        swizzled = any(tensor_kind(m) is TensorKind.MXFP8 and _swizzled_flag(m) for m in member_tuple)
    return GroupedStorage(
        owner=param,
        num_tensors=int(num),
        tensor_shapes=tuple(tuple(int(d) for d in s) for s in shapes),
        rowwise_data=row,
        columnwise_data=col,
        rowwise_scale_inv=storage_attr(param, "rowwise_scale_inv"),
        columnwise_scale_inv=storage_attr(param, "columnwise_scale_inv"),
        rowwise_scale_inv_offsets=_offsets(storage_field(param, "rowwise_scale_inv_offsets")),
        columnwise_scale_inv_offsets=_offsets(storage_field(param, "columnwise_scale_inv_offsets")),
        members=member_tuple,
        quantized=quantized,
        scales_swizzled=swizzled,
    )
