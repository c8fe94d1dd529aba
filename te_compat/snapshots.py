"""Typed snapshots of a TE tensor's storage: the buffers, as they are now, by logical name.

A snapshot holds references to TE's own buffers (no copy). Take a new one after TE may have
reassigned them (an in-place swizzle or re-quantisation reassigns attributes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from te_compat.errors import StorageNotFoundError, UnsupportedTensorError
from te_compat.probe import (
    class_path,
    is_torch_tensor,
    resolve,
    storage_attr,
    storage_field,
    storage_reader,
    tensor_kind,
)
from te_compat.table import TensorKind

if TYPE_CHECKING:
    import torch


def _need(obj: object, value: Any, name: str) -> Any:
    if value is not None:
        return value
    res = resolve(type(obj), name)
    attrs = " or ".join(repr(a) for a in res.candidates) or "(none in this release)"
    raise StorageNotFoundError(
        f"{class_path(type(obj))} holds no {name} (attribute {attrs} is None or absent; "
        f"TE {res.release}, {res.kind} row {res.row.span if res.row else 'newest'})"
    )


def _expect_kind(obj: object, expected: tuple[TensorKind, ...], what: str) -> TensorKind:
    kind = tensor_kind(obj)
    if kind not in expected:
        raise UnsupportedTensorError(
            f"{what} expects a TE {' or '.join(k.value for k in expected)} tensor; "
            f"found {class_path(type(obj))} (kind {kind})"
        )
    return kind


def _logical_shape(obj: object, *fallbacks: torch.Tensor | None) -> tuple[int, ...]:
    shape = getattr(obj, "shape", None)
    if isinstance(shape, tuple):  # torch.Size is a tuple of ints
        return tuple(shape)
    if shape is not None and not callable(shape):
        return tuple(int(d) for d in shape)
    for t in fallbacks:
        if t is not None:
            return tuple(int(d) for d in t.shape)
    raise StorageNotFoundError(f"{class_path(type(obj))}: no shape and no data to take it from")


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
    amax_rowwise: torch.Tensor | None = None  # NVFP4 groups: fp32 [num_tensors] ("amax")
    amax_columnwise: torch.Tensor | None = None  # NVFP4 groups: fp32 [num_tensors] ("columnwise_amax")

    def need(self, name: str) -> Any:
        return _need(self.owner, getattr(self, name), name)


def storage_values(obj: object, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Storage values of ``obj`` by logical name (default: all its kind has), without building a
    snapshot: one C-level read when the object holds them itself (a TE tensor or Parameter
    does), else name by name with the ``.data`` fallback. For hot paths over many experts; a
    name the release lacks is absent from the result."""
    reader = storage_reader(obj, names)
    try:
        return dict(zip(reader.names, reader.read(obj), strict=True))
    except AttributeError:
        return {name: storage_field(obj, name) for name in reader.names}


def _tensor(obj: object, values: dict[str, Any], name: str) -> torch.Tensor | None:
    """``values[name]``, which must be a tensor or None (what storage_attr promises)."""
    value = values.get(name)
    if value is None or is_torch_tensor(type(value)):
        return value
    raise UnsupportedTensorError(
        f"{name!r} of {class_path(type(obj))} is expected to be a torch.Tensor or None; found {type(value).__name__}"
    )


def _swizzled_flag(obj: object) -> bool:
    flag = storage_field(obj, "scales_swizzled")
    return bool(flag) if flag is not None else False


def mxfp8_storage(param: object) -> MXFP8Storage:
    """Snapshot of an MXFP8 tensor or Parameter. Raises if it holds neither usage."""
    _expect_kind(param, (TensorKind.MXFP8,), "mxfp8_storage")
    values = storage_values(param)
    row = _tensor(param, values, "rowwise_data")
    col = _tensor(param, values, "columnwise_data")
    if row is None and col is None:
        _need(param, None, "rowwise_data")
    return MXFP8Storage(
        owner=param,
        shape=_logical_shape(param, row, col),
        rowwise_data=row,
        rowwise_scale_inv=_tensor(param, values, "rowwise_scale_inv"),
        columnwise_data=col,
        columnwise_scale_inv=_tensor(param, values, "columnwise_scale_inv"),
        scales_swizzled=bool(values.get("scales_swizzled")),
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
        amax_rowwise=storage_attr(param, "amax_rowwise"),
        amax_columnwise=storage_attr(param, "amax_columnwise"),
    )


