"""The memory under the tensors a view reads, as the view's checks saw it, and the same compared
later: what makes a checked refresh see every change a new view would see.

A view depends, for every tensor it reads (TE's payloads, scales and amax, BF16 weights), on
the tensor's address, shape, dtype and strides, and on its storage still holding every byte the
tensor spans. :func:`read_memory` records exactly these, refusing a tensor whose storage lost its
memory (Megatron-FSDP and torch FSDP2 free unsharded weights with ``untyped_storage().resize_(0)``
between steps); :func:`same_memory` compares them, in C-level passes (a refresh of 256 experts
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
from te_compat import TensorKind, on_refresh, tensor_kind_or_none

_data_ptr, _untyped_storage, _offset = torch.Tensor.data_ptr, torch.Tensor.untyped_storage, torch.Tensor.storage_offset
_layout, _stride, _nbytes = attrgetter("shape", "dtype"), torch.Tensor.stride, torch.UntypedStorage.nbytes

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
    """What a view depends on of the tensors it read, in order: each one's address, (shape, dtype)
    and strides, and its storage with the bytes that storage held."""

    addresses: tuple[int, ...]
    layouts: tuple[tuple[torch.Size, torch.dtype], ...]
    strides: tuple[tuple[int, ...], ...]
    storages: tuple[torch.UntypedStorage, ...]
    sizes: tuple[int, ...]

    def __add__(self, other: tuple[Any, ...]) -> Memory:
        """The memory of two readings, one after the other."""
        if not isinstance(other, Memory):
            return NotImplemented
        return Memory(*map(operator.add, self, other))


NO_MEMORY = Memory((), (), (), (), ())


def _spans(keys: Iterable[tuple[tuple[torch.Size, torch.dtype], tuple[int, ...]]]) -> dict[Any, tuple[int, int]]:
    """(itemsize, bytes spanned from the first element) of each distinct (shape, dtype, strides):
    a view's experts share one, so this is worked out once, not per tensor."""
    spans = {}
    for key in set(keys):
        (shape, dtype), strides = key
        spanned = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        spans[key] = dtype.itemsize, spanned * dtype.itemsize
    return spans


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
    layouts, strides = tuple(map(_layout, tensors)), tuple(map(_stride, tensors))
    storages = tuple(map(_untyped_storage, tensors))
    sizes = _sizes(tensors, storages, name)
    keys = list(zip(layouts, strides, strict=True))
    spans = _spans(keys)
    for i, (offset, key, size) in enumerate(zip(map(_offset, tensors), keys, sizes, strict=True)):
        itemsize, spanned = spans[key]
        if offset * itemsize + spanned > size:
            raise StorageFreedError(
                f"{name(i)}: its storage holds {size} bytes, but the tensor spans {spanned} bytes from byte "
                f"{offset * itemsize} of it: {advice}"
            )
    return Memory(tuple(map(_data_ptr, tensors)), layouts, strides, storages, sizes)


def same_memory(tensors: Sequence[Any], memory: Memory) -> bool:
    """``tensors`` (read again) are at the addresses, of the shapes, dtypes and strides that
    ``memory`` recorded, and its storages still hold what they held. C-level passes, cheapest
    first; a value that is no tensor any more raises AttributeError or TypeError."""
    return (
        tuple(map(_data_ptr, tensors)) == memory.addresses
        and tuple(map(_layout, tensors)) == memory.layouts
        and tuple(map(_stride, tensors)) == memory.strides
        and tuple(map(_nbytes, memory.storages)) == memory.sizes
    )


def owned_memory(tensors: Iterable[torch.Tensor]) -> Memory:
    """The storages of ``tensors`` (buffers a view owns and a launch writes), each once, with
    their sizes: what a refresh guard compares (mok.refresh). Their addresses and shapes are the view's
    own, which nothing re-views."""
    storages = tuple({s.data_ptr(): s for s in map(_untyped_storage, tensors)}.values())
    return Memory((), (), (), storages, tuple(map(_nbytes, storages)))
