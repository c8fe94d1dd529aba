"""Typed snapshots of a TE tensor's storage: the buffers, as they are now, by logical name.

A snapshot holds references to TE's own buffers (no copy). Take a new one after TE may have
reassigned them (an in-place swizzle or re-quantisation reassigns attributes).

Every snapshot is read the same way: one :func:`storage_values` call for all of the object's
storage, then each value checked against the type TE stores there (a tensor, a bool flag, an int
count) as it is taken: a value of another type is a :class:`StorageValueError`, never coerced
(``bool("False")`` is True). A shape comes from TE's own ``shape`` where the object has one, and
from its first payload otherwise (:func:`_logical_shape`).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, ClassVar, cast

from te_compat.errors import (
    StorageNotFoundError,
    StorageValueError,
    UnknownStorageNameError,
    UnsupportedTensorError,
    describe,
)
from te_compat.geometry import block_geometry
from te_compat.probe import (
    class_path,
    is_torch_tensor,
    resolve,
    storage_field,
    storage_reader,
    tensor_kind,
)
from te_compat.table import TensorKind, name_text, quantizer_flag_rows

if TYPE_CHECKING:
    import torch


def storage_values(obj: object, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Storage values of ``obj`` by logical name (default: all its kind has), without building a
    snapshot: one C-level read when the object holds them itself (a TE tensor or Parameter
    does), else name by name with the ``.data`` fallback. For hot paths over many experts; a
    name the release lacks is absent from the result."""
    reader = storage_reader(obj, names)
    try:
        return dict(zip(reader.names, reader.read(obj), strict=True))
    except AttributeError:  # StorageReader's contract: an attribute kept only on .data
        return {name: storage_field(obj, name) for name in reader.names}


def _attributes(obj: object, name: str) -> tuple[str, str]:
    """(the TE attribute(s) that hold ``name`` on ``obj``, the release and row that say so): what
    every error about a storage value names."""
    res = resolve(type(obj), name)
    attrs = " or ".join(repr(a) for a in res.candidates) or "(none in this release)"
    return attrs, f"TE {res.release}, {res.kind} row {res.row.span if res.row else 'newest'}"


def _not_found(obj: object, name: str) -> StorageNotFoundError:
    attrs, where = _attributes(obj, name)
    return StorageNotFoundError(
        f"{class_path(type(obj))} holds no {name} (attribute {attrs} is None or absent; {where})"
    )


