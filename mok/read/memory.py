"""The memory under the tensors a view reads, as the view's checks saw it, and the same compared
later: what makes a checked refresh see every change a new view would see.

A view depends, for every tensor it reads (TE's payloads, scales and amax, BF16 weights), on
the tensor's address, shape, dtype and strides, and on its storage still holding every byte the
tensor spans. :func:`read_memory` records exactly these, refusing a tensor whose storage lost its
memory (Megatron-FSDP and torch FSDP2 free unsharded weights with ``untyped_storage().resize_(0)``
between steps); :func:`comparer` compares them, in C-level passes (a refresh of 256 experts
compares a thousand tensors). The storages are kept alive, so an equal address later is still
that memory, unless a caller freed it, which its size then shows; a storage regrown at a new
address (the next all-gather) shows in the addresses.

Only tensors with memory of their own are read this way: plain tensors and Parameters. TE's own
tensor classes wrap such buffers (their data pointer is 0, their storage invalid) and are
compared as objects, by identity; their buffers are read on their own.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any, NamedTuple

import torch

from mok.checks import describe
from mok.errors import ExpertWeightError, StorageFreedError
from mok.read.fingerprint import compiled
from te_compat import TensorKind, on_refresh, tensor_kind_or_none

_data_ptr, _untyped_storage, _offset = torch.Tensor.data_ptr, torch.Tensor.untyped_storage, torch.Tensor.storage_offset
_size, _dtype, _is_contiguous = torch.Tensor.size, attrgetter("dtype"), torch.Tensor.is_contiguous
_nbytes, _tensor_nbytes = torch.UntypedStorage.nbytes, attrgetter("nbytes")
_storage_ptr = torch.UntypedStorage.data_ptr

# whether instances of a class hold memory of their own; decided once per class (te_compat's
# kinds, which a te_compat.refresh() may change, so cleared with its caches)
_HOLDS_MEMORY: dict[type, bool] = {}
on_refresh(_HOLDS_MEMORY.clear)


def _learn(values: Iterable[object]) -> None:
    for value in values:
        if type(value) not in _HOLDS_MEMORY:
            kind = tensor_kind_or_none(value) if isinstance(value, torch.Tensor) else None
            _HOLDS_MEMORY[type(value)] = kind is TensorKind.PLAIN


def holds_memory(value: object) -> bool:
    """``value`` is a tensor with memory of its own (not None, a flag, or a TE tensor object)."""
    found = _HOLDS_MEMORY.get(type(value))
    if found is None:
        _learn((value,))
        found = _HOLDS_MEMORY[type(value)]
    return found


def memory_classes(classes: Iterable[type], values: Iterable[object]) -> list[bool]:
    """:func:`holds_memory` of each of ``classes`` (those of ``values``, in order), learnt once."""
    classes = list(classes)
    if not _HOLDS_MEMORY.keys() >= set(classes):
        _learn(values)
    return list(map(_HOLDS_MEMORY.__getitem__, classes))


def tensors_in(values: Iterable[object]) -> list[Any]:
    """The values with memory of their own, in order (one C-level pass over known classes)."""
    values = list(values)
    return list(compress(values, memory_classes(map(type, values), values)))


class Memory(NamedTuple):
    """What a view depends on of the tensors it read, in order: each one's address, shape, dtype
    and strides (in ``facts``), and its storage with the bytes that storage held.

    ``facts``: the compiled reader's record of every tensor (address, storage size and offset,
    dtype, device, sizes, strides: mok.read.fingerprint), or, where it is not there, the same
    read in Python: the addresses, shapes, dtypes and contiguity of the tensors, and the strides
    of those not contiguous (a contiguous tensor's size fixes how it addresses its memory; its
    offset into the storage shows in its address, which a storage's start does not move while
    the storage keeps its size)."""

    facts: bytes | PythonFacts
    storages: tuple[torch.UntypedStorage, ...]
    sizes: tuple[int, ...]

    @property
    def addresses(self) -> tuple[int, ...]:
        if isinstance(self.facts, PythonFacts):
            return self.facts.addresses
        words, found, i = memoryview(self.facts).cast("q"), [], 0
        while i < len(words):  # each tensor's words: address, 6 more (the last its dim), sizes, strides
            found.append(words[i])
            i += _HEAD + 2 * words[i + _HEAD - 1]
        return tuple(found)

    def __add__(self, other: tuple[Any, ...]) -> Memory:
        """The memory of two readings, one after the other."""
        if not isinstance(other, Memory):
            return NotImplemented
        if isinstance(self.facts, bytes) and isinstance(other.facts, bytes):
            facts: bytes | PythonFacts = self.facts + other.facts
        elif isinstance(self.facts, PythonFacts) and isinstance(other.facts, PythonFacts):
            facts = self.facts + other.facts
        elif not self.storages or not other.storages:  # one of them read no tensor
            facts = self.facts if other.storages == () else other.facts
        else:
            raise TypeError("Memory: expected two readings by the same reader (compiled or Python); found both")
        return Memory(facts, self.storages + other.storages, self.sizes + other.sizes)


_HEAD = 7  # the words of a tensor's compiled record before its sizes and strides (_fingerprint.c)


class PythonFacts(NamedTuple):
    """The facts of :class:`Memory` as the Python reader reads them."""

    addresses: tuple[int, ...]
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    contiguous: tuple[bool, ...]
    strided: tuple[tuple[int, tuple[int, ...]], ...]  # (index, strides) of each tensor not contiguous

    def __add__(self, other: tuple[Any, ...]) -> PythonFacts:
        if not isinstance(other, PythonFacts):
            return NotImplemented
        shift = len(self.addresses)
        return PythonFacts(
            self.addresses + other.addresses,
            self.shapes + other.shapes,
            self.dtypes + other.dtypes,
            self.contiguous + other.contiguous,
            self.strided + tuple((i + shift, s) for i, s in other.strided),
        )


NO_MEMORY = Memory(PythonFacts((), (), (), (), ()), (), ())


def _span(tensor: torch.Tensor) -> int:
    """Bytes ``tensor`` spans from its first element (any strides; 0 when it has no element)."""
    spanned = (
        0 if tensor.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    )
    return spanned * tensor.element_size()


def _sizes(
    tensors: Sequence[torch.Tensor], storages: Sequence[torch.UntypedStorage], name: Callable[[int], str]
) -> tuple[int, ...]:
    try:
        return tuple(map(_nbytes, storages))
    except RuntimeError:  # a tensor subclass that wraps others holds no storage of its own
        for i, storage in enumerate(storages):
            try:
                storage.nbytes()
            except RuntimeError:
                raise ExpertWeightError(
                    f"{name(i)}: expected a tensor with memory of its own; found {describe(tensors[i])}, which holds "
                    "none (a subclass wrapping other tensors, such as FSDP2's sharded DTensor: view the unsharded "
                    "weights, inside forward or after unshard())"
                ) from None
        raise


FSDP_ADVICE = (
    "its memory was freed or shrunk (FSDP frees unsharded weights between steps with resize_(0)); "
    "view or refresh these weights after the all-gather"
)
OWN_ADVICE = "a buffer of the view's own was freed or shrunk; build a new view (without cached=)"


def read_memory(tensors: Sequence[torch.Tensor], name: Callable[[int], str], advice: str = FSDP_ADVICE) -> Memory:
    """The :class:`Memory` of ``tensors``, after checking that each one's storage still holds every
    byte it spans (``name(i)`` names the i-th in the :class:`StorageFreedError` otherwise, with
    ``advice``)."""
    if not tensors:
        return NO_MEMORY
    reader = compiled()
    if reader is not None:
        try:
            found = reader.record(tensors)
        except TypeError:  # a tensor torch cannot read so (no memory of its own): the Python reader names it
            found = None
        if isinstance(found, bytes):
            storages = tuple(map(_untyped_storage, tensors))
            return Memory(found, storages, tuple(map(_nbytes, storages)))
    return _read_in_python(tensors, name, advice)


def _read_in_python(tensors: Sequence[torch.Tensor], name: Callable[[int], str], advice: str) -> Memory:
    shapes, dtypes, contiguous = (
        tuple(map(_size, tensors)),
        tuple(map(_dtype, tensors)),
        tuple(map(_is_contiguous, tensors)),
    )
    storages = tuple(map(_untyped_storage, tensors))
    sizes = _sizes(tensors, storages, name)
    itemsizes = {dtype: dtype.itemsize for dtype in set(dtypes)}
    starts = list(map(operator.mul, map(_offset, tensors), map(itemsizes.__getitem__, dtypes)))
    spans = list(map(_tensor_nbytes, tensors))  # a contiguous tensor spans its own bytes
    strided = tuple((i, tensors[i].stride()) for i in compress(range(len(tensors)), map(operator.not_, contiguous)))
    for i, _ in strided:
        spans[i] = _span(tensors[i])
    ends = list(map(operator.add, starts, spans))
    if not all(map(operator.le, ends, sizes)):  # C-level passes: a view reads a thousand tensors
        i = next(i for i, (end, size) in enumerate(zip(ends, sizes, strict=True)) if end > size)
        raise StorageFreedError(
            f"{name(i)}: its storage holds {sizes[i]} bytes, but the tensor spans {spans[i]} bytes from "
            f"byte {starts[i]} of it: {advice}"
        )
    facts = PythonFacts(tuple(map(_data_ptr, tensors)), shapes, dtypes, contiguous, strided)
    return Memory(facts, storages, sizes)


def comparer(memory: Memory) -> Callable[[Sequence[Any]], bool]:
    """``compare(tensors)``: the tensors (read again) are at the addresses, of the shapes, dtypes
    and strides ``memory`` recorded, and its storages still hold what they held (the view's own
    tensors share them). A value that is no tensor any more raises AttributeError or TypeError."""
    facts, storages, sizes = memory
    if isinstance(facts, bytes):
        reader = compiled()
        if reader is None:
            raise RuntimeError("mok.read.memory: facts recorded by the compiled reader, which is gone")
        same = reader.same
        if reader.names_storages:  # the very storages the view's tensors share, kept alive: no size to ask
            return lambda tensors: same(tensors, facts)

        def compare_compiled(tensors: Sequence[Any]) -> bool:
            return same(tensors, facts) and tuple(map(_nbytes, storages)) == sizes

        return compare_compiled
    addresses, shapes, dtypes, contiguous, strided = facts

    def compare(tensors: Sequence[Any]) -> bool:
        if (
            tuple(map(_data_ptr, tensors)) != addresses
            or tuple(map(_size, tensors)) != shapes
            or tuple(map(_dtype, tensors)) != dtypes
            or tuple(map(_is_contiguous, tensors)) != contiguous
            or tuple(map(_nbytes, storages)) != sizes
        ):
            return False
        return not strided or all(tensors[i].stride() == s for i, s in strided)

    return compare


def owned_memory(tensors: Iterable[torch.Tensor]) -> Memory:
    """The storages of ``tensors`` (buffers a view owns and a launch writes), each once, with
    their sizes: what a refresh guard compares (mok.plan.guard). Their addresses and shapes are the view's
    own, which nothing re-views."""
    found = list(map(_untyped_storage, tensors))
    storages = tuple(dict(zip(map(_storage_ptr, found), found, strict=True)).values())
    return Memory(NO_MEMORY.facts, storages, tuple(map(_nbytes, storages)))
