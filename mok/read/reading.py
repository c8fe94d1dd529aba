"""What one read of TE returned, kept as it was read: the objects, their storage values and the
addresses of their tensors at that moment (:class:`Reading`); and what a view is planned from
(:class:`Snapshot`: the readings and, per direction, the payload views and scale sources made from
those same values).

A refresh guard is built from the readings of the snapshot its launch was planned from, never
from a second read: if TE reassigns a buffer while a view is planned, the guard holds the old
buffer's address, the next refresh sees the new one, and plans again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, repeat
from operator import is_, itemgetter
from typing import Any, NamedTuple, TypeVar

import torch

from mok.formats import Format
from mok.layout import Geometry, logical_view
from mok.read.blocks import Direction
from mok.read.memory import Memory, holds_memory, memory_classes, read_memory, tensors_in
from te_compat import storage_reader, storage_values

ITSELF = "(the tensor itself)"  # the one name of a reading of plain tensors: their own memory


@dataclass(frozen=True, eq=False)
class Reading:
    """One read of ``objects``: per object the values of the logical storage ``names``, in order.

    ``bulk``: read by the objects' one class's C-level reader (te_compat.storage_reader), which a
    guard reads again the same way; else name by name (te_compat.storage_values: the ``.data``
    fallback, mixed classes). ``memory``: every tensor value's :class:`Memory`, object by object,
    taken with the read. ``lists``: each list value (TE's list of a group's members, of their
    shapes) with its items as read: TE may edit such a list in place, so the guard compares the
    items, not only the list object."""

    objects: tuple[object, ...]
    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    bulk: bool
    requested: tuple[str, ...] | None  # the names asked for (None: each object's kind's own)
    memory: Memory
    lists: tuple[tuple[list[Any], tuple[Any, ...]], ...] = ()

    @property
    def addresses(self) -> tuple[int, ...]:
        return self.memory.addresses

    @property
    def storages(self) -> tuple[torch.UntypedStorage, ...]:
        return self.memory.storages

    @cached_property
    def tensor_columns(self) -> tuple[int, ...] | None:
        """The indices of the names holding a tensor on every object, where every other name
        holds none on any; None where some name mixes them. Worked out when a guard first needs
        it (the values never change): a view that is never refreshed never pays for it."""
        return _tensor_columns(self.values, len(self.names))

    @cached_property
    def _columns(self) -> dict[str, tuple[Any, ...]]:
        """The columns asked for so far (a reader asks for some more than once)."""
        return {}

    def joined(self, other: Reading) -> Reading:
        """This reading followed by ``other``, a bulk reading of the same names and tensor
        columns on objects of the same class: what a guard checks in one bulk read."""
        mine = (type(self.objects[0]), self.names, self.tensor_columns, self.bulk)
        theirs = (type(other.objects[0]), other.names, other.tensor_columns, other.bulk)
        if mine != theirs or not self.bulk:
            raise ValueError(
                f"Reading.joined: expected a bulk reading of (class, names, tensor columns, bulk) {mine}; "
                f"found {theirs}"
            )
        joined = Reading(
            self.objects + other.objects,
            self.names,
            self.values + other.values,
            self.bulk,
            self.requested,
            self.memory + other.memory,
            self.lists + other.lists,
        )
        return _known(joined, self.tensor_columns)

    def flat(self, columns: Sequence[int]) -> list[Any]:
        """The values of ``columns`` (indices into ``names``), object by object, as one list."""
        return _flat(self.values, columns)

    def column(self, name: str) -> tuple[Any, ...]:
        """The value of ``name`` on every object (None where the release has no such storage)."""
        found = self._columns.get(name)
        if found is None:
            if name not in self.names:
                return (None,) * len(self.objects)
            found = self._columns[name] = tuple(map(itemgetter(self.names.index(name)), self.values))
        return found


def _known(reading: Reading, columns: tuple[int, ...] | None) -> Reading:
    """``reading`` with its tensor columns known already (those of the reading it was made from)."""
    reading.__dict__["tensor_columns"] = columns  # what the cached property would store
    return reading


def _picker(indices: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``itemgetter`` of ``indices`` that always returns a tuple."""
    if len(indices) == 1:
        get = itemgetter(indices[0])
        return lambda row: (get(row),)
    return itemgetter(*indices) if indices else lambda row: ()


def _flat(rows: Sequence[tuple[Any, ...]], columns: Sequence[int]) -> list[Any]:
    return list(chain.from_iterable(map(_picker(columns), rows)))


Label = Callable[[int], str]  # how a refusal names the i-th object of a reading ("expert 3")


