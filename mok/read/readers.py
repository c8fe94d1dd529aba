"""The readers of TE: one per weight layout, each reading the weights once into a
:class:`~mok.read.reading.Snapshot` (what it read, and the directions planned from exactly that).

- :class:`SplitReader`: one Parameter per expert (MXFP8, NVFP4), and TE 2.19+ hybrid weights,
  each direction read off its own sub-storage, in its own format.
- :class:`GroupedReader`: one grouped Parameter ``(E, rows, columns)`` (TE 2.13 and 2.14+).
- :class:`BF16Reader`: BF16 weights (grouped or one per expert), viewed as they are or quantised
  by mok to MXFP8 itself, at every view and refresh.
- :class:`SeamReader`: any weights read through a caller's functions for the steps of a view
  (mok.weights, whose callers may replace Megatron's module's functions), each called as that
  module calls it.

mok.door chooses the reader; a reader checks what it reads (kinds, shapes, packing) and raises
naming the expert; it never plans, allocates or launches (mok.plan.pipeline does). Everything
TE-specific comes from te_compat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, is_, methodcaller
from typing import Any, NamedTuple

import torch

from mok.checks import describe
from mok.errors import ExpertWeightError, LayoutError
from mok.formats import Format
from mok.layout import as_batch, check_scale_dtype
from mok.read.blocks import BLOCK_OF_KIND, BLOCKS, BlockFormat, Direction, block_format
from mok.read.reading import (
    CallerRead,
    DirectionSource,
    Reading,
    Recorder,
    ScaleSource,
    Snapshot,
    read_by_name,
    read_itself,
    read_one_class,
    read_storage,
)
from mok.views import (
    ExpertWeights,
    GroupedExpertWeights,
    Shape,
    SplitExpertWeights,
    param_list,
    same_device,
    storage_view,
    storage_views,
)
from te_compat import (
    GroupedStorage,
    StorageName,
    TensorKind,
    grouped_scale_buffers,
    grouped_storage,
    hybrid_storage,
    scale_matrix,
    storage_field,
    storage_reader,
    tensor_kind,
    tensor_kind_or_none,
)
from te_compat.geometry import MXFP8

_shape, _name, _data_ptr = attrgetter("shape"), attrgetter("name"), methodcaller("data_ptr")
_device, _te_buffer = attrgetter("device"), attrgetter("te_buffer")
_HYBRID_NAMES = (str(StorageName.ROWWISE_STORAGE), str(StorageName.COLUMNWISE_STORAGE))


# ------------------------------------------------------------------------------ one per expert


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


def _expert(e: int) -> str:
    return f"expert {e}"


def _read_experts(stored: _Stored, names: tuple[str, ...], dims: tuple[int, int]) -> Reading:
    """Every expert's storage, read once. Experts of one class, the expected kind and shape pass a
    class check and a shape comparison; anything else is checked expert by expert, which raises
    naming the first expert that is wrong. Every name is read, a direction's absent payload too:
    the refresh guard then sees TE store that direction again."""
    owners, block, label = stored.owners, stored.block, stored.label
    first = owners[0]
    fine = len(set(map(type, owners))) == 1 and tensor_kind(first) is block.kind and hasattr(first, "shape")
    if not fine or list(map(_shape, owners)).count(dims) != len(owners):
        for e, p in enumerate(owners):
            _check_expert(e, p, block, *dims)
        return read_storage(owners, names, label=label)
    found = read_one_class(owners, names, label=label)  # their one class is known already
    return found if found is not None else read_by_name(owners, names, label=label)


Columns = dict[str, tuple[Any, ...]]  # a reading's values by name, one per object


def _columns_of(reading: Reading) -> Columns:
    """Every name's values, object by object: one C-level pass over the reading (its direction
    sources ask for several columns each)."""
    return dict(zip(reading.names, zip(*reading.values, strict=True), strict=True))


def _column(reading: Reading, columns: Columns, name: str) -> tuple[Any, ...]:
    """The value of ``name`` on every object (None where the release has no such storage)."""
    found = columns.get(name)
    return (None,) * len(reading.objects) if found is None else found


def _need(reading: Reading, columns: Columns, block: BlockFormat, name: str) -> tuple[Any, ...]:
    """The column ``name``; te_compat's error naming attribute, class and release if an expert
    lacks it."""
    column = _column(reading, columns, name)
    if any(map(is_, column, repeat(None))):
        pairs = zip(reading.objects, column, strict=True)
        return tuple(v if v is not None else block.snapshot(o).need(name) for o, v in pairs)
    return column


def _swizzled_flags(reading: Reading, columns: Columns) -> tuple[bool, ...]:
    """TE's swizzled-scales flag of every expert (False where the release has none); a flag that
    is not a bool is refused, never read as ``bool()`` (the string "False" is truthy)."""
    flags = _column(reading, columns, str(StorageName.SCALES_SWIZZLED))
    if not set(map(type, flags)) <= {bool, type(None)}:  # one set of classes, not a loop of 256 checks
        e = next(i for i, flag in enumerate(flags) if flag is not None and not isinstance(flag, bool))
        raise ExpertWeightError(
            f"expert {e}: TE's swizzled-scales flag ({type(reading.objects[e]).__name__}) is "
            f"{describe(flags[e])}; expected a bool"
        )
    return tuple(map(bool, flags))


def _split_direction(
    reading: Reading, read: Columns, block: BlockFormat, d: Direction, rows: int, columns: int
) -> DirectionSource | None:
    """One direction of every expert (None where no expert stores it), from ``read``, the
    reading's columns."""
    payloads = _column(reading, read, str(d.data))
    missing = list(map(is_, payloads, repeat(None)))
    if all(missing):
        return None
    if any(missing):
        raise ExpertWeightError(f"expert {missing.index(True)} has no {d.name} data; the others do")
    shape = d.payload_shape(rows, columns)
    data = storage_views(payloads, shape, dtype=block.payload_dtype, name=lambda e: f"expert {e} {d.name} data")
    buffers = _need(reading, read, block, str(d.scales))
    names = [f"expert {e} {d.name} scales" for e in range(len(buffers))]
    found, geometries = block.scale_columns(d, buffers, rows, columns, names)
    flags = _swizzled_flags(reading, read)  # as many as experts: columns of one reading
    # ScaleSource records made in C (a view of 256 experts makes 256 a direction; its constructor is Python)
    sources = tuple(map(tuple.__new__, repeat(ScaleSource), zip(names, found, geometries, flags, strict=True)))
    amax = _aliases(_need(reading, read, block, str(d.amax)), f"{d.name} amax") if d.amax is not None else None
    return DirectionSource(d, block.format, data, sources, amax)


