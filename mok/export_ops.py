"""The conversions of an MXFP8 export (mok.export) as torch library ops, namespace ``mok``.

Each reads what a view holds (payloads, scales in the 128x4 layout of mok.layout) and writes
an inference engine's layout into its ``out`` argument, declared in the schema (``Tensor(a!)``),
as mok.ops does for the layout conversions: ``torch.compile`` traces them, ``FakeTensorMode``
and meta tensors run their fake implementation (the argument checks, nothing written), and
``torch.library.opcheck`` can check them. They are pure data movement (strided copies, no
temporary, nothing dequantised): the same torch code on the CPU and on CUDA. A CUDA kernel of
its own waits (docs/export.md).

- ``mxfp8_scales_to_deepgemm(layout, out)``: DeepGEMM's MN-major, TMA-aligned, packed UE8M0
  scales. Definition: DeepGEMM ``csrc/jit_kernels/impls/smxx_layout.hpp``,
  ``get_mn_major_tma_aligned_packed_ue8m0_tensor_torch`` (its reference): one int32 per 4
  consecutive scales of a row (byte ``j`` holds scale ``4g + j``, the rest of the last word 0),
  shape ``[E, R, ceil(C/4)]``, strides ``(aR * ceil(C/4), 1, aR)`` with ``aR = roundup(R, 4)``
  (``get_tma_aligned_size(R, 4)``, ``csrc/utils/math.hpp``). ``out`` is that strided tensor;
  the rows ``R..aR`` of its storage are the caller's (mok.export allocates them zeroed).
- ``mxfp8_scales_to_trtllm(layout, out)``: the scales of FlashInfer's TRT-LLM routed MoE
  (``trtllm_fp8_block_scale_routed_moe``, ``WeightLayout.MajorK``) as Megatron-Core builds
  them: ``megatron/core/inference/moe/flashinfer_mxfp8.py``, ``_shuffle_routed_scale`` over the
  logical matrix zero-padded to ``[roundup(R, 128), roundup(C, 4)]``: rows permuted within
  blocks of 32 by FlashInfer's ``get_shuffle_matrix_a_row_indices(.., 128)``
  (``flashinfer/utils.py``: row ``o`` of a block goes to ``srcToDstBlk32RowMap[o] = (o % 4) * 8
  + o // 4``), then ``_block_scale_interleave``, which is the 128x4 layout itself. So the result
  is the view's layout with its 32 lanes permuted. ``out`` is uint8 ``[E, Rp * Cp]``.
- ``mxfp8_payload_to_trtllm(data, out)``: the payload as Megatron's
  ``prepare_routed_mxfp8_weights`` makes it: zero-padded to ``[roundup(N, 128),
  roundup(K, 128)]``, rows permuted as above (FlashInfer's ``shuffle_matrix_a(.., 128)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mok.checks import describe
from mok.errors import LayoutError
from mok.layout import COL_BLOCK, ROW_BLOCK, TILE_BYTES, check_writable
from mok.overlap import check_no_overlap
from te_compat.geometry import roundup as _roundup

SHUFFLE_BLOCK = 32  # FlashInfer's get_shuffle_block_size(128): rows are permuted within blocks of 32
TRTLLM_ALIGN = 128  # Megatron pads N and K of a routed weight to multiples of this
TMA_ALIGN_WORDS = 4  # DeepGEMM's get_tma_aligned_size(R, 4): 16 bytes of int32


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


def _deepgemm_args(layout: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    return tiles, o


def _to_deepgemm(layout: torch.Tensor, out: torch.Tensor) -> None:
    tiles, o = _deepgemm_args(layout, out)
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


def _trtllm_scale_args(layout: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    o = _tensor(out, "out")
    if o.dim() != 2 or o.dtype != torch.uint8 or o.shape[0] == 0:
        raise LayoutError(f"out: expected uint8 scales [E, Rp*Cp]; found dtype {o.dtype}, shape {tuple(o.shape)}")
    tiles, rp, cp = _layout_tiles(layout, o.shape[0])
    if o.shape[1] != rp * cp or not o.is_contiguous() or layout.device != o.device:
        raise LayoutError(
            f"out: expected a contiguous uint8 [{o.shape[0]}, {rp * cp}] on {layout.device} (a layout padded to "
            f"[{rp}, {cp}] per expert); found shape {tuple(o.shape)}, strides {o.stride()}, device {o.device}"
        )
    return tiles, o


def _to_trtllm_scales(layout: torch.Tensor, out: torch.Tensor) -> None:
    tiles, o = _trtllm_scale_args(layout, out)
    check_writable(o, "out")
    check_no_overlap([o], [layout], "mxfp8_scales_to_trtllm", out_label="out", input_label="layout")
    # lane n of a tile holds row 32k + n; Megatron's shuffled row n is source row (n % 8) * 4 + n // 8
    src = tiles.view(-1, 8, 4, 16).transpose(1, 2)  # [tiles, n // 8, n % 8, 16]
    o.view(-1, 4, 8, 16).copy_(src)


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


_LIB = torch.library.Library("mok", "FRAGMENT")  # type: ignore[no-untyped-call]
_OPS: tuple[tuple[str, Callable[..., None], Callable[..., object]], ...] = (
    ("mxfp8_scales_to_deepgemm(Tensor layout, Tensor(a!) out) -> ()", _to_deepgemm, _deepgemm_args),
    ("mxfp8_scales_to_trtllm(Tensor layout, Tensor(a!) out) -> ()", _to_trtllm_scales, _trtllm_scale_args),
    ("mxfp8_payload_to_trtllm(Tensor data, Tensor(a!) out) -> ()", _to_trtllm_payload, _trtllm_payload_args),
)


def _fake(check: Callable[..., object]) -> Callable[..., None]:
    """The fake (meta) implementation: the op's checks where sizes are known, nothing written."""

    def fake(*args: torch.Tensor) -> None:
        if all(type(n) is int for t in args for n in t.shape):
            check(*args)

    return fake


for _schema, _impl, _check in _OPS:
    _LIB.define(_schema)  # type: ignore[no-untyped-call]
    _name = _schema.split("(", 1)[0]
    for _key in ("CPU", "CUDA"):  # strided copies: the same torch code on both
        _LIB.impl(_name, _impl, _key)  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"mok::{_name}", _fake(_check), lib=_LIB)

deepgemm_scales_op = torch.ops.mok.mxfp8_scales_to_deepgemm.default
trtllm_scales_op = torch.ops.mok.mxfp8_scales_to_trtllm.default
trtllm_payload_op = torch.ops.mok.mxfp8_payload_to_trtllm.default