@dataclass(frozen=True, repr=False)
class StorageSnapshot:
    """What every snapshot has: the object read (``owner``) and :meth:`need`."""

    owner: object
    # field -> the logical storage name it holds, where the two differ (hybrid's directions)
    _storage_names: ClassVar[dict[str, str]] = {}

    def __repr__(self) -> str:
        """Class, shapes, dtypes, devices and flags; never TE's own repr of a tensor (TE's
        ``MXFP8Tensor.__repr__`` dequantizes the whole tensor)."""
        parts = ", ".join(f"{f.name}={brief(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({parts})"

    def need(self, name: str) -> Any:
        """The named field, or StorageNotFoundError naming the attribute, class and TE release."""
        name = name_text(name, "name")  # a StorageName or a plain string
        if name not in self.__dataclass_fields__:
            known = ", ".join(f.name for f in fields(self))
            raise UnknownStorageNameError(f"{type(self).__name__} has no field {name!r}; expected one of {known}")
        value = getattr(self, name)
        if value is None:
            raise _not_found(self.owner, self._storage_names.get(name, name))
        return value


def brief(value: object) -> str:
    """``value`` for a repr, without calling a tensor's own repr or str: a tensor (TE's or
    torch's) as its class, dtype, shape and device; a sequence of them by count; an object of
    another class by name; plain values (numbers, flags, strings, shapes) as they are."""
    if is_torch_tensor(type(value)):
        t: Any = value
        name = "" if type(value).__module__.startswith("torch") else f"{type(value).__name__} "
        return f"{name}{t.dtype}{list(t.shape)} {t.device}"
    if isinstance(value, (tuple, list)) and value and not all(isinstance(v, (int, float, str)) for v in value):
        kinds = sorted({brief(v) if not is_torch_tensor(type(v)) else type(v).__name__ for v in value})
        return f"{len(value)} x {' | '.join(kinds)}"
    if value is None or isinstance(value, (bool, int, float, str, tuple, list, Enum)):
        return repr(value)
    return f"<{type(value).__name__}>"


def _is_tensor(value: object) -> bool:
    return is_torch_tensor(type(value))


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


StorageRead = Callable[[object], Mapping[str, Any]]
"""How a snapshot reads an object's storage values by logical name: :func:`storage_values` unless
a caller passes its own (one that records what it read, so it can later check exactly that)."""


class _Values:
    """One object's storage, read once, each value checked as it is taken (see the module doc)."""

    def __init__(self, obj: object, kind: TensorKind, caller: str, read: StorageRead | None = None) -> None:
        if read is not None and not callable(read):
            raise TypeError(
                f"{caller}: read: expected a callable (obj -> storage values by name) or None; found {describe(read)}"
            )
        found = tensor_kind(obj)
        if found is not kind:
            raise UnsupportedTensorError(
                f"{caller} expects a TE {kind.value} tensor; found {class_path(type(obj))} (kind {found})"
            )
        self.obj = obj
        self.values = (read or storage_values)(obj)

    def raw(self, name: str) -> Any:
        """The value as TE stores it (None where the release has no such storage)."""
        return self.values.get(name)

    def tensor(self, name: str) -> torch.Tensor | None:
        return cast("torch.Tensor | None", self._typed(name, _is_tensor, "a torch.Tensor or None"))

    def flag(self, name: str) -> bool | None:
        return cast("bool | None", self._typed(name, _is_bool, "a bool (TE stores True or False)"))

    def count(self, name: str) -> int | None:
        return cast("int | None", self._typed(name, _is_int, "an int"))

    def needed(self, value: Any, name: str) -> Any:
        if value is None:
            raise _not_found(self.obj, name)
        return value

    def payloads(self, *names: str) -> list[torch.Tensor | None]:
        """The payload tensors ``names``; at least one of them must be there."""
        found = [self.tensor(name) for name in names]
        if all(t is None for t in found):
            raise _not_found(self.obj, names[0])
        return found

    def shapes(self, name: str) -> tuple[tuple[int, ...], ...]:
        """TE's list of per-tensor shapes as tuples of ints, in C-level passes (a group holds
        hundreds); raises where the group has none, or anything but whole numbers."""
        value = self.needed(self.raw(name), name)
        try:
            shapes = list(value)
            if set(map(type, shapes)) <= {tuple, list} and set(map(type, chain.from_iterable(shapes))) == {int}:
                return tuple(map(tuple, shapes))
            return tuple(map(tuple, map(map, repeat(operator.index), shapes)))
        except TypeError:
            raise self._refused(name, value, "a list of shapes, each a sequence of ints") from None

    def offsets(self, name: str) -> tuple[int, ...] | None:
        """TE's byte offsets (a list, or a tensor) as ints; None where the release keeps none."""
        value = self.raw(name)
        if value is None:
            return None
        try:
            return tuple(map(operator.index, value.tolist() if hasattr(value, "tolist") else value))
        except TypeError:
            raise self._refused(name, value, "a sequence of ints or an integer tensor") from None

    def _typed(self, name: str, accepts: Callable[[object], bool], expected: str) -> Any:
        value = self.values.get(name)
        if value is None or accepts(value):
            return value
        raise self._refused(name, value, expected)

    def _refused(self, name: str, value: object, expected: str) -> StorageValueError:
        attrs, where = _attributes(self.obj, name)
        return StorageValueError(
            f"{class_path(type(self.obj))}: attribute {attrs} (storage {name!r}; {where}) is expected to be "
            f"{expected}; found {describe(value)}"
        )


def _logical_shape(obj: object, payloads: list[tuple[torch.Tensor | None, bool]], packed: int = 1) -> tuple[int, ...]:
    """The logical shape: TE's own ``shape`` where the object has one (a storage-only object has
    none), else the first payload present, ``(tensor, stored transposed)``: its last dim holds
    ``packed`` values an element, and a transposed payload keeps the last logical dim first."""
    shape = getattr(obj, "shape", None)
    if shape is not None and not callable(shape):
        return tuple(int(d) for d in shape)
    for payload, transposed in payloads:
        if payload is not None:
            dims = [int(d) for d in payload.shape]
            dims[-1] *= packed
            return (*dims[1:], dims[0]) if transposed else tuple(dims)
    raise StorageNotFoundError(f"{class_path(type(obj))}: no shape and no data to take it from")


@dataclass(frozen=True, repr=False)
class MXFP8Storage(StorageSnapshot):
    """The buffers of one MXFP8 tensor. Payloads are uint8 ``[M, K]`` (columnwise too, not
    transposed); scales are uint8 and padded by TE (see ``docs``/the layout spec)."""

    shape: tuple[int, ...]
    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    scales_swizzled: bool  # TE 2.12+: scales already in GEMM layout; always False before
    # TE 2.19+ (PR 2634): quantized in 32x32 blocks, as its quantizer's with_2d_quantization says;
    # None where the release has no such flag or the tensor no quantizer. The scale layout is the
    # 1x32 one either way: each block's scale is written at every 1x32 position it covers.
    quantized_2d: bool | None = None

    def scale_matrix(self, direction: str = "rowwise") -> torch.Tensor:
        """``direction``'s scale matrix as a GEMM reads it (:func:`scale_matrix`)."""
        return _matrix(self, TensorKind.MXFP8, direction)


@dataclass(frozen=True, repr=False)
class Float8Storage(StorageSnapshot):
    """The buffers of one Float8 (per-tensor scaled) tensor."""

    shape: tuple[int, ...]
    data: torch.Tensor | None
    transpose: torch.Tensor | None  # shape [K] + shape[:-1], when TE cached it
    scale_inv: torch.Tensor | None  # fp32 [1]


@dataclass(frozen=True, repr=False)
class GroupedStorage(StorageSnapshot):
    """The buffers of one GroupedTensor (all experts in flat 1-D buffers)."""

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
    quantized_2d: bool | None = None  # MXFP8 groups, TE 2.19+: as MXFP8Storage.quantized_2d, from the group's quantizer


def _positive(name: str, value: object) -> int:
    """``value`` as an int >= 1 (numpy integers too; a bool is no size)."""
    if type(value) is int and value > 0:  # the common case, decided without the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= 1; found {describe(value)}")
    if int(value) <= 0:
        raise ValueError(f"{name}: expected an int >= 1; found {int(value)}")
    return int(value)


def scale_matrix(
    buffer: torch.Tensor, rows: int, columns: int, *, kind: TensorKind = TensorKind.MXFP8, direction: str = "rowwise"
) -> torch.Tensor:
    """The scale matrix of one direction of a ``[rows, columns]`` weight of ``kind`` (MXFP8,
    NVFP4) as a GEMM reads it, ``[R, C]``: rowwise ``[rows, columns/block]``, columnwise
    ``[columns, rows/block]``. A uint8 view of TE's padded buffer of logical scales (no copy):
    TE's padding cut off, transposed where TE keeps the buffer the other way round (MXFP8
    columnwise; te_compat.geometry). Not for scales TE keeps in the GEMM layout already."""
    d = block_geometry(kind).direction(direction)
    rows, columns = _positive("rows", rows), _positive("columns", columns)
    scaled = ("columns", columns) if d.rowwise else ("rows", rows)  # the dimension a scale runs along
    if scaled[1] % d.block:
        raise ValueError(
            f"{scaled[0]}: expected a multiple of {d.block} ({kind.value} has one {direction} scale per {d.block} "
            f"values); found {scaled[1]}"
        )
    if not is_torch_tensor(type(buffer)):
        raise TypeError(f"buffer: expected a torch.Tensor scale buffer; found {describe(buffer)}")
    r, c = d.buffer_matrix(rows, columns)
    if buffer.dim() < 2 or buffer.shape[-2] < r or buffer.shape[-1] < c:
        raise ValueError(
            f"{direction} scales: expected a buffer of at least [{r}, {c}] (TE pads it); found {tuple(buffer.shape)}"
        )
    if buffer.element_size() != 1:
        raise ValueError(f"{direction} scales: expected 1-byte scales; found dtype {buffer.dtype}")
    import torch

    cut = (buffer if buffer.dtype == torch.uint8 else buffer.view(torch.uint8))[..., :r, :c]
    return d.orient(cut)


def grouped_scale_buffers(
    flat: torch.Tensor,
    experts: int,
    rows: int,
    columns: int,
    *,
    kind: TensorKind = TensorKind.MXFP8,
    direction: str = "rowwise",
    name: str | None = None,
) -> torch.Tensor:
    """``[E, R', C']`` (uint8, no copy): a GroupedTensor's flat scale buffer of ``experts``
    ``[rows, columns]`` weights of ``kind`` viewed as each expert's padded buffer, in TE's
    orientation (``DirectionGeometry.scale_buffer``), expert-major at the group's offsets
    (``DirectionGeometry.grouped_offsets``). ``DirectionGeometry.logical_matrices`` gives the
    matrices a GEMM reads over it. ``name`` (default: the kind and direction) starts every error."""
    d = block_geometry(kind).direction(direction)
    what = name if name is not None else f"{kind.value} grouped {direction} scales"
    experts = _positive("experts", experts)
    rows, columns = _positive("rows", rows), _positive("columns", columns)
    if not is_torch_tensor(type(flat)):
        raise TypeError(f"{what}: expected a torch.Tensor scale buffer; found {describe(flat)}")
    if flat.element_size() != 1:
        raise ValueError(f"{what}: expected 1-byte scales; found dtype {flat.dtype} of shape {tuple(flat.shape)}")
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError(
            f"{what}: expected a flat contiguous buffer; found shape {tuple(flat.shape)} strides {flat.stride()}"
        )
    r, c = d.scale_buffer(rows, columns)
    if flat.numel() != experts * r * c:
        raise ValueError(
            f"{what}: expected {experts} experts x [{r}, {c}] = {experts * r * c} bytes; found {flat.numel()}"
        )
    import torch

    return (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).view(experts, r, c)


def _matrix(snapshot: MXFP8Storage | NVFP4Storage, kind: TensorKind, direction: str) -> torch.Tensor:
    if snapshot.scales_swizzled:
        raise ValueError(
            f"{kind.value} {direction} scales: TE keeps them in the GEMM layout already, so there is no logical "
            "matrix to view (mok.logical_scales reads them back)"
        )
    d = block_geometry(kind).direction(direction)
    shape = snapshot.shape
    return scale_matrix(snapshot.need(str(d.scales)), math.prod(shape[:-1]), shape[-1], kind=kind, direction=direction)


def _payloads(v: _Values, first: str, second: str, transposed: bool, packed: int = 1) -> dict[str, Any]:
    """What every snapshot starts with: the object, its two payloads (at least one there) and its
    logical shape, from TE's own or from the payloads (``transposed``: TE keeps the second one
    the other way round; ``packed`` values an element of the last dim)."""
    a, b = v.payloads(first, second)
    shape = _logical_shape(v.obj, [(a, False), (b, transposed)], packed)
    return {"owner": v.obj, "shape": shape, first: a, second: b}


def _scales(v: _Values) -> dict[str, Any]:
    return {
        "rowwise_scale_inv": v.tensor("rowwise_scale_inv"),
        "columnwise_scale_inv": v.tensor("columnwise_scale_inv"),
    }


def mxfp8_storage(param: object) -> MXFP8Storage:
    """Snapshot of an MXFP8 tensor or Parameter. Raises if it holds neither usage."""
    v = _Values(param, TensorKind.MXFP8, "mxfp8_storage")
    return MXFP8Storage(
        **_payloads(v, "rowwise_data", "columnwise_data", False),
        **_scales(v),
        scales_swizzled=bool(v.flag("scales_swizzled")),  # None: a release before the flag
        quantized_2d=_quantizer_flag(v, TensorKind.MXFP8, "quantized_2d"),
    )


_LINEAGES: dict[type, frozenset[str]] = {}  # per quantizer class: a class's bases do not change


def _lineage(cls: type) -> frozenset[str]:
    """The class paths of ``cls`` and its bases (what a flag row's quantizer is matched against)."""
    found = _LINEAGES.get(cls)
    if found is None:
        found = _LINEAGES[cls] = frozenset(class_path(c) for c in cls.__mro__)
    return found


def _quantizer_flag(v: _Values, kind: TensorKind, field: str) -> bool | None:
    """A quantizer flag of te_compat's quantizer flag rows, read from the tensor's quantizer (TE
    keeps it there, not on the tensor): None where the release has no such row or the tensor no
    quantizer; a value that is not a bool is a StorageValueError, never coerced."""
    quantizer = v.raw("quantizer")
    if quantizer is None:
        return None
    release = resolve(type(v.obj), "quantizer").release
    lineage = _lineage(type(quantizer))
    for row in quantizer_flag_rows(kind, release):
        if row.storage != field or row.quantizer not in lineage:  # another quantizer's flag of that name
            continue
        value = getattr(quantizer, row.attribute, None)
        if value is None or isinstance(value, bool):
            return value
        raise StorageValueError(
            f"{class_path(type(quantizer))}.{row.attribute} (the quantizer of a {class_path(type(v.obj))}; "
            f"TE {row.span}) is expected to be a bool (TE stores True or False); found {describe(value)}"
        )
    return None


def float8_storage(param: object) -> Float8Storage:
    """Snapshot of a Float8 tensor or Parameter (1.x ``_fp8_attrs`` and 2.x layouts)."""
    v = _Values(param, TensorKind.FLOAT8, "float8_storage")
    return Float8Storage(**_payloads(v, "data", "transpose", True), scale_inv=v.tensor("scale_inv"))


def _group_swizzled(v: _Values, members: tuple[object, ...] | None, read: StorageRead | None) -> bool:
    """The group's flag (2.14+); 2.13 keeps none on the group, and its MXFP8 members (2.12+)
    carry their own."""
    flag = v.flag("scales_swizzled")
    if flag is not None or v.raw("quantizer") is None or not members:
        return bool(flag)
    mxfp8 = [m for m in members if tensor_kind(m) is TensorKind.MXFP8]
    return any(bool(_Values(m, TensorKind.MXFP8, "grouped_storage", read).flag("scales_swizzled")) for m in mxfp8)


def grouped_storage(param: object, *, read: StorageRead | None = None) -> GroupedStorage:
    """Snapshot of a GroupedTensor (2.13 plain class, 2.14+ tensor/Parameter). ``read``: how the
    group's storage (and, in TE 2.13, where the group keeps no swizzled flag, each member's) is
    read; default :func:`storage_values`."""
    v = _Values(param, TensorKind.GROUPED, "grouped_storage", read)
    row, col = v.payloads("rowwise_data", "columnwise_data")
    members = v.raw("quantized_tensors")
    member_tuple = tuple(members) if members is not None else None
    return GroupedStorage(
        owner=param,
        num_tensors=v.needed(v.count("num_tensors"), "num_tensors"),
        tensor_shapes=v.shapes("tensor_shapes"),
        rowwise_data=row,
        columnwise_data=col,
        rowwise_scale_inv=v.tensor("rowwise_scale_inv"),
        columnwise_scale_inv=v.tensor("columnwise_scale_inv"),
        rowwise_scale_inv_offsets=v.offsets("rowwise_scale_inv_offsets"),
        columnwise_scale_inv_offsets=v.offsets("columnwise_scale_inv_offsets"),
        members=member_tuple,
        quantized=v.raw("quantizer") is not None,
        scales_swizzled=_group_swizzled(v, member_tuple, read),
        amax_rowwise=v.tensor("amax_rowwise"),
        amax_columnwise=v.tensor("amax_columnwise"),
        quantized_2d=_quantizer_flag(v, TensorKind.GROUPED, "quantized_2d"),
    )


# --- NVFP4 -------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class NVFP4Storage(StorageSnapshot):
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

    def scale_matrix(self, direction: str = "rowwise") -> torch.Tensor:
        """``direction``'s scale matrix as a GEMM reads it (:func:`scale_matrix`)."""
        return _matrix(self, TensorKind.NVFP4, direction)


def nvfp4_storage(param: object) -> NVFP4Storage:
    """Snapshot of an NVFP4 tensor, Parameter, ``.data`` or storage. Raises if it holds neither
    direction."""
    v = _Values(param, TensorKind.NVFP4, "nvfp4_storage")
    return NVFP4Storage(
        # TE's NVFP4 size(): rowwise bytes [..., K/2] -> [..., K]; columnwise [K, M/2] -> [M, K]
        **_payloads(v, "rowwise_data", "columnwise_data", True, packed=2),
        **_scales(v),
        amax_rowwise=v.tensor("amax_rowwise"),
        amax_columnwise=v.tensor("amax_columnwise"),
        scales_swizzled=bool(v.flag("scales_swizzled")),  # None: a release before the flag
        row_scaled_nvfp4=v.flag("row_scaled_nvfp4"),
        nvfp4_e4m3_max=v.count("nvfp4_e4m3_max"),
        nvfp4_use_4over6=v.flag("nvfp4_use_4over6"),
    )


# --- Float8 blockwise --------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class BlockwiseStorage(StorageSnapshot):
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

    shape: tuple[int, ...]
    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    is_2d_scaled: bool  # 128x128 blocks (True) or 1x128 (False)
    data_format: str | None  # TE 2.5-2.11: "GEMM_READY" or "COMPACT"
    columnwise_transposed: bool  # columnwise data is [K, M] (False only for 2.5-2.11 COMPACT 1-D)


def _format_name(value: Any) -> str | None:
    """A tex.Float8BlockScaleTensorFormat (a pybind11 enum) as its member name."""
    if value is None:
        return None
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value).rsplit(".", 1)[-1]