def _aliases(tensors: Sequence[Any], what: str) -> tuple[torch.Tensor, ...]:
    """A tensor of the view's own over each of TE's ``tensors`` (a refresh may re-point it)."""
    for e, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            name = what if len(tensors) == 1 and what.startswith("grouped") else f"expert {e} {what}"
            raise ExpertWeightError(f"{name}: expected a tensor; found {describe(t)}")
    return tuple(map(torch.Tensor.view_as, tensors, tensors))


def _check_device(device: torch.device, source: DirectionSource) -> None:
    """Every payload and scale buffer of ``source`` on ``device`` (the first expert's data): one
    launch reads them all. One pass in C where they are; else raises naming the first that is not."""
    buffers = list(map(_te_buffer, source.sources))
    if set(map(_device, source.data)) | set(map(_device, buffers)) == {device}:
        return
    named = [(f"expert {e} {source.direction.name} data", t) for e, t in enumerate(source.data)]
    named += [(s.name, s.te_buffer) for s in source.sources]
    for name, tensor in named:
        if tensor.device != device:
            raise ExpertWeightError(f"{name} is on {tensor.device}; expected it on {device}, with expert 0's data")


class _Stored(NamedTuple):
    """Objects storing some directions of every expert in one block format: the parameters
    themselves, or each expert's sub-storage of one direction (hybrid weights)."""

    owners: tuple[object, ...]
    block: BlockFormat
    directions: tuple[Direction, ...]
    label: Callable[[int], str] = _expert  # how a refusal names an owner


