"""The conversions of an MXFP8 export (mok.export) as torch library ops, namespace ``mok``.

Each reads what a view holds (payloads, scales in the 128x4 layout of mok.layout) and writes
an inference engine's layout into its ``out`` argument, declared in the schema (``Tensor(a!)``),
as mok.ops does for the layout conversions: ``torch.compile`` traces them, ``FakeTensorMode``
and meta tensors run their fake implementation (the argument checks, nothing written), and
``torch.library.opcheck`` can check them. They are pure data movement (strided copies, no
temporary, nothing dequantised): the same torch code on the CPU and on CUDA.

- ``mxfp8_scales_to_deepgemm(layout, out, columns=None)``: DeepGEMM's MN-major, TMA-aligned,
  packed UE8M0 scales. Definition: DeepGEMM ``csrc/jit_kernels/impls/smxx_layout.hpp``,
  ``get_mn_major_tma_aligned_packed_ue8m0_tensor_torch`` (its reference): one int32 per 4
  consecutive scales of a row (byte ``j`` holds scale ``4g + j``, the rest of the last word 0),
  shape ``[E, R, ceil(C/4)]``, strides ``(aR * ceil(C/4), 1, aR)`` with ``aR = roundup(R, 4)``
  (``get_tma_aligned_size(R, 4)``, ``csrc/utils/math.hpp``). ``out`` is that strided tensor;
  the rows ``R..aR`` of its storage are the caller's (mok.export allocates them zeroed).
  ``columns`` is the logical C: the bytes of the last word past it are written 0, whatever the
  layout's padding holds (None: C is ``Cp``, the layout's padding copied as it is: right only
  for a layout whose padding is zero, as mok's own conversions leave it).
- ``mxfp8_scales_to_trtllm(layout, out, rows=None, columns=None)``: the scales of FlashInfer's
  TRT-LLM routed MoE (``trtllm_fp8_block_scale_routed_moe``, ``WeightLayout.MajorK``) as
  Megatron-Core builds them: ``megatron/core/inference/moe/flashinfer_mxfp8.py``,
  ``_shuffle_routed_scale`` over the logical matrix zero-padded to ``[roundup(R, 128),
  roundup(C, 4)]``: rows permuted within blocks of 32 by FlashInfer's
  ``get_shuffle_matrix_a_row_indices(.., 128)`` (``flashinfer/utils.py``: row ``o`` of a block
  goes to ``srcToDstBlk32RowMap[o] = (o % 4) * 8 + o // 4``), then ``_block_scale_interleave``,
  which is the 128x4 layout itself. So the result is the view's layout with its 32 lanes
  permuted, and its bytes of rows past R or columns past C (``rows``, ``columns``: the logical
  ``[R, C]``; None, the padded ones) written 0. ``out`` is uint8 ``[E, Rp * Cp]``.

The layout's padding is zero where mok converted the scales, but not where TE keeps them in the
GEMM layout itself (2.12+'s swizzled flag): the view is then TE's bytes, padding as TE left it.
The owners' references always write zeros there (and FlashInfer's zero K padding would turn an
0xFF, E8M0's NaN, into NaN), so the export writes zeros past the logical matrix, never the
layout's padding.
- ``mxfp8_payload_to_trtllm(data, out)``: the payload as Megatron's
  ``prepare_routed_mxfp8_weights`` makes it: zero-padded to ``[roundup(N, 128),
  roundup(K, 128)]``, rows permuted as above (FlashInfer's ``shuffle_matrix_a(.., 128)``).
- ``mxfp8_export(data, scales, columnwise_data, columnwise_scales, out, layout, backend=None)``:
  a whole export (mok.export_mxfp8's conversion) of every expert and direction: ``data`` one
  ``[E, N, K]`` payload or E ``[N, K]`` ones, ``scales`` their 128x4 layouts (one, or one an
  expert), the columnwise lists alike or empty, ``out`` the layout's buffers (data, scales, then
  the columnwise ones; shapes: :func:`export_shapes`). On CUDA it is ONE launch of
  mok/kernels/mxfp8_export.cu (where the backend is the kernel: mok.backend); on the CPU, or with
  the torch backend, the three ops above and ``mok::unswizzle_mxfp8_scales``, per direction and
  expert batch: the reference the kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from mok.backend import Backend, backend_for
from mok.checks import describe
from mok.errors import LayoutError
from mok.layout import COL_BLOCK, ROW_BLOCK, TILE_BYTES, check_writable, layout_shape
from mok.ops import unswizzle_op
from mok.overlap import check_no_overlap
from te_compat.geometry import MXFP8
from te_compat.geometry import roundup as _roundup

SHUFFLE_BLOCK = 32  # FlashInfer's get_shuffle_block_size(128): rows are permuted within blocks of 32
TRTLLM_ALIGN = 128  # Megatron pads N and K of a routed weight to multiples of this
TMA_ALIGN_WORDS = 4  # DeepGEMM's get_tma_aligned_size(R, 4): 16 bytes of int32
LAYOUTS = ("compact", "deepgemm", "flashinfer")
EXPORT_FIELDS = ("data", "scales", "columnwise_data", "columnwise_scales")  # an export's buffers, in order
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7 names the E8M0 dtype
COMPACT_SCALE_DTYPES = (torch.uint8,) if _E8M0 is None else (torch.uint8, _E8M0)


def _tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise LayoutError(f"{name}: expected a torch.Tensor; found {describe(value)}")
    return value


def _layout_tiles(layout: object, experts: int) -> tuple[torch.Tensor, int, int]:
    """``layout`` as ``[E, Rp/128, Cp/4, 512]`` uint8, with Rp and Cp: it must be a view's
    contiguous 128x4 layout ``[E*Rp/128, Cp/4, 32, 16]`` of ``experts`` experts."""
    t = _tensor(layout, "layout")
    shape = tuple(t.shape)
    if (
        t.dtype != torch.uint8
        or len(shape) != 4
        or shape[2:] != (32, 16)
        or 0 in shape
        or shape[0] % experts
        or not t.is_contiguous()
    ):
        raise LayoutError(
            f"layout: expected the contiguous uint8 128x4 layout [E*Rp/128, Cp/4, 32, 16] of {experts} experts; "
            f"found dtype {t.dtype}, shape {shape}, strides {t.stride()}"
        )
    blocks = shape[0] // experts
    return t.view(experts, blocks, shape[1], TILE_BYTES), blocks * ROW_BLOCK, shape[1] * COL_BLOCK


def _extent(value: int | None, padded: int, block: int, name: str) -> int:
    """A logical extent of a layout padded to ``padded`` (a multiple of ``block``): ``value``,
    checked to pad to it, or ``padded`` where None."""
    if value is None:
        return padded
    if type(value) is not int or value < 1 or _roundup(value, block) != padded:
        raise LayoutError(
            f"{name}: expected the logical {name} of the layout, padded to {padded} {name}; found {value!r}"
        )
    return value


def _deepgemm_args(
    layout: torch.Tensor, out: torch.Tensor, columns: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    o = _tensor(out, "out")
    if o.dim() != 3 or o.dtype != torch.int32 or 0 in o.shape:
        raise LayoutError(
            f"out: expected DeepGEMM's int32 scales [E, R, ceil(C/4)]; found dtype {o.dtype}, shape {tuple(o.shape)}"
        )
    experts, rows, words = o.shape
    tiles, rp, cp = _layout_tiles(layout, experts)
    if _roundup(rows, ROW_BLOCK) != rp or words != cp // COL_BLOCK:
        raise LayoutError(
            f"out: shape {tuple(o.shape)} does not fit a layout of {experts} experts padded to [{rp}, {cp}]; expected "
            f"[{experts}, R, {cp // COL_BLOCK}] with roundup(R, 128) = {rp}"
        )
    aligned = _roundup(rows, TMA_ALIGN_WORDS)
    want = (aligned * words, 1, aligned)
    if o.stride() != want:
        raise LayoutError(
            f"out: expected DeepGEMM's MN-major TMA-aligned strides {want} for shape {tuple(o.shape)}; "
            f"found {o.stride()}"
        )
    if layout.device != o.device:
        raise LayoutError(f"out: expected device {layout.device} (the layout's); found {o.device}")
    return tiles, o, _extent(columns, cp, COL_BLOCK, "columns")


def _to_deepgemm(layout: torch.Tensor, out: torch.Tensor, columns: int | None = None) -> None:
    tiles, o, c = _deepgemm_args(layout, out, columns)
    check_writable(o, "out")
    check_no_overlap([o], [layout], "mxfp8_scales_to_deepgemm", out_label="out", input_label="layout")
    experts, rows, words = o.shape
    # a tile's word (lane l, group i) holds scales 4g..4g+3 of row 128b + 32i + l, byte j scale 4g + j:
    # exactly DeepGEMM's packed int32, so each copy moves whole words
    src = tiles.view(torch.int32).view(experts, -1, words, 32, 4).permute(0, 1, 4, 3, 2)  # [E, Rp/128, i, l, g]
    se, sr, sg = o.stride()
    full, rest = divmod(rows, ROW_BLOCK)
    base = o.storage_offset()
    if full:
        dst = o.as_strided((experts, full, 4, 32, words), (se, ROW_BLOCK * sr, 32 * sr, sr, sg), base)
        dst.copy_(src[:, :full])
    groups, lanes = divmod(rest, 32)
    start = base + full * ROW_BLOCK * sr
    if groups:
        dst = o.as_strided((experts, groups, 32, words), (se, 32 * sr, sr, sg), start)
        dst.copy_(src[:, full, :groups])
    if lanes:
        dst = o.as_strided((experts, lanes, words), (se, sr, sg), start + groups * 32 * sr)
        dst.copy_(src[:, full, groups, :lanes])
    if c % COL_BLOCK:  # the last word's bytes past C: the layout's padding columns, written 0
        o[:, :, -1].bitwise_and_((1 << 8 * (c % COL_BLOCK)) - 1)


def _trtllm_scale_args(
    layout: torch.Tensor, out: torch.Tensor, rows: int | None = None, columns: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    o = _tensor(out, "out")
    if o.dim() != 2 or o.dtype != torch.uint8 or o.shape[0] == 0:
        raise LayoutError(f"out: expected uint8 scales [E, Rp*Cp]; found dtype {o.dtype}, shape {tuple(o.shape)}")
    tiles, rp, cp = _layout_tiles(layout, o.shape[0])
    if o.shape[1] != rp * cp or not o.is_contiguous() or layout.device != o.device:
        raise LayoutError(
            f"out: expected a contiguous uint8 [{o.shape[0]}, {rp * cp}] on {layout.device} (a layout padded to "
            f"[{rp}, {cp}] per expert); found shape {tuple(o.shape)}, strides {o.stride()}, device {o.device}"
        )
    return tiles, o, _extent(rows, rp, ROW_BLOCK, "rows"), _extent(columns, cp, COL_BLOCK, "columns")


def _to_trtllm_scales(
    layout: torch.Tensor, out: torch.Tensor, rows: int | None = None, columns: int | None = None
) -> None:
    tiles, o, r, c = _trtllm_scale_args(layout, out, rows, columns)
    check_writable(o, "out")
    check_no_overlap([o], [layout], "mxfp8_scales_to_trtllm", out_label="out", input_label="layout")
    # lane n of a tile holds row 32k + n; Megatron's shuffled row n is source row (n % 8) * 4 + n // 8
    src = tiles.view(-1, 8, 4, 16).transpose(1, 2)  # [tiles, n // 8, n % 8, 16]
    o.view(-1, 4, 8, 16).copy_(src)
    _zero_trtllm_padding(o, tiles.shape[1] * ROW_BLOCK, tiles.shape[2] * COL_BLOCK, r, c)


def _zero_trtllm_padding(o: torch.Tensor, rp: int, cp: int, r: int, c: int) -> None:
    """Zero the bytes of ``o`` (TRT-LLM scales ``[E, Rp * Cp]``) of rows >= ``r`` or columns >=
    ``c``: a few strided slices of the edge tiles. Byte ``4i + j`` of output lane ``8y + x`` of tile
    ``(b, g)`` holds row ``128b + 32i + 4x + y`` (source lane ``4x + y``), column ``4g + j``."""
    v = o.view(o.shape[0], rp // ROW_BLOCK, cp // COL_BLOCK, 4, 8, 4, 4).permute(0, 1, 2, 5, 4, 3, 6)  # [E,b,g,i,x,y,j]
    if c % COL_BLOCK:
        v[:, :, -1, :, :, :, c % COL_BLOCK :].zero_()
    tail = r - (rp - ROW_BLOCK)  # rows of the last 128-row slab
    if tail < ROW_BLOCK:
        i, lane = divmod(tail, 32)
        x, y = divmod(lane, 4)
        last = v[:, -1]  # [E, g, i, x, y, j]
        last[:, :, i + 1 :].zero_()
        last[:, :, i, x + 1 :].zero_()
        last[:, :, i, x, y:].zero_()


def _trtllm_payload_args(data: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d, o = _tensor(data, "data"), _tensor(out, "out")
    if d.dim() != 3 or d.element_size() != 1 or d.shape[1] % SHUFFLE_BLOCK or 0 in d.shape:
        raise LayoutError(
            f"data: expected 1-byte payloads [E, N, K] with N a multiple of {SHUFFLE_BLOCK}; "
            f"found dtype {d.dtype}, shape {tuple(d.shape)}"
        )
    experts, n, k = d.shape
    want = (experts, _roundup(n, TRTLLM_ALIGN), _roundup(k, TRTLLM_ALIGN))
    if tuple(o.shape) != want or o.dtype != d.dtype or not o.is_contiguous() or o.device != d.device:
        raise LayoutError(
            f"out: expected a contiguous {d.dtype} {want} on {d.device} (N and K padded to {TRTLLM_ALIGN}); "
            f"found {o.dtype} {tuple(o.shape)}, strides {o.stride()}, device {o.device}"
        )
    return d, o


def _to_trtllm_payload(data: torch.Tensor, out: torch.Tensor) -> None:
    d, o = _trtllm_payload_args(data, out)
    check_writable(o, "out")
    check_no_overlap([o], [d], "mxfp8_payload_to_trtllm", out_label="out", input_label="data")
    n, k = d.shape[1:]
    blocks = n // SHUFFLE_BLOCK
    if o.shape[2] > k:
        o[:, :n, k:].zero_()
    if o.shape[1] > n:
        o[:, n:].zero_()
    src = d.view(d.shape[0], blocks, 8, 4, k).transpose(2, 3)  # [E, blocks, n // 8, n % 8, K] (see _to_trtllm_scales)
    o[:, :n, :k].view(o.shape[0], blocks, 4, 8, k).copy_(src)


def export_shapes(layout: str, e: int, n: int, k: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """Each buffer's (shape, strides; None: contiguous) of an export of ``e`` experts ``[n, k]``
    in ``layout`` (the columnwise ones "compact" only)."""
    if layout == "flashinfer":
        np_, kp = _roundup(n, TRTLLM_ALIGN), _roundup(k, TRTLLM_ALIGN)
        return {"data": ((e, np_, kp), None), "scales": ((e, np_ * kp // MXFP8.block), None)}
    if layout == "deepgemm":
        words, aligned = _roundup(k // MXFP8.block, 4) // 4, _roundup(n, TMA_ALIGN_WORDS)
        return {"data": ((e, n, k), None), "scales": ((e, n, words), (aligned * words, 1, aligned))}
    return {
        "data": ((e, n, k), None),
        "scales": ((e, n, k // MXFP8.block), None),
        "columnwise_data": ((e, n, k), None),
        "columnwise_scales": ((e, n // MXFP8.block, k), None),
    }


def scale_dtypes(layout: str) -> tuple[torch.dtype, ...]:
    """The dtypes an export's scale buffer may have in ``layout``."""
    return {"deepgemm": (torch.int32,), "flashinfer": (torch.uint8,)}.get(layout, COMPACT_SCALE_DTYPES)


