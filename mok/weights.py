"""Drop-in for Megatron-Core's MOK weights module (``...moe.megakernel.mok.weights``).

The same names, signatures, results and exception types as that module, and the same
composition: the views call this module's ``_parameter_storage_attr``, ``_storage_view``,
``_single_grouped_mxfp8_scale_view`` and ``_swizzle_mxfp8_scale`` by their global names, so a
caller (or its test) that replaces one (``monkeypatch.setattr``) sees the calls upstream makes.
Any object that carries the storage is accepted (a TE tensor or a duck-typed stand-in); with
``use_mxfp8=True`` the caller asserts MXFP8, and the storage found decides.

While those four names are this module's own functions and the weights are TE tensors te_compat
knows, a view is mok's: it goes through mok's one refresh pipeline (mok.pipeline), every expert
and both directions in one kernel launch, and a refresh reruns the prepared launch while TE
reassigned nothing.

On top of upstream: padded shapes work, scales TE already swizzled are never swizzled twice,
storage names may be TE's attribute names of any release or te_compat's logical names, and CPU
tensors work (the torch reference). Every refusal is a ``RuntimeError``, as upstream's are; its
message names the parameter, expert and what was expected, and its ``__cause__`` is mok's or
te_compat's own error (a ``LayoutError``, ``ExpertWeightError``, ``TypeError``, ...).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

import torch

from mok.blocks import BLOCKS
from mok.checks import check_bool, check_int, check_sequence, describe
from mok.errors import ExpertWeightError, LayoutError, MokError, RefreshError
from mok.formats import Format
from mok.layout import MXFP8_BLOCK
from mok.pipeline import view_or_refresh
from mok.readers import BF16Reader, GroupedReader, SplitReader, is_bf16_group
from mok.shared_expert import bf16_config, warn_shared_experts_bf16
from mok.swizzle import swizzle_mxfp8_scales, swizzle_mxfp8_scales_many
from mok.views import GroupedExpertWeights, SplitExpertWeights, check_sizes, ptr_table, same_device, storage_view
from te_compat import (
    TECompatError,
    TensorKind,
    grouped_storage,
    known_storage_name,
    scale_matrix,
    storage_field,
    tensor_kind_or_none,
)

__all__ = [
    "_SHARED_EXPERT_BF16_WARNING_EMITTED",
    "GroupedWeightTuple",
    "SplitRoutedWeight",
    "_native_single_grouped_weight_view",
    "_native_split_weight_view",
    "_parameter_storage_attr",
    "_single_grouped_mxfp8_scale_view",
    "_storage_view",
    "_swizzle_mxfp8_scale",
    "prepare_shared_expert_config",
]

P = ParamSpec("P")
R = TypeVar("R")

# Upstream's module global: prepare_shared_expert_config warns once, then sets it; a caller (or
# Megatron's tests) resets it by assigning the module attribute.
_SHARED_EXPERT_BF16_WARNING_EMITTED = False

_REFUSALS = (MokError, TECompatError, TypeError, ValueError)


def _upstream_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Every refusal of ``fn`` as a ``RuntimeError`` (upstream's type), its own error the cause."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RuntimeError:
            raise
        except _REFUSALS as exc:
            raise RuntimeError(*exc.args) from exc

    return call


def _own(*names: str) -> bool:
    """Whether ``names`` are still this module's own functions (none replaced by a caller)."""
    current = globals()
    return all([current[name] is _OWN[name] for name in names])


# ------------------------------------------------------------------------------ storage names


def _te_kind(obj: object) -> TensorKind | None:
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
    """Upstream's lookup: ``name``, then ``_name`` (a name given with its underscore only as
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


@_upstream_errors
def _parameter_storage_attr(param: torch.nn.Parameter, name: str) -> torch.Tensor | None:
    """The storage object ``name`` of ``param`` itself (on it or on its ``.data``), never
    materialised, or None where there is none.

    Any object works as upstream's does (public name, then private, then both on ``.data``).
    On a TE tensor te_compat's table translates ``name`` (a TE attribute of any release, or a
    logical name) into the attribute the installed release uses.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str naming a storage attribute; found {describe(name)}")
    kind = _te_kind(param)
    logical = None if kind is None else _logical(name, kind)
    if logical is not None:
        return storage_field(param, logical)  # type: ignore[no-any-return]
    return _attribute(param, name)  # type: ignore[no-any-return]