class SplitReader(NamedTuple):
    """Reads one Parameter per expert (``objects``, checked by mok.door), ``shape`` (experts,
    rows, columns), in ``format`` (MXFP8, NVFP4, or HYBRID: each direction in its own sub-storage
    and block format). ``both_directions``: weights TE keeps rowwise only are refused (Megatron's
    results hold both). A named tuple, its fields what the pipeline reads (no call): a refresh
    makes one, and pays a C-level construction."""

    objects: tuple[object, ...]
    format: Format
    shape: Shape
    both_directions: bool = False
    view_type: type[SplitExpertWeights] = SplitExpertWeights
    what: str = ""  # how messages name the weights

    def read(self) -> Snapshot:
        """Every direction TE stores of the experts, rowwise first (a refresh reads as a new view)."""
        recorder = Recorder()
        sources: list[DirectionSource] = []
        _, rows, columns = self.shape
        for stored in self._stored(recorder):
            stored.block.check_dims(rows, columns, f"{self.format} weights")
            names = stored.block.names_for(stored.directions)
            reading = recorder.add(_read_experts(stored, names, (rows, columns)))
            read = _columns_of(reading)
            for d in stored.directions:
                source = _split_direction(reading, read, stored.block, d, rows, columns)
                if source is None and self.format is Format.HYBRID:
                    raise ExpertWeightError(f"hybrid weights: the {d.name} sub-storages hold no {d.name} data")
                if source is None and d.name == "rowwise":
                    _need(reading, read, stored.block, str(d.data))  # raises, naming the attribute and release
                sources += [source] if source is not None else []
        device = same_device(sources[0].data)
        for source in sources:
            _check_device(device, source)
        if self.both_directions and len(sources) < 2:
            raise ExpertWeightError(NEEDS_COLUMNWISE[False])
        return Snapshot(tuple(recorder.readings), tuple(sources))

    def _stored(self, recorder: Recorder) -> list[_Stored]:
        if self.format is not Format.HYBRID:
            block = block_format(self.format)
            return [_Stored(self.objects, block, block.directions())]
        return _hybrid_stored(self.objects, recorder)


def _sub_storage(direction: str) -> Callable[[int], str]:
    return lambda e: f"expert {e} {direction} sub-storage"


def _hybrid_stored(params: tuple[object, ...], recorder: Recorder) -> list[_Stored]:
    """TE 2.19+ hybrid weights: each direction stored in its own sub-storage, in its own format.
    The parameters' sub-storages are read once, in bulk, and recorded before the sub-storages."""
    for e, p in enumerate(params):
        if tensor_kind(p) is not TensorKind.HYBRID:
            raise ExpertWeightError(f"expert {e}: expected a hybrid parameter; found {type(p).__name__}")
    recorder.add(read_storage(params, _HYBRID_NAMES, label=_expert))
    hybrids = [hybrid_storage(p, read=recorder) for p in params]
    stored = []
    for name in ("rowwise", "columnwise"):
        subs = tuple(getattr(h, name) for h in hybrids)
        if all(s is None for s in subs):
            if name == "rowwise":
                hybrids[0].need("rowwise")  # raises, naming the attribute and release
            continue
        kinds = [getattr(h, f"{name}_kind") for h in hybrids]
        block = BLOCK_OF_KIND.get(kinds[0])
        if block is None or any(k is not kinds[0] for k in kinds):
            e = next((i for i, k in enumerate(kinds) if k is not kinds[0]), 0)
            h = hybrids[e]
            raise ExpertWeightError(
                f"expert {e}: hybrid weight with rowwise {h.rowwise_kind} and columnwise {h.columnwise_kind} "
                f"storage; mok views MXFP8 or NVFP4 in each direction, the same for every expert"
            )
        if any(s is None for s in subs):
            raise ExpertWeightError(f"expert {subs.index(None)} has no {name} sub-storage; the others do")
        direction = block.rowwise if name == "rowwise" else block.columnwise
        stored.append(_Stored(subs, block, (direction,), _sub_storage(name)))
    return stored


# ------------------------------------------------------------------------------ grouped


def check_group_shape(gs: GroupedStorage, dims: tuple[int, int, int]) -> None:
    """The group holds ``E`` experts of one ``(rows, columns)``, as the caller declared."""
    experts, rows, columns = dims
    if gs.num_tensors != experts:
        raise ExpertWeightError(f"grouped weight: expected {experts} experts; found {gs.num_tensors}")
    if len(gs.tensor_shapes) != experts:
        raise ExpertWeightError(
            f"grouped weight: expected a shape for each of its {experts} experts; found {len(gs.tensor_shapes)}"
        )
    if gs.tensor_shapes.count((rows, columns)) == len(gs.tensor_shapes):  # one C-level pass
        return
    for e, shape in enumerate(gs.tensor_shapes):
        if tuple(shape) != (rows, columns):
            raise ExpertWeightError(
                f"grouped weight: expected every expert of shape ({rows}, {columns}); expert {e} has {tuple(shape)}"
            )


def _check_group(gs: GroupedStorage, block: BlockFormat, dims: tuple[int, int, int]) -> None:
    check_group_shape(gs, dims)
    block.check_dims(dims[1], dims[2], "grouped weight")
    if not gs.quantized:
        raise ExpertWeightError("grouped weight holds no quantized data (no quantizer); pass format='bf16'")
    if gs.members and tensor_kind(gs.members[0]) is not block.kind:
        raise ExpertWeightError(
            f"grouped weight: expected {block.format.name} experts; found {type(gs.members[0]).__name__} members"
        )