# --- NVFP4 -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NVFP4Storage:
    """The buffers of one NVFP4 tensor (TE 2.8+), as TE's source shapes them (checked in every
    release 2.8-2.20.2: NVFP4Quantizer.get_scale_shape, get_columnwise_shape and
    convert_shape_for_fp4 in pytorch/tensor/nvfp4_tensor.py are the same in all of them).

    With ``M = prod(shape[:-1])`` and ``K = shape[-1]``:

    - ``rowwise_data``: uint8 ``shape[:-1] + [K/2]``, two FP4 (E2M1) values a byte;
    - ``rowwise_scale_inv``: uint8 E4M3 bytes ``[roundup(M,128), roundup(ceil(K/16),4)]``, one per
      16 values of a row; TE leaves the padding uninitialised;
    - ``columnwise_data``: uint8 ``[K, M/2]``, stored already TRANSPOSED (TE's make_empty passes
      the 2-D shape through get_columnwise_shape: ``[K, M]``, then halves the last dim);
    - ``columnwise_scale_inv``: uint8 ``[roundup(K,128), roundup(ceil(M/16),4)]`` (transposed
      too, unlike MXFP8's ``[M/32, K]`` columnwise scales);
    - ``amax_rowwise`` / ``amax_columnwise``: fp32 ``[1]`` (per-tensor); ``amax_rowwise`` is
      ``[M]`` when ``row_scaled_nvfp4`` (2.19+'s inner_tensor_specs says so).

    The flags are None where the release lacks them: ``scales_swizzled`` 2.12+ (False before),
    ``row_scaled_nvfp4`` 2.16+, ``nvfp4_use_4over6`` and ``nvfp4_e4m3_max`` 2.17+
    (storage/nvfp4_tensor_storage.py's constructor; matrix/records).
    """

    owner: object
    shape: tuple[int, ...]  # logical, unpacked: [..., K]
    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    amax_rowwise: torch.Tensor | None
    amax_columnwise: torch.Tensor | None
    scales_swizzled: bool  # TE 2.12+: scales already in GEMM layout; always False before
    row_scaled_nvfp4: bool | None  # TE 2.16+
    nvfp4_e4m3_max: int | None  # TE 2.17+
    nvfp4_use_4over6: bool | None  # TE 2.17+

    def need(self, name: str) -> Any:
        """The named buffer or flag, or an error naming the attribute, class and TE release."""
        return _need(self.owner, getattr(self, name), name)


def _tensor_shape(obj: object) -> tuple[int, ...] | None:
    """The logical shape of a TE tensor (a storage-only object has none)."""
    shape = getattr(obj, "shape", None)
    if shape is None or callable(shape):
        return None
    return tuple(int(d) for d in shape)


def _nvfp4_shape(obj: object, row: torch.Tensor | None, col: torch.Tensor | None) -> tuple[int, ...]:
    """TE's NVFP4 size(): rowwise bytes [..., K/2] -> [..., K]; columnwise [K, M/2] -> [M, K]."""
    shape = _tensor_shape(obj)
    if shape is not None:
        return shape
    if row is not None:
        dims = tuple(int(d) for d in row.shape)
        return (*dims[:-1], dims[-1] * 2)
    if col is not None:
        dims = tuple(int(d) for d in col.shape)
        return (*dims[1:-1], dims[-1] * 2, dims[0])
    raise StorageNotFoundError(f"{class_path(type(obj))}: no shape and no data to take it from")


def _optional_flag(obj: object, name: str, kind: type) -> Any:
    value = storage_field(obj, name)
    return None if value is None else kind(value)


def nvfp4_storage(param: object) -> NVFP4Storage:
    """Snapshot of an NVFP4 tensor, Parameter, ``.data`` or storage. Raises if it holds neither
    direction."""
    _expect_kind(param, (TensorKind.NVFP4,), "nvfp4_storage")
    row = storage_attr(param, "rowwise_data")
    col = storage_attr(param, "columnwise_data")
    if row is None and col is None:
        _need(param, None, "rowwise_data")
    return NVFP4Storage(
        owner=param,
        shape=_nvfp4_shape(param, row, col),
        rowwise_data=row,
        rowwise_scale_inv=storage_attr(param, "rowwise_scale_inv"),
        columnwise_data=col,
        columnwise_scale_inv=storage_attr(param, "columnwise_scale_inv"),
        amax_rowwise=storage_attr(param, "amax_rowwise"),
        amax_columnwise=storage_attr(param, "amax_columnwise"),
        scales_swizzled=_swizzled_flag(param),
        row_scaled_nvfp4=_optional_flag(param, "row_scaled_nvfp4", bool),
        nvfp4_e4m3_max=_optional_flag(param, "nvfp4_e4m3_max", int),
        nvfp4_use_4over6=_optional_flag(param, "nvfp4_use_4over6", bool),
    )


