"""The MXFP8 scale layout of tcgen05 / cuBLAS ("128x4", see the layout spec) and the torch
reference that produces it.

A logical scale matrix ``S[R, C]`` (uint8, one E8M0 byte per 32 values) is padded to
``Rp = roundup(R, 128)``, ``Cp = roundup(C, 4)`` and laid out as ``[Rp/128, Cp/4, 32, 16]``:
``S[r, c]`` goes to byte ``((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``.
Padding bytes are 0. A batch ``[E, R, C]`` pads each expert on its own, expert-major.
"""

from __future__ import annotations

import functools
import math
import operator
import os
from collections.abc import Sequence
from typing import NamedTuple

import torch

from mok.checks import check_index, check_int, describe
from mok.errors import LayoutError
from te_compat.geometry import roundup

ROW_BLOCK = 128  # rows of one tile of the layout
COL_BLOCK = 4  # scale columns of one tile
TILE_BYTES = 512

_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7 names the E8M0 dtype
_SCALE_DTYPES = (torch.uint8,) if _E8M0 is None else (torch.uint8, _E8M0)


def _dims(rows: object, columns: object) -> tuple[int, int]:
    """The two dimensions of a scale matrix, checked: ints >= 1 (a wrong one would pad wrongly)."""
    return check_int("rows", rows, minimum=1), check_int("columns", columns, minimum=1)


def padded_shape(rows: int, columns: int) -> tuple[int, int]:
    """``(Rp, Cp)`` of the layout of a logical ``[rows, columns]`` scale matrix."""
    r, c = _dims(rows, columns)
    return roundup(r, ROW_BLOCK), roundup(c, COL_BLOCK)


def layout_shape(rows: int, columns: int, experts: int = 1) -> tuple[int, int, int, int]:
    """Shape of the layout of ``experts`` logical ``[rows, columns]`` matrices."""
    rp, cp = padded_shape(rows, columns)
    return check_int("experts", experts, minimum=1) * rp // ROW_BLOCK, cp // COL_BLOCK, 32, 16


@functools.cache
def _capacity(device: torch.device) -> int | None:
    """Bytes of memory ``device`` has in all (None where unknown: a meta tensor has none to run out
    of, and a fake CUDA tensor may live on a machine without CUDA). Cached: asked at every
    allocation of mok's buffers, and a device's memory does not change."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return None


def new_buffers(
    buffers: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device, what: str
) -> list[torch.Tensor]:
    """New (uninitialised) tensors of the ``(shape, dtype)`` pairs ``buffers`` on ``device``.
    Requests larger than the device's memory in all are refused before anything is allocated,
    and a failed allocation is named, both with the bytes required (``what`` says whose)."""
    if torch.compiler.is_compiling():  # traced, not run: the compiled graph allocates them
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in buffers]
    need = sum(math.prod(shape) * dtype.itemsize for shape, dtype in buffers)
    capacity = _capacity(device)
    if capacity is not None and need > capacity:
        raise LayoutError(f"{what} needs {need} bytes; expected at most the {capacity} bytes {device} has in all")
    try:
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in buffers]
    except RuntimeError as exc:  # torch.OutOfMemoryError on CUDA, the CPU allocator's RuntimeError
        raise LayoutError(
            f"{what} needs {need} bytes; allocating them on {device} failed ({type(exc).__name__})"
        ) from exc


def empty_layout(rows: int, cols: int, experts: int, device: torch.device, what: str) -> torch.Tensor:
    """A new layout buffer for ``experts`` logical ``[rows, cols]`` matrices (see :func:`new_buffers`)."""
    shape = layout_shape(rows, cols, experts)
    return new_buffers([(shape, torch.uint8)], device, f"{what}: the layout of {experts} x [{rows}, {cols}] scales")[0]


def te_swizzled_layout(buffer: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """TE's buffer of scales it keeps swizzled (uint8), viewed as the layout ``shape`` it must
    hold exactly: TE's swizzled scales are used as they are, so any other size or any gap is
    refused rather than read as the layout."""
    if buffer.numel() != math.prod(shape) or not buffer.is_contiguous():
        raise LayoutError(
            f"{name}: TE marks these scales swizzled, so its buffer should be exactly the layout {shape}; "
            f"found shape {tuple(buffer.shape)}, strides {buffer.stride()}"
        )
    return buffer.view(shape)


Geometry = tuple[tuple[int, int, int], tuple[int, int, int]]  # sizes and strides of logical [E, R, C]


def logical_view(buffer: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """The logical ``[E, R, C]`` scale matrices ``geometry`` describes over ``buffer``, from
    ``buffer``'s own offset (a strided view: no copy)."""
    return buffer.as_strided(geometry[0], geometry[1], buffer.storage_offset())