def _members_scales(members: tuple[object, ...], d: Direction) -> list[Any]:
    """Each member's scales of direction ``d``: one C-level read per member where they share a
    class and hold the storage themselves (a snapshot of each of 256 members would cost
    milliseconds on a first view), else member by member."""
    reader = storage_reader(members[0], (str(d.scales),))
    if len(set(map(type, members))) == 1 and reader.read_one is not None:
        try:
            return list(map(reader.read_one, members))
        except AttributeError:  # storage kept on .data only: read below
            pass
    return [storage_field(m, d.scales) for m in members]


def _check_packing(gs: GroupedStorage, d: Direction, flat: torch.Tensor, bounds: Sequence[int]) -> None:
    """Each member's scales must be a view at ``bounds[e]`` (te_compat's grouped offsets: E + 1)
    of the grouped buffer (what the group's offsets say, and where its members' scales are: a
    consistency check, not something the launch reads, so not recorded for the guard)."""
    n = gs.num_tensors
    found = gs.rowwise_scale_inv_offsets if d.name == "rowwise" else gs.columnwise_scale_inv_offsets
    offsets = (found or ())[:n]
    starts, per_expert = bounds[:n], bounds[1] - bounds[0]  # expert e's: e * per_expert
    if tuple(offsets) != tuple(starts[: len(offsets)]):  # compared whole; named expert by expert
        _check_offsets(offsets, d, per_expert)
    if not gs.members:
        return
    if len(gs.members) != n:
        raise ExpertWeightError(  # upstream's words: "expected E grouped members, got n"
            f"grouped weight: expected {n} grouped members, got {len(gs.members)}"
        )
    scales = _members_scales(gs.members, d)
    if _addresses(scales) != list(map(flat.data_ptr().__add__, starts)):
        _check_members(scales, d, flat, per_expert)


def _addresses(tensors: list[Any]) -> list[int] | None:
    """Every tensor's ``data_ptr()``; None where one is no tensor (then checked one by one)."""
    try:
        return list(map(_data_ptr, tensors))
    except (AttributeError, TypeError):
        return None


def _check_offsets(offsets: Sequence[int], d: Direction, per_expert: int) -> None:
    for e, off in enumerate(offsets):
        if off != e * per_expert:
            raise ExpertWeightError(
                f"grouped weight: {d.name} scale offsets are not expert-major: expert {e} starts "
                f"at byte {off}, expected {e * per_expert}"
            )


def _check_members(members_scales: list[Any], d: Direction, flat: torch.Tensor, per_expert: int) -> None:
    base = flat.data_ptr()
    for e, scales in enumerate(members_scales):
        if scales is None:
            raise ExpertWeightError(f"grouped weight: expert {e} has no {d.name} scales")
        where = scales.data_ptr() - base
        if where != e * per_expert:
            found = f"byte {where} of it" if 0 <= where < flat.numel() else "outside it"
            raise ExpertWeightError(  # upstream's words: "member e scale is not packed expert-major"
                f"grouped weight: member {e} scale is not packed expert-major ({d.name} scales in the grouped "
                f"buffer): expected byte {e * per_expert}, found {found}"
            )


def _group_direction(
    gs: GroupedStorage, block: BlockFormat, d: Direction, dims: tuple[int, int, int]
) -> DirectionSource | None:
    experts, rows, columns = dims
    data = getattr(gs, d.data.value)
    if data is None:
        return None
    name = f"grouped {d.name}"
    payload = storage_view(
        data, (experts, *d.payload_shape(rows, columns)), dtype=block.payload_dtype, name=f"{name} data"
    )
    flat = gs.need(d.scales)
    if isinstance(flat, torch.Tensor):  # scales, not any 1-byte dtype (te_compat's view takes any)
        check_scale_dtype(flat, f"{name} scales")
    try:
        padded = grouped_scale_buffers(
            flat, experts, rows, columns, kind=block.kind, direction=d.name, name=f"{name} scales"
        )
    except ValueError as exc:
        raise LayoutError(str(exc)) from None
    _check_packing(gs, d, flat, d.grouped_offsets(experts, rows, columns))
    buffer, geometry = block.scale_source(d, padded, rows, columns, f"{name} scales")
    source = ScaleSource(f"{name} scales", buffer, geometry, gs.scales_swizzled)
    amax = None if d.amax is None else _aliases((gs.need(d.amax),), f"grouped {d.name} amax")
    return DirectionSource(d, block.format, (payload,), (source,), amax)