class ExportArgs(NamedTuple):
    """``mxfp8_export``'s arguments, checked: ``experts`` weights ``[rows, cols]``, each
    direction's (payloads, scale layouts), the output buffers."""

    layout: str
    experts: int
    rows: int
    cols: int
    inputs: tuple[tuple[list[torch.Tensor], list[torch.Tensor]], ...]
    outs: list[torch.Tensor]


def _payloads(data: Sequence[torch.Tensor], name: str) -> tuple[int, int, int]:
    """``data`` (one ``[E, N, K]`` or E ``[N, K]`` 1-byte tensors of one shape, strides and device,
    bytes contiguous along rows) checked; (E, N, K)."""
    if len(data) == 0:
        raise LayoutError(f"{name}: expected one [E, N, K] payload or one [N, K] payload per expert; found none")
    first = _tensor(data[0], f"{name}[0]")
    if first.dim() not in (2, 3) or (first.dim() == 3 and len(data) != 1):
        raise LayoutError(
            f"{name}: expected one [E, N, K] payload or one [N, K] payload per expert; found {len(data)} tensors, "
            f"the first of shape {tuple(first.shape)}"
        )
    for i, t in enumerate(data):
        t = _tensor(t, f"{name}[{i}]")
        found = (tuple(t.shape), t.stride(), t.dtype, t.device)
        if found != (tuple(first.shape), first.stride(), first.dtype, first.device) or t.element_size() != 1:
            raise LayoutError(
                f"{name}[{i}]: expected a 1-byte payload like {name}[0] ({first.dtype} {tuple(first.shape)}, strides "
                f"{first.stride()}, on {first.device}); found {t.dtype} {found[0]}, strides {found[1]}, on {t.device}"
            )
    if 0 in first.shape or first.stride(-1) != 1:
        raise LayoutError(
            f"{name}: expected non-empty payloads, bytes contiguous along rows; found shape {tuple(first.shape)}, "
            f"strides {first.stride()}"
        )
    experts = first.shape[0] if first.dim() == 3 else len(data)
    n, k = first.shape[-2:]
    return experts, n, k


