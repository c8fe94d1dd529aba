"""Torch reference of Transformer Engine's MXFP8 quantisation of BF16 weights, and its inverse.

Written from TE's own source (NVIDIA/TransformerEngine), the kernels ``MXFP8Quantizer`` runs for
BF16 input with E4M3 output, in releases 2.9 to 2.20:

- ``transformer_engine/common/util/ptx.cuh``: ``float_to_e8m0`` (the scale's E8M0 code) and
  ``exp2f_rcp`` (the reciprocal the values are multiplied by), ``mul_cvt_2x`` (``mul.f32x2`` then
  ``cvt.rn.satfinite.e4m3x2.f32``);
- ``transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh`` (2.9: ``common/util/cast_kernels.cuh``
  is its predecessor; the specialized cast-only kernels beside it in later releases follow the
  same steps): per 1x32 block, ``amax`` is the largest ``|x|`` (``max.xorsign.abs.bf16x2``,
  ``__hmax``, ``fmaxf``: a NaN never wins), the code is ``float_to_e8m0(amax * max_norm_rcp)``
  with ``max_norm_rcp = 1/448`` in fp32, and each value is ``cvt.satfinite(x * exp2f_rcp(code))``;
- ``tests/cpp/operator/test_cast_mxfp8.cu`` and ``tests/cpp/test_common.h``: TE's own CPU
  reference of the same rule (``std::max(amax, |x|)``, ``float_to_e8m0``, ``exp2f_rcp``).

The rule, per block of 32 BF16 values (rowwise: 32 consecutive columns of a row; columnwise:
32 consecutive rows of a column, payload NOT transposed):

1. ``amax = max |x|`` over the block's non-NaN values, starting from 0 (exact: no rounding).
2. ``v = fp32(amax * fp32(1/448))`` (round to nearest, subnormals kept: TE does not build the
   cast kernels with fast math). Code: NaN -> 255, +inf -> 254, 0 -> 0, else the fp32 exponent
   field of ``v``, plus one unless ``v`` is a power of two, is already 254, or is at most 2^-127
   (``cvt.rp.satfinite.ue8m0x2.f32`` on Blackwell, the same bit recipe elsewhere). For every
   finite BF16 ``amax`` above ``448 * 2^-127`` this is the smallest ``e`` with
   ``448 * 2^(e-127) >= amax``.
3. Payload: ``x * rcp(code)`` in fp32, then E4M3 rounded to nearest even, saturated to +-448
   (infinities too), NaN -> 0x7F (the canonical E4M3 NaN: assumed for both signs of NaN, to be
   confirmed on a GPU by tests/gpu/test_quantize_gpu.py, which compares hardware ``cvt`` with this).
   The product is exact (a power of two) unless it underflows fp32; the sign of a zero product
   depends on the kernel TE runs (see :class:`ProductRule`).

Where releases differ: ``exp2f_rcp`` (see :class:`ReciprocalRule`). TE 2.9's (``ptx.cuh``) gives
1 for code 0 and ``(254 - code) << 23`` as float bits otherwise: 0 for code 254, -inf for 255.
TE PR 2647 (first shipped in TE 2.13; te_compat's release table records the rule of each
release, and mok's quantiser follows the installed one's: :func:`installed_rule`) gives
``2^(127 - code)`` for every code but 255 (NaN): 2^127 for code 0, 2^-127 for 254.
With NaN-free ``amax`` only two kinds of block see the difference: a block whose
``amax <= 448 * 2^-127`` (code 0: all payloads 0 under the old rule, ``x * 2^127`` under the new)
and a block holding an infinity (code 254: finite values -> +-0 and infinities -> NaN under the
old rule; ``x * 2^-127`` and infinities -> +-448 under the new).

Where kernels differ within a release: later releases send cast-only BF16 input whose shape fits
to specialized kernels (``cast/mxfp8/specialized/``), which multiply with ``fma.rn.f32x2`` and a
+0 addend (``ptx::mul_cvt_4x``): a -0.0 input gives payload 0x00 there and 0x80 in the generic
kernel (see :class:`ProductRule`). Their scale arithmetic was read to give the
same codes (the register-resident ``cast_bidim.cu`` computes them from the BF16 amax bits; the
result equals ``float_to_e8m0(amax * 1/448)`` for every BF16 amax, and its reciprocals are the
exact rule's).
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, NamedTuple

import torch

from mok.checks import describe
from mok.errors import LayoutError
from te_compat import mxfp8_reciprocal_rule
from te_compat.geometry import MXFP8

E4M3_MAX = 448.0
MAX_NORM_RCP = torch.tensor(1.0, dtype=torch.float32) / E4M3_MAX  # fp32(1/448) = 0x3B124925, as TE
E4M3_NAN = 0x7F
Direction = Literal["rowwise", "columnwise"]


class ReciprocalRule(str, Enum):
    """TE's ``exp2f_rcp``: the fp32 reciprocal of a scale code, which changed between releases."""

    SHIFT = "shift"  # TE 2.9 ptx.cuh: code 0 -> 1; else (254 - code) << 23: 254 -> 0, 255 -> -inf
    EXACT = "exact"  # after TE PR 2647: 2^(127 - code) for codes 0..254 (0 -> 2^127), 255 -> NaN