class GroupedReader(NamedTuple):
    """Reads one grouped Parameter (``objects`` holds it alone) of ``shape`` (E, rows, columns)
    and ``format`` (MXFP8, NVFP4): TE's flat buffers, all experts (TE 2.13 ``data`` and 2.14+
    ``rowwise_data`` naming). ``both_directions`` as for :class:`SplitReader`."""

    objects: tuple[object]
    format: Format
    shape: Shape
    both_directions: bool = False
    view_type: type[GroupedExpertWeights] = GroupedExpertWeights
    what: str = "grouped "  # how messages name the weights

    def read(self) -> Snapshot:
        """Every direction TE stores of the group, rowwise first (a refresh reads as a new view).
        The group's storage, and in TE 2.13 its members' flags, are recorded for the guard."""
        recorder = Recorder("grouped weight")
        gs = grouped_storage(self.objects[0], read=recorder)
        block = block_format(self.format)
        _check_group(gs, block, self.shape)
        sources = [_group_direction(gs, block, d, self.shape) for d in block.directions()]
        found = tuple(s for s in sources if s is not None)
        if not found or found[0].direction.name != "rowwise":
            gs.need(StorageName.ROWWISE_DATA)  # raises, naming the attribute and release
        if self.both_directions and len(found) < 2:
            raise ExpertWeightError(NEEDS_COLUMNWISE[True])
        return Snapshot(tuple(recorder.readings), found)


# ------------------------------------------------------------------------------ BF16: viewed, or quantised by mok


def is_bf16_group(weight: object) -> bool:
    """Whether a grouped weight holds BF16 (or other high-precision) data, no MXFP8: a plain
    tensor, or TE's GroupedTensor without a quantizer."""
    kind = tensor_kind_or_none(weight)
    return kind is TensorKind.PLAIN or (
        kind is TensorKind.GROUPED and storage_field(weight, StorageName.QUANTIZER) is None
    )


_TO_QUANTISE = " to quantise"
_PASS_FORMAT = "; pass the format TE quantized them to (format=) for quantized weights"


def _bf16_group(
    weight: object, dims: tuple[int, int, int], quantized_on_the_fly: bool
) -> tuple[tuple[Reading, ...], torch.Tensor]:
    """The readings and the BF16 ``[E, R, C]`` payload of one grouped weight: the tensor itself,
    or the ``rowwise_data`` of TE's high-precision GroupedTensor."""
    kind = tensor_kind(weight)
    if kind is TensorKind.GROUPED:
        recorder = Recorder("grouped weight")
        gs = grouped_storage(weight, read=recorder)
        check_group_shape(gs, dims)
        if gs.quantized:
            raise ExpertWeightError(
                "grouped weight is quantized by TE (it has a quantizer): read TE's MXFP8 storage"
                if quantized_on_the_fly
                else "grouped weight is quantized (it has a quantizer); pass the format TE quantized it to (format=)"
            )
        payload = storage_view(gs.need(StorageName.ROWWISE_DATA), dims, dtype=torch.bfloat16, name="grouped BF16 data")
        return tuple(recorder.readings), payload
    if kind is not TensorKind.PLAIN or not isinstance(weight, torch.Tensor):
        raise ExpertWeightError(
            f"grouped weight: expected a BF16 tensor {dims} (or TE's BF16 GroupedTensor)"
            f"{_TO_QUANTISE if quantized_on_the_fly else ''}; found {type(weight).__name__} (kind {kind})"
            f"{'' if quantized_on_the_fly else _PASS_FORMAT}"
        )
    if tuple(weight.shape) != dims:
        raise ExpertWeightError(f"grouped weight: expected shape {dims}; found {tuple(weight.shape)}")
    reading = read_itself((weight,), lambda _: "grouped weight")
    return (reading,), storage_view(weight, dims, dtype=torch.bfloat16, name="grouped weight")


def _bf16_experts(
    params: tuple[object, ...], rows: int, columns: int, quantized_on_the_fly: bool
) -> tuple[tuple[Reading, ...], tuple[torch.Tensor, ...]]:
    """The readings and the BF16 ``[R, C]`` payload of every expert: each Parameter itself."""
    tensors = param_list(params)
    for e, p in enumerate(tensors):
        kind = tensor_kind(p)
        if kind is not TensorKind.PLAIN:
            raise ExpertWeightError(
                f"expert {e}: expected a {'BF16' if quantized_on_the_fly else 'plain (BF16)'} parameter"
                f"{_TO_QUANTISE if quantized_on_the_fly else ''}; found {type(p).__name__} (kind {kind})"
                f"{'' if quantized_on_the_fly else _PASS_FORMAT}"
            )
    plain: list[torch.Tensor] = tensors  # type: ignore[assignment]
    if set(map(_shape, plain)) != {(rows, columns)}:  # one C-level pass; a transposed twin has the same numel
        e = next(e for e, p in enumerate(plain) if tuple(p.shape) != (rows, columns))
        raise ExpertWeightError(f"expert {e}: expected shape ({rows}, {columns}); found {tuple(plain[e].shape)}")
    reading = read_itself(plain, lambda e: f"expert {e} weight")
    payloads = storage_views(plain, (rows, columns), dtype=torch.bfloat16, name=lambda e: f"expert {e} weight")
    same_device(payloads)
    return (reading,), payloads


