"""The MXFP8 scale layout of tcgen05 / cuBLAS ("128x4", see the layout spec) and the torch
reference that produces it.

A logical scale matrix ``S[R, C]`` (uint8, one E8M0 byte per 32 values) is padded to
``Rp = roundup(R, 128)``, ``Cp = roundup(C, 4)`` and laid out as ``[Rp/128, Cp/4, 32, 16]``:
``S[r, c]`` goes to byte ``((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``.
Padding bytes are 0. A batch ``[E, R, C]`` pads each expert on its own, expert-major.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mok.checks import check_index, check_int, describe
from mok.errors import LayoutError

ROW_BLOCK = 128  # rows of one tile of the layout
COL_BLOCK = 4  # scale columns of one tile
TILE_BYTES = 512
MXFP8_BLOCK = 32  # values per E8M0 scale

_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7 names the E8M0 dtype
_SCALE_DTYPES = (torch.uint8,) if _E8M0 is None else (torch.uint8, _E8M0)


def _roundup(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def roundup(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (both checked: ints, value >= 0)."""
    return _roundup(check_int("value", value), check_int("multiple", multiple, minimum=1))


def _dims(rows: object, cols: object) -> tuple[int, int]:
    """The two dimensions of a scale matrix, checked: ints >= 1 (a wrong one would pad wrongly)."""
    return check_int("rows", rows, minimum=1), check_int("cols", cols, minimum=1)


def padded_shape(rows: int, cols: int) -> tuple[int, int]:
    """``(Rp, Cp)`` of the layout of a logical ``[rows, cols]`` scale matrix."""
    r, c = _dims(rows, cols)
    return _roundup(r, ROW_BLOCK), _roundup(c, COL_BLOCK)


def layout_shape(rows: int, cols: int, experts: int = 1) -> tuple[int, int, int, int]:
    """Shape of the layout of ``experts`` logical ``[rows, cols]`` matrices."""
    rp, cp = padded_shape(rows, cols)
    return check_int("experts", experts, minimum=1) * rp // ROW_BLOCK, cp // COL_BLOCK, 32, 16


Geometry = tuple[tuple[int, int, int], tuple[int, int, int]]  # sizes and strides of logical [E, R, C]


