"""The adapters between Megatron's MOK weights module's contract and mok's one door (mok.door):
the steps a mok.weights caller may replace, in upstream's signatures (mok's own implementations
of them); the :class:`~mok.read.readers.Seams` of a call, looked up as that module and
Megatron's ``fp8_utils`` hold them at the call; Megatron's argument checks, refresh contracts
and result types (:class:`GroupedWeightTuple`, :class:`SplitRoutedWeight`).

A view asked of mok.weights goes through mok.door.view once: mok's readers read TE's weights
while every step is mok's own, a :class:`~mok.read.readers.SeamReader` reads through the
caller's functions otherwise, each called as Megatron's module calls it.

mok's own steps do what Megatron's do, and more where a caller would not notice: TE attribute
names of any release translated through te_compat's table, padded shapes (Megatron needs
multiples of 128), TE's own GroupedTensor read through its flat buffers, and errors that say
what was expected and what was found.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from mok import door
from mok.checks import check_bool, check_int, check_sequence, describe
from mok.errors import ExpertWeightError, LayoutError, RefreshError
from mok.formats import Format
from mok.plan.pipeline import check_cached_as
from mok.read.blocks import BLOCKS
from mok.read.readers import NEEDS_COLUMNWISE, Seams, StorageNames, check_logical_scales, is_bf16_group
from mok.swizzle import swizzle_mxfp8_scales
from mok.views import ExpertWeights, GroupedExpertWeights, SplitExpertWeights, check_sizes, storage_view
from te_compat import TensorKind, grouped_storage, known_storage_name, storage_field, tensor_kind_or_none

__all__ = ["Seams", "StorageNames"]  # the reader's types, where mok.weights finds them

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
    check_logical_scales(logical_scale, rows, columns)
    converted: torch.Tensor = swizzle_mxfp8_scales(logical_scale, out=out)
    return converted


# ------------------------------------------------------------------------------ a grouped weight's scales


def grouped_scale_view(
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
    reader = door.reader_for(
        param, grouped=True, format=Format.MXFP8, rows=rows, columns=columns, experts=gs.num_tensors
    )
    snapshot = reader.read()
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


def check_experts(params: object) -> tuple[Any, ...]:
    found = check_sequence("params", params, "per-expert parameters")
    if not found:
        raise ExpertWeightError("params: expected at least one per-expert parameter; found an empty sequence")
    for e, p in enumerate(found):
        if p is None:
            raise ExpertWeightError(f"params[{e}]: expected a parameter; found None")
    return found


# --------------------------------------------------------------------- Megatron's results and fp8_utils


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


def routed(view: SplitExpertWeights, expert_view: SplitExpertWeights | None) -> SplitRoutedWeight:
    """Megatron's split result over ``view``'s payloads, layouts and tables; ``expert_view``: the
    view a ``cached_view=`` refresh refreshes (None where the caller's functions made it: its
    refresh calls them again, into its ``scale_tensors``)."""
    row, col = view.rowwise, view.columnwise
    if col is None or row.scales is None or col.scales is None:
        raise ExpertWeightError(NEEDS_COLUMNWISE[False])
    return SplitRoutedWeight(
        data=row.data[0],
        storage_table=cast(torch.Tensor, row.data_ptrs),
        scale=row.scales[0],
        scale_storage_table=row.scale_ptrs,
        scale_tensors=row.scales,
        transposed_data=col.data[0],
        transposed_scale=col.scales[0],
        transposed_storage_table=col.data_ptrs,
        transposed_scale_storage_table=col.scale_ptrs,
        transposed_scale_tensors=col.scales,
        native_columnwise=True,
        expert_view=expert_view,
    )


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


# The storage names Megatron's module asks its steps for: TE's, as its callers' replacements expect.
MEGATRON_NAMES = StorageNames("rowwise_data", "columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv")


def seams_of(module: Mapping[str, Any]) -> Seams:
    """The steps as they are at this call: ``module``'s globals (mok.weights', whose ``_OWN``
    names its own functions) and Megatron's fp8_utils."""
    own: Mapping[str, object] = module["_OWN"]
    return Seams(
        MEGATRON_NAMES,
        module["_parameter_storage_attr"],
        module["_storage_view"],
        module["_single_grouped_mxfp8_scale_view"],
        module["_swizzle_mxfp8_scale"],
        megatron("is_mxfp8tensor", is_mxfp8),
        megatron("is_grouped_mxfp8tensor", is_grouped_mxfp8),
        all([module[name] is function for name, function in own.items()]),
        module["_swizzle_mxfp8_scale"] is own["_swizzle_mxfp8_scale"],
    )


