"""Views over one Parameter per expert, with device pointer tables for a kernel."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import torch

from mok.backend import preference
from mok.errors import ExpertWeightError, RefreshError
from mok.formats import FORMAT_OF_KIND, FORMATS, Direction, WeightFormat
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
    storage_views,
)
from te_compat import (
    StorageName,
    TensorKind,
    hybrid_storage,
    storage_field,
    storage_reader,
    storage_values,
    tensor_kind,
)

_shape = attrgetter("shape")


class ExpertStorage(NamedTuple):
    """The storage of every expert, by logical name: one value per expert (None where absent)."""

    owners: tuple[object, ...]
    values: dict[str, tuple[Any, ...]]

    def column(self, name: str) -> tuple[Any, ...]:
        return self.values.get(name) or (None,) * len(self.owners)

    def need(self, fmt: WeightFormat, name: str) -> tuple[Any, ...]:
        """The column ``name``; te_compat's error naming attribute, class and release if an
        expert lacks it."""
        column = self.column(name)
        if any(v is None for v in column):
            pairs = zip(self.owners, column, strict=True)
            return tuple(v if v is not None else fmt.snapshot(o).need(name) for o, v in pairs)
        return column


def _expert_storage(e: int, p: object, fmt: WeightFormat, rows: int, columns: int) -> dict[str, Any]:
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
    values = storage_values(p, fmt.storage_names)
    if p.shape != (rows, columns):
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(p.shape)}")
    return values


def _read_experts(params: Sequence[object], fmt: WeightFormat, rows: int, columns: int) -> ExpertStorage:
    """Every expert's storage. Experts of one class with the expected kind and shape are read in
    bulk (a class check, then one C-level read per expert); anything else expert by expert,
    which raises naming the first expert that is wrong."""
    if len(set(map(type, params))) == 1 and isinstance(params[0], torch.Tensor) and tensor_kind(params[0]) is fmt.kind:
        reader = storage_reader(params[0], fmt.storage_names)
        if all(s == (rows, columns) for s in map(_shape, params)):
            try:
                read = list(map(reader.read, params))
            except AttributeError:  # storage kept on .data only: read below, name by name
                pass
            else:
                return ExpertStorage(tuple(params), dict(zip(reader.names, zip(*read, strict=True), strict=True)))
    storages = [_expert_storage(e, p, fmt, rows, columns) for e, p in enumerate(params)]
    return _columns(params, storages, fmt.storage_names)


def _columns(owners: Sequence[object], storages: Sequence[dict[str, Any]], names: Sequence[str]) -> ExpertStorage:
    return ExpertStorage(tuple(owners), {name: tuple(st.get(name) for st in storages) for name in names})


def _split_side(storage: ExpertStorage, fmt: WeightFormat, d: Direction, rows: int, columns: int) -> Side | None:
    """One direction of every expert."""
    payloads = storage.column(str(d.data))
    present = [t is not None for t in payloads]
    if not any(present):
        return None
    if not all(present):
        raise ExpertWeightError(f"expert {present.index(False)} has no {d.name} data; the others do")
    shape = fmt.payload_shape(d, rows, columns)
    data = storage_views(payloads, shape, dtype=fmt.payload_dtype, name=lambda e: f"expert {e} {d.name} data")
    buffers = storage.need(fmt, str(d.scales))
    names = [f"expert {e} {d.name} scales" for e in range(len(buffers))]
    flags = map(bool, storage.column("scales_swizzled"))
    found = fmt.scale_sources(d, buffers, rows, columns, names)
    sources = tuple(ScaleSource(n, b, g, f) for n, (b, g), f in zip(names, found, flags, strict=True))
    amax = storage.need(fmt, str(d.amax)) if d.amax is not None else None
    return Side(d, fmt.name, data, sources, amax)


def _format_sides(params: Sequence[object], fmt: WeightFormat, rows: int, columns: int) -> list[Side]:
    fmt.check_dims(rows, columns, "split weights")
    storage = _read_experts(params, fmt, rows, columns)
    sides = [s for d in fmt.directions() if (s := _split_side(storage, fmt, d, rows, columns)) is not None]
    if not sides or sides[0].direction.name != "rowwise":
        storage.need(fmt, str(StorageName.ROWWISE_DATA))
    return sides


def _hybrid_sides(params: Sequence[object], rows: int, columns: int) -> list[Side]:
    """TE 2.19+ hybrid weights: each direction read off its own sub-storage, in its own format."""
    hybrids = []
    for e, p in enumerate(params):
        if tensor_kind(p) is not TensorKind.HYBRID:
            raise ExpertWeightError(f"expert {e}: expected a hybrid parameter; found {type(p).__name__}")
        hybrids.append(hybrid_storage(p))
    sides = []
    for d_name in ("rowwise", "columnwise"):
        subs = [getattr(h, d_name) for h in hybrids]
        if all(s is None for s in subs):
            continue
        kinds = [getattr(h, f"{d_name}_kind") for h in hybrids]
        fmt = FORMAT_OF_KIND.get(kinds[0])
        if fmt is None or any(k is not kinds[0] for k in kinds):
            e = next((i for i, k in enumerate(kinds) if k is not kinds[0]), 0)
            h = hybrids[e]
            raise ExpertWeightError(
                f"expert {e}: hybrid weight with rowwise {h.rowwise_kind} and columnwise {h.columnwise_kind} "
                f"storage; mok views MXFP8 or NVFP4 in each direction, the same for every expert"
            )
        fmt.check_dims(rows, columns, "hybrid weights")
        storages = [_sub_storage(e, s, fmt, rows, columns, d_name) for e, s in enumerate(subs)]
        direction = fmt.rowwise if d_name == "rowwise" else fmt.columnwise
        side = _split_side(_columns(subs, storages, fmt.storage_names), fmt, direction, rows, columns)
        if side is None:
            raise ExpertWeightError(f"hybrid weights: the {d_name} sub-storages hold no {d_name} data")
        sides.append(side)
    if not sides:
        hybrids[0].need("rowwise")
    return sides


def _sub_storage(e: int, sub: object, fmt: WeightFormat, rows: int, columns: int, d_name: str) -> dict[str, Any]:
    if sub is None:
        raise ExpertWeightError(f"expert {e} has no {d_name} sub-storage; the others do")
    st: Any = fmt.snapshot(sub)  # a sub-storage has no .shape: the snapshot derives it
    if st.shape != (rows, columns):
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(st.shape)}")
    return {name: getattr(st, name) for name in fmt.storage_names}


def watched(params: Sequence[object], fmt: str) -> Sequence[object]:
    """What a refresh guard watches: the parameters and, for hybrids, their sub-storages too
    (TE may reassign a buffer inside a sub-storage without touching the hybrid)."""
    if fmt != "hybrid":
        return params
    subs = [v for p in params for v in (storage_field(p, "rowwise_storage"), storage_field(p, "columnwise_storage"))]
    return [*params, *(s for s in subs if s is not None)]


def guarded_names(view: SplitExpertWeights) -> tuple[str, ...] | None:
    """The storage a refresh of ``view`` depends on: its directions' payloads, scales and amax,
    and TE's swizzled flag (None for hybrids: their guard reads everything)."""
    if view.format == "hybrid":
        return None
    fmt = FORMATS[view.format]
    present = ((fmt.rowwise, view.row_data), (fmt.columnwise, view.col_data))
    return fmt.names_of([d for d, data in present if data is not None])