def installed_rule() -> ReciprocalRule:
    """The rule of the installed TE release, as te_compat's release table records it
    (``te_compat.mxfp8_reciprocal_rule``): SHIFT for TE 2.0 to 2.12, EXACT from TE 2.13 (PR 2647),
    and EXACT, the newest, where TE is absent, has no MXFP8 or states no readable version. TE is
    not imported."""
    return ReciprocalRule(mxfp8_reciprocal_rule())


class ProductRule(str, Enum):
    """How TE multiplies a value by its reciprocal, which decides the sign of an exactly zero
    product (x = -0, or a reciprocal of 0 under ReciprocalRule.SHIFT): the generic kernel's
    ``mul_cvt_2x`` (``mul.f32x2``) keeps -0 (payload 0x80); the specialized cast-only kernels'
    ``mul_cvt_4x`` (``fma.rn.f32x2`` with a +0 addend) gives +0 (0x00). A negative product that
    underflows fp32 is -0 either way (fma rounds the exact, negative, sum)."""

    MUL = "mul"
    FMA_ZERO = "fma+0"


class MXFP8Reference(NamedTuple):
    """Both directions of one quantisation: payloads (``torch.float8_e4m3fn``, the input's shape)
    and logical E8M0 scales (uint8; rowwise ``[..., R, C/32]``, columnwise ``[..., R/32, C]``)."""

    row_data: torch.Tensor
    row_scales: torch.Tensor
    col_data: torch.Tensor
    col_scales: torch.Tensor


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def e8m0_of(amax: torch.Tensor) -> torch.Tensor:
    """TE's scale code (uint8) for fp32 block maxima ``amax`` (>= 0): ``float_to_e8m0(amax * 1/448)``."""
    v = amax.to(torch.float32) * MAX_NORM_RCP
    bits = _bits(v)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    tiny = (exponent == 0) & (mantissa <= 0x400000)  # at most 2^-127: rounds up to code 0
    code = exponent + ((mantissa > 0) & (exponent != 0xFE) & ~tiny).to(torch.int32)
    code = torch.where(torch.isinf(v), 0xFE, code)
    return torch.where(torch.isnan(v), 0xFF, code).to(torch.uint8)


def e8m0_reciprocal(codes: torch.Tensor, rule: ReciprocalRule = ReciprocalRule.EXACT) -> torch.Tensor:
    """TE's ``exp2f_rcp`` of uint8 ``codes`` as fp32, under ``rule`` (see :class:`ReciprocalRule`)."""
    c = codes.to(torch.int32)
    bits = (254 - c) << 23  # int32: code 255 gives 0xFF800000 (-inf)
    if ReciprocalRule(rule) is ReciprocalRule.SHIFT:
        bits = torch.where(c == 0, 0x3F800000, bits)
    else:
        bits = torch.where(c == 254, 0x00400000, torch.where(c == 255, 0x7FFFFFFF, bits))
    return bits.view(torch.float32)


def e8m0_value(codes: torch.Tensor) -> torch.Tensor:
    """The value a scale code stands for, ``2^(code - 127)`` in fp32 (code 0: 2^-127, a subnormal;
    code 255: NaN)."""
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, 0x00400000, torch.where(c == 255, 0x7FFFFFFF, c << 23))
    return bits.view(torch.float32)


def e4m3_satfinite(values: torch.Tensor) -> torch.Tensor:
    """``cvt.rn.satfinite.e4m3`` of fp32 ``values``: nearest even, +-448 for anything larger
    (infinities too), NaN -> 0x7F. Returned as ``torch.float8_e4m3fn``. (torch's own cast gives NaN
    above 448, so the clamp comes first.)"""
    payload = values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(values), E4M3_NAN, payload).view(torch.float8_e4m3fn)