def logical_view(buffer: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """The logical ``[E, R, C]`` scale matrices ``geometry`` describes over ``buffer``, from
    ``buffer``'s own offset (a strided view: no copy)."""
    return buffer.as_strided(geometry[0], geometry[1], buffer.storage_offset())


def layout_offset(r: int, c: int, rows: int, cols: int) -> int:
    """Byte offset of ``S[r, c]`` in the layout of one ``[rows, cols]`` matrix (the spec's formula).

    ``r`` and ``c`` must lie inside the matrix: outside it the formula gives another entry's byte.
    """
    rows, cols = _dims(rows, cols)
    r, c = check_index("r", r, rows), check_index("c", c, cols)
    cp = _roundup(cols, COL_BLOCK)
    return ((r // 128) * (cp // 4) + c // 4) * TILE_BYTES + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _as_uint8(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in _SCALE_DTYPES:
        raise LayoutError(f"{name}: expected uint8 (E8M0) scales; found dtype {t.dtype} of shape {tuple(t.shape)}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def as_batch(scales: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """Validate logical scales ``[R, C]`` or ``[E, R, C]`` and return them as ``[E, R, C]`` uint8."""
    if not isinstance(scales, torch.Tensor):
        raise LayoutError(f"{name}: expected a torch.Tensor; found {type(scales).__name__}")
    s = _as_uint8(scales, name)
    if s.dim() == 2:
        s = s.unsqueeze(0)
    if s.dim() != 3 or 0 in s.shape:
        raise LayoutError(
            f"{name}: expected a non-empty logical scale matrix [R, C] or batch [E, R, C]; "
            f"found shape {tuple(scales.shape)}"
        )
    return s


def check_out(out: torch.Tensor, batch: torch.Tensor, name: str = "out") -> None:
    """``out`` must be exactly the layout buffer for ``batch``: shape, dtype, device, contiguous."""
    e, r, c = batch.shape
    want = layout_shape(r, c, e)
    if not isinstance(out, torch.Tensor):
        raise LayoutError(f"{name}: expected a torch.Tensor; found {type(out).__name__}")
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
    if out.untyped_storage().data_ptr() == batch.untyped_storage().data_ptr():
        raise LayoutError(
            f"{name} shares storage with the input scales; the layout cannot be written over its own input"
        )


def swizzle_reference(batch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Torch reference: ``[E, R, C]`` uint8 (any strides) into ``out`` (validated by the caller)."""
    e, r, c = batch.shape
    rp, cp = padded_shape(r, c)
    padded = torch.zeros((e, rp, cp), dtype=torch.uint8, device=batch.device)
    padded[:, :r, :c] = batch
    tiles = padded.view(e, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    out.view(e, rp // 128, cp // 4, 32, 4, 4).copy_(tiles)
    return out


def rowwise_scales(buffer: torch.Tensor, rows: int, cols: int, name: str = "rowwise scales") -> torch.Tensor:
    """Logical ``[rows, cols/32]`` view of TE's padded rowwise scale buffer (no copy)."""
    r, c = _dims(rows, cols)
    return _cut(buffer, r, _blocks(c, name), name)


def columnwise_scales(buffer: torch.Tensor, rows: int, cols: int, name: str = "columnwise scales") -> torch.Tensor:
    """Logical ``[cols, rows/32]`` view (the transpose) of TE's ``[rows/32, cols]`` buffer."""
    r, c = _dims(rows, cols)
    return _cut(buffer, _blocks(r, name), c, name).transpose(-1, -2)


def _blocks(n: int, name: str) -> int:
    if n % MXFP8_BLOCK:
        raise LayoutError(f"{name}: MXFP8 needs dimensions divisible by {MXFP8_BLOCK}; found {n}")
    return n // MXFP8_BLOCK


def _cut(buffer: torch.Tensor, r: int, c: int, name: str) -> torch.Tensor:
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor scale buffer; found {describe(buffer)}")
    if buffer.dim() < 2 or buffer.shape[-2] < r or buffer.shape[-1] < c:
        raise LayoutError(f"{name}: expected a buffer of at least [{r}, {c}] (TE pads it); found {tuple(buffer.shape)}")
    return _as_uint8(buffer, name)[..., :r, :c]


def grouped_scales(flat: torch.Tensor, experts: int, rows: int, cols: int, name: str) -> torch.Tensor:
    """``[E, rows, cols]`` view of a flat grouped buffer of E TE-padded ``[rows, cols]`` matrices."""
    experts = check_int("experts", experts, minimum=1)
    rows, cols = _dims(rows, cols)
    if not isinstance(flat, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor scale buffer; found {describe(flat)}")
    flat = _as_uint8(flat, name)
    if flat.dim() != 1 or not flat.is_contiguous():
        raise LayoutError(
            f"{name}: expected a flat contiguous buffer; found shape {tuple(flat.shape)} strides {flat.stride()}"
        )
    if flat.numel() != experts * rows * cols:
        raise LayoutError(
            f"{name}: expected {experts} experts x [{rows}, {cols}] = {experts * rows * cols} bytes; "
            f"found {flat.numel()}"
        )
    return flat.view(experts, rows, cols)


def te_rowwise_padding(rows: int, cols: int) -> tuple[int, int]:
    """TE's allocation of rowwise scales for data ``[rows, cols]``: [roundup(rows,128), roundup(cols/32,4)]."""
    rows, cols = _dims(rows, cols)
    return _roundup(rows, 128), _roundup(cols // MXFP8_BLOCK, 4)


def te_columnwise_padding(rows: int, cols: int) -> tuple[int, int]:
    """TE's allocation of columnwise scales: [roundup(rows/32,4), roundup(cols,128)]."""
    rows, cols = _dims(rows, cols)
    return _roundup(rows // MXFP8_BLOCK, 4), _roundup(cols, 128)


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)``: the addresses of the bytes a (non-empty) view can touch."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """Every byte address a view covers (int64, on the CPU; only shapes and strides are read)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    starts = t.data_ptr() + offsets.flatten() * t.element_size()
    return (starts.unsqueeze(-1) + torch.arange(t.element_size(), dtype=torch.int64)).flatten()


def _overlap(a: torch.Tensor, b: torch.Tensor, span_a: tuple[int, int], span_b: tuple[int, int]) -> bool:
    if a.device != b.device or span_a[0] >= span_b[1] or span_b[0] >= span_a[1]:
        return False
    if a.is_contiguous() and b.is_contiguous():  # each covers its whole span: the spans meet
        return True
    return bool(torch.isin(_bytes_of(a), _bytes_of(b)).any())  # strided views may interleave


def check_no_overlap(
    outs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    what: str,
    *,
    out_label: str = "outs",
    input_label: str = "inputs",
) -> None:
    """Raise LayoutError when an output shares a byte with another output or with an input.

    A conversion writing such an output would overwrite an input, or one result with another,
    without any error. Exact: the bytes each view covers (offset, sizes, strides) are compared,
    so disjoint views of one buffer pass. Inputs may overlap each other.
    """
    spans = [
        (_byte_span(t), is_out, i, t)
        for is_out, tensors in ((True, outs), (False, inputs))
        for i, t in enumerate(tensors)
        if t.numel() > 0
    ]
    spans.sort(key=lambda item: item[0][0])
    open_spans: list[tuple[tuple[int, int], bool, int, torch.Tensor]] = []
    for span, is_out, i, t in spans:
        open_spans = [o for o in open_spans if o[0][1] > span[0]]
        for other_span, other_is_out, j, other in open_spans:
            if (is_out or other_is_out) and _overlap(t, other, span, other_span):
                (_, a, ia), (_, b, ib) = sorted([(not is_out, is_out, i), (not other_is_out, other_is_out, j)])
                raise LayoutError(
                    f"{what}: {out_label if a else input_label}[{ia}] overlaps "
                    f"{out_label if b else input_label}[{ib}] in memory; "
                    f"expected every output in a buffer of its own, apart from every input"
                )
        open_spans.append((span, is_out, i, t))