def _layouts(
    scales: Sequence[torch.Tensor], count: int, experts: int, r: int, c: int, name: str, device: torch.device
) -> None:
    """``scales``: ``count`` contiguous uint8 128x4 layouts of logical ``[r, c]`` on ``device``
    (the payloads'), all experts in one or one an expert."""
    if len(scales) != count:
        raise LayoutError(f"{name}: expected {count} layout buffers, as many as the payloads; found {len(scales)}")
    want = layout_shape(r, c, experts if count == 1 else 1)
    for i, t in enumerate(scales):
        t = _tensor(t, f"{name}[{i}]")
        if tuple(t.shape) != want or t.dtype != torch.uint8 or not t.is_contiguous() or t.device != device:
            raise LayoutError(
                f"{name}[{i}]: expected the contiguous uint8 128x4 layout {want} of [{r}, {c}] scales on {device}; "
                f"found {t.dtype} {tuple(t.shape)}, strides {t.stride()}, on {t.device}"
            )


def _export_args(
    data: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    columnwise_data: Sequence[torch.Tensor],
    columnwise_scales: Sequence[torch.Tensor],
    out: Sequence[torch.Tensor],
    layout: str,
    backend: str | None = None,
) -> ExportArgs:
    """Every argument of ``mxfp8_export`` checked (shapes, dtypes, strides, devices: what fake
    tensors have too)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}; found {layout!r}")
    experts, n, k = _payloads(data, "data")
    if k % MXFP8.block:
        raise LayoutError(f"data: expected K a multiple of {MXFP8.block} (one scale a 32 values); found K = {k}")
    device, dtype = data[0].device, data[0].dtype
    _layouts(scales, len(data), experts, n, k // MXFP8.block, "scales", device)
    inputs = [(list(data), list(scales))]
    if len(columnwise_data) or len(columnwise_scales):
        if layout != "compact":
            raise LayoutError(
                f"columnwise_data: layout {layout!r} holds the forward (rowwise) operand only; found some"
            )
        # the outputs have data's dtype (the reference's copy_ would convert another) and device
        found = _payloads(columnwise_data, "columnwise_data")
        first = columnwise_data[0]
        same = (first.dtype, first.device) == (dtype, device)
        if found != (experts, n, k) or len(columnwise_data) != len(data) or not same:
            raise LayoutError(
                f"columnwise_data: expected payloads like data ({dtype} on {device}, {len(data)} tensors of {experts} "
                f"x [{n}, {k}]); found {first.dtype} on {first.device}, {len(columnwise_data)} tensors of shape "
                f"{tuple(first.shape)}"
            )
        if n % MXFP8.block:
            raise LayoutError(f"columnwise_data: expected N a multiple of {MXFP8.block}; found N = {n}")
        _layouts(columnwise_scales, len(data), experts, k, n // MXFP8.block, "columnwise_scales", device)
        inputs.append((list(columnwise_data), list(columnwise_scales)))
    shapes = list(export_shapes(layout, experts, n, k).items())[: 2 * len(inputs)]
    if len(out) != len(shapes):
        raise LayoutError(f"out: expected {len(shapes)} buffers ({', '.join(s[0] for s in shapes)}); found {len(out)}")
    for (name, (shape, strides)), t in zip(shapes, out, strict=True):
        t = _tensor(t, f"out ({name})")
        dtypes = (dtype,) if name.endswith("data") else scale_dtypes(layout)
        ok_strides = t.is_contiguous() if strides is None else t.stride() == strides
        if tuple(t.shape) != shape or t.dtype not in dtypes or not ok_strides or t.device != device:
            where = "contiguous" if strides is None else f"strides {strides}"
            raise LayoutError(
                f"out ({name}): expected {' or '.join(map(str, dtypes))} {shape} ({where}) on {device}; found "
                f"{t.dtype} {tuple(t.shape)}, strides {t.stride()}, on {t.device}"
            )
    return ExportArgs(layout, experts, n, k, tuple(inputs), list(out))


def export_reference(args: ExportArgs, backend: str | None = None) -> None:
    """What the export kernel writes, by the torch ops (any device): per direction and expert
    batch (a grouped weight: one; per expert: one an expert)."""
    for d, (data, scales) in enumerate(args.inputs):
        out_data, out_scales = args.outs[2 * d], args.outs[2 * d + 1]
        if len(data) == 1 and data[0].dim() == 3:
            batches = [(slice(0, args.experts), data[0], scales[0])]
        else:
            batches = [(slice(e, e + 1), x.unsqueeze(0), s) for e, (x, s) in enumerate(zip(data, scales, strict=True))]
        for experts, payload, layout in batches:
            # flashinfer and deepgemm: rowwise only, the logical [N, K/32] (padding written 0)
            if args.layout == "flashinfer":
                _to_trtllm_payload(payload, out_data[experts])
                _to_trtllm_scales(layout, out_scales[experts], args.rows, args.cols // MXFP8.block)
                continue
            out_data[experts].copy_(payload)
            if args.layout == "deepgemm":
                _to_deepgemm(layout, out_scales[experts], args.cols // MXFP8.block)
                continue
            logical = out_scales[experts].view(torch.uint8)
            # the layout holds the matrix a GEMM reads: columnwise that is [K, N/32], TE's [N/32, K] transposed
            unswizzle_op(layout, logical if d == 0 else logical.transpose(1, 2), backend)


def _export(
    data: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    columnwise_data: Sequence[torch.Tensor],
    columnwise_scales: Sequence[torch.Tensor],
    out: Sequence[torch.Tensor],
    layout: str,
    backend: str | None = None,
) -> None:
    args = _export_args(data, scales, columnwise_data, columnwise_scales, out, layout)
    for i, t in enumerate(args.outs):
        check_writable(t, f"out[{i}]")
    inputs = [t for d, s in args.inputs for t in (*d, *s)]
    check_no_overlap(args.outs, inputs, "mxfp8_export", out_label="out", input_label="inputs")
    if backend_for(args.outs[0].device, backend) is Backend.CUDA:
        from mok.kernels.export_launch import cached_launch

        cached_launch(args.layout, args.inputs, args.outs, experts=args.experts, rows=args.rows, cols=args.cols)()
        return
    export_reference(args, backend)


_LIB = torch.library.Library("mok", "FRAGMENT")  # type: ignore[no-untyped-call]
_OPS: tuple[tuple[str, Callable[..., None], Callable[..., object]], ...] = (
    ("mxfp8_scales_to_deepgemm(Tensor layout, Tensor(a!) out, int? columns=None) -> ()", _to_deepgemm, _deepgemm_args),
    (
        "mxfp8_scales_to_trtllm(Tensor layout, Tensor(a!) out, int? rows=None, int? columns=None) -> ()",
        _to_trtllm_scales,
        _trtllm_scale_args,
    ),
    ("mxfp8_payload_to_trtllm(Tensor data, Tensor(a!) out) -> ()", _to_trtllm_payload, _trtllm_payload_args),
)


def _fake(check: Callable[..., object]) -> Callable[..., None]:
    """The fake (meta) implementation: the op's checks where sizes are known, nothing written."""

    def fake(*args: object) -> None:
        tensors = [t for a in args for t in (a if isinstance(a, list | tuple) else [a]) if isinstance(t, torch.Tensor)]
        if all(type(n) is int for t in tensors for n in t.shape):
            check(*args)

    return fake


_OPS += (
    (
        "mxfp8_export(Tensor[] data, Tensor[] scales, Tensor[] columnwise_data, Tensor[] columnwise_scales, "
        "Tensor(a!)[] out, str layout, str? backend=None) -> ()",
        _export,
        _export_args,
    ),
)


for _schema, _impl, _check in _OPS:
    _LIB.define(_schema)  # type: ignore[no-untyped-call]
    _name = _schema.split("(", 1)[0]
    for _key in ("CPU", "CUDA"):  # the same torch code on both; mxfp8_export: the kernel on CUDA
        _LIB.impl(_name, _impl, _key)  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"mok::{_name}", _fake(_check), lib=_LIB)

deepgemm_scales_op = torch.ops.mok.mxfp8_scales_to_deepgemm.default
trtllm_scales_op = torch.ops.mok.mxfp8_scales_to_trtllm.default
trtllm_payload_op = torch.ops.mok.mxfp8_payload_to_trtllm.default
export_op = torch.ops.mok.mxfp8_export.default
