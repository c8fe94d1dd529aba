"""The steps of a view a caller may bring its own functions for, as Megatron's MOK weights module
lets its callers replace them (mok.weights passes them in as :class:`Seams`): reading a storage
attribute off any object, viewing a payload, viewing a grouped weight's scales, converting one
scale matrix, telling MXFP8 weights. Here are mok's own implementations of them, and the
composition over whatever a caller passed (:func:`compose_grouped`, :func:`compose_split`): each
function called as Megatron's module calls it, so a caller that replaced one sees every call,
every expert's scales still converted in one launch while the conversion is mok's own.

mok's own do what Megatron's do, and more where a caller would not notice: TE attribute names of
any release translated through te_compat's table, padded shapes (Megatron needs multiples of
128), TE's own GroupedTensor read through its flat buffers, and errors that say what was
expected and what was found. Where they are all mok's own and the weights are TE's, mok.weights
takes the one door (mok.door) instead.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from mok.checks import check_int, check_sequence, describe
from mok.errors import ExpertWeightError, LayoutError, RefreshError
from mok.formats import Format
from mok.read.blocks import BLOCKS
from mok.read.readers import GroupedReader, is_bf16_group
from mok.read.reading import Snapshot
from mok.swizzle import swizzle_mxfp8_scales, swizzle_mxfp8_scales_many
from mok.views import GroupedExpertWeights, SplitExpertWeights, check_sizes, ptr_table, same_device, storage_view
from te_compat import TensorKind, grouped_storage, known_storage_name, scale_matrix, storage_field, tensor_kind_or_none
from te_compat.geometry import MXFP8

MembersOf = Callable[[object], Any]  # a grouped weight's per-expert quantized tensors (Megatron's fp8_utils)


def te_kind(obj: object) -> TensorKind | None:
    """te_compat's kind of a TE class its table covers; None for plain tensors and other objects."""
    kind = tensor_kind_or_none(obj)
    return None if kind in (None, TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED) else kind


def _logical(name: str, kind: TensorKind) -> str | None:
    """te_compat's logical name of ``name`` for ``kind``: one of the kind's own attribute or logical
    names, or another kind's attribute naming storage this kind has too (a member's private scale
    name passed for its grouped parent); None for a name te_compat does not know for ``kind``."""
    own = known_storage_name(name, kind)
    if own is not None:
        return own
    other = known_storage_name(name)
    return None if other is None else known_storage_name(other, kind)


def _attribute(obj: object, name: str) -> Any:
    """Megatron's lookup: ``name``, then ``_name`` (a name given with its underscore only as
    given), on the object, then on its ``.data``; None when none holds a value."""
    candidates = (name,) if name.startswith("_") else (name, f"_{name}")
    for holder in (obj, getattr(obj, "data", None)):
        if holder is None:
            continue
        for candidate in candidates:
            value = getattr(holder, candidate, None)
            if value is not None:
                return value
    return None


def storage_attr(param: object, name: str) -> Any:
    """The storage object ``name`` of ``param`` (on it or on its ``.data``), never materialised,
    or None. On a TE tensor te_compat's table translates ``name`` (a TE attribute of any release,
    or a logical name) into the installed release's attribute; on any other object, Megatron's
    lookup (public name, then private, then both on ``.data``)."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str naming a storage attribute; found {describe(name)}")
    kind = te_kind(param)
    logical = None if kind is None else _logical(name, kind)
    if logical is not None:
        return storage_field(param, logical)
    return _attribute(param, name)


def payload_view(storage: torch.Tensor, shape: tuple[int, ...], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """mok.storage_view, except that a view in the storage's own dtype stays in autograd, as
    Megatron's ``Tensor.view`` does."""
    view = storage_view(storage, shape, dtype=dtype, name=name)
    if storage.requires_grad and storage.dtype == dtype:
        return storage.view(view.shape)
    return view