# --- Float8 blockwise --------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockwiseStorage:
    """The buffers of one Float8 blockwise tensor (TE 2.3+), as Float8BlockQuantizer shapes them
    (pytorch/tensor/float8_blockwise_tensor.py: get_scale_shape, get_columnwise_shape,
    make_empty / inner_tensor_specs; checked 2.3.0-2.20.2). Blocks are 128 long; with
    ``M = prod(shape[:-1])``, ``K = shape[-1]``, ``c(x) = ceil(x/128)``, ``r4`` = round up to 4:

    - payloads uint8 (FP8): rowwise ``shape``; columnwise TRANSPOSED ``[K, *shape[:-1]]``;
    - scales fp32: 2-D (128x128) rowwise ``[c(M), r4(c(K))]``, columnwise ``[c(K), r4(c(M))]``;
      1-D (1x128) rowwise ``[c(K), r4(M)]`` (already transposed for GEMM), columnwise
      ``[c(M), r4(K)]``.
    - TE 2.5-2.11 only: ``data_format`` ``"GEMM_READY"`` (as above) or ``"COMPACT"`` (the
      quantizer's all_gather_usage): with 1-D scaling, COMPACT keeps columnwise data
      untransposed ``shape`` and scales unpadded (rowwise ``[M, c(K)]``, columnwise ``[c(M), K]``).
      ``columnwise_transposed`` says which; ``data_format`` is None outside 2.5-2.11.
    """

    owner: object
    shape: tuple[int, ...]
    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    is_2d_scaled: bool  # 128x128 blocks (True) or 1x128 (False)
    data_format: str | None  # TE 2.5-2.11: "GEMM_READY" or "COMPACT"
    columnwise_transposed: bool  # columnwise data is [K, M] (False only for 2.5-2.11 COMPACT 1-D)

    def need(self, name: str) -> Any:
        """The named buffer, or an error naming the attribute, class and TE release."""
        return _need(self.owner, getattr(self, name), name)


def _format_name(value: Any) -> str | None:
    """A tex.Float8BlockScaleTensorFormat (a pybind11 enum) as its member name."""
    if value is None:
        return None
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value).rsplit(".", 1)[-1]


def _blockwise_shape(
    obj: object, row: torch.Tensor | None, col: torch.Tensor | None, transposed: bool
) -> tuple[int, ...]:
    shape = _tensor_shape(obj)
    if shape is not None:
        return shape
    if row is not None:
        return tuple(int(d) for d in row.shape)
    if col is not None:
        dims = tuple(int(d) for d in col.shape)
        return (*dims[1:], dims[0]) if transposed else dims
    raise StorageNotFoundError(f"{class_path(type(obj))}: no shape and no data to take it from")


def blockwise_storage(param: object) -> BlockwiseStorage:
    """Snapshot of a Float8 blockwise tensor, Parameter, ``.data`` or storage (TE 2.3+)."""
    _expect_kind(param, (TensorKind.FLOAT8_BLOCKWISE,), "blockwise_storage")
    row = storage_attr(param, "rowwise_data")
    col = storage_attr(param, "columnwise_data")
    if row is None and col is None:
        _need(param, None, "rowwise_data")
    is_2d = bool(_need(param, storage_field(param, "is_2d_scaled"), "is_2d_scaled"))
    data_format = _format_name(storage_field(param, "data_format"))
    transposed = not (data_format == "COMPACT" and not is_2d)
    return BlockwiseStorage(
        owner=param,
        shape=_blockwise_shape(param, row, col, transposed),
        rowwise_data=row,
        rowwise_scale_inv=storage_attr(param, "rowwise_scale_inv"),
        columnwise_data=col,
        columnwise_scale_inv=storage_attr(param, "columnwise_scale_inv"),
        is_2d_scaled=is_2d,
        data_format=data_format,
        columnwise_transposed=transposed,
    )


# --- Hybrid (TE 2.19+) -------------------------------------------------------------------------


@dataclass(frozen=True)
class HybridStorage:
    """The two sub-storages of a HybridQuantizedTensor (TE 2.19+, experimental; PR 2817).

    pytorch/tensor/hybrid_tensor.py: HybridQuantizer pins its rowwise sub-quantizer to rowwise
    usage only and its columnwise one to columnwise only, so ``rowwise`` holds only rowwise
    buffers and ``columnwise`` only columnwise ones; either may be None (that direction not
    needed) and they may be of different kinds (MXFP8, NVFP4, blockwise, Float8, IDENTITY for
    high-precision data, or a custom recipe's). Read each with the snapshot of its kind
    (``mxfp8_storage``, ``nvfp4_storage``, ...).
    """

    owner: object
    rowwise: object | None
    columnwise: object | None
    rowwise_kind: TensorKind | None
    columnwise_kind: TensorKind | None

    def need(self, name: str) -> Any:
        """The named sub-storage, or an error naming the attribute, class and TE release."""
        return _need(self.owner, getattr(self, name), f"{name}_storage")


def hybrid_storage(param: object) -> HybridStorage:
    """Snapshot of a HybridQuantizedTensor, Parameter, ``.data`` or storage (TE 2.19+)."""
    _expect_kind(param, (TensorKind.HYBRID,), "hybrid_storage")
    row = storage_field(param, "rowwise_storage")
    col = storage_field(param, "columnwise_storage")
    if row is None and col is None:
        _need(param, None, "rowwise_storage")
    return HybridStorage(
        owner=param,
        rowwise=row,
        columnwise=col,
        rowwise_kind=tensor_kind(row) if row is not None else None,
        columnwise_kind=tensor_kind(col) if col is not None else None,
    )