class BF16Reader(NamedTuple):
    """Reads BF16 weights: one grouped ``[E, R, C]`` weight (a :class:`GroupedExpertWeights`
    ``view_type``: ``objects`` holds it alone), or one ``[R, C]`` Parameter per expert. Viewed as
    they are (``format`` BF16: the view's payloads are the weights' memory, a refresh follows
    it), or, ``quantized_on_the_fly`` (``format`` MXFP8), quantised by mok to MXFP8 (both
    directions, scales in the layout) at every view and refresh. The guard watches each BF16
    tensor's memory."""

    objects: tuple[object, ...]
    format: Format
    shape: Shape
    view_type: type[ExpertWeights]
    what: str  # how messages name the weights ("" or "grouped ")
    quantized_on_the_fly: bool

    def read(self) -> Snapshot:
        _, rows, columns = self.shape
        quantized = self.quantized_on_the_fly
        grouped = self.view_type is GroupedExpertWeights
        if quantized:
            BLOCKS[Format.MXFP8].check_dims(rows, columns, f"{self.what}BF16 weights to quantise")
        if grouped:
            readings, payload = _bf16_group(self.objects[0], self.shape, quantized)
            payloads: tuple[torch.Tensor, ...] = (payload,)
        else:
            readings, payloads = _bf16_experts(self.objects, rows, columns, quantized)
        if quantized:
            return Snapshot(readings, (), payloads[0] if grouped else payloads)
        # a BF16 view has its rowwise payloads alone (the direction's name is all the pipeline reads of it)
        return Snapshot(readings, (DirectionSource(BLOCKS[Format.MXFP8].rowwise, Format.BF16, payloads, (), None),))


# ------------------------------------------------------------------------------ through a caller's functions

# Megatron's results hold both directions: a view of weights TE keeps rowwise only is refused so
NEEDS_COLUMNWISE = {
    True: "grouped weight: the 5-tuple needs columnwise data and scales; the weight has none",
    False: "split weights: the view needs columnwise data and both directions' scales; found less",
}


class StorageNames(NamedTuple):
    """The storage attribute names a :class:`SeamReader` asks a caller's ``storage_attr`` for:
    the names the caller's module passes (Megatron's module passes TE's)."""

    rowwise_data: str
    columnwise_data: str
    rowwise_scales: str
    columnwise_scales: str


class Seams(NamedTuple):
    """The functions a caller brings for the steps of a view (mok.weights: Megatron's module's
    own names, looked up at each call), and the storage names they are asked for. ``own``: every
    function is mok's, so mok's own readers may read TE's weights instead; ``own_conversion``:
    the conversion is mok's, so the pipeline's kernels convert every scale matrix in one launch."""

    names: StorageNames
    storage_attr: Callable[[object, str], Any]  # a storage attribute off any object, or None
    storage_view: Callable[..., Any]  # (storage, shape, *, dtype, name): a payload view
    scale_view: Callable[..., Any]  # (weight, member_attr, shape, *, name): a group's [E, a, b] scales
    convert: Callable[..., Any]  # (logical [E, R, C], *, rows, columns, out=None): the layout
    is_mxfp8: Callable[[object], bool]
    is_grouped_mxfp8: Callable[[object], bool]
    own: bool
    own_conversion: bool


