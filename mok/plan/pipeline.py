"""The one refresh pipeline: read TE once, plan from that read, prepare the launch, guard exactly
what was read.

Every view and every refresh goes through here, whatever reads the weights (mok.read.readers: one
Parameter per expert, one grouped Parameter, hybrid weights):

1. a refresh checks the prepared state: the same views, the same backend, and a guard that reads
   back what the last planning read (mok.plan.guard). Then it reruns the prepared launch: no reading
   of storage beyond that check, no planning, no allocation;
2. otherwise the reader reads the weights once into a :class:`~mok.read.reading.Snapshot`;
3. :func:`plan_directions` decides the layout buffers (new ones, the cached view's, or TE's own
   swizzled ones) and the work that fills them, from the snapshot alone;
4. the work is bound to the view's backend and run (mok.plan.work: one kernel launch on CUDA), and the
   view keeps it with a guard built from the snapshot's readings, never from a new read.

:func:`view_or_refresh` serves one view (split_weight_view, grouped_weight_view, mok.weights);
:func:`refresh` any number of cached views in one launch (a layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, ne
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from mok.backend import Backend, backend_for
from mok.errors import MokError, RefreshError
from mok.formats import Format
from mok.kernels.quantize import QuantizeOutputs, empty_outputs
from mok.layout import check_out, empty_layout, layout_shape, padded_shape, te_swizzled_layout
from mok.overlap import check_no_overlap
from mok.plan.guard import StorageGuard
from mok.plan.work import CallerWork, PreparedWork, QuantizeWork, ScaleWork
from mok.read.blocks import BLOCKS, Direction
from mok.read.memory import OWN_ADVICE, owned_memory, read_memory
from mok.read.reading import DirectionSource, Reading, ScaleSource, Snapshot
from mok.views import ExpertWeights, RefreshPlan, Shape, SplitExpertWeights, ViewDirection, ptr_table
from te_compat import TECompatError

V = TypeVar("V", bound=ExpertWeights)
V_co = TypeVar("V_co", bound=ExpertWeights, covariant=True)


class Reader(Protocol[V_co]):
    """What mok.read.readers provide: the view type they read for, and one read of the weights."""

    @property
    def view_type(self) -> type[V_co]: ...

    @property
    def what(self) -> str: ...  # how messages name the weights ("" or "grouped ")

    @property
    def objects(self) -> tuple[object, ...]: ...  # the caller's objects, compared by identity

    @property
    def shape(self) -> Shape: ...

    @property
    def format(self) -> object: ...

    def read(self) -> Snapshot: ...


class PreparedRefresh(NamedTuple):
    """What a refresh may rerun: the launch, for these views, on this backend, while the guard
    finds the storage it was planned from unchanged. Replaced whole when planned again."""

    views: tuple[int, ...]  # ids: the views own their plans, so no reference back to them
    guard: StorageGuard
    work: PreparedWork
    backend: Backend


# ------------------------------------------------------------------------------ planning


class ScaleSlots(NamedTuple):
    """The layout buffers of one direction of a view, one per source. ``zero_copy``: they are
    TE's own swizzled buffers (aligned shapes), so a refresh has nothing to convert."""

    tensors: tuple[torch.Tensor, ...]
    zero_copy: bool


_swizzled, _te_buffer, _geometry = attrgetter("swizzled"), attrgetter("te_buffer"), attrgetter("geometry")
_data_ptr = torch.Tensor.data_ptr


def _te_layout(source: ScaleSource, shape: tuple[int, ...]) -> torch.Tensor:
    return te_swizzled_layout(source.te_buffer, shape, source.name)


