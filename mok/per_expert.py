"""Views over one Parameter per expert, with device pointer tables for a kernel: every expert's
storage read through te_compat, in bulk where the experts allow it, then planned by mok.plan.

Each direction is read off the objects that store it in its block format: the parameters
themselves (MXFP8, NVFP4), or, for TE 2.19+ hybrid weights, each direction's sub-storage, in its
own format. One path serves both.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import torch

from mok.backend import preference
from mok.checks import describe
from mok.errors import ExpertWeightError, RefreshError
from mok.formats import FORMAT_OF_KIND, BlockFormat, Direction, Format, format_named
from mok.plan import DirectionSource, ScaleSource, ViewRequest, check_cached, plan_view
from mok.views import (
    SplitExpertWeights,
    ViewDirection,
    check_sizes,
    param_list,
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

    def need(self, block: BlockFormat, name: str) -> tuple[Any, ...]:
        """The column ``name``; te_compat's error naming attribute, class and release if an
        expert lacks it."""
        column = self.column(name)
        if any(v is None for v in column):
            pairs = zip(self.owners, column, strict=True)
            return tuple(v if v is not None else block.snapshot(o).need(name) for o, v in pairs)
        return column


class StoredGroup(NamedTuple):
    """Objects storing some directions of every expert in one block format: the parameters
    themselves, or each expert's sub-storage of one direction (hybrid weights)."""

    owners: tuple[object, ...]
    block: BlockFormat
    directions: tuple[Direction, ...]