def layout_offset(r: int, c: int, rows: int, columns: int) -> int:
    """Byte offset of ``S[r, c]`` in the layout of one ``[rows, columns]`` matrix (the spec's formula).

    ``r`` and ``c`` must lie inside the matrix: outside it the formula gives another entry's byte.
    """
    rows, columns = _dims(rows, columns)
    r, c = check_index("r", r, rows), check_index("c", c, columns)
    cp = roundup(columns, COL_BLOCK)
    return ((r // 128) * (cp // 4) + c // 4) * TILE_BYTES + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def check_scale_dtype(t: torch.Tensor, name: str) -> None:
    """``t`` holds scales: uint8, or E8M0 where torch has it (LayoutError naming its dtype)."""
    if t.dtype not in _SCALE_DTYPES:
        raise LayoutError(f"{name}: expected uint8 (E8M0) scales; found dtype {t.dtype} of shape {tuple(t.shape)}")


def _as_uint8(t: torch.Tensor, name: str) -> torch.Tensor:
    check_scale_dtype(t, name)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def as_batch(scales: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """Validate logical scales ``[R, C]`` or ``[E, R, C]`` and return them as ``[E, R, C]`` uint8."""
    if not isinstance(scales, torch.Tensor):
        raise LayoutError(f"{name}: expected a torch.Tensor; found {describe(scales)}")
    s = _as_uint8(scales, name)
    if s.dim() == 2:
        s = s.unsqueeze(0)
    if s.dim() != 3 or 0 in s.shape:
        raise LayoutError(
            f"{name}: expected a non-empty logical scale matrix [R, C] or batch [E, R, C]; "
            f"found shape {tuple(scales.shape)}"
        )
    return s


def check_writable(out: torch.Tensor, name: str) -> None:
    """Outside inference mode torch refuses in-place writes to an inference tensor, and only at the
    first write (a call with several outputs may have written others by then): refused up front."""
    if torch.compiler.is_compiling():  # Dynamo cannot trace is_inference(); the op checks when it runs
        return
    if out.is_inference() and not torch.is_inference_mode_enabled():
        raise LayoutError(
            f"{name} is an inference tensor (made under torch.inference_mode()), which torch refuses to write "
            "outside inference mode; expected a tensor made outside it, or this call made under it"
        )


def check_out(out: torch.Tensor, batch: torch.Tensor, name: str = "out") -> None:
    """``out`` must be exactly the layout buffer for ``batch``: shape, dtype, device, contiguous,
    and writable here."""
    e, r, c = batch.shape
    want = layout_shape(r, c, e)
    if not isinstance(out, torch.Tensor):
        raise LayoutError(f"{name}: expected a torch.Tensor; found {describe(out)}")
    problems = []
    if tuple(out.shape) != want:
        problems.append(f"shape {want} (found {tuple(out.shape)})")
    if out.dtype != torch.uint8:
        problems.append(f"dtype torch.uint8 (found {out.dtype})")
    if out.device != batch.device:
        problems.append(f"device {batch.device} (found {out.device})")
    if not out.is_contiguous():
        problems.append(f"a contiguous buffer (found strides {out.stride()})")
    if problems:
        raise LayoutError(
            f"{name} cannot hold the layout of scales {tuple(batch.shape)}: expected " + ", ".join(problems)
        )
    check_writable(out, name)


def check_layout_of(layout: object, logical: tuple[int, int, int]) -> torch.Tensor:
    """``layout`` must be the contiguous uint8 layout of ``logical`` ``[E, R, C]`` scales."""
    experts, rows, cols = logical
    want = layout_shape(rows, cols, experts)
    if not isinstance(layout, torch.Tensor) or tuple(layout.shape) != want or layout.dtype != torch.uint8:
        found = (tuple(layout.shape), layout.dtype) if isinstance(layout, torch.Tensor) else describe(layout)
        raise LayoutError(f"layout: expected a uint8 layout of shape {want}; found {found}")
    if not layout.is_contiguous():
        raise LayoutError(f"layout: expected a contiguous layout buffer; found strides {layout.stride()}")
    return layout


class _Box(NamedTuple):
    """Ranges of the layout's six indices ``[e, r/128, (r%128)/32, r%32, c/4, c%4]`` over which a
    logical ``[E, R, C]`` matrix and its layout are two strided views of each other."""

    blocks: slice  # r // 128
    groups: slice  # (r % 128) // 32
    lanes: slice  # r % 32
    tiles: slice  # c // 4
    columns: slice  # c % 4


def _row_sets(rows: int) -> list[tuple[slice, slice, slice]]:
    """``range(rows)`` as at most three (block, group, lane) products: whole 128-row blocks, the
    whole 32-row groups of the last block, and the rows of its last group."""
    blocks, rest = divmod(rows, ROW_BLOCK)
    groups, lanes = divmod(rest, 32)
    sets = [(slice(0, blocks), slice(0, 4), slice(0, 32))] if blocks else []
    if groups:
        sets.append((slice(blocks, blocks + 1), slice(0, groups), slice(0, 32)))
    if lanes:
        sets.append((slice(blocks, blocks + 1), slice(groups, groups + 1), slice(0, lanes)))
    return sets


def _boxes(rows: int, cols: int) -> list[_Box]:
    tiles, last = divmod(cols, COL_BLOCK)
    col_sets = [(slice(0, tiles), slice(0, 4))] if tiles else []
    if last:
        col_sets.append((slice(tiles, tiles + 1), slice(0, last)))
    return [_Box(*r, *c) for r in _row_sets(rows) for c in col_sets]


def _logical_box(t: torch.Tensor, box: _Box) -> torch.Tensor:
    """The elements of logical ``[E, R, C]`` ``t`` (any strides) in ``box``, as a 6-D view."""
    es, rs, cs = t.stride()
    sizes = [t.shape[0]] + [s.stop - s.start for s in box]
    strides = (es, ROW_BLOCK * rs, 32 * rs, rs, COL_BLOCK * cs, cs)
    starts = (0, *(s.start for s in box))
    return t.as_strided(sizes, strides, t.storage_offset() + sum(map(operator.mul, starts, strides)))


def _layout_box(layout: torch.Tensor, experts: int, rows: int, cols: int, box: _Box) -> torch.Tensor:
    """The same elements in the layout buffer, indexed as :func:`_logical_box` indexes them."""
    rp, cp = padded_shape(rows, cols)
    six = layout.view(experts, rp // ROW_BLOCK, cp // COL_BLOCK, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    return six[(slice(None), *box)]


def _padding_boxes(rows: int, cols: int) -> list[_Box]:
    """The layout's padding, as at most three boxes: the last tile's columns past ``cols``, then
    the last block's rows past ``rows`` (the rest of a partial 32-row group, the groups after)."""
    rp, cp = padded_shape(rows, cols)
    all_rows, all_cols = (
        (slice(0, rp // ROW_BLOCK), slice(0, 4), slice(0, 32)),
        (slice(0, cp // COL_BLOCK), slice(0, 4)),
    )
    boxes = [_Box(*all_rows, slice(cp // 4 - 1, cp // 4), slice(cols % 4, 4))] if cols % 4 else []
    last = slice(rp // ROW_BLOCK - 1, rp // ROW_BLOCK)
    groups, lanes = divmod(rows - (rp - ROW_BLOCK), 32)
    if lanes:
        boxes.append(_Box(last, slice(groups, groups + 1), slice(lanes, 32), *all_cols))
        groups += 1
    if groups < 4:
        boxes.append(_Box(last, slice(groups, 4), slice(0, 32), *all_cols))
    return boxes


def swizzle_reference(batch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Torch reference: ``[E, R, C]`` uint8 (any strides) into layout ``out`` (validated by the
    caller), padding zeroed. A few strided copies, no temporary: memory peaks at ``out``. Each
    byte is written once, with its final value, so two conversions into one buffer never leave
    it wrong for a moment (concurrent refreshes of one view are safe)."""
    e, r, c = batch.shape
    for box in _padding_boxes(r, c):
        _layout_box(out, e, r, c, box).zero_()
    for box in _boxes(r, c):
        _layout_box(out, e, r, c, box).copy_(_logical_box(batch, box))
    return out


def unswizzle_reference(layout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The exact inverse of :func:`swizzle_reference`: layout ``layout`` back into logical
    ``[E, R, C]`` ``out`` (any strides, validated by the caller), the padding dropped."""
    e, r, c = out.shape
    for box in _boxes(r, c):
        _logical_box(out, box).copy_(_layout_box(layout, e, r, c, box))
    return out