def check_logical_scales(logical: object, rows: int, columns: int, name: str = "logical_scale") -> torch.Tensor:
    """MXFP8 scales to convert for weights ``(rows, columns)``: a 3-D ``[E, rows, columns/32]``
    tensor of a 1-byte dtype (any strides), as uint8."""
    if not isinstance(logical, torch.Tensor) or logical.dim() != 3:
        found = tuple(logical.shape) if isinstance(logical, torch.Tensor) else describe(logical)
        raise LayoutError(f"{name}: expected a 3-D tensor [E, rows, columns/32]; found {found}")
    if columns % MXFP8.block:
        raise LayoutError(f"columns: expected a multiple of {MXFP8.block} (one scale per block); found {columns}")
    want = (logical.shape[0], rows, columns // MXFP8.block)
    if tuple(logical.shape) != want:
        raise LayoutError(
            f"{name}: expected shape {want} for rows={rows}, columns={columns}; found {tuple(logical.shape)}"
        )
    return as_batch(logical, name)


def _scale_source(name: str, logical: Any, rows: int, columns: int, own_conversion: bool) -> ScaleSource:
    """Scales a caller's function returned, to convert for weights ``(rows, columns)``: checked
    as mok's conversion checks them where it converts (uint8, its geometry), as they are for a
    caller's conversion (which checks them itself)."""
    if own_conversion:
        logical = check_logical_scales(logical, rows, columns, name)
    return ScaleSource(name, logical, (tuple(logical.shape), logical.stride()), False)


def _storage(seams: Seams, obj: object, name: str, what: str) -> Any:
    value = seams.storage_attr(obj, name)
    if value is None:
        raise ExpertWeightError(f"{what}: expected {name} storage on the {type(obj).__name__}; found none")
    return value


def _expert_storage(e: int, param: object, seams: Seams, names: Sequence[str]) -> dict[str, Any]:
    found = {name: seams.storage_attr(param, name) for name in names}
    missing = [name for name, value in found.items() if value is None]
    if missing:
        raise ExpertWeightError(
            f"expert {e}: expected MXFP8 storage {', '.join(names)} on the {type(param).__name__} "
            f"(shape {tuple(getattr(param, 'shape', ()))}); missing {', '.join(missing)}"
        )
    return found


def _gemm_pair(e: int, storage: dict[str, Any], names: StorageNames, rows: int, columns: int) -> tuple[Any, Any]:
    """One expert's scale matrices as the GEMMs read them, cut from TE's padded buffers (no copy)."""
    try:
        return (
            scale_matrix(storage[names.rowwise_scales], rows, columns),
            scale_matrix(storage[names.columnwise_scales], rows, columns, direction="columnwise"),
        )
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"expert {e}: {exc}") from exc