def _shape_of(owner: object, block: BlockFormat) -> tuple[int, ...]:
    """The logical shape of an expert; a TE storage object (a hybrid direction) has none, so its
    snapshot derives it from the payload."""
    shape = getattr(owner, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else tuple(block.snapshot(owner).shape)


def _check_expert(e: int, p: object, block: BlockFormat, rows: int, columns: int) -> None:
    kind = tensor_kind(p)
    if kind is not block.kind:
        quantizer = (
            storage_field(p, StorageName.QUANTIZER)
            if kind not in (TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED)
            else None
        )
        extra = f", quantizer {type(quantizer).__name__}" if quantizer is not None else ""
        raise ExpertWeightError(
            f"expert {e}: expected an {block.format.name} parameter; found {type(p).__name__} (kind {kind}{extra})"
        )
    shape = _shape_of(p, block)
    if shape != (rows, columns):
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {shape}")


def _read_experts(group: StoredGroup, rows: int, columns: int) -> ExpertStorage:
    """Every expert's storage. Experts of one class with the expected kind and shape are read in
    bulk (a class check, then one C-level read per expert); anything else expert by expert,
    which raises naming the first expert that is wrong."""
    owners, block = group.owners, group.block
    names = block.names_of(group.directions)
    first = owners[0]
    if len(set(map(type, owners))) == 1 and tensor_kind(first) is block.kind and hasattr(first, "shape"):
        reader = storage_reader(first, names)
        if all(s == (rows, columns) for s in map(_shape, owners)):
            try:
                read = list(map(reader.read, owners))
            except AttributeError:  # storage kept on .data only: read below, name by name
                pass
            else:
                return ExpertStorage(owners, dict(zip(reader.names, zip(*read, strict=True), strict=True)))
    storages = []
    for e, p in enumerate(owners):
        _check_expert(e, p, block, rows, columns)
        storages.append(storage_values(p, names))
    return ExpertStorage(owners, {name: tuple(st.get(name) for st in storages) for name in names})


def _swizzled_flags(storage: ExpertStorage) -> tuple[bool, ...]:
    """TE's swizzled-scales flag of every expert (False where the release has none); a flag that
    is not a bool is refused, never read as ``bool()`` (the string "False" is truthy)."""
    flags = storage.column(str(StorageName.SCALES_SWIZZLED))
    if not set(map(type, flags)) <= {bool, type(None)}:  # one set of classes, not a loop of 256 checks
        e = next(i for i, flag in enumerate(flags) if flag is not None and not isinstance(flag, bool))
        raise ExpertWeightError(
            f"expert {e}: TE's swizzled-scales flag ({type(storage.owners[e]).__name__}) is "
            f"{describe(flags[e])}; expected a bool"
        )
    return tuple(map(bool, flags))


def _direction_source(
    storage: ExpertStorage, block: BlockFormat, d: Direction, rows: int, columns: int
) -> DirectionSource | None:
    """One direction of every expert (None where no expert stores it)."""
    payloads = storage.column(str(d.data))
    present = [t is not None for t in payloads]
    if not any(present):
        return None
    if not all(present):
        raise ExpertWeightError(f"expert {present.index(False)} has no {d.name} data; the others do")
    shape = block.payload_shape(d, rows, columns)
    data = storage_views(payloads, shape, dtype=block.payload_dtype, name=lambda e: f"expert {e} {d.name} data")
    buffers = storage.need(block, str(d.scales))
    names = [f"expert {e} {d.name} scales" for e in range(len(buffers))]
    found = block.scale_sources(d, buffers, rows, columns, names)
    flags = _swizzled_flags(storage)
    sources = tuple(ScaleSource(n, b, g, f) for n, (b, g), f in zip(names, found, flags, strict=True))
    amax = storage.need(block, str(d.amax)) if d.amax is not None else None
    return DirectionSource(d, block.format, data, sources, amax)


def _hybrid_groups(params: Sequence[object]) -> list[StoredGroup]:
    """TE 2.19+ hybrid weights: each direction stored in its own sub-storage, in its own format."""
    hybrids = []
    for e, p in enumerate(params):
        if tensor_kind(p) is not TensorKind.HYBRID:
            raise ExpertWeightError(f"expert {e}: expected a hybrid parameter; found {type(p).__name__}")
        hybrids.append(hybrid_storage(p))
    groups = []
    for name in ("rowwise", "columnwise"):
        subs = tuple(getattr(h, name) for h in hybrids)
        if all(s is None for s in subs):
            if name == "rowwise":
                hybrids[0].need("rowwise")  # raises, naming the attribute and release
            continue
        kinds = [getattr(h, f"{name}_kind") for h in hybrids]
        block = FORMAT_OF_KIND.get(kinds[0])
        if block is None or any(k is not kinds[0] for k in kinds):
            e = next((i for i, k in enumerate(kinds) if k is not kinds[0]), 0)
            h = hybrids[e]
            raise ExpertWeightError(
                f"expert {e}: hybrid weight with rowwise {h.rowwise_kind} and columnwise {h.columnwise_kind} "
                f"storage; mok views MXFP8 or NVFP4 in each direction, the same for every expert"
            )
        if any(s is None for s in subs):
            raise ExpertWeightError(f"expert {subs.index(None)} has no {name} sub-storage; the others do")
        groups.append(StoredGroup(subs, block, (block.rowwise if name == "rowwise" else block.columnwise,)))
    return groups


def _stored_groups(params: Sequence[object], fmt: Format) -> list[StoredGroup]:
    if fmt is Format.HYBRID:
        return _hybrid_groups(params)
    block = fmt.block_format
    return [StoredGroup(tuple(params), block, block.directions())]


def read_split(params: Sequence[object], fmt: Format, rows: int, columns: int) -> list[DirectionSource]:
    """Every direction TE stores of the experts, rowwise first (a view needs it)."""
    sources: list[DirectionSource] = []
    for group in _stored_groups(params, fmt):
        group.block.check_dims(rows, columns, f"{fmt} weights")
        storage = _read_experts(group, rows, columns)
        for d in group.directions:
            source = _direction_source(storage, group.block, d, rows, columns)
            if source is None and fmt is Format.HYBRID:
                raise ExpertWeightError(f"hybrid weights: the {d.name} sub-storages hold no {d.name} data")
            if source is None and d.name == "rowwise":
                storage.need(group.block, str(d.data))  # raises, naming the attribute and release
            sources += [source] if source is not None else []
    same_device(sources[0].data)
    return sources


def watched(params: Sequence[object], fmt: Format) -> Sequence[object]:
    """What a refresh guard watches: the parameters and, for hybrids, their sub-storages too
    (TE may reassign a buffer inside a sub-storage without touching the hybrid)."""
    if fmt is not Format.HYBRID:
        return params
    subs = [v for p in params for v in (storage_field(p, "rowwise_storage"), storage_field(p, "columnwise_storage"))]
    return [*params, *(s for s in subs if s is not None)]


def guarded_names(fmt: Format, columnwise: bool) -> tuple[str, ...] | None:
    """The storage a refresh depends on: its directions' payloads, scales and amax, and TE's
    swizzled flag (None for hybrids: their guard reads everything)."""
    if fmt is Format.HYBRID:
        return None
    block = fmt.block_format
    return block.names_of((block.rowwise, block.columnwise) if columnwise else (block.rowwise,))


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
    rowwise = ViewDirection(Format.BF16, tuple(views), ptr_table(views, same_device(views)))
    return SplitExpertWeights(len(views), rows, columns, Format.BF16, rowwise)


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
    in its own format (``rowwise.format``/``columnwise.format``); default from the seed's
    ``use_mxfp8``. With ``cached`` (a previous result), refresh its scale buffers in place (same
    addresses) after checking that no payload moved, and return it: when TE reassigned no
    storage since, the prepared launch simply runs again. All experts convert in one kernel
    launch (cuda backend).

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers is not: the check can pass just
    before TE moves a buffer, and the launch then reads the old one. Order the two yourself.
    """
    fmt = format_named(format, use_mxfp8)
    rows, columns = check_sizes(rows=rows, columns=columns)
    params = param_list(params, tensors=cached is None or fmt in (Format.BF16, Format.HYBRID))
    if fmt is Format.BF16:
        preference(backend)  # checked on every path, though a BF16 view converts nothing
        return _split_bf16(params, rows, columns, cached)
    dims = (len(params), rows, columns)
    key = ("split", fmt, rows, columns, preference(backend))  # a changed TE_COMPAT_KERNEL_BACKEND re-plans
    weights = watched(params, fmt)
    if cached is not None:
        cached = check_cached(cached, SplitExpertWeights, fmt, dims)  # type: ignore[assignment]
        if cached.refresh_plan.rerun(weights, key):  # the same objects as planned: tensors
            return cached
        param_list(params)
    sources = read_split(params, fmt, rows, columns)
    names = guarded_names(fmt, len(sources) > 1)
    return plan_view(SplitExpertWeights, ViewRequest(dims, fmt, weights, key, names, backend), sources, cached)
