"""The guard of a prepared refresh, built from the readings its launch was planned from.

A refresh of weights whose storage nothing changed reruns the prepared launch; the guard says
whether it may, comparing exactly what the first view's checks read: the same objects as read;
every tensor read still at its address, of its shape, dtype and strides, its storage still
holding what it held (mok.read.memory); every flag and count the same; and the view's own buffers
still allocated. Anything else plans again, with the checks of a new view (mok.plan.pipeline). It
never reads TE to learn what to expect, so a buffer TE reassigns while a view is planned shows at
the next refresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import chain
from operator import is_
from typing import Any

import torch

from mok.read.fingerprint import compiled
from mok.read.memory import NO_MEMORY, Memory, comparer, holds_memory
from mok.read.reading import ITSELF, Reading
from te_compat import storage_reader, storage_values

_nbytes = torch.UntypedStorage.nbytes


def _same(old: Any, new: Any) -> bool:
    """``new`` (read now) is what ``old`` (recorded) was: the same object (a list's items are
    compared apart, by :func:`_lists_unchanged`), or equal plain values (counts, flags, tuples of
    them, item by item: ``==`` on a tuple of tensors would compare tensors)."""
    if old is new:
        return True
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        return False  # a tensor with memory is compared by its memory; a TE tensor object by identity
    if type(old) is tuple and type(new) is tuple:
        return len(old) == len(new) and all(map(_same, old, new))
    return type(old) is type(new) and isinstance(old, (int, float, str)) and old == new


class StorageGuard:
    """What a prepared refresh must find unchanged: ``top``, the caller's objects, are the same
    objects, and every reading of the snapshot reads back the same (tensors by address, the rest
    by identity or value). Readings of objects found inside another (a hybrid's sub-storages, a
    TE 2.13 group's members) come after the reading they were found in, which vouches for them.

    ``owned``: the memory of the view's own buffers the launch writes; a buffer freed since (its
    storage resized) would take the launch's writes into memory that is gone.

    Host cost is what a checked refresh pays, so a reading of one class is checked in bulk: one
    C-level read per object of its tensors, fed straight into C-level passes over their memory
    (mok.read.memory.comparer), and one of its flags; nothing else per object. Neighbouring
    readings of one class under the same names (a layer's fc1 and fc2) are one such read. The
    checks are made at the first refresh, not with the view.
    """

    def __init__(self, top: Sequence[object], readings: Sequence[Reading], owned: Memory = NO_MEMORY) -> None:
        self.top = tuple(top)
        self.readings = tuple(readings)
        self.owned = owned
        self._checks: tuple[Callable[[], bool], ...] | None = None  # made by the first refresh

    @property
    def storages(self) -> list[torch.UntypedStorage]:
        """The memory of every tensor read, kept alive while the guard lives."""
        return [s for r in self.readings for s in r.storages]

    def unchanged(self, objects: Sequence[object]) -> bool:
        """``objects`` are ``top``, every reading reads back what it read, and the view's own
        buffers are still allocated."""
        if len(objects) != len(self.top) or not all(map(is_, objects, self.top)):
            return False
        checks = self._checks
        if checks is None:  # a view never refreshed never pays for them (two racing threads make equal ones)
            lists = tuple(chain.from_iterable(r.lists for r in self.readings))
            found = tuple(map(_check_of, _joined(self.readings)))
            checks = self._checks = found + ((partial(_lists_unchanged, lists),) if lists else ())
        try:
            for check in checks:  # usually one: a loop here calls it with no generator frame
                if not check():
                    return False
        except (AttributeError, TypeError):  # an attribute left, a tensor became None: plan again
            return False
        owned = self.owned  # its storages still the sizes recorded
        return tuple(map(_nbytes, owned.storages)) == owned.sizes


def _lists_unchanged(lists: tuple[tuple[list[Any], tuple[Any, ...]], ...]) -> bool:
    """Every list read (TE's member and shape lists) still holds the items it held when read."""
    reader = compiled()
    if reader is not None:
        return reader.same_items(lists)
    return all(len(now) == len(then) and all(map(is_, now, then)) for now, then in lists)


def _joined(readings: Iterable[Reading]) -> list[Reading]:
    """``readings`` in order, each run of neighbours read in bulk from objects of one class under
    the same names joined into one reading: a layer's fc1 and fc2, or its experts' groups, are
    then checked by one bulk read, whose cost is mostly per call, not per object."""
    joined: list[Reading] = []
    for reading in readings:
        last = joined[-1] if joined else None
        if last is not None and reading.bulk and last.bulk and _same_kind(last, reading):
            joined[-1] = last.joined(reading)
        else:
            joined.append(reading)
    return joined


def _same_kind(a: Reading, b: Reading) -> bool:
    return (
        type(a.objects[0]) is type(b.objects[0])
        and a.names == b.names
        and a.tensor_columns == b.tensor_columns
        and a.tensor_columns is not None
    )


def _check_of(reading: Reading) -> Callable[[], bool]:
    """The check of one reading: in bulk where each name holds tensors on every object, or
    non-tensors on every object; else value by value."""
    if reading.bulk:
        found = _bulk_check(reading)
        if found is not None:
            return found
    return partial(_rows_unchanged, reading)


def _bulk_check(reading: Reading) -> Callable[[], bool] | None:
    columns = reading.tensor_columns
    if columns is None:
        return None
    first, objects = reading.objects[0], reading.objects
    tensor_names = tuple(reading.names[i] for i in columns)
    value_columns = [i for i in range(len(reading.names)) if i not in columns]
    value_names = tuple(reading.names[i] for i in value_columns)
    tensors_of = _itself if tensor_names == (ITSELF,) else storage_reader(first, tensor_names).read
    values_reader = storage_reader(first, value_names)
    same_memory = comparer(reading.memory)
    recorded = reading.flat(value_columns)
    one, read_values = values_reader.read_one, values_reader.read

    def check() -> bool:
        if not same_memory(list(chain.from_iterable(map(tensors_of, objects)))):
            return False
        if not value_names:
            return True
        now = list(map(one, objects)) if one is not None else list(chain.from_iterable(map(read_values, objects)))
        return all(map(is_, now, recorded)) or (len(now) == len(recorded) and all(map(_same, recorded, now)))

    return check


def _itself(tensor: object) -> tuple[object]:
    return (tensor,)


def _rows_unchanged(reading: Reading) -> bool:
    """Every object's values read again as they were read, compared value by value."""
    names = reading.names
    if reading.bulk:
        read: Callable[[object], tuple[Any, ...]] = storage_reader(reading.objects[0], names).read
    else:

        def read(obj: object) -> tuple[Any, ...]:
            values = storage_values(obj, reading.requested)
            return tuple(values.get(n) for n in names)

    tensors = []
    for obj, old_row in zip(reading.objects, reading.values, strict=True):
        for old, new in zip(old_row, read(obj), strict=True):
            if holds_memory(old):
                if not holds_memory(new):
                    return False
                tensors.append(new)
            elif not _same(old, new):
                return False
    return comparer(reading.memory)(tensors)