def _quantize_blocks(
    blocks: torch.Tensor, dim: int, rule: ReciprocalRule, product: ProductRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """Payload and codes of fp32 ``blocks`` whose dimension ``dim`` holds the 32 values of a block."""
    magnitude = blocks.abs()
    amax = torch.where(torch.isnan(magnitude), 0.0, magnitude).amax(dim=dim, keepdim=True)
    codes = e8m0_of(amax)
    rcp = e8m0_reciprocal(codes, rule)
    scaled = blocks * rcp  # exact but for fp32 underflow, as on the GPU
    if ProductRule(product) is ProductRule.FMA_ZERO:  # fma rounds x * rcp + 0 once: only an exact
        exact_zero = (blocks == 0) | (rcp == 0)  # zero turns +0 (an underflow keeps its sign)
        scaled = torch.where(exact_zero, scaled + 0.0, scaled)
    return e4m3_satfinite(scaled), codes.squeeze(dim)


def check_input(x: object, name: str = "x") -> torch.Tensor:
    """``x`` as a BF16 ``[E, R, C]`` batch (``[R, C]`` gets E = 1), R and C multiples of 32."""
    if not isinstance(x, torch.Tensor):
        raise LayoutError(f"{name}: expected a BF16 torch.Tensor [E, R, C] or [R, C]; found {describe(x)}")
    if x.dtype != torch.bfloat16 or x.dim() not in (2, 3) or 0 in x.shape:
        raise LayoutError(
            f"{name}: expected a non-empty BF16 tensor [E, R, C] or [R, C]; found dtype {x.dtype}, "
            f"shape {tuple(x.shape)}"
        )
    batch = x if x.dim() == 3 else x.unsqueeze(0)
    if batch.shape[1] % MXFP8.block or batch.shape[2] % MXFP8.block:
        raise LayoutError(
            f"{name}: MXFP8 needs rows and columns divisible by {MXFP8.block}; found shape {tuple(x.shape)}"
        )
    return batch


def quantize_mxfp8_reference(
    x: torch.Tensor, rule: ReciprocalRule = ReciprocalRule.EXACT, product: ProductRule = ProductRule.MUL
) -> MXFP8Reference:
    """Quantise BF16 ``x`` (``[E, R, C]`` or ``[R, C]``) both ways as TE does; outputs keep ``x``'s
    leading dimensions. A reference: clear, exact, and as slow as torch on the CPU is."""
    batch = check_input(x).to(torch.float32)
    e, r, c = batch.shape
    row_data, row_scales = _quantize_blocks(batch.view(e, r, c // MXFP8.block, MXFP8.block), 3, rule, product)
    col_data, col_scales = _quantize_blocks(batch.view(e, r // MXFP8.block, MXFP8.block, c), 2, rule, product)
    shape = x.shape[:-2]
    return MXFP8Reference(
        row_data.view(*shape, r, c),
        row_scales.view(*shape, r, c // MXFP8.block),
        col_data.view(*shape, r, c),
        col_scales.view(*shape, r // MXFP8.block, c),
    )


def dequantize_mxfp8_reference(payload: torch.Tensor, scales: torch.Tensor, direction: Direction) -> torch.Tensor:
    """The exact inverse: ``payload * 2^(scale - 127)`` in fp32 (exact: an E4M3 value times a power
    of two stays representable, down to 2^-136), for one direction's payload ``[..., R, C]`` and its
    logical scales (rowwise ``[..., R, C/32]``, columnwise ``[..., R/32, C]``)."""
    if payload.dtype != torch.float8_e4m3fn or scales.dtype != torch.uint8:
        raise LayoutError(
            f"expected a float8_e4m3fn payload and uint8 scales; found {payload.dtype} and {scales.dtype}"
        )
    r, c = payload.shape[-2:]
    want = (
        (*payload.shape[:-2], r, c // MXFP8.block)
        if direction == "rowwise"
        else (*payload.shape[:-2], r // MXFP8.block, c)
    )
    if tuple(scales.shape) != want:
        raise LayoutError(
            f"{direction} scales of payload {tuple(payload.shape)}: expected {want}; found {tuple(scales.shape)}"
        )
    dim = -1 if direction == "rowwise" else -2
    factor = e8m0_value(scales).repeat_interleave(MXFP8.block, dim=dim)
    return payload.to(torch.float32) * factor