def plan_split(
    params: Sequence[object], fmt: str, rows: int, columns: int, cached: SplitExpertWeights | None
) -> tuple[SplitExpertWeights, list[ScaleWork]]:
    sides = (
        _hybrid_sides(params, rows, columns) if fmt == "hybrid" else _format_sides(params, FORMATS[fmt], rows, columns)
    )
    device = same_device(sides[0].data)
    slots, work = plan_sides(sides, cached, "")
    if cached is not None:
        return cached, work
    fields: dict[str, Any] = {}
    for side, slot in zip(sides, slots, strict=True):
        p = "row" if side.direction.name == "rowwise" else "col"
        fields.update(
            {
                f"{p}_format": side.format,
                f"{p}_data": side.data,
                f"{p}_data_ptrs": ptr_table(side.data, device),
                f"{p}_scales": slot.tensors,
                f"{p}_scale_ptrs": ptr_table(slot.tensors, device),
                f"{p}_scales_zero_copy": slot.zero_copy,
            }
        )
        if side.amax is not None:
            fields.update({f"{p}_amax": side.amax, f"{p}_amax_ptrs": ptr_table(side.amax, device)})
    return SplitExpertWeights(len(params), rows, columns, fmt == "mxfp8", format=fmt, **fields), work


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
        views.append(storage_view(p, (rows, columns), dtype=torch.bfloat16, name=f"expert {e} weight"))
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

    ``format``: "bf16", "mxfp8", "nvfp4", or "hybrid" for TE 2.19+ hybrid weights, each direction
    in its own format (``row_format``/``col_format``); default from the seed's ``use_mxfp8``. With
    ``cached`` (a previous result), refresh its scale buffers in place (same addresses) after
    checking that no payload moved, and return it: when TE reassigned no storage since, the
    prepared launch simply runs again. All experts convert in one kernel launch (cuda backend).

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers is not: the check can pass just
    before TE moves a buffer, and the launch then reads the old one. Order the two yourself.
    """
    fmt = _format(format, use_mxfp8)
    rows, columns = check_sizes(rows=rows, columns=columns)
    params = param_list(params)
    if fmt == "bf16":
        return _split_bf16(params, rows, columns, cached)
    key = ("split", fmt, rows, columns, preference(backend))  # a changed TE_COMPAT_KERNEL_BACKEND re-plans
    if cached is not None:
        check_cached(cached, SplitExpertWeights, fmt, (len(params), rows, columns))
        if cached.refresh_plan.rerun(watched(params, fmt), key):
            return cached
    view, work = plan_split(params, fmt, rows, columns, cached)
    view.refresh_plan.prepare(watched(params, fmt), key, work, backend, guarded_names(view))
    return view