@_upstream_errors
def _storage_view(storage: torch.Tensor, shape: tuple[int, ...], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Zero-copy dense view of ``storage`` as ``shape``/``dtype`` (mok.storage_view's checks: uint8
    may be read as any 1-byte dtype; raises naming ``name`` rather than copying). A view in the
    storage's own dtype stays in autograd, as upstream's ``Tensor.view`` does."""
    view = storage_view(storage, shape, dtype=dtype, name=name)
    if storage.requires_grad and storage.dtype == dtype:
        return storage.view(view.shape)
    return view


def _member(obj: Any, name: str, what: str) -> Any:
    """Storage ``name`` of ``obj``, found through _parameter_storage_attr; a named error if none."""
    value = _parameter_storage_attr(obj, name)
    if value is None:
        raise ExpertWeightError(f"{what}: expected {name} storage on the {type(obj).__name__}; found none")
    return value


# ------------------------------------------------------------------------------ grouped scales


def _scale_shape(shape: object) -> tuple[int, int, int]:
    dims = check_sequence("shape", shape, "three ints (experts, rows, columns)")
    if len(dims) != 3:
        raise LayoutError(f"shape: expected three ints (experts, rows, columns); found {tuple(dims)}")
    experts, a, b = (check_int(f"shape[{i}]", d, minimum=1) for i, d in enumerate(dims))
    return experts, a, b


@_upstream_errors
def _single_grouped_mxfp8_scale_view(
    param: torch.nn.Parameter, member_attr: str, shape: tuple[int, ...], *, name: str
) -> torch.Tensor:
    """``[E, a, b]`` view of a grouped parameter's expert-major scale storage (no copy).

    ``member_attr`` names the rowwise or columnwise scales as a member's attribute (any release's,
    or the group's, or a logical name); ``shape`` is the logical scale shape, ``(E, rows,
    columns/32)`` rowwise or ``(E, rows/32, columns)`` columnwise. A TE GroupedTensor's own flat
    buffer is viewed with TE's per-expert padding skipped; any other object's members (its
    ``quantized_tensors``) must hold their scales packed expert-major in one storage.
    """
    if not isinstance(member_attr, str) or not isinstance(name, str):
        raise TypeError(f"member_attr and name: expected str; found {describe(member_attr)}, {describe(name)}")
    dims = _scale_shape(shape)
    if _te_kind(param) is TensorKind.GROUPED:
        return _te_grouped_scales(param, member_attr, dims, name)
    return _packed_member_scales(param, member_attr, dims, name)


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
        found = "no such tensor" if buffer is None else "another tensor"
        raise ExpertWeightError(
            f"{name}: member_attr {member_attr!r} (logical {logical!r}) should name the rowwise or columnwise "
            f"scales of the grouped parameter; found {found}"
        )
    mxfp8 = BLOCKS[Format.MXFP8]
    direction = mxfp8.rowwise if buffer is gs.rowwise_scale_inv else mxfp8.columnwise
    rows, columns = _expert_shape(gs.tensor_shapes, name)
    want = (gs.num_tensors, rows, columns // MXFP8_BLOCK)
    if direction is mxfp8.columnwise:
        want = (gs.num_tensors, rows // MXFP8_BLOCK, columns)
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


def _packed_member_scales(param: Any, member_attr: str, shape: tuple[int, int, int], name: str) -> torch.Tensor:
    """Upstream's view: the members' scales, packed expert-major in one storage, as one tensor."""
    members = _parameter_storage_attr(param, "quantized_tensors")
    count = 0 if members is None else len(members)
    if members is None or count != shape[0]:
        raise ExpertWeightError(  # upstream's words: "MOK {name} expected E grouped members, got n"
            f"MOK {name} expected {shape[0]} grouped members, got {count} (quantized_tensors of {type(param).__name__})"
        )
    scales: list[Any] = [_parameter_storage_attr(m, member_attr) for m in members]
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


# ------------------------------------------------------------------------------ layout


@_upstream_errors
def _swizzle_mxfp8_scale(
    logical_scale: torch.Tensor, *, rows: int, columns: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """TE's logical scales ``[E, rows, columns/32]`` (any strides) in the tcgen05 layout
    ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/32, 4)``;
    for aligned shapes upstream's ``[E*rows/128, columns/128, 32, 16]``). Padded shapes work.
    With ``out`` the layout is written there in place (same address) and ``out`` returned."""
    rows, columns = check_sizes(rows=rows, columns=columns)
    if not isinstance(logical_scale, torch.Tensor) or logical_scale.dim() != 3:
        found = tuple(logical_scale.shape) if isinstance(logical_scale, torch.Tensor) else describe(logical_scale)
        raise LayoutError(f"logical_scale: expected a 3-D tensor [E, rows, columns/32]; found {found}")
    if columns % MXFP8_BLOCK:
        raise LayoutError(f"columns: expected a multiple of {MXFP8_BLOCK} (one scale per block); found {columns}")
    want = (logical_scale.shape[0], rows, columns // MXFP8_BLOCK)
    if tuple(logical_scale.shape) != want:
        raise LayoutError(
            f"logical_scale: expected shape {want} for rows={rows}, columns={columns}; "
            f"found {tuple(logical_scale.shape)}"
        )
    converted: torch.Tensor = swizzle_mxfp8_scales(logical_scale, out=out)
    return converted


# ------------------------------------------------------------------------------ grouped


class GroupedWeightTuple(tuple[Any, ...]):
    """Upstream's 5-tuple ``(row_data, row_scales, column_data, column_scales, True)``.

    It also carries ``expert_view``, the public view it came from: a ``cached_view=`` refresh
    reruns that view's prepared refresh (no planning while TE reassigned nothing) and knows
    whether the scales are TE's own buffers. Kept on the tuple, not in a weak-key table keyed by
    a scale tensor: the view holds that tensor, so such an entry would never be freed.
    """

    expert_view: GroupedExpertWeights

    def __new__(cls, view: GroupedExpertWeights) -> GroupedWeightTuple:
        self = super().__new__(cls, (view.row_data, view.row_scales, view.col_data, view.col_scales, True))
        self.expert_view = view
        return self


def _check_grouped_shape(weight: object, shape: tuple[int, int, int]) -> None:
    """Upstream's only check of the weight itself: its shape (a TE group's, read through te_compat:
    TE 2.13's ``shape`` is the list of member shapes)."""
    if _te_kind(weight) is TensorKind.GROUPED:
        gs = grouped_storage(weight)
        found: object = (gs.num_tensors, *_expert_shape(gs.tensor_shapes, "grouped weight"))
    else:
        found = getattr(weight, "shape", None)
        found = tuple(found) if isinstance(found, Sequence) else found
    if found != shape:
        raise ExpertWeightError(f"grouped weight: expected shape {shape}; found {found} ({type(weight).__name__})")