def convert_scale(
    logical_scale: torch.Tensor, *, rows: int, columns: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """TE's logical scales ``[E, rows, columns/32]`` (any strides) in the tcgen05 layout
    ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/32, 4)``;
    for aligned shapes Megatron's ``[E*rows/128, columns/128, 32, 16]``), into ``out`` when given."""
    rows, columns = check_sizes(rows=rows, columns=columns)
    if not isinstance(logical_scale, torch.Tensor) or logical_scale.dim() != 3:
        found = tuple(logical_scale.shape) if isinstance(logical_scale, torch.Tensor) else describe(logical_scale)
        raise LayoutError(f"logical_scale: expected a 3-D tensor [E, rows, columns/32]; found {found}")
    if columns % MXFP8.block:
        raise LayoutError(f"columns: expected a multiple of {MXFP8.block} (one scale per block); found {columns}")
    want = (logical_scale.shape[0], rows, columns // MXFP8.block)
    if tuple(logical_scale.shape) != want:
        raise LayoutError(
            f"logical_scale: expected shape {want} for rows={rows}, columns={columns}; "
            f"found {tuple(logical_scale.shape)}"
        )
    converted: torch.Tensor = swizzle_mxfp8_scales(logical_scale, out=out)
    return converted


# ------------------------------------------------------------------------------ a grouped weight's scales


def grouped_scales(
    param: object, member_attr: str, shape: tuple[int, int, int], name: str, members: MembersOf
) -> torch.Tensor:
    """``[E, a, b]`` view of a grouped weight's expert-major scale storage (no copy).

    ``member_attr`` names the rowwise or columnwise scales as a member's attribute (any release's,
    or the group's, or a logical name); ``shape`` is the logical scale shape, ``(E, rows,
    columns/32)`` rowwise or ``(E, rows/32, columns)`` columnwise. The weight's ``members``
    (Megatron's ``get_grouped_quantized_members``) must be E; a TE GroupedTensor's own flat
    buffer is then viewed with TE's per-expert padding skipped; any other weight's members must
    hold their scales packed expert-major in one storage."""
    found = members(param)
    te_group = te_kind(param) is TensorKind.GROUPED
    count = 0 if found is None else len(found)
    if (found is None and not te_group) or (found is not None and count != shape[0]):
        raise ExpertWeightError(  # Megatron's words: "MOK {name} expected E grouped members, got n"
            f"MOK {name} expected {shape[0]} grouped members, got {count} (members of {describe(param)})"
        )
    if te_group:  # its flat buffers, whether TE made its members or not
        return _te_grouped_scales(param, member_attr, shape, name)
    return _packed(list(found), member_attr, shape, name)


def _te_grouped_scales(param: object, member_attr: str, shape: tuple[int, int, int], name: str) -> torch.Tensor:
    gs = grouped_storage(param)
    if not gs.quantized:
        raise ExpertWeightError(f"{name}: expected a quantized (MXFP8) grouped parameter; found one with no quantizer")
    if gs.scales_swizzled:
        raise LayoutError(
            f"{name}: TE already holds these scales in the GEMM layout, so there is no logical matrix to view; "
            "_native_single_grouped_weight_view exposes (or copies) them as they are"
        )
    logical = _logical(member_attr, TensorKind.GROUPED)
    buffer: torch.Tensor | None = None if logical is None else storage_field(param, logical)
    if buffer is None or (buffer is not gs.rowwise_scale_inv and buffer is not gs.columnwise_scale_inv):
        what = "no such tensor" if buffer is None else "another tensor"
        raise ExpertWeightError(
            f"{name}: member_attr {member_attr!r} (logical {logical!r}) should name the rowwise or columnwise "
            f"scales of the grouped parameter; found {what}"
        )
    mxfp8 = BLOCKS[Format.MXFP8]
    direction = mxfp8.rowwise if buffer is gs.rowwise_scale_inv else mxfp8.columnwise
    rows, columns = _expert_shape(gs.tensor_shapes, name)
    want = (gs.num_tensors, *direction.buffer_matrix(rows, columns))
    if shape != want:
        raise LayoutError(
            f"{name}: expected the {direction.name} scale shape {want} of {gs.num_tensors} experts of shape "
            f"({rows}, {columns}); found {shape}"
        )
    # mok's reading of the group: TE's padding skipped, offsets and members' packing checked
    snapshot = GroupedReader(param, Format.MXFP8, (gs.num_tensors, rows, columns)).read()
    matrices = next((s.sources[0].logical for s in snapshot.directions if s.direction is direction), None)
    if matrices is None:
        raise ExpertWeightError(f"{name}: the grouped parameter holds no {direction.name} data")
    return matrices.transpose(1, 2) if direction.scales_transposed else matrices


def _expert_shape(shapes: Sequence[Sequence[int]], name: str) -> tuple[int, int]:
    """The one (rows, columns) every expert of a group has."""
    found = {tuple(s) for s in shapes}
    if len(found) != 1 or len(next(iter(found))) != 2:
        raise ExpertWeightError(f"{name}: expected experts of one 2-D shape; found {sorted(found)}")
    rows, columns = next(iter(found))
    return rows, columns


def _packed(members: list[Any], member_attr: str, shape: tuple[int, int, int], name: str) -> torch.Tensor:
    """Megatron's view: the members' scales, packed expert-major in one storage, as one tensor."""
    scales: list[Any] = [storage_attr(m, member_attr) for m in members]
    first, per_expert = scales[0], shape[1] * shape[2]
    for expert, scale in enumerate(scales):
        if not isinstance(scale, torch.Tensor):
            raise ExpertWeightError(
                f"MOK {name} member {expert} has no {member_attr}: expected a tensor; found {describe(scale)}"
            )
        packed = (
            tuple(scale.shape) == shape[1:]
            and scale.is_contiguous()
            and scale.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and scale.storage_offset() == first.storage_offset() + expert * per_expert
        )
        if not packed:
            raise ExpertWeightError(
                f"MOK {name} member {expert} scale is not packed expert-major: expected shape {shape[1:]} at "
                f"element {first.storage_offset() + expert * per_expert} of member 0's storage; found shape "
                f"{tuple(scale.shape)} at element {scale.storage_offset()}"
            )
    flat: torch.Tensor = first.as_strided((shape[0] * per_expert,), (1,), first.storage_offset())
    return flat.view(shape)


# --------------------------------------------------------------------- the composition over a caller's functions


class StorageNames(NamedTuple):
    """The storage attribute names a composition asks a caller's ``storage_attr`` for: the names
    the caller's module passes (Megatron's module passes TE's); mok's own ``storage_attr``
    translates them through te_compat's table."""

    rowwise_data: str
    columnwise_data: str
    rowwise_scales: str
    columnwise_scales: str

    def of(self, direction: str) -> str:
        """The payload name of ``direction`` ("rowwise" or "columnwise")."""
        return self.rowwise_data if direction == "rowwise" else self.columnwise_data


class Seams(NamedTuple):
    """The functions a caller brings for the steps of a view (mok.weights: Megatron's module's
    own names, looked up at each call), and the storage names they are asked for. ``own``: every
    function is mok's, so TE's weights may go through the pipeline instead."""

    names: StorageNames
    storage_attr: Callable[[object, str], Any]  # a storage attribute off any object, or None
    storage_view: Callable[..., Any]  # (storage, shape, *, dtype, name): a payload view
    grouped_scales: Callable[..., Any]  # (weight, member_attr, shape, *, name): [E, a, b] scales
    convert: Callable[..., Any]  # (logical [E, R, C], *, rows, columns, out=None): the layout
    is_mxfp8: Callable[[object], bool]
    is_grouped_mxfp8: Callable[[object], bool]
    own: bool


def is_mxfp8(obj: object) -> bool:
    """mok's test of MXFP8 weights where Megatron's is not there: a TE MXFP8 tensor, or an object
    te_compat does not know (its storage decides); no plain tensor or other TE kind."""
    kind = tensor_kind_or_none(obj)
    return kind is TensorKind.MXFP8 or (kind is None and not isinstance(obj, torch.Tensor))


def is_grouped_mxfp8(obj: object) -> bool:
    """The same for one grouped weight: a quantized TE GroupedTensor, or an object te_compat does
    not know."""
    kind = tensor_kind_or_none(obj)
    if kind is TensorKind.GROUPED:
        return not is_bf16_group(obj)
    return kind is None and not isinstance(obj, torch.Tensor)


def _storage(seams: Seams, obj: object, name: str, what: str) -> Any:
    value = seams.storage_attr(obj, name)
    if value is None:
        raise ExpertWeightError(f"{what}: expected {name} storage on the {type(obj).__name__}; found none")
    return value


def compose_grouped(weight: object, dims: tuple[int, int, int], seams: Seams, outs: Sequence[Any]) -> tuple[Any, ...]:
    """Megatron's grouped MXFP8 view over ``seams``: ``(row data, row scales, column data,
    column scales, True)``, the scales converted into ``outs`` (two buffers, or two Nones)."""
    experts, rows, columns = dims
    if not seams.is_grouped_mxfp8(weight):
        raise ExpertWeightError(
            f"grouped weight: expected native TE grouped MXFP8 parameters; found {describe(weight)}"
        )
    fp8 = torch.float8_e4m3fn
    row_data = seams.storage_view(
        _storage(seams, weight, seams.names.rowwise_data, "grouped weight"),
        dims,
        dtype=fp8,
        name="single-grouped MXFP8 rowwise",
    )
    col_data = seams.storage_view(
        _storage(seams, weight, seams.names.columnwise_data, "grouped weight"),
        dims,
        dtype=fp8,
        name="single-grouped MXFP8 columnwise",
    )
    row = seams.grouped_scales(
        weight, seams.names.rowwise_scales, (experts, rows, columns // MXFP8.block), name="single-grouped rowwise"
    )
    col = seams.grouped_scales(
        weight, seams.names.columnwise_scales, (experts, rows // MXFP8.block, columns), name="single-grouped columnwise"
    ).transpose(-2, -1)  # the [columns, rows/32] transpose: the dgrad GEMM reads [M, K] as [K, M]
    return (
        row_data,
        seams.convert(row, rows=rows, columns=columns, out=outs[0]),
        col_data,
        seams.convert(col, rows=columns, columns=rows, out=outs[1]),
        True,
    )


def _expert_storage(e: int, param: object, seams: Seams, names: Sequence[str]) -> dict[str, Any]:
    found = {name: seams.storage_attr(param, name) for name in names}
    missing = [name for name, value in found.items() if value is None]
    if missing:
        raise ExpertWeightError(
            f"expert {e}: expected MXFP8 storage {', '.join(names)} on the {type(param).__name__} "
            f"(shape {tuple(getattr(param, 'shape', ()))}); missing {', '.join(missing)}"
        )
    return found


def _logical_pair(
    e: int, storage: dict[str, Any], names: StorageNames, rows: int, columns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's scale matrices as the GEMMs read them, cut from TE's padded buffers (no copy)."""
    try:
        return (
            scale_matrix(storage[names.rowwise_scales], rows, columns),
            scale_matrix(storage[names.columnwise_scales], rows, columns, direction="columnwise"),
        )
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"expert {e}: {exc}") from exc


def compose_split(
    params: Sequence[object], rows: int, columns: int, seams: Seams, outs: tuple[Sequence[Any], Sequence[Any]] | None
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Megatron's split MXFP8 view over ``seams``: the row payloads, column payloads, row layouts
    and column layouts of every expert. A refresh (``outs``, the cached layout buffers) reads the
    scales again and converts them into ``outs``, expert by expert as Megatron does."""
    names = seams.names[2:] if outs is not None else tuple(seams.names)
    for e, param in enumerate(params):  # a refresh refuses what a new view refuses, first
        if not seams.is_mxfp8(param):
            raise ExpertWeightError(f"expert {e}: expected native TE MXFP8 storage; found {describe(param)}")
    storage = [_expert_storage(e, p, seams, names) for e, p in enumerate(params)]
    row_data: list[Any] = []
    col_data: list[Any] = []
    if outs is None:
        for e, found in enumerate(storage):
            for direction, payloads in (("rowwise", row_data), ("columnwise", col_data)):
                payloads.append(
                    seams.storage_view(
                        found[seams.names.of(direction)],
                        (rows, columns),
                        dtype=torch.float8_e4m3fn,
                        name=f"expert {e} MXFP8 {direction}",
                    )
                )
    logical = [_logical_pair(e, found, seams.names, rows, columns) for e, found in enumerate(storage)]
    row_scales, col_scales = _convert(logical, rows, columns, seams, outs)
    return row_data, col_data, row_scales, col_scales


def _convert(
    logical: Sequence[tuple[torch.Tensor, torch.Tensor]],
    rows: int,
    columns: int,
    seams: Seams,
    outs: tuple[Sequence[Any], Sequence[Any]] | None,
) -> tuple[list[Any], list[Any]]:
    """Every expert's two scale matrices in the layout: in one launch with mok's own conversion;
    a caller's, once per expert and direction (every rowwise matrix, then every columnwise one;
    a refresh expert by expert), as Megatron calls it."""
    if seams.own:
        matrices = [r for r, _ in logical] + [c for _, c in logical]
        converted = swizzle_mxfp8_scales_many(matrices, outs=None if outs is None else [*outs[0], *outs[1]])
        return converted[: len(logical)], converted[len(logical) :]
    convert = seams.convert
    if outs is None:
        return (
            [convert(r.unsqueeze(0), rows=rows, columns=columns) for r, _ in logical],
            [convert(c.unsqueeze(0), rows=columns, columns=rows) for _, c in logical],
        )
    for (r, c), row_out, col_out in zip(logical, *outs, strict=True):
        convert(r.unsqueeze(0), rows=rows, columns=columns, out=row_out)
        convert(c.unsqueeze(0), rows=columns, columns=rows, out=col_out)
    return list(outs[0]), list(outs[1])


def split_outputs(cached: object, experts: int) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """Megatron's refresh contract: any object with ``scale_tensors`` and
    ``transposed_scale_tensors``, one layout buffer per expert each."""
    row = getattr(cached, "scale_tensors", None)
    col = getattr(cached, "transposed_scale_tensors", None)
    if row is None or col is None:
        raise RefreshError(
            "cached_view: expected an earlier split view (a SplitRoutedWeight, or any object with scale_tensors "
            f"and transposed_scale_tensors: per-expert layout buffers); found {describe(cached)}"
            f"{_other_kind(cached, grouped=False)}"
        )
    row = check_sequence("cached_view.scale_tensors", row, "layout buffers", item_type=torch.Tensor)
    col = check_sequence("cached_view.transposed_scale_tensors", col, "layout buffers", item_type=torch.Tensor)
    if len(row) != experts or len(col) != experts:
        raise RefreshError(
            f"cached_view: expected {experts} rowwise and columnwise scale buffers, one per parameter; "
            f"found {len(row)} and {len(col)}"
        )
    return row, col


def grouped_outputs(cached: object) -> tuple[Any, Any]:
    """Items 1 and 3 of an earlier grouped view (Megatron's contract): its layout buffers."""
    if not isinstance(cached, Sequence) or len(cached) < 4:
        raise RefreshError(
            "cached_view: expected an earlier grouped view, the 5-tuple (row_data, row_scales, column_data, "
            f"column_scales, True); found {describe(cached)}{_other_kind(cached, grouped=True)}"
        )
    return cached[1], cached[3]


def _other_kind(cached: object, *, grouped: bool) -> str:
    """What a refusal of ``cached`` adds where it is a view of the other kind, or mok's own view
    where this module's result was expected."""
    if grouped and isinstance(cached, (SplitRoutedWeight, SplitExpertWeights)):
        return (
            ": the view is per expert and the weight is grouped (one [E, rows, columns] parameter); refresh a "
            "per-expert view with _native_split_weight_view, a grouped one with the 5-tuple this function returned"
        )
    if not grouped and isinstance(cached, (GroupedWeightTuple, GroupedExpertWeights)):
        return (
            ": the view is grouped and the weights are not (one parameter per expert); refresh a grouped view with "
            "_native_single_grouped_weight_view, a per-expert one with the SplitRoutedWeight this function returned"
        )
    if isinstance(cached, (GroupedExpertWeights, SplitExpertWeights)):
        mine = "5-tuple" if grouped else "SplitRoutedWeight"
        return f": mok's own view; pass the {mine} this function returned (it carries that view)"
    return ""


def check_scale_shape(shape: object) -> tuple[int, int, int]:
    """A grouped scale view's logical shape: three ints >= 1."""
    dims = check_sequence("shape", shape, "three ints (experts, rows, columns)")
    if len(dims) != 3:
        raise LayoutError(f"shape: expected three ints (experts, rows, columns); found {describe(shape)}")
    experts, a, b = (check_int(f"shape[{i}]", d, minimum=1) for i, d in enumerate(dims))
    return experts, a, b


def check_grouped_shape(weight: object, shape: tuple[int, ...]) -> None:
    """Megatron's first check: the weight's shape (a TE group's through te_compat: TE 2.13's
    ``shape`` is the list of member shapes)."""
    if te_kind(weight) is TensorKind.GROUPED:
        gs = grouped_storage(weight)
        shapes = {tuple(s) for s in gs.tensor_shapes}
        found: object = (gs.num_tensors, *shapes.pop()) if len(shapes) == 1 else (gs.num_tensors, sorted(shapes))
    else:
        found = getattr(weight, "shape", None)
        found = tuple(found) if isinstance(found, Sequence) else found
    if found is None:
        raise ExpertWeightError(f"grouped weight: expected a weight of shape {shape}; found {describe(weight)}")
    if found != shape:
        # a shape of ints as mok.door's reader words it (a refresh and a new view say the same)
        shown = found if isinstance(found, tuple) and all(type(d) is int for d in found) else describe(found)
        raise ExpertWeightError(f"grouped weight: expected shape {shape}; found {shown}")


def compose_grouped_bf16(weight: Any, shape: tuple[int, ...], seams: Seams) -> Any:
    """Megatron's BF16 view: the weight's dtype and contiguity checked, then TE's high-precision
    payload (``rowwise_data``) where the weight has one, else the weight itself."""
    dtype, contiguous = getattr(weight, "dtype", None), getattr(weight, "is_contiguous", None)
    if (dtype is not None and dtype != torch.bfloat16) or (callable(contiguous) and not contiguous()):
        state = "" if not callable(contiguous) or contiguous() else " (not contiguous)"
        raise ExpertWeightError(
            f"grouped weight: expected a contiguous torch.bfloat16 tensor of shape {shape}; found {dtype}{state}"
        )
    storage = seams.storage_attr(weight, seams.names.rowwise_data)
    if storage is not None:
        return seams.storage_view(storage, shape, dtype=torch.bfloat16, name="single-grouped BF16 rowwise")
    if not isinstance(weight, torch.Tensor):
        raise ExpertWeightError(
            "grouped weight: expected a torch.bfloat16 tensor, or storage rowwise_data on the weight; found "
            f"{describe(weight)} with neither"
        )
    return weight


def check_experts(params: object) -> tuple[Any, ...]:
    found = check_sequence("params", params, "per-expert parameters")
    if not found:
        raise ExpertWeightError("params: expected at least one per-expert parameter; found an empty sequence")
    for e, p in enumerate(found):
        if p is None:
            raise ExpertWeightError(f"params[{e}]: expected a parameter; found None")
    return found


def compose_split_bf16(experts: Sequence[object], rows: int, columns: int, seams: Seams) -> list[Any]:
    """Megatron's BF16 split view: each expert's TE high-precision payload (``rowwise_data``)
    where it has one, else the expert itself, viewed as ``(rows, columns)``."""
    held = [seams.storage_attr(p, seams.names.rowwise_data) for p in experts]
    return [
        seams.storage_view(
            p if h is None else h, (rows, columns), dtype=torch.bfloat16, name=f"expert {e} BF16 rowwise"
        )
        for e, (p, h) in enumerate(zip(experts, held, strict=True))
    ]


# --------------------------------------------------------------------- Megatron's results and fp8_utils


# Megatron's results hold both directions: a view of weights TE keeps rowwise only is refused so
NEEDS_COLUMNWISE = {
    True: "grouped weight: the 5-tuple needs columnwise data and scales; the weight has none",
    False: "split weights: the view needs columnwise data and both directions' scales; found less",
}


def check_both_directions(snapshot: Snapshot, grouped: bool) -> None:
    """A refresh of Megatron's result refuses, as a new one does, weights TE keeps rowwise only."""
    if snapshot.quantize is None and len(snapshot.directions) < 2:
        raise ExpertWeightError(NEEDS_COLUMNWISE[grouped])


class GroupedWeightTuple(tuple[Any, ...]):
    """Megatron's 5-tuple ``(row_data, row_scales, column_data, column_scales, True)``, carrying
    ``expert_view``, the mok view it came from: a ``cached_view=`` refresh refreshes that view.
    Kept on the tuple, not in a table keyed by a scale tensor the view holds (never freed)."""

    expert_view: GroupedExpertWeights

    def __new__(cls, view: GroupedExpertWeights) -> GroupedWeightTuple:
        row, col = view.rowwise, view.columnwise
        if col is None or col.scales is None or row.scales is None:
            raise ExpertWeightError(NEEDS_COLUMNWISE[True])
        self = super().__new__(cls, (row.data[0], row.scales[0], col.data[0], col.scales[0], True))
        self.expert_view = view
        return self


@dataclass(frozen=True, eq=False)
class SplitRoutedWeight:
    """Megatron's split view (the fields of MOK's ``SplitRoutedWeight``). The ``*storage_table``
    fields are int64 device pointer tables (one address per expert), not MOK's descriptor
    tables. ``expert_view``: the mok view behind it, so ``cached_view=`` refreshes that view.
    BF16 views have ``data`` and ``storage_table`` only."""

    data: torch.Tensor
    storage_table: torch.Tensor
    scale: torch.Tensor | None = None
    scale_storage_table: torch.Tensor | None = None
    scale_tensors: tuple[torch.Tensor, ...] | None = None
    transposed_data: torch.Tensor | None = None
    transposed_scale: torch.Tensor | None = None
    transposed_storage_table: torch.Tensor | None = None
    transposed_scale_storage_table: torch.Tensor | None = None
    transposed_scale_tensors: tuple[torch.Tensor, ...] | None = None
    native_columnwise: bool = False
    expert_view: SplitExpertWeights | None = field(default=None, repr=False)


def routed(
    row_data: Sequence[Any],
    col_data: Sequence[Any],
    row_scales: Sequence[Any],
    col_scales: Sequence[Any],
    view: Any = None,
) -> SplitRoutedWeight:
    device = same_device(list(row_data))
    return SplitRoutedWeight(
        data=row_data[0],
        storage_table=ptr_table(row_data, device) if view is None else view.rowwise.data_ptrs,
        scale=row_scales[0],
        scale_storage_table=ptr_table(row_scales, device) if view is None else view.rowwise.scale_ptrs,
        scale_tensors=tuple(row_scales),
        transposed_data=col_data[0],
        transposed_scale=col_scales[0],
        transposed_storage_table=ptr_table(col_data, device) if view is None else view.columnwise.data_ptrs,
        transposed_scale_storage_table=ptr_table(col_scales, device) if view is None else view.columnwise.scale_ptrs,
        transposed_scale_tensors=tuple(col_scales),
        native_columnwise=True,
        expert_view=view,
    )


def routed_from_view(view: SplitExpertWeights) -> SplitRoutedWeight:
    row, col = view.rowwise, view.columnwise
    if col is None or row.scales is None or col.scales is None:
        raise ExpertWeightError(NEEDS_COLUMNWISE[False])
    return routed(row.data, col.data, row.scales, col.scales, view)


FP8_UTILS = "megatron.core.fp8_utils"
_no_megatron = False  # its fp8_utils could not be imported (tried once; a stand-in in sys.modules still counts)


def megatron(name: str, fallback: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``fp8_utils.<name>`` as it is now (a monkeypatch shows), else ``fallback``."""
    global _no_megatron
    module = sys.modules.get(FP8_UTILS)
    if module is None and not _no_megatron:
        try:
            module = importlib.import_module(FP8_UTILS)
        except ImportError:
            _no_megatron = True
    found = getattr(module, name, None) if module is not None else None
    return found if callable(found) else fallback