def grouped_view(
    weight: object,
    num_experts: object,
    rows: object,
    columns: object,
    use_mxfp8: object,
    cached_view: object,
    module: Mapping[str, Any],
) -> Any:
    """Megatron's grouped view (mok.weights._native_single_grouped_weight_view), its checks in
    upstream's order, through the door once."""
    seams, mine = seams_of(module), type(cached_view) is GroupedWeightTuple
    expert_view: GroupedExpertWeights | None = cast(GroupedWeightTuple, cached_view).expert_view if mine else None
    if (
        use_mxfp8 is True
        and expert_view is not None
        and (seams.own or expert_view.quantized_on_the_fly)
        and door.rerun(weight, True, Format.MXFP8, rows, columns, num_experts, expert_view)
    ):  # nothing the view was planned from changed: its launch ran again; else decided as a new view is
        return cached_view
    experts, rows, columns = check_sizes(num_experts=num_experts, rows=rows, columns=columns)
    shape = (experts, rows, columns)
    if expert_view is not None and use_mxfp8 is True:  # the call's sizes are the view's own, before reading
        check_cached_as(expert_view, GroupedExpertWeights, Format.MXFP8, shape)
    check_grouped_shape(weight, shape)
    if not check_bool("use_mxfp8", use_mxfp8):
        bf16: ExpertWeights = door.view(
            weight, grouped=True, format=Format.BF16, rows=rows, columns=columns, experts=experts, seams=seams
        )
        return bf16.rowwise.data[0]
    outs = None if cached_view is None else tuple((buffer,) for buffer in grouped_outputs(cached_view))
    view: ExpertWeights = door.view(
        weight,
        grouped=True,
        format=Format.MXFP8,
        rows=rows,
        columns=columns,
        experts=experts,
        cached=expert_view,
        seams=seams,
        outs=outs,
        both_directions=True,
    )
    if view.refresh_plan.prepared is None:  # made through the caller's functions: upstream's tuple
        row, col = view.rowwise, cast(Any, view.columnwise)
        return (row.data[0], cast(Any, row.scales)[0], col.data[0], col.scales[0], True)
    return cached_view if mine else GroupedWeightTuple(cast(GroupedExpertWeights, view))


def split_view(
    params: object, rows: object, columns: object, use_mxfp8: object, cached_view: object, module: Mapping[str, Any]
) -> Any:
    """Megatron's split view (mok.weights._native_split_weight_view), its checks in upstream's
    order, through the door once."""
    seams = seams_of(module)
    expert_view = cached_view.expert_view if type(cached_view) is SplitRoutedWeight else None
    if (
        use_mxfp8 is True
        and expert_view is not None
        and (seams.own or expert_view.quantized_on_the_fly)
        and door.rerun(params, False, Format.MXFP8, rows, columns, None, expert_view)
    ):  # nothing the view was planned from changed: its launch ran again; else decided as a new view is
        return cached_view
    experts = check_experts(params)
    rows, columns = check_sizes(rows=rows, columns=columns)
    if (
        expert_view is not None and use_mxfp8 is True
    ):  # the call's sizes are the view's own, before the weights are read
        check_cached_as(expert_view, SplitExpertWeights, Format.MXFP8, (len(experts), rows, columns))
    if not check_bool("use_mxfp8", use_mxfp8):
        if cached_view is not None:
            raise RefreshError(
                "cached_view: expected None for BF16 split weights (plain views of the parameters: nothing to "
                f"refresh); found {describe(cached_view)}"
            )
        bf16: ExpertWeights = door.view(
            experts, grouped=False, format=Format.BF16, rows=rows, columns=columns, seams=seams
        )
        payloads = bf16.rowwise
        return SplitRoutedWeight(data=payloads.data[0], storage_table=cast(torch.Tensor, payloads.data_ptrs))
    outs = None if cached_view is None else split_outputs(cached_view, len(experts))
    view = door.view(
        experts,
        grouped=False,
        format=Format.MXFP8,
        rows=rows,
        columns=columns,
        cached=expert_view,
        seams=seams,
        outs=outs,
        both_directions=True,
    )
    if cached_view is not None:
        return cached_view
    return routed(view, None if view.refresh_plan.prepared is None else view)