def blockwise_storage(param: object) -> BlockwiseStorage:
    """Snapshot of a Float8 blockwise tensor, Parameter, ``.data`` or storage (TE 2.3+)."""
    v = _Values(param, TensorKind.FLOAT8_BLOCKWISE, "blockwise_storage")
    is_2d: bool = v.needed(v.flag("is_2d_scaled"), "is_2d_scaled")
    data_format = _format_name(v.raw("data_format"))
    transposed = not (data_format == "COMPACT" and not is_2d)
    return BlockwiseStorage(
        **_payloads(v, "rowwise_data", "columnwise_data", transposed),
        **_scales(v),
        is_2d_scaled=is_2d,
        data_format=data_format,
        columnwise_transposed=transposed,
    )


# --- Hybrid (TE 2.19+) -------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class HybridStorage(StorageSnapshot):
    """The two sub-storages of a HybridQuantizedTensor (TE 2.19+, experimental; PR 2817).

    pytorch/tensor/hybrid_tensor.py: HybridQuantizer pins its rowwise sub-quantizer to rowwise
    usage only and its columnwise one to columnwise only, so ``rowwise`` holds only rowwise
    buffers and ``columnwise`` only columnwise ones; either may be None (that direction not
    needed) and they may be of different kinds (MXFP8, NVFP4, blockwise, Float8, IDENTITY for
    high-precision data, or a custom recipe's). Read each with the snapshot of its kind
    (``mxfp8_storage``, ``nvfp4_storage``, ...).
    """

    _storage_names: ClassVar[dict[str, str]] = {"rowwise": "rowwise_storage", "columnwise": "columnwise_storage"}

    rowwise: object | None
    columnwise: object | None
    rowwise_kind: TensorKind | None
    columnwise_kind: TensorKind | None


def hybrid_storage(param: object, *, read: StorageRead | None = None) -> HybridStorage:
    """Snapshot of a HybridQuantizedTensor, Parameter, ``.data`` or storage (TE 2.19+). ``read``:
    as for :func:`grouped_storage`."""
    v = _Values(param, TensorKind.HYBRID, "hybrid_storage", read)
    row, col = v.raw("rowwise_storage"), v.raw("columnwise_storage")
    if row is None and col is None:
        raise _not_found(param, "rowwise_storage")
    return HybridStorage(
        owner=param,
        rowwise=row,
        columnwise=col,
        rowwise_kind=tensor_kind(row) if row is not None else None,
        columnwise_kind=tensor_kind(col) if col is not None else None,
    )