def read_storage(
    objects: Sequence[object],
    names: tuple[str, ...] | None = None,
    label: Label | None = None,
) -> Reading:
    """Read the storage ``names`` (default: all the kind has) of every object once: in bulk where
    they share a class and hold it themselves, else name by name. ``label``: how a refusal names
    an object (default: its class and index)."""
    objects = tuple(objects)
    found = read_one_class(objects, names, label) if len(set(map(type, objects))) == 1 else None
    return found if found is not None else read_by_name(objects, names, label)


def read_one_class(
    objects: tuple[object, ...],
    names: tuple[str, ...] | None,
    label: Label | None = None,
) -> Reading | None:
    """:func:`read_storage` of objects known to share one class, in bulk; None where they keep
    their storage on ``.data`` only (then :func:`read_by_name` reads it)."""
    reader = storage_reader(objects[0], names)
    try:
        rows = tuple(map(reader.read, objects))
    except AttributeError:
        return None
    return _reading(objects, reader.names, rows, True, names, label)


def read_by_name(
    objects: tuple[object, ...],
    names: tuple[str, ...] | None,
    label: Label | None = None,
) -> Reading:
    """:func:`read_storage` object by object, name by name (the ``.data`` fallback, mixed classes)."""
    found = [storage_values(o, names) for o in objects]
    kept = tuple(dict.fromkeys(n for values in found for n in values))
    rows = tuple(tuple(values.get(n) for n in kept) for values in found)
    return _reading(objects, kept, rows, False, names, label)


def read_itself(tensors: Sequence[torch.Tensor], label: Label | None = None) -> Reading:
    """A reading of plain tensors (BF16 weights mok quantises): each one's own memory."""
    return _reading(tuple(tensors), (ITSELF,), tuple((t,) for t in tensors), True, None, label)


def _tensor_columns(rows: tuple[tuple[Any, ...], ...], width: int) -> tuple[int, ...] | None:
    """The indices of the names holding a tensor with memory on every object (None where a name
    mixes them with other values)."""
    if not rows:
        return ()
    first = rows[0]
    classes = list(map(type, first))
    if list(map(type, chain.from_iterable(rows))) == classes * len(rows):  # the usual case: one pass
        return tuple(compress(range(width), memory_classes(classes, first)))
    values = list(chain.from_iterable(rows))
    memory = iter(memory_classes(map(type, values), values))
    kinds: list[set[bool]] = [set() for _ in range(width)]
    for _ in rows:
        for column in kinds:
            column.add(next(memory))
    if any(len(k) > 1 for k in kinds):
        return None
    return tuple(i for i, k in enumerate(kinds) if k == {True})


def _reading(
    objects: tuple[object, ...],
    names: tuple[str, ...],
    rows: tuple[tuple[Any, ...], ...],
    bulk: bool,
    requested: tuple[str, ...] | None,
    label: Label | None = None,
) -> Reading:
    lists: tuple[tuple[list[Any], tuple[Any, ...]], ...] = ()
    if list in set(map(type, chain.from_iterable(rows))):  # TE may edit a list in place: keep its items
        lists = tuple((v, tuple(v)) for v in chain.from_iterable(rows) if type(v) is list)
    tensors = tensors_in(chain.from_iterable(rows))  # object by object, C-level
    memory = read_memory(tensors, _namer(objects, rows, names, label))
    return Reading(objects, names, rows, bulk, requested, memory, lists)


def _namer(
    objects: tuple[object, ...], rows: tuple[tuple[Any, ...], ...], names: tuple[str, ...], label: Label | None
) -> Label:
    """How a refusal names the i-th tensor with memory of ``rows``: its object (``label``, else its
    class and index) and its storage name."""

    def name(i: int) -> str:
        where = [(o, n) for o, row in enumerate(rows) for n, v in zip(names, row, strict=True) if holds_memory(v)]
        o, n = where[i]
        owner = label(o) if label is not None else f"{type(objects[o]).__name__} {o}"
        return owner if n == ITSELF else f"{owner} {n.replace('_', ' ')}"

    return name