def _allocate(sources: Sequence[ScaleSource], r: int, c: int) -> tuple[torch.Tensor, ...]:
    """One buffer for every source's layout, split per source (expert-major)."""
    counts = [geometry[0][0] for geometry in map(_geometry, sources)]  # each source's experts
    whole = empty_layout(r, c, sum(counts), sources[0].te_buffer.device, sources[0].name)
    if len(counts) == 1:  # one source (a grouped weight's direction): its buffer is the whole
        return (whole,)
    per_expert_tiles = layout_shape(r, c)[0]
    return tuple(whole.split_with_sizes([n * per_expert_tiles for n in counts]))  # C, not torch.split's Python


class Move(NamedTuple):
    """Tensors of a cached view that alias TE's memory (payloads, amax, TE's own swizzled scales),
    the tensors a new view would hold there, and the view's pointer table listing them: where TE
    moved the memory (FSDP's next all-gather, a buffer reassigned), the view's tensors are
    pointed at the new memory and the table rewritten in place."""

    tensors: tuple[torch.Tensor, ...]
    targets: tuple[torch.Tensor, ...]
    table: torch.Tensor | None


def plan_scales(
    sources: Sequence[ScaleSource], slots: ScaleSlots | None, what: str
) -> tuple[ScaleSlots, list[ScaleWork], tuple[torch.Tensor, ...] | None]:
    """The layout buffers for ``sources`` (``slots`` to refresh in place, else new ones or TE's
    own), the work that fills them, and, where the buffers are TE's own, what they alias now.
    Every source has the same logical ``[R, C]``."""
    _, r, c = sources[0].geometry[0]
    aligned = (r, c) == padded_shape(r, c)
    if slots is None:
        if aligned and all(map(_swizzled, sources)):
            return (
                ScaleSlots(tuple(_te_layout(s, layout_shape(r, c, s.geometry[0][0])) for s in sources), True),
                [],
                None,
            )
        outs, checked = _allocate(sources, r, c), True
        if not any(map(_swizzled, sources)):  # the usual case: each source converted into its new buffer
            nothing = [False] * len(sources)  # neither copies nor inverse conversions
            buffers, geometries = map(_te_buffer, sources), map(_geometry, sources)
            # ScaleWork records made in C (a view of 256 experts makes 512; its constructor is Python)
            records = map(
                tuple.__new__, repeat(ScaleWork), zip(buffers, outs, nothing, geometries, nothing, strict=True)
            )
            return ScaleSlots(outs, False), list(records), None
    else:
        if len(slots.tensors) != len(sources):
            raise RefreshError(f"{what}: the cached view has {len(slots.tensors)} scale buffers; found {len(sources)}")
        if slots.zero_copy:
            if not all(s.swizzled for s in sources):
                bad = next(s.name for s in sources if not s.swizzled)
                raise RefreshError(
                    f"{bad}: the cached view exposes TE's own swizzled scale buffers, but TE now holds unswizzled "
                    "scales; writing the layout there would overwrite TE's storage. Build a new view (without cached=)"
                )
            return (
                slots,
                [],
                tuple(_te_layout(s, tuple(out.shape)) for s, out in zip(sources, slots.tensors, strict=True)),
            )
        outs, checked = slots.tensors, False
        read_memory(outs, lambda i: f"{sources[i].name} (the cached view's layout buffer)", OWN_ADVICE)
    work: list[ScaleWork] = []
    for source, out in zip(sources, outs, strict=True):
        if source.swizzled:
            if out.data_ptr() != source.te_buffer.data_ptr():
                work.append(ScaleWork(_te_layout(source, tuple(out.shape)), out, copy=True))
            continue
        if not checked:
            check_out(out, source.logical, source.name)
        work.append(ScaleWork(source.te_buffer, out, geometry=source.geometry))
    if not checked:  # a cached view's buffers: never over TE's scales, nor over each other
        check_no_overlap([w.dst for w in work], [w.src for w in work], what, out_label="cached buffers")
    return slots if slots is not None else ScaleSlots(outs, False), work, None


NEW_VIEW = "Build a new view (without cached=)"


