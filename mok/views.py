"""Zero-copy views over routed-expert weights, ready for a MoE megakernel.

Payloads are views of TE's own buffers (same data pointers). MXFP8 scales are converted to the
tcgen05 layout into buffers this module owns, and refreshed in place (``cached=``) so kernels
captured in a CUDA graph keep valid addresses. Scales TE already swizzled (TE 2.12+) are never
converted again: aligned ones are exposed as they are, others copied.

Everything read off a TE object comes through te_compat: this module names no TE attribute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mok.errors import ExpertWeightError, LayoutError, RefreshError
from mok.layout import (
    MXFP8_BLOCK,
    check_out,
    columnwise_scales,
    grouped_scales,
    layout_shape,
    padded_shape,
    rowwise_scales,
    te_columnwise_padding,
    te_rowwise_padding,
)
from mok.swizzle import PreparedWork, ScaleWork
from te_compat import (
    GroupedStorage,
    StorageName,
    TECompatError,
    TensorKind,
    grouped_storage,
    mxfp8_storage,
    storage_field,
    storage_fingerprint,
    tensor_kind,
)

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True, eq=False)
class GroupedExpertWeights:
    """Views over one grouped expert Parameter of shape ``(E, rows, columns)``.

    ``row_scales`` is the layout of the rowwise scales ``[E*Rp/128, Cp/4, 32, 16]`` with
    ``Rp = roundup(rows, 128)``, ``Cp = roundup(columns/32, 4)``; ``col_scales`` the layout of
    the transposed columnwise scales (R = columns, C = rows/32). BF16 views have only ``row_data``.
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
    _refresh: dict[str, Any] = field(default_factory=dict, repr=False)


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
    _refresh: dict[str, Any] = field(default_factory=dict, repr=False)


def _key(weights: Sequence[object], *shape: int) -> tuple[Any, ...] | None:
    """What a refresh must see unchanged to rerun its prepared work (te_compat's fingerprint of
    each weight's storage: every buffer's identity and address, TE's swizzled flag), or None when
    the weights cannot be read that way (the full path then reports what is wrong). The prepared
    work holds the old tensors, so no id can be reused while it is compared."""
    try:
        return (tuple(storage_fingerprint(w) for w in weights), *shape)
    except (TECompatError, ValueError):
        return None


def _rerun(cached: object, key: tuple[Any, ...] | None, backend: str | None) -> bool:
    """Rerun the prepared refresh of ``cached`` if nothing it depends on changed."""
    plan = getattr(cached, "_refresh", {}).get("plan")
    if key is None or plan is None or plan[0] != key or plan[1].backend != backend:
        return False
    plan[1].run()
    return True


def _remember(result: object, key: tuple[Any, ...] | None, work: PreparedWork, slot: str = "plan") -> None:
    if key is not None:
        result._refresh[slot] = (key, work)  # type: ignore[attr-defined]


