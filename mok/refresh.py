"""The prepared refresh of a view or a layer: the launch that rewrites its layout buffers, and
the guard under which it may simply run again.

A refresh of weights whose storage TE did not reassign reruns the prepared launch after a bulk
identity check (:class:`StorageGuard`); anything TE changed is planned again (mok.plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from operator import is_
from typing import Any

import torch

from mok.errors import RefreshError
from mok.work import PreparedWork, ScaleWork
from te_compat import storage_reader, storage_values


def _same(a: object, b: object) -> bool:
    """Equal storage values: the same object, or equal plain values (counts, flags, shape lists)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return isinstance(a, (int, float, str, type(None))) and a == b


class StorageGuard:
    """What a prepared refresh must see unchanged: the same weight objects, every storage tensor
    they hold at the same address, every flag the same. TE re-quantising in place keeps all of
    it; reassigning a buffer or flag, or pointing a tensor at new memory under the same object
    (TE's own ``clear()``: ``t.data = _empty_tensor()``), does not.

    Host cost is what a checked refresh pays, so the common case (weights of one class) is read
    in bulk: one C-level ``attrgetter`` of the tensor names per weight, its results fed straight
    into ``Tensor.data_ptr``, and one of the flags; nothing else per weight.
    """

    def __init__(self, weights: Sequence[object], names: tuple[str, ...] | None = None) -> None:
        """``names``: the logical storage names the refresh depends on (default: all of them)."""
        self.weights = list(weights)
        self.names = names
        self._tensor_reader: Callable[[object], tuple[Any, ...]] | None = None
        self._value_reader: Callable[[object], Any] = _no_values
        self._one_value = False
        if len({type(w) for w in self.weights}) == 1 and self._read_in_bulk(names):
            return
        # mixed classes (hybrid sub-storages), storage kept on .data only, or a tensor one weight
        # has where another has None: read name by name, check every tensor found
        self._tensor_reader = None
        self.tensors, self.values = self._read_by_name(self.weights)
        self.addresses = list(map(_data_ptr, self.tensors))
        self.storages = list(map(torch.Tensor.untyped_storage, self.tensors))

    def _read_in_bulk(self, names: tuple[str, ...] | None) -> bool:
        """Split the names (per class) into tensors, checked by address, and the rest (flags),
        checked by identity or value; False where that split does not hold for every weight."""
        first = self.weights[0]
        reader = storage_reader(first, names)
        try:
            values = reader.read(first)
        except AttributeError:  # storage kept on .data only
            return False
        tensor_names = tuple(n for n, v in zip(reader.names, values, strict=True) if isinstance(v, torch.Tensor))
        self._tensor_reader = storage_reader(first, tensor_names).read
        value_reader = storage_reader(first, tuple(n for n in reader.names if n not in tensor_names))
        self._value_reader = value_reader.read_one or value_reader.read
        self._one_value = value_reader.read_one is not None
        try:
            self.tensors = list(chain.from_iterable(map(self._tensor_reader, self.weights)))
            self.values = self._bulk_values(self.weights)
            self.addresses = list(map(_data_ptr, self.tensors))
        except (AttributeError, TypeError):
            return False
        # the memory itself kept alive (TE's clear() swaps a tensor's storage under the same
        # object): an equal address is then always the old memory, never a reuse of it
        self.storages = list(map(torch.Tensor.untyped_storage, self.tensors))
        return not any(issubclass(t, torch.Tensor) for t in set(map(type, self.values)))

    def _bulk_values(self, weights: Sequence[object]) -> list[Any]:
        if self._one_value:  # the usual case: TE's swizzled flag alone
            return list(map(self._value_reader, weights))
        return list(chain.from_iterable(map(self._value_reader, weights)))

    def _read_by_name(self, weights: Sequence[object]) -> tuple[list[torch.Tensor], list[Any]]:
        """(every tensor, every other value) of ``weights``, read weight by weight."""
        state = [v for w in weights for v in self._values(w)]
        return [v for v in state if isinstance(v, torch.Tensor)], [v for v in state if not isinstance(v, torch.Tensor)]

    def _values(self, weight: object) -> tuple[Any, ...]:
        return tuple(storage_values(weight, self.names).values())

    def unchanged(self, weights: Sequence[object]) -> bool:
        """Same weights, every watched tensor at the same address, every flag the same."""
        if len(weights) != len(self.weights) or not all(map(is_, weights, self.weights)):
            return False
        try:
            tensors: Any
            if self._tensor_reader is None:
                tensors, values = self._read_by_name(weights)
            else:
                tensors = chain.from_iterable(map(self._tensor_reader, weights))
                values = self._bulk_values(weights)
            if list(map(_data_ptr, tensors)) != self.addresses:
                return False
        except (AttributeError, TypeError):  # an attribute left, a tensor became None: plan again
            return False
        if len(values) != len(self.values):
            return False
        return all(map(is_, values, self.values)) or all(map(_same, values, self.values))


_data_ptr = torch.Tensor.data_ptr


def _no_values(weight: object) -> tuple[()]:
    return ()


class RefreshPlan:
    """The prepared refresh of one view or one layer: the launch that rewrites its layout
    buffers, the guard under which it may simply run again, and how often it was planned."""

    def __init__(self) -> None:
        self.guard: StorageGuard | None = None
        self.work: PreparedWork | None = None
        self.key: tuple[Any, ...] = ()
        self.plans = 0

    def companions(self) -> tuple[object, ...]:
        """What the guard watches besides the first weight it was given (a TE 2.13 group's
        members, whose own flags say whether the group's scales are swizzled)."""
        return tuple(self.guard.weights[1:]) if self.guard is not None else ()

    def rerun(self, weights: Sequence[object], key: tuple[Any, ...]) -> bool:
        """Run the prepared work again if ``key`` matches and the guard sees nothing changed."""
        if self.work is None or self.guard is None or key != self.key or not self.guard.unchanged(weights):
            return False
        self.work.run()
        return True

    def prepare(
        self,
        weights: Sequence[object],
        key: tuple[Any, ...],
        work: Sequence[ScaleWork],
        backend: str | None,
        names: tuple[str, ...] | None = None,
    ) -> None:
        """Bind and run freshly planned ``work``; remember it for reruns under a new guard of
        ``names`` (see StorageGuard). ``key`` holds what else a rerun must match (shapes, format,
        backend)."""
        guard = StorageGuard(weights, names)  # before any write: a guard that cannot read raises first
        prepared = PreparedWork(work, backend)
        prepared.run()
        self.guard, self.work, self.key = guard, prepared, key
        self.plans += 1

    def run_unchecked(self) -> None:
        """Run the prepared launch again WITHOUT checking TE's storage (a few microseconds of
        host time). Only for callers who know TE reassigned no buffer and set no flag since the
        view was built or last refreshed (TE re-quantising in place); otherwise the result is
        silently stale. The checked refresh (``cached=``) is the default for that reason."""
        if self.work is None:
            raise RefreshError("run_unchecked: nothing prepared yet; build the view (or refresh it) first")
        self.work.run()