class SeamReader(NamedTuple):
    """Reads weights through a caller's :class:`Seams`, each function called as Megatron's
    module calls it (the same arguments, order and number of calls), into the snapshot every
    reader produces: the payloads are what the caller's ``storage_view`` returned, the scales
    what its storage or scale functions did. ``refresh``: a refresh into the caller's own
    buffers, for which upstream's split view reads the scales alone. Nothing is recorded for a
    guard: every view and refresh calls the caller's functions again. The conversion is the
    snapshot's ``called``: the caller's, or None for mok's kernels (mok's own function)."""

    objects: tuple[object, ...]
    format: Format  # MXFP8 or BF16
    shape: Shape
    seams: Seams
    refresh: bool
    view_type: type[ExpertWeights]
    what: str  # how messages name the weights ("" or "grouped ")

    def read(self) -> Snapshot:
        grouped = self.view_type is GroupedExpertWeights
        if self.format is Format.BF16:
            payloads = self._bf16_grouped() if grouped else self._bf16_split()
            source = DirectionSource(BLOCKS[Format.MXFP8].rowwise, Format.BF16, payloads, (), None)
            return Snapshot((), (source,), None, CallerRead(None, False, False))
        directions = self._grouped() if grouped else self._split()
        convert = None if self.seams.own_conversion else self.seams.convert
        return Snapshot(
            (), directions, None, CallerRead(convert, self.refresh and not grouped, self.refresh or grouped)
        )

    def _grouped(self) -> tuple[DirectionSource, ...]:
        """Upstream's grouped view: both payloads, then both directions' scales (columnwise as the
        ``[E, columns, rows/32]`` transpose the dgrad GEMM reads)."""
        weight, seams, names = self.objects[0], self.seams, self.seams.names
        experts, rows, columns = self.shape
        if not seams.is_grouped_mxfp8(weight):
            raise ExpertWeightError(
                f"grouped weight: expected native TE grouped MXFP8 parameters; found {describe(weight)}"
            )
        fp8, shape, own = torch.float8_e4m3fn, tuple(self.shape), seams.own_conversion
        row_data = seams.storage_view(
            _storage(seams, weight, names.rowwise_data, "grouped weight"),
            shape,
            dtype=fp8,
            name="single-grouped MXFP8 rowwise",
        )
        col_data = seams.storage_view(
            _storage(seams, weight, names.columnwise_data, "grouped weight"),
            shape,
            dtype=fp8,
            name="single-grouped MXFP8 columnwise",
        )
        row = seams.scale_view(
            weight, names.rowwise_scales, (experts, rows, columns // MXFP8.block), name="single-grouped rowwise"
        )
        col = seams.scale_view(
            weight, names.columnwise_scales, (experts, rows // MXFP8.block, columns), name="single-grouped columnwise"
        ).transpose(-2, -1)
        mxfp8 = BLOCKS[Format.MXFP8]
        return (
            DirectionSource(
                mxfp8.rowwise,
                Format.MXFP8,
                (row_data,),
                (_scale_source("grouped rowwise scales", row, rows, columns, own),),
                None,
            ),
            DirectionSource(
                mxfp8.columnwise,
                Format.MXFP8,
                (col_data,),
                (_scale_source("grouped columnwise scales", col, columns, rows, own),),
                None,
            ),
        )

    def _split(self) -> tuple[DirectionSource, ...]:
        """Upstream's split view: every expert's storage, then (a new view) its payloads expert by
        expert, then every expert's scale matrices."""
        params, seams, names = self.objects, self.seams, self.seams.names
        _, rows, columns = self.shape
        for e, param in enumerate(params):  # a refresh refuses what a new view refuses, first
            if not seams.is_mxfp8(param):
                raise ExpertWeightError(f"expert {e}: expected native TE MXFP8 storage; found {describe(param)}")
        asked = names[2:] if self.refresh else tuple(names)
        storage = [_expert_storage(e, p, seams, asked) for e, p in enumerate(params)]
        row_data: list[Any] = []
        col_data: list[Any] = []
        if not self.refresh:
            fp8 = torch.float8_e4m3fn
            for e, found in enumerate(storage):
                for direction, name, payloads in (
                    ("rowwise", names.rowwise_data, row_data),
                    ("columnwise", names.columnwise_data, col_data),
                ):
                    view = seams.storage_view(
                        found[name], (rows, columns), dtype=fp8, name=f"expert {e} MXFP8 {direction}"
                    )
                    payloads.append(view)
            same_device(row_data)
        pairs = [_gemm_pair(e, found, names, rows, columns) for e, found in enumerate(storage)]
        own, mxfp8 = seams.own_conversion, BLOCKS[Format.MXFP8]
        row_sources = tuple(
            _scale_source(f"expert {e} rowwise scales", r.unsqueeze(0), rows, columns, own)
            for e, (r, _) in enumerate(pairs)
        )
        col_sources = tuple(
            _scale_source(f"expert {e} columnwise scales", c.unsqueeze(0), columns, rows, own)
            for e, (_, c) in enumerate(pairs)
        )
        return (
            DirectionSource(mxfp8.rowwise, Format.MXFP8, tuple(row_data), row_sources, None),
            DirectionSource(mxfp8.columnwise, Format.MXFP8, tuple(col_data), col_sources, None),
        )

    def _bf16_grouped(self) -> tuple[Any, ...]:
        """Upstream's BF16 grouped view: the weight's dtype and contiguity checked, then TE's
        high-precision payload (``rowwise_data``) where the weight has one, else the weight."""
        weight, seams, shape = self.objects[0], self.seams, tuple(self.shape)
        dtype, contiguous = getattr(weight, "dtype", None), getattr(weight, "is_contiguous", None)
        if (dtype is not None and dtype != torch.bfloat16) or (callable(contiguous) and not contiguous()):
            state = "" if not callable(contiguous) or contiguous() else " (not contiguous)"
            raise ExpertWeightError(
                f"grouped weight: expected a contiguous torch.bfloat16 tensor of shape {shape}; found {dtype}{state}"
            )
        storage = seams.storage_attr(weight, seams.names.rowwise_data)
        if storage is not None:
            return (seams.storage_view(storage, shape, dtype=torch.bfloat16, name="single-grouped BF16 rowwise"),)
        if not isinstance(weight, torch.Tensor):
            raise ExpertWeightError(
                "grouped weight: expected a torch.bfloat16 tensor, or storage rowwise_data on the weight; found "
                f"{describe(weight)} with neither"
            )
        return (weight,)

    def _bf16_split(self) -> tuple[Any, ...]:
        """Upstream's BF16 split view: each expert's TE high-precision payload (``rowwise_data``)
        where it has one, else the expert itself, viewed as ``(rows, columns)``."""
        seams, (_, rows, columns) = self.seams, self.shape
        held = [seams.storage_attr(p, seams.names.rowwise_data) for p in self.objects]
        payloads = tuple(
            seams.storage_view(
                p if h is None else h, (rows, columns), dtype=torch.bfloat16, name=f"expert {e} BF16 rowwise"
            )
            for e, (p, h) in enumerate(zip(self.objects, held, strict=True))
        )
        same_device(payloads)
        return payloads