def storage_view(storage: torch.Tensor, shape: Sequence[int], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A dense view of ``storage`` as ``shape``/``dtype`` sharing its memory (uint8 may be
    reinterpreted as a 1-byte float8 dtype). Raises, naming ``name``, rather than copying."""
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
    return storage.detach().view(dtype).view(tuple(shape))


def _check_mxfp8_dims(rows: int, columns: int, what: str) -> None:
    if rows % MXFP8_BLOCK or columns % MXFP8_BLOCK or rows <= 0 or columns <= 0:
        raise ExpertWeightError(
            f"{what}: MXFP8 needs rows and columns that are positive multiples of {MXFP8_BLOCK}; "
            f"found rows={rows}, columns={columns}"
        )


def _convert(
    te_padded: torch.Tensor,
    logical: torch.Tensor,
    swizzled: bool,
    out: torch.Tensor | None,
    out_is_te: bool,
    name: str,
    work: list[ScaleWork],
) -> tuple[torch.Tensor, bool]:
    """Plan the layout of one batch of scales into ``out`` (or a new buffer), honouring TE's
    swizzled flag; the conversion itself is appended to ``work``.

    ``te_padded`` is TE's buffer ``[E, Rpad, Cpad]``; ``logical`` the ``[E, R, C]`` view of it to
    convert (a transpose for columnwise). Returns (layout tensor, is TE's own buffer).
    """
    experts, r, c = logical.shape
    shape = layout_shape(r, c, experts)
    if swizzled:
        if te_padded.numel() != math.prod(shape) or not te_padded.is_contiguous():
            raise LayoutError(
                f"{name}: TE marks these scales swizzled, so its buffer should be exactly the layout "
                f"{shape}; found shape {tuple(te_padded.shape)}, strides {te_padded.stride()}"
            )
        te_layout = te_padded.view(shape)
        if out is None:
            if (r, c) == padded_shape(r, c):
                return te_layout, True  # aligned: TE's buffer is the layout, zero-copy
            out = torch.empty(shape, dtype=torch.uint8, device=te_layout.device)
        elif out.data_ptr() == te_layout.data_ptr():
            return out, out_is_te
        work.append(ScaleWork(te_layout, out, copy=True))  # never converted a second time
        return out, out_is_te
    if out is not None and out_is_te:
        raise RefreshError(
            f"{name}: the cached view exposes TE's own swizzled scale buffer, but TE now holds "
            "unswizzled scales; writing the layout there would overwrite TE's storage. Build a new "
            "view (without cached=)"
        )
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=logical.device)
    check_out(out, logical, name)
    work.append(ScaleWork(logical, out))
    return out, False


# ---------------------------------------------------------------------------------- grouped


def _check_grouped(gs: GroupedStorage, num_experts: int, rows: int, columns: int) -> None:
    if gs.num_tensors != num_experts:
        raise ExpertWeightError(f"grouped weight: expected {num_experts} experts; found {gs.num_tensors}")
    for e, shape in enumerate(gs.tensor_shapes):
        if tuple(shape) != (rows, columns):
            raise ExpertWeightError(
                f"grouped weight: expected every expert of shape ({rows}, {columns}); expert {e} has {tuple(shape)}"
            )


def _check_packing(gs: GroupedStorage, usage: str, flat: torch.Tensor, per_expert: int) -> None:
    """Each member's scales must be a view at offset e*per_expert of the grouped buffer."""
    offsets = gs.rowwise_scale_inv_offsets if usage == "rowwise" else gs.columnwise_scale_inv_offsets
    if offsets is not None:
        for e, off in enumerate(offsets[: gs.num_tensors]):
            if off != e * per_expert:
                raise ExpertWeightError(
                    f"grouped weight: {usage} scale offsets are not expert-major: expert {e} starts "
                    f"at byte {off}, expected {e * per_expert}"
                )
    if not gs.members:
        return
    if len(gs.members) != gs.num_tensors:
        raise ExpertWeightError(
            f"grouped weight: expected {gs.num_tensors} per-expert members; found {len(gs.members)}"
        )
    base = flat.data_ptr()
    for e, member in enumerate(gs.members):
        st = mxfp8_storage(member)
        scales = st.rowwise_scale_inv if usage == "rowwise" else st.columnwise_scale_inv
        if scales is None:
            raise ExpertWeightError(f"grouped weight: expert {e} has no {usage} scales")
        where = scales.data_ptr() - base
        if where != e * per_expert:
            found = f"byte {where} of it" if 0 <= where < flat.numel() else "outside it"
            raise ExpertWeightError(
                f"grouped weight: expert {e}'s {usage} scales are not packed expert-major in the "
                f"grouped buffer: expected byte {e * per_expert}, found {found}"
            )


def grouped_weight_view(
    weight: object,
    *,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached: GroupedExpertWeights | None = None,
    backend: str | None = None,
) -> GroupedExpertWeights:
    """Views over one grouped Parameter ``(E, rows, columns)`` (TE 2.13 ``data`` and 2.14+
    ``rowwise_data`` naming, via te_compat). With ``cached`` (a previous result), re-convert
    the scales into its buffers in place and return it. One kernel launch on the cuda backend."""
    if cached is not None and use_mxfp8 and _rerun(cached, _key([weight], num_experts, rows, columns), backend):
        return cached
    work: list[ScaleWork] = []
    result = _plan_grouped(weight, num_experts, rows, columns, use_mxfp8, cached, work)
    prepared = PreparedWork(work, backend)
    prepared.run()
    if use_mxfp8:
        _remember(result, _key([weight], num_experts, rows, columns), prepared)
    return result


def _plan_grouped(
    weight: object,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached: GroupedExpertWeights | None,
    work: list[ScaleWork],
) -> GroupedExpertWeights:
    gs = grouped_storage(weight)
    _check_grouped(gs, num_experts, rows, columns)
    shape = (num_experts, rows, columns)
    if not use_mxfp8:
        if cached is not None:
            raise RefreshError("BF16 expert views are plain views of the parameter: nothing to refresh")
        if gs.quantized:
            raise ExpertWeightError("grouped weight is quantized (it has a quantizer); pass use_mxfp8=True")
        data = gs.need(StorageName.ROWWISE_DATA)
        return GroupedExpertWeights(
            num_experts, rows, columns, False, storage_view(data, shape, dtype=data.dtype, name="grouped rowwise data")
        )
    _check_mxfp8_dims(rows, columns, "grouped weight")
    if not gs.quantized:
        raise ExpertWeightError("grouped weight holds no quantized data (no quantizer); pass use_mxfp8=False")
    if gs.members and tensor_kind(gs.members[0]) is not TensorKind.MXFP8:
        raise ExpertWeightError(f"grouped weight: expected MXFP8 experts; found {type(gs.members[0]).__name__} members")
    if cached is not None:
        _check_cached(cached, GroupedExpertWeights, num_experts, rows, columns)
    row_data = storage_view(gs.need(StorageName.ROWWISE_DATA), shape, dtype=FP8_DTYPE, name="grouped rowwise data")
    if cached is not None and cached.row_data.data_ptr() != row_data.data_ptr():
        raise RefreshError(_moved("grouped rowwise data", cached.row_data, row_data))
    pr, pc = te_rowwise_padding(rows, columns)
    flat = gs.need(StorageName.ROWWISE_SCALE_INV)
    padded = grouped_scales(flat, num_experts, pr, pc, "grouped rowwise scales")
    _check_packing(gs, "rowwise", flat, pr * pc)
    row_scales, row_zc = _convert(
        padded,
        padded[:, :rows, : columns // MXFP8_BLOCK],
        gs.scales_swizzled,
        cached.row_scales if cached else None,
        bool(cached and cached.row_scales_zero_copy),
        "grouped rowwise scales",
        work,
    )
    col_data = col_scales = None
    col_zc = False
    if gs.columnwise_data is not None:
        col_data = storage_view(gs.columnwise_data, shape, dtype=FP8_DTYPE, name="grouped columnwise data")
        if cached is not None and (cached.col_data is None or cached.col_data.data_ptr() != col_data.data_ptr()):
            raise RefreshError(_moved("grouped columnwise data", cached.col_data, col_data))
        pr, pc = te_columnwise_padding(rows, columns)
        flat = gs.need(StorageName.COLUMNWISE_SCALE_INV)
        padded = grouped_scales(flat, num_experts, pr, pc, "grouped columnwise scales")
        _check_packing(gs, "columnwise", flat, pr * pc)
        col_scales, col_zc = _convert(
            padded,
            padded[:, : rows // MXFP8_BLOCK, :columns].transpose(1, 2),
            gs.scales_swizzled,
            cached.col_scales if cached else None,
            bool(cached and cached.col_scales_zero_copy),
            "grouped columnwise scales",
            work,
        )
    elif cached is not None and cached.col_data is not None:
        raise RefreshError("grouped weight: the cached view has columnwise data, the weight no longer does")
    if cached is not None:
        return cached
    return GroupedExpertWeights(
        num_experts, rows, columns, True, row_data, row_scales, col_data, col_scales, row_zc, col_zc
    )


# ------------------------------------------------------------------------------ per expert


def _moved(name: str, old: torch.Tensor | None, new: torch.Tensor | None) -> str:
    def addr(t: torch.Tensor | None) -> str:
        return "none" if t is None else hex(t.data_ptr())

    return (
        f"{name} moved from {addr(old)} to {addr(new)} since the cached view was built; its pointer "
        "tables would be stale. Build a new view (without cached=)"
    )


def _check_cached(cached: object, cls: type, num_experts: int, rows: int, columns: int) -> None:
    if not isinstance(cached, cls):
        raise RefreshError(f"cached: expected a {cls.__name__} from an earlier call; found {type(cached).__name__}")
    if not cached.use_mxfp8:  # type: ignore[attr-defined]
        raise RefreshError("cached view is a BF16 view: nothing to refresh")
    got = (cached.num_experts, cached.rows, cached.columns)  # type: ignore[attr-defined]
    if got != (num_experts, rows, columns):
        raise RefreshError(
            f"cached view was built for (experts, rows, columns) = {got}; asked for {(num_experts, rows, columns)}"
        )


def _ptr_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


def _expert_mxfp8(e: int, p: object, rows: int, columns: int):  # type: ignore[no-untyped-def]
    kind = tensor_kind(p)
    if kind is not TensorKind.MXFP8:
        quantizer = (
            storage_field(p, StorageName.QUANTIZER)
            if kind not in (TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED)
            else None
        )
        extra = f", quantizer {type(quantizer).__name__}" if quantizer is not None else ""
        raise ExpertWeightError(
            f"expert {e}: expected an MXFP8 parameter; found {type(p).__name__} (kind {kind}{extra})"
        )
    st = mxfp8_storage(p)
    if tuple(st.shape) != (rows, columns):
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(st.shape)}")
    return st


def _per_expert_outs(count: int, r: int, c: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    buffer = torch.empty(layout_shape(r, c, count), dtype=torch.uint8, device=device)
    return tuple(buffer.chunk(count, dim=0))


def _convert_split(
    te_buffers: list[torch.Tensor],
    logical: list[torch.Tensor],
    swizzled: list[bool],
    outs: tuple[torch.Tensor, ...] | None,
    outs_are_te: bool,
    name: str,
    work: list[ScaleWork],
) -> tuple[tuple[torch.Tensor, ...], bool]:
    r, c = logical[0].shape
    shape = layout_shape(r, c)
    count = len(logical)
    if outs is None:
        if (
            all(swizzled)
            and (r, c) == padded_shape(r, c)
            and all(b.is_contiguous() and b.numel() == math.prod(shape) for b in te_buffers)
        ):
            return tuple(b.view(shape) for b in te_buffers), True
        outs = _per_expert_outs(count, r, c, logical[0].device)
    elif outs_are_te and not all(swizzled):
        e = swizzled.index(False)
        raise RefreshError(
            f"{name}: the cached view exposes TE's own swizzled buffers, but expert {e} now holds "
            "unswizzled scales; build a new view (without cached=)"
        )
    for e in range(count):
        if not swizzled[e]:
            check_out(outs[e], logical[e].unsqueeze(0), f"expert {e} {name}")
            work.append(ScaleWork(logical[e].unsqueeze(0), outs[e]))
        elif outs[e].data_ptr() != te_buffers[e].data_ptr():
            if te_buffers[e].numel() != math.prod(shape) or not te_buffers[e].is_contiguous():
                raise LayoutError(
                    f"{name}: expert {e}'s scales are marked swizzled, so its buffer should be exactly "
                    f"the layout {shape}; found {tuple(te_buffers[e].shape)}"
                )
            work.append(ScaleWork(te_buffers[e].view(shape), outs[e], copy=True))
    return outs, outs_are_te


def split_weight_view(
    params: Sequence[object],
    *,
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached: SplitExpertWeights | None = None,
    backend: str | None = None,
) -> SplitExpertWeights:
    """Views over one Parameter per expert, each ``(rows, columns)``, with pointer tables.

    With ``cached`` (a previous result), re-convert the scales into its buffers in place (same
    addresses) after checking that no payload moved, and return it. All experts' scales are
    converted in one kernel launch on the cuda backend.
    """
    params = list(params)
    if cached is not None and use_mxfp8 and _rerun(cached, _key(params, rows, columns), backend):
        return cached
    work: list[ScaleWork] = []
    result = _plan_split(params, rows, columns, use_mxfp8, cached, work)
    prepared = PreparedWork(work, backend)
    prepared.run()
    if use_mxfp8:
        _remember(result, _key(params, rows, columns), prepared)
    return result


def _plan_split(
    params: Sequence[object],
    rows: int,
    columns: int,
    use_mxfp8: bool,
    cached: SplitExpertWeights | None,
    work: list[ScaleWork],
) -> SplitExpertWeights:
    params = list(params)
    if not params:
        raise ExpertWeightError("split_weight_view: expected at least one expert parameter; found none")
    count = len(params)
    if not use_mxfp8:
        if cached is not None:
            raise RefreshError("BF16 expert views are plain views of the parameters: nothing to refresh")
        views = []
        for e, p in enumerate(params):
            kind = tensor_kind(p)
            if kind is not TensorKind.PLAIN:
                raise ExpertWeightError(
                    f"expert {e}: expected a plain (BF16) parameter; found {type(p).__name__} (kind {kind}); "
                    "pass use_mxfp8=True for MXFP8 weights"
                )
            assert isinstance(p, torch.Tensor)
            if tuple(p.shape) != (rows, columns):
                raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(p.shape)}")
            views.append(storage_view(p, (rows, columns), dtype=p.dtype, name=f"expert {e} weight"))
        _same_device(views)
        return SplitExpertWeights(count, rows, columns, False, tuple(views), _ptr_table(views, views[0].device))
    _check_mxfp8_dims(rows, columns, "split weights")
    if cached is not None:
        _check_cached(cached, SplitExpertWeights, count, rows, columns)
    storages = [_expert_mxfp8(e, p, rows, columns) for e, p in enumerate(params)]
    row_data = tuple(
        storage_view(
            st.need(StorageName.ROWWISE_DATA), (rows, columns), dtype=FP8_DTYPE, name=f"expert {e} rowwise data"
        )
        for e, st in enumerate(storages)
    )
    device = _same_device(row_data)
    if cached is not None:
        _check_not_moved("rowwise data", cached.row_data, row_data)
    swizzled = [st.scales_swizzled for st in storages]
    row_bufs = [st.need(StorageName.ROWWISE_SCALE_INV) for st in storages]
    row_scales, row_zc = _convert_split(
        row_bufs,
        [rowwise_scales(b, rows, columns, f"expert {e} rowwise scales") for e, b in enumerate(row_bufs)],
        swizzled,
        cached.row_scales if cached else None,
        bool(cached and cached.row_scales_zero_copy),
        "rowwise scales",
        work,
    )
    has_col = [st.columnwise_data is not None for st in storages]
    col_data = col_scales = None
    col_zc = False
    if any(has_col):
        if not all(has_col):
            raise ExpertWeightError(f"expert {has_col.index(False)} has no columnwise data; the others do")
        col_data = tuple(
            storage_view(
                st.need(StorageName.COLUMNWISE_DATA),
                (rows, columns),
                dtype=FP8_DTYPE,
                name=f"expert {e} columnwise data",
            )
            for e, st in enumerate(storages)
        )
        if cached is not None:
            _check_not_moved("columnwise data", cached.col_data, col_data)
        col_bufs = [st.need(StorageName.COLUMNWISE_SCALE_INV) for st in storages]
        col_scales, col_zc = _convert_split(
            col_bufs,
            [columnwise_scales(b, rows, columns, f"expert {e} columnwise scales") for e, b in enumerate(col_bufs)],
            swizzled,
            cached.col_scales if cached else None,
            bool(cached and cached.col_scales_zero_copy),
            "columnwise scales",
            work,
        )
    elif cached is not None and cached.col_data is not None:
        raise RefreshError("the cached view has columnwise data; the experts no longer do")
    if cached is not None:
        return cached
    return SplitExpertWeights(
        count,
        rows,
        columns,
        True,
        row_data,
        _ptr_table(row_data, device),
        row_scales,
        _ptr_table(row_scales, device),
        col_data,
        _ptr_table(col_data, device) if col_data else None,
        col_scales,
        _ptr_table(col_scales, device) if col_scales else None,
        row_zc,
        col_zc,
    )


def _same_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    device = tensors[0].device
    for e, t in enumerate(tensors):
        if t.device != device:
            raise ExpertWeightError(f"expert {e} is on {t.device}; expected every expert on {device}")
    return device


def _check_not_moved(name: str, old: tuple[torch.Tensor, ...] | None, new: tuple[torch.Tensor, ...]) -> None:
    if old is None or len(old) != len(new):
        raise RefreshError(f"cached view has no {name} for {len(new)} experts; build a new view")
    for e, (a, b) in enumerate(zip(old, new, strict=True)):
        if a.data_ptr() != b.data_ptr():
            raise RefreshError(_moved(f"expert {e} {name}", a, b))


# ------------------------------------------------------------------------------ one launch per layer

LayerEntry = tuple[object, "GroupedExpertWeights | SplitExpertWeights"]


def _entry_key(weight: object, cached: object) -> tuple[Any, ...] | None:
    if isinstance(cached, GroupedExpertWeights):
        inner = _key([weight], cached.num_experts, cached.rows, cached.columns)
    elif isinstance(cached, SplitExpertWeights) and isinstance(weight, Sequence):
        inner = _key(list(weight), cached.rows, cached.columns)
    else:
        return None
    return None if inner is None else (id(cached), inner)


def refresh_layer(entries: Sequence[LayerEntry], *, backend: str | None = None) -> None:
    """Refresh every cached MXFP8 view of a layer in ONE kernel launch.

    ``entries`` pairs each weight with its cached view: ``(grouped_parameter, GroupedExpertWeights)``
    or ``(list_of_expert_parameters, SplitExpertWeights)``, any mix (fc1 and fc2, grouped and per
    expert; rowwise and columnwise scales are all included). Every check of the single-view
    refresh runs first; nothing is written unless all entries pass. When no TE buffer changed
    since the last call with these views, the prepared launch runs again without any planning.
    """
    if not entries:
        return
    holder = entries[0][1]
    keys = tuple(_entry_key(w, c) for w, c in entries)
    plan = getattr(holder, "_refresh", {}).get("layer")
    if plan is not None and None not in keys and plan[0] == keys and plan[1].backend == backend:
        plan[1].run()
        return
    work: list[ScaleWork] = []
    for i, (weight, cached) in enumerate(entries):
        try:
            if isinstance(cached, GroupedExpertWeights):
                _plan_grouped(weight, cached.num_experts, cached.rows, cached.columns, True, cached, work)
            elif isinstance(cached, SplitExpertWeights):
                if not isinstance(weight, Sequence):
                    raise RefreshError(f"expected the list of expert parameters; found {type(weight).__name__}")
                _plan_split(weight, cached.rows, cached.columns, True, cached, work)
            else:
                raise RefreshError(
                    f"expected a GroupedExpertWeights or SplitExpertWeights view; found {type(cached).__name__}"
                )
        except (RefreshError, ExpertWeightError, LayoutError) as exc:
            raise type(exc)(f"refresh_layer entry {i}: {exc}") from exc
    prepared = PreparedWork(work, backend)
    prepared.run()
    keys = tuple(_entry_key(w, c) for w, c in entries)
    if None not in keys:
        _remember(holder, keys, prepared, "layer")