def _grouped_bf16(weight: Any, shape: tuple[int, int, int]) -> Any:
    """TE's high-precision payload (``rowwise_data``) when the weight has one, else the weight."""
    _check_grouped_shape(weight, shape)
    storage = _parameter_storage_attr(weight, "rowwise_data")
    if storage is not None:
        return _storage_view(storage, shape, dtype=torch.bfloat16, name="single-grouped BF16 rowwise")
    if not isinstance(weight, torch.Tensor):
        raise ExpertWeightError(
            f"grouped weight: expected a torch.bfloat16 tensor, or storage rowwise_data on the weight; found "
            f"{describe(weight)} with neither"
        )
    if weight.dtype != torch.bfloat16 or not weight.is_contiguous():
        raise ExpertWeightError(
            f"grouped weight: expected a contiguous torch.bfloat16 tensor of shape {shape}; found "
            f"{weight.dtype} {tuple(weight.shape)}{'' if weight.is_contiguous() else ' (not contiguous)'}"
        )
    return weight


def _on_the_fly(weight: object) -> bool:
    """BF16 weights mok quantises when MXFP8 is asked for: a plain tensor, or TE's GroupedTensor
    without a quantizer (Megatron's BF16 master weights with ``fp8_param=False``)."""
    return isinstance(weight, torch.Tensor) and is_bf16_group(weight)


