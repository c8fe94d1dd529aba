"""Drop-in for Megatron-Core's MOK weights module (``...moe.megakernel.mok.weights``).

The same names, parameters and results as that module, each a thin layer over mok's public
API (``grouped_weight_view``, ``split_weight_view``, ``swizzle_mxfp8_scales``, ``storage_view``,
``prepare_shared_expert_config``) and te_compat's probes, so a Megatron user changes one import.
What differs, on purpose: every expert's scales convert in ONE launch (upstream converts one
expert at a time), padded shapes work (upstream raises), scales TE already swizzled are never
swizzled twice, errors are mok's/te_compat's exceptions naming expert and attribute (upstream
raises RuntimeError), CPU tensors work (the torch reference), and a refresh whose payload TE
moved raises RefreshError instead of handing back a payload a captured graph would not see.

Storage names (``name=``, ``member_attr=``) may be TE's own attribute names of any release in
te_compat's table, public or private, or te_compat's logical names: te_compat translates them.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from mok import (
    ExpertWeightError,
    GroupedExpertWeights,
    LayoutError,
    RefreshError,
    SplitExpertWeights,
    grouped_weight_view,
    padded_shape,
    prepare_shared_expert_config,
    shared_expert,
    split_weight_view,
    storage_view,
    swizzle_mxfp8_scales,
)
from mok.layout import MXFP8_BLOCK, grouped_scales
from te_compat import TensorKind, grouped_storage, storage_attr, tensor_kind
from te_compat.names import logical_storage_name

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

T = TypeVar("T")
_FLAG = "_SHARED_EXPERT_BF16_WARNING_EMITTED"

# Declared, never bound: reads go to __getattr__ below (PEP 562 is consulted only for names the
# module does not define), so the value is always mok.shared_expert's live state.
_SHARED_EXPERT_BF16_WARNING_EMITTED: bool


def _warning_emitted() -> bool:
    """Whether prepare_shared_expert_config has warned in this process."""
    return shared_expert.bf16_warning_emitted()


def __getattr__(name: str) -> bool:
    """PEP 562: upstream's module global, read live from mok.shared_expert."""
    if name == _FLAG:
        return _warning_emitted()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _WeightsModule(types.ModuleType):
    """Assigning the flag (Megatron's tests reset it with monkeypatch.setattr) sets
    mok.shared_expert's state; binding a global instead would hide the live value for good."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == _FLAG:
            shared_expert._warned = bool(value)
            return
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        # pytest >= 9.2's monkeypatch undoes a patch of a name absent from the module's dict by
        # deleting it: the flag is never in the dict (it reads mok.shared_expert's state)
        if name != _FLAG:
            super().__delattr__(name)


sys.modules[__name__].__class__ = _WeightsModule


# ------------------------------------------------------------------------------ storage names


def _logical(name: str, kind: TensorKind | None) -> str:
    """te_compat's logical name for ``name``: ``kind``'s own attribute names first, then any
    kind's (a member's private scale name passed for its grouped parent means the same storage)."""
    try:
        return logical_storage_name(name, kind)
    except ValueError:
        return logical_storage_name(name)


def _parameter_storage_attr(param: torch.nn.Parameter, name: str) -> torch.Tensor | None:
    """TE storage ``name`` of ``param`` (on it or on its ``.data``), never materialised.

    ``name`` is a TE attribute name of any release or a logical name. A plain tensor holds no
    TE storage: None (what upstream's callers take to mean "use the parameter itself").
    """
    kind = tensor_kind(param)
    if kind is TensorKind.PLAIN:
        logical_storage_name(name)  # an unknown name still raises
        return None
    return storage_attr(param, _logical(name, kind))


def _storage_view(storage: torch.Tensor, shape: tuple[int, ...], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Zero-copy dense view of ``storage`` as ``shape``/``dtype`` (mok.storage_view: uint8 may be
    read as float8; raises ExpertWeightError naming ``name`` rather than copying)."""
    return storage_view(storage, shape, dtype=dtype, name=name)


def _single_grouped_mxfp8_scale_view(
    param: torch.nn.Parameter, member_attr: str, shape: tuple[int, ...], *, name: str
) -> torch.Tensor:
    """``[E, a, b]`` view of a grouped parameter's expert-major scale buffer (no copy).

    ``member_attr`` names the rowwise or columnwise scales (a member's attribute, the group's,
    or a logical name); ``shape`` is the logical scale shape: ``(E, rows, columns/32)`` rowwise,
    ``(E, rows/32, columns)`` columnwise, as upstream. TE pads each expert's matrix; the view
    skips the padding (strided when padded, contiguous when aligned).
    """
    gs = grouped_storage(param)
    if not gs.quantized:
        raise ExpertWeightError(f"{name}: expected a quantized (MXFP8) grouped parameter; found one with no quantizer")
    if gs.scales_swizzled:
        raise LayoutError(
            f"{name}: TE already holds these scales in the GEMM layout, so there is no logical matrix to view; "
            "_native_single_grouped_weight_view exposes (or copies) them as they are"
        )
    logical = _logical(member_attr, TensorKind.GROUPED)
    buffer = storage_attr(param, logical)
    if buffer is None or (buffer is not gs.rowwise_scale_inv and buffer is not gs.columnwise_scale_inv):
        found = "no such tensor" if buffer is None else "another tensor"
        raise ExpertWeightError(
            f"{name}: member_attr {member_attr!r} (logical {logical!r}) should name the rowwise or columnwise "
            f"scales of the grouped parameter; found {found}"
        )
    if len(shape) != 3 or shape[0] != gs.num_tensors:
        raise LayoutError(f"{name}: expected shape (experts={gs.num_tensors}, rows, columns); found {tuple(shape)}")
    experts, a, b = shape
    # TE pads rowwise [a, b] to the layout's padding; columnwise [a, b] so that its transpose is.
    padded_rows, padded_cols = padded_shape(a, b) if buffer is gs.rowwise_scale_inv else padded_shape(b, a)[::-1]
    return grouped_scales(buffer, experts, padded_rows, padded_cols, name)[:, :a, :b]


# ------------------------------------------------------------------------------ layout


def _swizzle_mxfp8_scale(
    logical_scale: torch.Tensor, *, rows: int, columns: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """TE's logical scales ``[E, rows, columns/32]`` (any strides) in the tcgen05 layout
    ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/32, 4)``;
    for aligned shapes upstream's ``[E*rows/128, columns/128, 32, 16]``). Padded shapes work.
    With ``out`` the layout is written there in place (same address) and ``out`` returned."""
    if not isinstance(logical_scale, torch.Tensor) or logical_scale.dim() != 3:
        found = tuple(logical_scale.shape) if isinstance(logical_scale, torch.Tensor) else type(logical_scale).__name__
        raise LayoutError(f"logical_scale: expected a 3-D tensor [E, rows, columns/32]; found {found}")
    if columns % MXFP8_BLOCK:
        raise LayoutError(f"columns: expected a multiple of {MXFP8_BLOCK} (one scale per block); found {columns}")
    want = (logical_scale.shape[0], rows, columns // MXFP8_BLOCK)
    if tuple(logical_scale.shape) != want:
        raise LayoutError(
            f"logical_scale: expected shape {want} for rows={rows}, columns={columns}; "
            f"found {tuple(logical_scale.shape)}"
        )
    return swizzle_mxfp8_scales(logical_scale, out=out)


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


def _plain_bf16(weight: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """A plain BF16 ``(E, rows, columns)`` weight is its own view (upstream returns it as is)."""
    if tuple(weight.shape) != shape or weight.dtype != torch.bfloat16 or not weight.is_contiguous():
        raise ExpertWeightError(
            f"grouped weight: expected a contiguous torch.bfloat16 tensor of shape {shape}; found "
            f"{weight.dtype} {tuple(weight.shape)}{'' if weight.is_contiguous() else ' (not contiguous)'}"
        )
    return weight


def _grouped_bf16(weight: torch.nn.Parameter, dims: tuple[int, int, int]) -> torch.Tensor:
    if tensor_kind(weight) is TensorKind.PLAIN:
        return _plain_bf16(weight, dims)
    experts, rows, columns = dims
    data = grouped_weight_view(weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=False).row_data
    if data.dtype != torch.bfloat16:
        raise ExpertWeightError(f"grouped weight: expected torch.bfloat16 storage; found {data.dtype}")
    return data


def _native_single_grouped_weight_view(
    weight: torch.nn.Parameter,
    *,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached_view: Any = None,
) -> Any:
    """View over one grouped parameter ``(E, rows, columns)``: mok.grouped_weight_view.

    BF16: the ``[E, rows, columns]`` payload (a view of TE's buffer, or a plain weight itself;
    ``cached_view`` is not needed). MXFP8: a :class:`GroupedWeightTuple`, payloads as
    float8_e4m3fn views, scales in the layout (columnwise: of the ``[columns, rows/32]``
    transpose). ``cached_view`` (that tuple) refreshes items 1 and 3 in place and is returned.
    """
    if not use_mxfp8:
        return _grouped_bf16(weight, (num_experts, rows, columns))
    if cached_view is not None and not isinstance(cached_view, GroupedWeightTuple):
        raise RefreshError(
            "cached_view: expected the tuple _native_single_grouped_weight_view returned (it carries the "
            f"view it refreshes); found {type(cached_view).__name__}. Build a new view (cached_view=None)"
        )
    cached = None if cached_view is None else cached_view.expert_view
    view = grouped_weight_view(
        weight, num_experts=num_experts, rows=rows, columns=columns, use_mxfp8=True, cached=cached
    )
    if cached_view is not None:
        return cached_view
    if view.col_data is None or view.col_scales is None:
        raise ExpertWeightError("grouped weight: the 5-tuple needs columnwise data and scales; the weight has none")
    return GroupedWeightTuple(view)


# ------------------------------------------------------------------------------ per expert


@dataclass(frozen=True, eq=False)
class SplitRoutedWeight:
    """Upstream's split view (fields of MOK's ``SplitRoutedWeight``) over one parameter per expert.

    The ``*storage_table`` fields are NOT MOK's descriptor tables: they are the int64 device
    pointer tables of mok.SplitExpertWeights (one address per expert: ``row_data_ptrs``,
    ``row_scale_ptrs``, ``col_data_ptrs``, ``col_scale_ptrs``). ``expert_view`` is that public
    view, kept so ``cached_view=`` refreshes it in place (same addresses, one launch).
    BF16 views have ``data`` and ``storage_table`` only.
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


def _need(value: T | None, what: str) -> T:
    if value is None:
        raise ExpertWeightError(f"split weights: the view needs {what}; the experts hold none")
    return value


def _split_mxfp8(view: SplitExpertWeights) -> SplitRoutedWeight:
    row_scales = _need(view.row_scales, "rowwise scales")
    col_data = _need(view.col_data, "columnwise data")
    col_scales = _need(view.col_scales, "columnwise scales")
    return SplitRoutedWeight(
        data=view.row_data[0],
        storage_table=view.row_data_ptrs,
        scale=row_scales[0],
        scale_storage_table=_need(view.row_scale_ptrs, "rowwise scale pointers"),
        scale_tensors=row_scales,
        transposed_data=col_data[0],
        transposed_scale=col_scales[0],
        transposed_storage_table=_need(view.col_data_ptrs, "columnwise data pointers"),
        transposed_scale_storage_table=_need(view.col_scale_ptrs, "columnwise scale pointers"),
        transposed_scale_tensors=col_scales,
        native_columnwise=True,
        expert_view=view,
    )


def _split_bf16(view: SplitExpertWeights) -> SplitRoutedWeight:
    for e, data in enumerate(view.row_data):
        if data.dtype != torch.bfloat16:
            raise ExpertWeightError(f"expert {e}: expected a torch.bfloat16 parameter; found {data.dtype}")
    return SplitRoutedWeight(data=view.row_data[0], storage_table=view.row_data_ptrs, expert_view=view)


def _native_split_weight_view(
    params: Sequence[torch.nn.Parameter],
    *,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached_view: Any = None,
) -> Any:
    """A :class:`SplitRoutedWeight` over one ``(rows, columns)`` parameter per expert:
    mok.split_weight_view, every expert's scales in one launch. ``cached_view`` (an earlier
    result) is refreshed in place and returned: same scale addresses, fresh values."""
    if cached_view is None:
        view = split_weight_view(params, rows=rows, columns=columns, use_mxfp8=use_mxfp8)
        return _split_mxfp8(view) if use_mxfp8 else _split_bf16(view)
    if not use_mxfp8:
        raise RefreshError("cached_view: BF16 split weights are plain views of the parameters; nothing to refresh")
    cached = getattr(cached_view, "expert_view", None)
    if not isinstance(cached, SplitExpertWeights):
        raise RefreshError(
            "cached_view: expected the SplitRoutedWeight _native_split_weight_view returned (it carries "
            f"the view it refreshes); found {type(cached_view).__name__}. Build a new view (cached_view=None)"
        )
    split_weight_view(params, rows=rows, columns=columns, use_mxfp8=True, cached=cached)
    return cached_view
