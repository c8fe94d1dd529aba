"""Whether an output shares a byte of memory with another output or with an input.

A conversion writing into such an output would overwrite its own input, or one result with
another, without any error. The check is exact and reads only addresses, shapes and strides:
tensors that share memory through different storages (numpy arrays, ``torch.frombuffer``, DLPack)
are compared by address, disjoint views of one buffer pass, and tensors without memory (meta) or
on different devices never overlap.

Cost: one sort of the tensors' byte spans, then only pairs whose spans meet are compared; a pair
of dense views whose spans meet overlaps, and two strided views are compared on a byte mask of
their joint span (written and read through strided views of it, at memory speed), or, where that
span is far larger than their bytes (sparse views), on their sorted byte addresses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from mok.errors import LayoutError

_SPARSE = 8  # a joint span over this many times the views' bytes is compared address by address


class _Span(NamedTuple):
    start: int  # address of the first byte the view can touch
    end: int  # one past the last
    is_out: bool
    position: int
    tensor: torch.Tensor


def _end(t: torch.Tensor, start: int) -> int:
    """One past the last byte address the (non-empty) view ``t`` starting at ``start`` can touch."""
    if t.is_contiguous():
        return start + t.numel() * t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return start + (last + 1) * t.element_size()


def _span(t: torch.Tensor, is_out: bool, index: int) -> _Span:
    start = t.data_ptr()
    return _Span(start, _end(t, start), is_out, index, t)


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A quick answer for one output and one input (every eager conversion): no shared memory
    possible (other devices, no memory, disjoint spans)."""
    if a.device != b.device or a.device.type == "meta" or not a.numel() or not b.numel():
        return True
    sa, sb = a.data_ptr(), b.data_ptr()
    return _end(a, sa) <= sb or _end(b, sb) <= sa


def _dense(t: torch.Tensor) -> bool:
    """Every byte of the view's span belongs to one of its elements (any dimension order)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an expanded view, or strides that fold
    back): taken in stride order, each dimension must step past everything the smaller ones span.
    A write through such a view would race with itself on the kernel."""
    span = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        if stride < span:
            return True
        span = stride * size
    return False


def _bytes_view(mask: torch.Tensor, base: int, t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a strided view of ``mask``, whose byte 0 stands for address ``base``."""
    k = t.element_size()
    sizes = (*t.shape, k)
    strides = (*(s * k for s in t.stride()), 1)
    return mask.as_strided(sizes, strides, t.data_ptr() - base)


def _addresses(t: torch.Tensor) -> torch.Tensor:
    """Every byte address of a (sparse) view, sorted (int64, on the CPU)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    starts = t.data_ptr() + offsets.flatten() * t.element_size()
    return (starts.unsqueeze(-1) + torch.arange(t.element_size(), dtype=torch.int64)).flatten().sort().values


def _residues_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """False when no byte of ``a`` and of ``b`` can share an address modulo the gcd of every
    byte stride of both (views interleaved in one buffer: ``buf[0::2]`` and ``buf[1::2]``)."""
    strides = [s * t.element_size() for t in (a, b) for s, n in zip(t.stride(), t.shape, strict=True) if n > 1]
    g = math.gcd(*strides) if strides else 0
    if g == 0:
        return True
    ka, kb = a.element_size(), b.element_size()
    shift = a.data_ptr() - b.data_ptr()
    return any((shift + x) % g < kb for x in range(min(ka, g))) or kb >= g


def _meet(a: _Span, b: _Span) -> bool:
    """Whether views whose spans intersect share a byte."""
    if _dense(a.tensor) and _dense(b.tensor):
        return True
    if not _residues_meet(a.tensor, b.tensor):
        return False
    base, joint = min(a.start, b.start), max(a.end, b.end) - min(a.start, b.start)
    nbytes = a.tensor.numel() * a.tensor.element_size() + b.tensor.numel() * b.tensor.element_size()
    if joint <= _SPARSE * nbytes:
        mask = torch.zeros(joint, dtype=torch.uint8)
        _bytes_view(mask, base, a.tensor).fill_(1)
        return bool(_bytes_view(mask, base, b.tensor).any())
    return bool(torch.isin(_addresses(a.tensor), _addresses(b.tensor), assume_unique=False).any())


def _spans(outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> dict[torch.device, list[_Span]]:
    """The byte spans of every tensor with memory, by device, sorted by start address."""
    found: dict[torch.device, list[_Span]] = {}
    for is_out, tensors in ((True, outs), (False, inputs)):
        for i, t in enumerate(tensors):
            if t.numel() > 0 and t.device.type != "meta":
                found.setdefault(t.device, []).append(_span(t, is_out, i))
    for spans in found.values():
        spans.sort(key=lambda s: s.start)
    return found


def check_no_overlap(
    outs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    what: str,
    *,
    out_label: str = "outs",
    input_label: str = "inputs",
) -> None:
    """Raise LayoutError when an output shares a byte with another output or with an input
    (inputs may share memory with each other)."""
    if len(outs) == 1 and len(inputs) == 1 and _apart(outs[0], inputs[0]):
        return
    for spans in _spans(outs, inputs).values():
        open_spans: list[_Span] = []
        for span in spans:
            open_spans = [o for o in open_spans if o.end > span.start]
            for other in open_spans:
                if (span.is_out or other.is_out) and _meet(span, other):
                    first, second = sorted([other, span], key=lambda s: (not s.is_out, s.position))
                    raise LayoutError(
                        f"{what}: {out_label if first.is_out else input_label}[{first.position}] overlaps "
                        f"{out_label if second.is_out else input_label}[{second.position}] in memory; "
                        f"expected every output in a buffer of its own, apart from every input"
                    )
            open_spans.append(span)