def _grouped_view(weight: object, dims: tuple[int, int, int], cached_view: GroupedWeightTuple | None) -> Any:
    """mok's view through the pipeline: both directions in one launch (TE's MXFP8 storage read,
    or BF16 weights quantised); a refresh reruns it while nothing was reassigned."""
    cached = None if cached_view is None else cached_view.expert_view
    quantize = cached.quantized_on_the_fly if cached is not None else _on_the_fly(weight)
    reader = BF16Reader((weight,), True, dims) if quantize else GroupedReader(weight, Format.MXFP8, dims)
    view = cast(GroupedExpertWeights, view_or_refresh(reader, cached))  # the readers' grouped view
    if cached_view is not None:
        return cached_view
    if view.col_data is None or view.col_scales is None:
        raise ExpertWeightError("grouped weight: the 5-tuple needs columnwise data and scales; the weight has none")
    return GroupedWeightTuple(view)


def _grouped_composed(weight: Any, dims: tuple[int, int, int], cached_view: Any) -> tuple[Any, ...]:
    """Upstream's composition of the grouped view, through the module's own (or replaced) functions."""
    _check_grouped_shape(weight, dims)
    row_out, col_out = (None, None) if cached_view is None else _tuple_outputs(cached_view)
    experts, rows, columns = dims
    fp8 = torch.float8_e4m3fn
    row_data = _storage_view(
        _member(weight, "rowwise_data", "grouped weight"), dims, dtype=fp8, name="single-grouped MXFP8 rowwise"
    )
    col_data = _storage_view(
        _member(weight, "columnwise_data", "grouped weight"), dims, dtype=fp8, name="single-grouped MXFP8 columnwise"
    )
    row_scale = _single_grouped_mxfp8_scale_view(
        weight, "_rowwise_scale_inv", (experts, rows, columns // 32), name="single-grouped rowwise"
    )
    col_scale = _single_grouped_mxfp8_scale_view(
        weight, "_columnwise_scale_inv", (experts, rows // 32, columns), name="single-grouped columnwise"
    ).transpose(-2, -1)  # the [columns, rows/32] transpose: the dgrad GEMM reads [M, K] as [K, M]
    return (
        row_data,
        _swizzle_mxfp8_scale(row_scale, rows=rows, columns=columns, out=row_out),
        col_data,
        _swizzle_mxfp8_scale(col_scale, rows=columns, columns=rows, out=col_out),
        True,
    )


def _tuple_outputs(cached_view: object) -> tuple[Any, Any]:
    """Items 1 and 3 of an earlier grouped view (upstream's contract): its layout buffers."""
    if not isinstance(cached_view, Sequence) or len(cached_view) < 4:
        raise RefreshError(
            "cached_view: expected an earlier grouped view, the 5-tuple (row_data, row_scales, column_data, "
            f"column_scales, True); found {describe(cached_view)}"
        )
    return cached_view[1], cached_view[3]


_GROUPED_SEAMS = (
    "_parameter_storage_attr",
    "_storage_view",
    "_single_grouped_mxfp8_scale_view",
    "_swizzle_mxfp8_scale",
)


@_upstream_errors
def _native_single_grouped_weight_view(
    weight: torch.nn.Parameter,
    *,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached_view: Any = None,
) -> Any:
    """View over one grouped parameter ``(E, rows, columns)``.

    BF16: a view of TE's ``rowwise_data`` (a high-precision GroupedTensor's payload), or the
    weight itself. MXFP8: ``(row_data, row_scales, column_data, column_scales, True)``, payloads
    as float8_e4m3fn views, scales in the layout (columnwise: of the ``[columns, rows/32]``
    transpose). ``cached_view`` (an earlier result) has items 1 and 3 refreshed in place.
    Threads: as mok.grouped_weight_view.
    """
    if (
        use_mxfp8 is True
        and type(cached_view) is GroupedWeightTuple
        and (_own(*_GROUPED_SEAMS) or _by_mok(cached_view))
    ):
        # the refresh of a view mok made: the pipeline checks its own arguments
        return _grouped_view(weight, (num_experts, rows, columns), cached_view)
    dims = check_sizes(num_experts=num_experts, rows=rows, columns=columns)
    shape = (dims[0], dims[1], dims[2])
    if not check_bool("use_mxfp8", use_mxfp8):
        return _grouped_bf16(weight, shape)
    mine = cached_view is None or isinstance(cached_view, GroupedWeightTuple)
    if mine and _on_the_fly(weight):  # mok quantises: upstream composes nothing of its functions here
        return _grouped_view(weight, shape, cached_view)
    if mine and _te_kind(weight) is TensorKind.GROUPED and _own(*_GROUPED_SEAMS):
        return _grouped_view(weight, shape, cached_view)
    return _grouped_composed(weight, shape, cached_view)


def _by_mok(cached_view: GroupedWeightTuple | SplitRoutedWeight) -> bool:
    """A view of BF16 weights mok quantised: its refresh is mok's, whatever a caller replaced."""
    view = cached_view.expert_view
    return view is not None and view.quantized_on_the_fly


# ------------------------------------------------------------------------------ per expert


@dataclass(frozen=True, eq=False)
class SplitRoutedWeight:
    """Upstream's split view (fields of MOK's ``SplitRoutedWeight``) over one parameter per expert.

    The ``*storage_table`` fields are NOT MOK's descriptor tables: they are int64 device pointer
    tables (one address per expert, on the experts' device). ``expert_view`` is the public
    mok.SplitExpertWeights behind a view of TE tensors, kept so ``cached_view=`` reruns its
    prepared refresh. BF16 views have ``data`` and ``storage_table`` only.
    """

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


_MXFP8_MEMBERS = ("rowwise_data", "columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv")
_SPLIT_SEAMS = ("_parameter_storage_attr", "_storage_view", "_swizzle_mxfp8_scale")


def _expert_params(params: object) -> tuple[Any, ...]:
    found = check_sequence("params", params, "per-expert parameters")
    if not found:
        raise ExpertWeightError("params: expected at least one per-expert parameter; found an empty sequence")
    for e, p in enumerate(found):
        if p is None:
            raise ExpertWeightError(f"params[{e}]: expected a parameter; found None")
    return found


def _all_te_mxfp8(params: Sequence[object]) -> bool:
    """Every expert a TE MXFP8 tensor (one kind check per class, not per expert)."""
    return all(_te_kind(p) is TensorKind.MXFP8 for p in {type(p): p for p in params}.values())


def _expert_members(e: int, param: Any) -> dict[str, Any]:
    """The four MXFP8 storages of one expert, through _parameter_storage_attr."""
    found = {name: _parameter_storage_attr(param, name) for name in _MXFP8_MEMBERS}
    missing = [name for name, value in found.items() if value is None]
    if missing:
        raise ExpertWeightError(
            f"expert {e}: expected MXFP8 storage {', '.join(_MXFP8_MEMBERS)} on the {type(param).__name__} "
            f"(shape {tuple(getattr(param, 'shape', ()))}); missing {', '.join(missing)}"
        )
    return found


def _logical_pair(e: int, members: dict[str, Any], rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's logical rowwise scales ``[rows, columns/32]`` and the ``[columns, rows/32]``
    transpose of its columnwise ones, cut from TE's (padded) buffers without a copy."""
    try:
        return (
            scale_matrix(members["_rowwise_scale_inv"], rows, columns),
            scale_matrix(members["_columnwise_scale_inv"], rows, columns, direction="columnwise"),
        )
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"expert {e}: {exc}") from exc


def _convert(
    logical: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int, columns: int, outs: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every expert's two scale matrices in the layout (into ``outs``, (row, column) output
    sequences, when refreshing). The module's own _swizzle_mxfp8_scale converts them all in one
    launch; a replacement is called as upstream calls it, once per expert and direction."""
    if _own("_swizzle_mxfp8_scale"):
        matrices = [r for r, _ in logical] + [c for _, c in logical]
        converted = swizzle_mxfp8_scales_many(matrices, outs=None if outs is None else [*outs[0], *outs[1]])
        return converted[: len(logical)], converted[len(logical) :]
    if outs is None:  # upstream converts every rowwise matrix, then every columnwise one
        return (
            [_swizzle_mxfp8_scale(r.unsqueeze(0), rows=rows, columns=columns) for r, _ in logical],
            [_swizzle_mxfp8_scale(c.unsqueeze(0), rows=columns, columns=rows) for _, c in logical],
        )
    for (r, c), row_out, col_out in zip(logical, *outs, strict=True):  # a refresh: expert by expert
        _swizzle_mxfp8_scale(r.unsqueeze(0), rows=rows, columns=columns, out=row_out)
        _swizzle_mxfp8_scale(c.unsqueeze(0), rows=columns, columns=rows, out=col_out)
    return list(outs[0]), list(outs[1])


def _split_bf16(params: Sequence[Any], shape: tuple[int, int]) -> SplitRoutedWeight:
    payloads = []
    for e, param in enumerate(params):
        storage = _parameter_storage_attr(param, "rowwise_data")
        payload = param if storage is None else storage
        payloads.append(_storage_view(payload, shape, dtype=torch.bfloat16, name=f"expert {e} BF16 rowwise"))
    return SplitRoutedWeight(data=payloads[0], storage_table=ptr_table(payloads, same_device(payloads)))


def _split_composed(params: Sequence[Any], rows: int, columns: int) -> SplitRoutedWeight:
    """Upstream's composition of the MXFP8 split view, through the module's own (or replaced) functions."""
    fp8 = torch.float8_e4m3fn
    row_data, col_data, logical = [], [], []
    for e, param in enumerate(params):
        members = _expert_members(e, param)
        row_data.append(
            _storage_view(members["rowwise_data"], (rows, columns), dtype=fp8, name=f"expert {e} MXFP8 rowwise")
        )
        col_data.append(
            _storage_view(members["columnwise_data"], (rows, columns), dtype=fp8, name=f"expert {e} MXFP8 columnwise")
        )
        logical.append(_logical_pair(e, members, rows, columns))
    row_scales, col_scales = _convert(logical, rows, columns, None)
    device = same_device(row_data)
    return SplitRoutedWeight(
        data=row_data[0],
        storage_table=ptr_table(row_data, device),
        scale=row_scales[0],
        scale_storage_table=ptr_table(row_scales, device),
        scale_tensors=tuple(row_scales),
        transposed_data=col_data[0],
        transposed_scale=col_scales[0],
        transposed_storage_table=ptr_table(col_data, device),
        transposed_scale_storage_table=ptr_table(col_scales, device),
        transposed_scale_tensors=tuple(col_scales),
        native_columnwise=True,
    )


def _need(value: R | None, what: str) -> R:
    if value is None:
        raise ExpertWeightError(f"split weights: the view needs {what}; the experts hold none")
    return value


def _split_reader(params: tuple[object, ...], rows: int, columns: int, quantize: bool) -> Any:
    if quantize:
        return BF16Reader(params, False, (len(params), rows, columns))
    return SplitReader(params, Format.MXFP8, rows, columns)


def _split_view(params: Sequence[object], rows: int, columns: int, quantize: bool) -> SplitRoutedWeight:
    """mok's view through the pipeline (TE's MXFP8 storage read, or BF16 weights quantised), in
    upstream's fields."""
    view = view_or_refresh(_split_reader(tuple(params), rows, columns, quantize))
    row, col = view.rowwise, _need(view.columnwise, "columnwise data")
    row_scales, col_scales = _need(row.scales, "rowwise scales"), _need(col.scales, "columnwise scales")
    return SplitRoutedWeight(
        data=row.data[0],
        storage_table=_need(row.data_ptrs, "rowwise data pointers"),
        scale=row_scales[0],
        scale_storage_table=_need(row.scale_ptrs, "rowwise scale pointers"),
        scale_tensors=row_scales,
        transposed_data=col.data[0],
        transposed_scale=col_scales[0],
        transposed_storage_table=_need(col.data_ptrs, "columnwise data pointers"),
        transposed_scale_storage_table=_need(col.scale_ptrs, "columnwise scale pointers"),
        transposed_scale_tensors=col_scales,
        native_columnwise=True,
        expert_view=view,
    )


def _cached_outputs(cached_view: object, experts: int) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """Upstream's refresh contract: ``scale_tensors`` and ``transposed_scale_tensors``, one per expert."""
    row = getattr(cached_view, "scale_tensors", None)
    col = getattr(cached_view, "transposed_scale_tensors", None)
    if row is None or col is None:
        raise RefreshError(
            "cached_view: expected an earlier split view, with scale_tensors and transposed_scale_tensors "
            f"(per-expert layout buffers); found {type(cached_view).__name__} without them"
        )
    row = check_sequence("cached_view.scale_tensors", row, "layout buffers", item_type=torch.Tensor)
    col = check_sequence("cached_view.transposed_scale_tensors", col, "layout buffers", item_type=torch.Tensor)
    if len(row) != experts or len(col) != experts:
        raise RefreshError(
            f"cached_view: expected {experts} rowwise and columnwise scale buffers, one per parameter; "
            f"found {len(row)} and {len(col)}"
        )
    return row, col


def _split_refresh(params: Sequence[Any], rows: int, columns: int, cached_view: Any) -> Any:
    """Upstream's refresh of any cached view: each expert's scales read again and converted into
    the view's buffers."""
    outs = _cached_outputs(cached_view, len(params))
    logical = []
    for e, param in enumerate(params):
        scales = {n: _member(param, n, f"expert {e}") for n in _MXFP8_MEMBERS[2:]}
        logical.append(_logical_pair(e, scales, rows, columns))
    _convert(logical, rows, columns, outs)
    return cached_view


@_upstream_errors
def _native_split_weight_view(
    params: Sequence[torch.nn.Parameter],
    *,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached_view: Any = None,
) -> Any:
    """A :class:`SplitRoutedWeight` over one ``(rows, columns)`` parameter per expert, every
    expert's scales in one launch. ``cached_view`` (any object with ``scale_tensors`` and
    ``transposed_scale_tensors``, per-expert layout buffers) is refreshed in place and returned:
    same scale addresses, fresh values.

    Threads: as mok.split_weight_view.
    """
    if (
        use_mxfp8 is True
        and type(cached_view) is SplitRoutedWeight
        and cached_view.expert_view
        and (_own(*_SPLIT_SEAMS) or _by_mok(cached_view))
    ):  # the refresh of a view mok made: the pipeline checks its own arguments
        r, c = check_sizes(rows=rows, columns=columns)
        experts = tuple(check_sequence("params", params, "per-expert parameters"))
        view = cached_view.expert_view
        view_or_refresh(_split_reader(experts, r, c, view.quantized_on_the_fly), view)
        return cached_view
    experts = _expert_params(params)
    rows, columns = check_sizes(rows=rows, columns=columns)
    mxfp8 = check_bool("use_mxfp8", use_mxfp8)
    if cached_view is not None:
        if not mxfp8:
            raise RefreshError(
                "cached_view: expected None for BF16 split weights (plain views of the parameters: nothing to "
                f"refresh); found {describe(cached_view)}"
            )
        return _split_refresh(experts, rows, columns, cached_view)
    if not mxfp8:
        return _split_bf16(experts, (rows, columns))
    if all(map(_on_the_fly, experts)):  # BF16 master weights: mok quantises them
        return _split_view(experts, rows, columns, True)
    if _own(*_SPLIT_SEAMS) and _all_te_mxfp8(experts):
        return _split_view(experts, rows, columns, False)
    return _split_composed(experts, rows, columns)


# ------------------------------------------------------------------------------ shared experts


@_upstream_errors
def prepare_shared_expert_config(config: Any) -> Any:
    """For a config with FP8 parameters, a copy with FP8 execution and FP8 parameters off
    (``fp8 = None``, ``fp8_param = False``), so shared experts run in BF16; ``config`` itself is
    never changed, and one without FP8 parameters is returned as it is. Warns once while this
    module's ``_SHARED_EXPERT_BF16_WARNING_EMITTED`` is False (rank 0 only under
    torch.distributed), then sets it. The copy is made as mok.prepare_shared_expert_config makes it.
    """
    global _SHARED_EXPERT_BF16_WARNING_EMITTED
    shared = bf16_config(config)
    if shared is config:
        return config
    if not _SHARED_EXPERT_BF16_WARNING_EMITTED:
        _SHARED_EXPERT_BF16_WARNING_EMITTED = warn_shared_experts_bf16(config, stacklevel=4)
    return shared


_OWN: dict[str, object] = {
    name: globals()[name]
    for name in ("_parameter_storage_attr", "_storage_view", "_single_grouped_mxfp8_scale_view", "_swizzle_mxfp8_scale")
}