class Recorder:
    """A storage read for te_compat's snapshots (``grouped_storage(obj, read=recorder)``) that
    reads each object once, in bulk where it can, and keeps every reading for the guard. Objects
    read already (``add``) are answered from their reading; an object found in a list another
    reading holds (a TE 2.13 group's members) is read with the others of its class there, in one
    reading after the one that vouches for them."""

    def __init__(self, label: str | None = None) -> None:
        self.label = label  # how a refusal names the first object read (the caller's own)
        self.readings: list[Reading] = []
        self._rows: dict[int, tuple[Reading, int]] = {}  # by id: the readings keep their objects alive
        self._indexed = 0  # readings indexed in _rows; indexed when asked (a split read never asks)

    def add(self, reading: Reading) -> Reading:
        self.readings.append(reading)
        return reading

    def __call__(self, obj: object) -> dict[str, Any]:
        for reading in self.readings[self._indexed :]:
            objects = reading.objects
            # the first reading of an object answers, and in it the object's first row
            rows = zip(repeat(reading), range(len(objects) - 1, -1, -1))
            later = dict(zip(map(id, reversed(objects)), rows, strict=True))
            self._rows = later | self._rows
        self._indexed = len(self.readings)
        if id(obj) not in self._rows:
            label = self.label
            named = None if label is None or self.readings else (lambda i: label)
            reading = self.add(read_storage(self._with_siblings(obj), label=named))
            self._rows[id(obj)] = reading, 0
        reading, i = self._rows[id(obj)]
        return dict(zip(reading.names, reading.values[i], strict=True))

    def _with_siblings(self, obj: object) -> tuple[object, ...]:
        """``obj`` first, then the objects of its class not read yet in the list (or tuple) value
        of a reading that holds it."""
        for reading in self.readings:
            for value in chain.from_iterable(reading.values):
                if isinstance(value, (list, tuple)) and any(map(is_, value, repeat(obj))):
                    cls, read = type(obj), self._rows
                    return (obj, *(v for v in value if type(v) is cls and v is not obj and id(v) not in read))
        return (obj,)


R = TypeVar("R", bound=tuple[Any, ...])


def records(cls: type[R], *columns: Iterable[Any]) -> list[R]:
    """``[cls(*row) for row in zip(*columns, strict=True)]`` for a named tuple ``cls`` (one
    column a field, every field given), made in C: a view of 256 experts makes hundreds of them,
    and a named tuple's own constructor is a Python function."""
    fields = cls._fields  # type: ignore[attr-defined]  # R is a named tuple
    if len(columns) != len(fields):  # tuple.__new__ checks no arity: a short record would pass
        raise TypeError(f"records: expected a column for each field of {cls.__name__} {fields}; found {len(columns)}")
    return list(map(tuple.__new__, repeat(cls), zip(*columns, strict=True)))


class ScaleSource(NamedTuple):
    """Scales of ``E`` experts to bring into the layout: the logical ``[E, R, C]`` matrices are
    ``geometry`` (sizes, strides in bytes) over uint8 ``te_buffer`` from its own offset. A
    geometry, not a strided view: a view of 256 experts would make 512 tensors it never needs on
    the CUDA path. When TE already ``swizzled`` them, ``te_buffer`` holds the layout itself and
    is copied or exposed, never converted a second time."""

    name: str
    te_buffer: torch.Tensor
    geometry: Geometry
    swizzled: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.geometry[0]

    @property
    def logical(self) -> torch.Tensor:
        """The logical ``[E, R, C]`` view itself (for checks and the torch reference)."""
        return logical_view(self.te_buffer, self.geometry)


class DirectionSource(NamedTuple):
    """One direction of the weights as read off TE: how TE stores it, its format, the payload
    views (one per expert, or one over all), the scales to bring into the layout, TE's amax. A
    named tuple, as the other records a first view makes: cheap to make, immutable."""

    direction: Direction
    format: Format
    data: tuple[torch.Tensor, ...]
    sources: tuple[ScaleSource, ...]
    amax: tuple[torch.Tensor, ...] | None


class CallerRead(NamedTuple):
    """How a snapshot read through a caller's functions (mok.read.readers.SeamReader) is
    converted: by ``convert``, the caller's conversion (None: mok's kernels), called as the
    caller's module calls it: ``by_expert`` (each expert's rowwise, then its columnwise scales;
    else every rowwise matrix, then every columnwise one), and ``out`` passed as a keyword
    (``out_keyword``) or left out where there is no buffer to fill."""

    convert: Callable[..., Any] | None
    by_expert: bool
    out_keyword: bool


class Snapshot(NamedTuple):
    """Everything one read of the weights found: the readings (what the refresh guard compares,
    the caller's objects read first) and the directions planned from them, rowwise first; or,
    for BF16 weights mok quantises, ``bf16_to_quantize``: the BF16 payload (one ``[E, R, C]``
    view, or one ``[R, C]`` view per expert) as read. ``called``: read through a caller's
    functions, which every refresh calls again (nothing to guard), and how it is converted."""

    readings: tuple[Reading, ...]
    directions: tuple[DirectionSource, ...]
    bf16_to_quantize: torch.Tensor | tuple[torch.Tensor, ...] | None = None
    called: CallerRead | None = None
