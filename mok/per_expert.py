"""Views over one Parameter per expert, with device pointer tables for a kernel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mok.errors import ExpertWeightError, RefreshError
from mok.formats import FORMATS, Direction, WeightFormat
from mok.formats import format_named as _format
from mok.plan import ScaleSource
from mok.swizzle import ScaleWork
from mok.views import (
    Side,
    SplitExpertWeights,
    check_cached,
    check_sizes,
    param_list,
    plan_sides,
    ptr_table,
    same_device,
    storage_view,
)
from te_compat import StorageName, TensorKind, storage_field, tensor_kind
from te_compat import snapshots as te_snapshots


def _expert_storage(e: int, p: object, fmt: WeightFormat, rows: int, columns: int) -> Any:
    if p is None or not isinstance(p, torch.Tensor):
        raise ExpertWeightError(f"expert {e}: expected an {fmt.name.upper()} parameter; found {type(p).__name__}")
    kind = tensor_kind(p)
    if kind is not fmt.kind:
        quantizer = (
            storage_field(p, StorageName.QUANTIZER)
            if kind not in (TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED)
            else None
        )
        extra = f", quantizer {type(quantizer).__name__}" if quantizer is not None else ""
        raise ExpertWeightError(
            f"expert {e}: expected an {fmt.name.upper()} parameter; found {type(p).__name__} (kind {kind}{extra})"
        )
    snapshot = te_snapshots.mxfp8_storage if fmt.name == "mxfp8" else te_snapshots.nvfp4_storage
    st = snapshot(p)
    if st.shape != (rows, columns):
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(st.shape)}")
    return st


def _split_side(storages: Sequence[Any], fmt: WeightFormat, d: Direction, rows: int, columns: int) -> Side | None:
    data_name, scales_name = str(d.data), str(d.scales)
    payloads = [getattr(st, data_name) for st in storages]
    present = [t is not None for t in payloads]
    if not any(present):
        return None
    if not all(present):
        raise ExpertWeightError(f"expert {present.index(False)} has no {d.name} data; the others do")
    shape, dtype, logical = fmt.payload_shape(d, rows, columns), fmt.payload_dtype, fmt.logical_scales
    data, sources = [], []
    for e, (st, payload) in enumerate(zip(storages, payloads, strict=True)):
        data.append(storage_view(payload, shape, dtype=dtype, name=f"expert {e} {d.name} data"))
        buf = getattr(st, scales_name)
        name = f"expert {e} {d.name} scales"
        if buf is None:
            st.need(scales_name)  # raises, naming the attribute and release
        sources.append(ScaleSource(name, buf, logical(d, buf, rows, columns, name), st.scales_swizzled))
    amax = tuple(st.need(str(d.amax)) for st in storages) if d.amax else None
    return Side(d, tuple(data), tuple(sources), amax)


def plan_split(
    params: Sequence[object], fmt: WeightFormat, rows: int, columns: int, cached: SplitExpertWeights | None
) -> tuple[SplitExpertWeights, list[ScaleWork]]:
    fmt.check_dims(rows, columns, "split weights")
    storages = [_expert_storage(e, p, fmt, rows, columns) for e, p in enumerate(params)]
    sides = [s for d in fmt.directions() if (s := _split_side(storages, fmt, d, rows, columns)) is not None]
    if not sides or sides[0].direction.name != "rowwise":
        storages[0].need(StorageName.ROWWISE_DATA.value)
    device = same_device(sides[0].data)
    slots, work = plan_sides(sides, cached, "")
    if cached is not None:
        return cached, work
    fields: dict[str, Any] = {}
    for side, slot in zip(sides, slots, strict=True):
        p = "row" if side.direction.name == "rowwise" else "col"
        fields.update(
            {
                f"{p}_data": side.data,
                f"{p}_data_ptrs": ptr_table(side.data, device),
                f"{p}_scales": slot.tensors,
                f"{p}_scale_ptrs": ptr_table(slot.tensors, device),
                f"{p}_scales_zero_copy": slot.zero_copy,
            }
        )
        if side.amax is not None:
            fields.update({f"{p}_amax": side.amax, f"{p}_amax_ptrs": ptr_table(side.amax, device)})
    return SplitExpertWeights(len(params), rows, columns, fmt.name == "mxfp8", format=fmt.name, **fields), work


def _split_bf16(params: Sequence[object], rows: int, columns: int, cached: object) -> SplitExpertWeights:
    if cached is not None:
        raise RefreshError("BF16 expert views are plain views of the parameters: nothing to refresh")
    views = []
    for e, p in enumerate(params):
        kind = tensor_kind(p)
        if kind is not TensorKind.PLAIN:
            raise ExpertWeightError(
                f"expert {e}: expected a plain (BF16) parameter; found {type(p).__name__} (kind {kind}); "
                "pass use_mxfp8=True or format= for quantized weights"
            )
        assert isinstance(p, torch.Tensor)
        if tuple(p.shape) != (rows, columns):
            raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(p.shape)}")
        views.append(storage_view(p, (rows, columns), dtype=p.dtype, name=f"expert {e} weight"))
    device = same_device(views)
    return SplitExpertWeights(len(views), rows, columns, False, tuple(views), ptr_table(views, device), format="bf16")


def split_weight_view(
    params: Sequence[object],
    *,
    rows: int,
    columns: int,
    use_mxfp8: bool | None = None,
    format: str | None = None,
    cached: SplitExpertWeights | None = None,
    backend: str | None = None,
) -> SplitExpertWeights:
    """Views over one Parameter per expert, each ``(rows, columns)``, with pointer tables.

    ``format``: "bf16", "mxfp8" or "nvfp4" (default from the seed's ``use_mxfp8``). With
    ``cached`` (a previous result), refresh its scale buffers in place (same addresses) after
    checking that no payload moved, and return it: when TE reassigned no storage since, the
    prepared launch simply runs again. All experts convert in one kernel launch (cuda backend).
    """
    fmt = _format(format, use_mxfp8)
    rows, columns = check_sizes(rows=rows, columns=columns)
    params = param_list(params)
    if fmt == "bf16":
        return _split_bf16(params, rows, columns, cached)
    key = ("split", fmt, rows, columns, backend)
    if cached is not None:
        check_cached(cached, SplitExpertWeights, fmt, (len(params), rows, columns))
        if cached.refresh_plan.rerun(params, key):
            return cached
    view, work = plan_split(params, FORMATS[fmt], rows, columns, cached)
    view.refresh_plan.prepare(params, key, work, backend)
    return view
