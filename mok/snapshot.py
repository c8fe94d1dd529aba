"""What one read of TE returned, kept as it was read: the objects, their storage values and the
addresses of their tensors at that moment (:class:`Reading`); and what a view is planned from
(:class:`Snapshot`: the readings and, per direction, the payload views and scale sources made from
those same values).

A refresh guard is built from the readings of the snapshot its launch was planned from, never
from a second read: if TE reassigns a buffer while a view is planned, the guard holds the old
buffer's address, the next refresh sees the new one, and plans again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import torch

from mok.formats import Direction, Format
from mok.layout import Geometry, logical_view
from te_compat import storage_reader, storage_values

_is_tensor = torch.Tensor.__instancecheck__


def frozen(value: Any) -> Any:
    """``value`` as it is now: a list (TE's member list, shapes, offsets) becomes a tuple, so a
    later change of the list in place cannot change what was recorded."""
    return tuple(map(frozen, value)) if isinstance(value, list) else value


@dataclass(frozen=True, eq=False)
class Reading:
    """One read of ``objects``: per object the values of the logical storage ``names``, in order.

    ``bulk``: read by the objects' one class's C-level reader (te_compat.storage_reader), which a
    guard reads again the same way; else name by name (te_compat.storage_values: the ``.data``
    fallback, mixed classes). ``addresses``: every tensor value's ``data_ptr()``, object by object,
    taken with the read; ``storages``: their memory, kept alive so an equal address later is
    still that memory (TE's ``clear()`` swaps a tensor's storage under the same object)."""

    objects: tuple[object, ...]
    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    bulk: bool
    requested: tuple[str, ...] | None  # the names asked for (None: each object's kind's own)
    addresses: tuple[int, ...]
    storages: tuple[torch.UntypedStorage, ...]

    def column(self, name: str) -> tuple[Any, ...]:
        """The value of ``name`` on every object (None where the release has no such storage)."""
        if name not in self.names:
            return (None,) * len(self.objects)
        i = self.names.index(name)
        return tuple(row[i] for row in self.values)


def read_storage(objects: Sequence[object], names: tuple[str, ...] | None = None) -> Reading:
    """Read the storage ``names`` (default: all the kind has) of every object once: in bulk where
    they share a class and hold it themselves, else name by name."""
    objects = tuple(objects)
    if len(set(map(type, objects))) == 1:
        reader = storage_reader(objects[0], names)
        try:
            rows = tuple(map(reader.read, objects))
        except AttributeError:  # storage kept on .data only: read below, name by name
            pass
        else:
            if list in set(map(type, chain.from_iterable(rows))):  # a group's member list, shapes
                rows = tuple(tuple(map(frozen, row)) for row in rows)
            return _reading(objects, reader.names, rows, True, names)
    found = [storage_values(o, names) for o in objects]
    kept = tuple(dict.fromkeys(n for values in found for n in values))
    rows = tuple(tuple(frozen(values.get(n)) for n in kept) for values in found)
    return _reading(objects, kept, rows, False, names)


def _reading(
    objects: tuple[object, ...],
    names: tuple[str, ...],
    rows: tuple[tuple[Any, ...], ...],
    bulk: bool,
    requested: tuple[str, ...] | None,
) -> Reading:
    tensors = [v for v in chain.from_iterable(rows) if _is_tensor(v)]
    addresses = tuple(map(torch.Tensor.data_ptr, tensors))
    storages = tuple(map(torch.Tensor.untyped_storage, tensors))
    return Reading(objects, names, rows, bulk, requested, addresses, storages)


class Recorder:
    """A storage read for te_compat's snapshots (``grouped_storage(obj, read=recorder)``) that
    reads each object once, in bulk where it can, and keeps every reading for the guard. Objects
    read already (``add``) are answered from their reading."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self._rows: dict[int, dict[str, Any]] = {}  # id(object) -> its values; the readings keep it alive

    def add(self, reading: Reading) -> Reading:
        self.readings.append(reading)
        for obj, row in zip(reading.objects, reading.values, strict=True):
            self._rows[id(obj)] = dict(zip(reading.names, row, strict=True))
        return reading

    def __call__(self, obj: object) -> dict[str, Any]:
        row = self._rows.get(id(obj))
        if row is None:
            self.add(read_storage((obj,)))
            row = self._rows[id(obj)]
        return row


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


@dataclass(frozen=True)
class DirectionSource:
    """One direction of the weights as read off TE: how TE stores it, its format, the payload
    views (one per expert, or one over all), the scales to bring into the layout, TE's amax."""

    direction: Direction
    format: Format
    data: tuple[torch.Tensor, ...]
    sources: tuple[ScaleSource, ...]
    amax: tuple[torch.Tensor, ...] | None


@dataclass(frozen=True)
class Snapshot:
    """Everything one read of the weights found: the readings (what the refresh guard compares,
    the caller's objects read first) and the directions planned from them, rowwise first."""

    readings: tuple[Reading, ...]
    directions: tuple[DirectionSource, ...]