def _same_count(
    what: str, old: tuple[torch.Tensor, ...] | None, new: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    if old is None or len(old) != len(new):
        found = "none" if old is None else len(old)
        raise RefreshError(f"{what}: the cached view has {found} of these; the weights have {len(new)}. {NEW_VIEW}")
    return old


def _plan_as_new(snapshot: Snapshot, what: str) -> None:
    """Plan ``snapshot`` as a new view would, raising what that raises: a refresh about to refuse
    something only a refresh refuses (the view cannot hold the weights) raises a new view's error
    instead, where a new view of the weights would refuse them too. Only a refusing refresh gets
    here; what it allocates is dropped."""
    if snapshot.bf16_to_quantize is None:
        plan_directions(snapshot.directions, None, what)


def check_kind(view: ExpertWeights, snapshot: Snapshot, what: str) -> None:
    """A cached view holds what a new view of the weights as read would: TE's storage (payloads
    at TE's memory), or BF16 weights mok quantises into buffers the view owns. Where the weights
    changed from one to the other, the view's buffers are the wrong ones: refused, saying so."""
    quantized = snapshot.bf16_to_quantize is not None
    if quantized == view.quantized_on_the_fly:
        return
    if quantized:
        found = "BF16 weights, which mok quantises to MXFP8 into buffers of a view's own"
        held = "views of TE's quantized storage"
    else:
        found = "TE's quantized storage, which a view shows in place"
        held = "mok's own buffers of BF16 weights it quantised"
    raise RefreshError(f"{what}weights: the weights are now {found}; the cached view holds {held}. {NEW_VIEW}")


def plan_directions(
    sources: Sequence[DirectionSource], cached: ExpertWeights | None, what: str
) -> tuple[list[ScaleSlots], list[ScaleWork], list[Move]]:
    """Every direction's scale buffers (the cached view's, or new ones), the work filling them,
    and, for a cached view, the tensors of it that must follow TE's memory."""
    all_slots: list[ScaleSlots] = []
    work: list[ScaleWork] = []
    moves: list[Move] = []
    for source in sources:
        name = source.direction.name
        old = None if cached is None else (cached.rowwise if name == "rowwise" else cached.columnwise)
        if cached is not None:
            if old is None:
                raise RefreshError(
                    f"{what}weights: TE now stores {name} data; the cached view was made without it and has no "
                    f"buffers for it. {NEW_VIEW}"
                )
            if old.format is not source.format:
                raise RefreshError(
                    f"{what}{name}: the weights are now {source.format.name}, the cached view holds "
                    f"{old.format.name} in buffers laid out for it. {NEW_VIEW}"
                )
            data = _same_count(f"{what}{name} data", old.data, source.data)
            moves.append(Move(data, source.data, old.data_ptrs))
            if source.amax is not None:
                moves.append(Move(_same_count(f"{what}{name} amax", old.amax, source.amax), source.amax, old.amax_ptrs))
        cached_slots = None if old is None else ScaleSlots(old.scales or (), old.scales_zero_copy)
        if source.format is Format.BF16:  # no scales
            all_slots.append(ScaleSlots((), False))
            continue
        slots, items, aliased = plan_scales(source.sources, cached_slots, f"{what}{name} scales")
        if aliased is not None and old is not None:
            moves.append(Move(slots.tensors, aliased, old.scale_ptrs))
        all_slots.append(slots)
        work.extend(items)
    if cached is not None and len(sources) < 2 and cached.columnwise is not None:
        raise RefreshError(
            f"{what}weights: the cached view has columnwise data; TE no longer stores it (kernels captured "
            f"with the view's columnwise tables would read stale memory). {NEW_VIEW}"
        )
    return all_slots, work, moves


def follow(moves: Sequence[Move]) -> None:
    """Point each view tensor whose memory TE moved at the new memory (same tensor object, same
    shape and dtype), and write its pointer table again in place (same table address): a
    storage regrown under the view's own tensor (FSDP) moves it without a re-point, so the table
    is written whatever moved. Only a refresh that plans again gets here."""
    for move in moves:
        moved = list(map(ne, map(_data_ptr, move.tensors), map(_data_ptr, move.targets)))
        for tensor, target in compress(zip(move.tensors, move.targets, strict=True), moved):
            tensor.set_(target.untyped_storage(), target.storage_offset(), target.shape, target.stride())
        if move.table is not None:
            move.table.copy_(torch.tensor(list(map(_data_ptr, move.tensors)), dtype=torch.int64))


def _view_direction(source: DirectionSource, slots: ScaleSlots, tables: bool) -> ViewDirection:
    scales = None if source.format is Format.BF16 else slots.tensors
    if not tables:
        return ViewDirection(source.format, source.data, None, scales, None, slots.zero_copy, source.amax)
    device = source.data[0].device
    return ViewDirection(
        source.format,
        source.data,
        ptr_table(source.data, device),
        scales,
        None if scales is None else ptr_table(scales, device),
        slots.zero_copy,
        source.amax,
        None if source.amax is None else ptr_table(source.amax, device),
    )


def check_cached(cached: object, reader: Reader[V]) -> V:
    """``cached`` as an earlier view of the reader's class, format and shape."""
    return check_cached_as(cached, reader.view_type, reader.format, reader.shape)


def check_cached_as(cached: object, cls: type[V], fmt: object, shape: tuple[int, int, int]) -> V:
    """``cached`` as an earlier view of class ``cls``, format ``fmt`` and ``shape``: the
    arguments a refresh is called with are the view's own."""
    if not isinstance(cached, cls):
        raise RefreshError(f"cached: expected a {cls.__name__} from an earlier call; found {type(cached).__name__}")
    if cached.format is not fmt:
        raise RefreshError(f"cached: expected a {fmt} view, as asked for; found a {cached.format} view")
    got = (cached.num_experts, cached.rows, cached.columns)
    if got != shape:
        raise RefreshError(
            f"cached: expected a view of (experts, rows, columns) = {tuple(shape)}, as asked for; found one of {got}"
        )
    return cached


# ------------------------------------------------------------------------------ the pipeline


def _prepare(
    plan: RefreshPlan,
    views: tuple[ExpertWeights, ...],
    top: tuple[object, ...],
    readings: Sequence[Reading],
    work: Sequence[ScaleWork | QuantizeWork],
    backend: Backend,
) -> None:
    """Bind ``work`` to ``backend``, run it, and keep it under a guard of ``readings`` and of the
    buffers it writes."""
    guard = StorageGuard(top, readings, owned_memory(_destinations(work)))
    prepared = PreparedWork(work, backend)
    prepared.run()
    plan.prepared = PreparedRefresh(tuple(map(id, views)), guard, prepared, backend)
    plan.plans += 1


def _destinations(work: Sequence[ScaleWork | QuantizeWork]) -> list[torch.Tensor]:
    """Every buffer ``work`` writes."""
    found: list[torch.Tensor] = []
    for item in work:
        found += item.out if isinstance(item, QuantizeWork) else (item.dst,)
    return found


def rerun_unchanged(
    cached: object,
    view_type: type[ExpertWeights],
    fmt: object,
    shape: tuple[object, object, object],
    objects: tuple[object, ...],
    backend: str | None,
) -> bool:
    """Rerun ``cached``'s prepared launch if it is a view of ``view_type``, ``fmt`` and ``shape``
    (experts, rows, columns as given, unchecked) and its guard finds ``objects`` and all they
    held unchanged; False (nothing done) otherwise."""
    if type(cached) is not view_type or set(map(type, shape)) != {int}:  # sizes as given: 128.0 is no size
        return False
    view: ExpertWeights = cached
    if view.format is not fmt or (view.num_experts, view.rows, view.columns) != shape:
        return False
    wanted = None if backend is None else _resolve((view,), backend)
    return _reran(view.refresh_plan.prepared, (id(view),), objects, wanted)


def view_or_refresh(
    reader: Reader[V], cached: V | None = None, backend: str | None = None, outs: Sequence[Any] | None = None
) -> V:
    """A new view of what ``reader`` reads, or ``cached`` refreshed in place (same buffers) and
    returned. ``backend``: a request ("auto", "cuda", "torch"); None takes the environment's for
    a new view and the view's own for a refresh. ``outs``: for weights read through a caller's
    functions, the caller's layout buffers (one sequence per direction) to convert into."""
    if cached is not None:
        view = check_cached(cached, reader)
        plan = view.refresh_plan
        wanted = None if backend is None else _resolve((view,), backend)
        if not _reran(plan.prepared, (id(view),), reader.objects, wanted):
            refresh(plan, [(reader, view)], backend)
        return view
    snapshot = reader.read()
    if snapshot.bf16_to_quantize is not None:
        return _new_quantized_view(reader, snapshot, backend)
    if snapshot.called is not None:
        return _new_called_view(reader, snapshot, backend, outs)
    slots, work, _ = plan_directions(snapshot.directions, None, reader.what)
    tables = issubclass(reader.view_type, SplitExpertWeights)  # per-expert tensors: kernels find them by tables
    rowwise, *columnwise = (
        _view_direction(s, slot, tables) for s, slot in zip(snapshot.directions, slots, strict=True)
    )
    new = reader.view_type(*reader.shape, reader.format, rowwise, columnwise[0] if columnwise else None)  # type: ignore[arg-type]
    backend_ = backend_for(rowwise.data[0].device, backend)
    _prepare(new.refresh_plan, (new,), reader.objects, snapshot.readings, work, backend_)
    return new


def refresh(
    plan: RefreshPlan,
    entries: Sequence[tuple[Reader[Any], ExpertWeights]],
    backend: str | None = None,
    label: str | None = None,
) -> None:
    """Refresh every ``(reader, cached view)`` entry in place, in one launch kept in ``plan``.
    ``label`` (a layer's name for itself) prefixes each refusal with the entry it is about."""
    views = tuple(view for _, view in entries)
    top = entries[0][0].objects if len(entries) == 1 else tuple(chain.from_iterable(r.objects for r, _ in entries))
    prepared = plan.prepared if isinstance(plan.prepared, PreparedRefresh) else None
    wanted = prepared.backend if backend is None and prepared is not None else _resolve(views, backend)
    if _reran(prepared, tuple(map(id, views)), top, wanted):
        return
    readings: list[Reading] = []
    work: list[ScaleWork | QuantizeWork] = []
    moves: list[Move] = []
    for i, (reader, view) in enumerate(entries):  # every entry read and checked before anything is written
        with _naming(label, i):
            check_cached(view, reader)
            snapshot = reader.read()  # as a new view reads: it raises what a new view raises
            try:
                check_kind(view, snapshot, reader.what)
                if snapshot.bf16_to_quantize is None:
                    _, items, found = plan_directions(snapshot.directions, view, reader.what)
                    work += items
                    moves += found
                else:
                    work.append(QuantizeWork(snapshot.bf16_to_quantize, _quantized_outputs(view)))
            except MokError:
                _plan_as_new(snapshot, reader.what)  # a new view's refusal comes first
                raise
        readings += snapshot.readings
    follow(moves)
    _prepare(plan, views, top, readings, work, wanted)


class LayerRerun:
    """A layer's refresh without building its readers, for ``entries``, ``(weights, view)``
    pairs: a split view's weights are its sequence of parameters, read as they are at each call
    (a caller may put another parameter in that list; new pairs need a new LayerRerun)."""

    def __init__(self, entries: Sequence[tuple[object, ExpertWeights]]) -> None:
        self.parts: tuple[Any, ...] = tuple(w if isinstance(v, SplitExpertWeights) else (w,) for w, v in entries)
        self.views = tuple(id(v) for _, v in entries)

    def __call__(self, plan: RefreshPlan) -> bool:
        """True if ``plan``'s prepared launch ran again."""
        return _reran(plan.prepared, self.views, tuple(chain.from_iterable(self.parts)), None)


def _reran(prepared: object, views: tuple[int, ...], top: tuple[object, ...], backend: Backend | None) -> bool:
    """Run ``prepared`` again if it was made for these views, on ``backend`` (None: the one it
    has), and its guard finds the storage it was planned from unchanged."""
    if type(prepared) is not PreparedRefresh or prepared.views != views:
        return False
    if backend is not None and prepared.backend is not backend:
        return False
    if not prepared.guard.unchanged(top):
        return False
    prepared.work.run()
    return True


# ------------------------------------------------------------------------------ quantised by mok


def _new_quantized_view(reader: Reader[V], snapshot: Snapshot, backend: str | None) -> V:
    """A view of BF16 weights mok quantises: new buffers for both payloads and both layouts (each
    one allocation over every expert), the work that fills them, prepared and run."""
    assert snapshot.bf16_to_quantize is not None
    src = snapshot.bf16_to_quantize
    device = (src if isinstance(src, torch.Tensor) else src[0]).device
    experts, rows, columns = reader.shape
    out = empty_outputs(experts, rows, columns, device)
    tables = issubclass(reader.view_type, SplitExpertWeights)

    def direction(d: Direction, data: torch.Tensor, scales: torch.Tensor) -> ViewDirection:
        payloads = tuple(data.unbind(0)) if tables else (data,)
        layouts = tuple(scales.split_with_sizes([scales.shape[0] // experts] * experts)) if tables else (scales,)
        source = DirectionSource(d, Format.MXFP8, payloads, (), None)
        return _view_direction(source, ScaleSlots(layouts, False), tables)

    mxfp8 = BLOCKS[Format.MXFP8]
    rowwise = direction(mxfp8.rowwise, out.row_data, out.row_scales)
    columnwise = direction(mxfp8.columnwise, out.col_data, out.col_scales)
    new = reader.view_type(*reader.shape, Format.MXFP8, rowwise, columnwise, True)
    work = [QuantizeWork(src, out)]
    _prepare(new.refresh_plan, (new,), reader.objects, snapshot.readings, work, backend_for(device, backend))
    return new


# ------------------------------------------------------------------------------ through a caller's functions


def _new_called_view(reader: Reader[V], snapshot: Snapshot, backend: str | None, outs: Sequence[Any] | None) -> V:
    """A view of weights read through a caller's functions: its scales converted into ``outs``
    (the caller's buffers), into new buffers, or by the caller's conversion (what it returns is
    the view's). Nothing is kept to rerun: a refresh calls the caller's functions again."""
    assert snapshot.called is not None
    slots: list[ScaleSlots] = []
    work: list[ScaleWork | CallerWork] = []
    for i, source in enumerate(snapshot.directions):
        given = None if outs is None else ScaleSlots(tuple(outs[i]), False)
        if source.format is Format.BF16:  # no scales
            slots.append(ScaleSlots((), False))
        elif snapshot.called.convert is None:  # mok's own conversion: one launch over every matrix
            found, items, _ = plan_scales(source.sources, given, f"{reader.what}{source.direction.name} scales")
            slots.append(found)
            work += items
        else:
            slots.append(ScaleSlots((), False))  # filled with the caller's results once they ran
    per_direction = _called_work(reader.shape, snapshot, outs) if snapshot.called.convert is not None else []
    if snapshot.called.by_expert:  # each expert's rowwise, then its columnwise scales
        called = [item for per_expert in zip(*per_direction, strict=True) for item in per_expert]
    else:
        called = [item for direction in per_direction for item in direction]
    PreparedWork([*called, *work], backend).run()
    if per_direction:
        slots = [ScaleSlots(tuple(item.result for item in items), False) for items in per_direction]
    tables = issubclass(reader.view_type, SplitExpertWeights) and bool(snapshot.directions[0].data)
    rowwise, *columnwise = (
        _view_direction(s, slot, tables) for s, slot in zip(snapshot.directions, slots, strict=True)
    )
    return reader.view_type(*reader.shape, reader.format, rowwise, columnwise[0] if columnwise else None)  # type: ignore[arg-type]


def _called_work(shape: Shape, snapshot: Snapshot, outs: Sequence[Any] | None) -> list[list[CallerWork]]:
    """The caller's conversion of every scale matrix, direction by direction: weights ``(rows,
    columns)`` rowwise, ``(columns, rows)`` columnwise (the transpose the dgrad GEMM reads), each
    into its buffer of ``outs`` (or None)."""
    called = snapshot.called
    assert called is not None and called.convert is not None
    _, rows, columns = shape
    found: list[list[CallerWork]] = []
    for i, source in enumerate(snapshot.directions):
        r, c = (rows, columns) if source.direction.name == "rowwise" else (columns, rows)
        buffers = (None,) * len(source.sources) if outs is None else tuple(outs[i])
        found.append(
            [
                CallerWork(called.convert, scales.te_buffer, r, c, out, called.out_keyword)
                for scales, out in zip(source.sources, buffers, strict=True)
            ]
        )
    return found


def _whole(parts: tuple[torch.Tensor, ...] | None, what: str) -> torch.Tensor:
    """The one allocation a quantised view's per-expert buffers are consecutive pieces of."""
    if not parts or not all(p.is_contiguous() for p in parts):
        raise RefreshError(f"{what}: expected the view's own contiguous buffers; found none or a strided one")
    first, step = parts[0], parts[0].numel() * parts[0].element_size()
    if any(p.data_ptr() != first.data_ptr() + i * step or p.shape != first.shape for i, p in enumerate(parts)):
        raise RefreshError(f"{what}: expected the view's buffers back to back in one allocation; found them apart")
    shape = (len(parts) * first.shape[0], *first.shape[1:]) if first.dim() == 4 else (len(parts), *first.shape)
    if len(parts) == 1 and first.dim() == 3:
        return first
    return first.as_strided(shape, torch.empty(shape, device="meta").stride())


def _quantized_outputs(view: ExpertWeights) -> QuantizeOutputs:
    """The output buffers a view mok quantises into, refreshed in place (same addresses)."""
    assert view.quantized_on_the_fly and view.columnwise is not None  # check_kind made sure
    row, col = view.rowwise, view.columnwise
    parts = [
        (f"{d} {what}", t)
        for d, direction in (("rowwise", row), ("columnwise", col))
        for what, ts in (("data", direction.data), ("scales", direction.scales or ()))
        for t in ts
    ]
    read_memory([t for _, t in parts], lambda i: f"{parts[i][0]} (the cached view's own buffer)", OWN_ADVICE)
    return QuantizeOutputs(
        _whole(row.data, "rowwise data"),
        _whole(row.scales, "rowwise scales"),
        _whole(col.data, "columnwise data"),
        _whole(col.scales, "columnwise scales"),
    )


def _resolve(views: Sequence[ExpertWeights], backend: str | None) -> Backend:
    return backend_for(views[0].rowwise.data[0].device, backend)


@contextlib.contextmanager
def _naming(label: str | None, index: int) -> Iterator[None]:
    """Within a layer, every refusal names its entry (same exception class)."""
    if label is None:
        yield
        return
    try:
        yield
    except (MokError, TECompatError, TypeError, ValueError) as exc:
        raise type(exc)(f"{label} entry {index}: {exc}") from exc
