"""The torch reference of TE's MXFP8 quantisation (mok.quantize_reference) against values worked
out by hand from TE's rule, and against an exact oracle written here with fractions: the scale code
is the smallest power of two with 448 * 2^(code - 127) >= amax, the payload the E4M3 value nearest
to x / 2^(code - 127) (ties to even, +-448 at most)."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from fractions import Fraction
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from mok.errors import LayoutError
from mok.quantize_reference import (
    MAX_NORM_RCP,
    ProductRule,
    ReciprocalRule,
    dequantize_mxfp8_reference,
    e4m3_satfinite,
    e8m0_reciprocal,
    quantize_mxfp8_reference,
)

EXACT, SHIFT = ReciprocalRule.EXACT, ReciprocalRule.SHIFT
INF, NAN = float("inf"), float("nan")
LARGEST_BF16 = 3.3895313892515355e38  # (2 - 2^-7) * 2^127


def _e4m3(bits: int) -> Fraction:
    """Value of a finite positive E4M3 bit pattern (OCP E4M3: bias 7, subnormals, no infinity)."""
    exponent, mantissa = bits >> 3 & 15, bits & 7
    if exponent == 0:
        return Fraction(mantissa, 8) * Fraction(1, 64)
    return (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


E4M3 = [(_e4m3(b), b) for b in range(0x7F)]  # 0x00 .. 0x7E: 0 up to 448


def e4m3_oracle(value: Fraction, negative: bool) -> int:
    """The E4M3 bits nearest ``value`` (ties to the even pattern), saturated to +-448; ``negative``
    gives a zero its sign."""
    sign = 0x80 if negative else 0
    magnitude = abs(value)
    if magnitude >= 448:
        return sign | 0x7E
    best = min(E4M3, key=lambda vb: (abs(vb[0] - magnitude), vb[1] & 1))
    return sign | best[1]


def code_oracle(amax: Fraction) -> int:
    """The smallest code with 448 * 2^(code - 127) >= amax, at least 0 (TE's rounding up)."""
    code = 0
    while 448 * Fraction(2) ** (code - 127) < amax:
        code += 1
    return code


def _block(values: list[float]) -> torch.Tensor:
    """A [32, 32] BF16 matrix whose first row is ``values`` padded with zeros (the rest zeros)."""
    x = torch.zeros(32, 32)
    x[0, : len(values)] = torch.tensor(values)
    return x.to(torch.bfloat16)


def _row(
    values: list[float], rule: ReciprocalRule = EXACT, product: ProductRule = ProductRule.MUL
) -> tuple[int, list[int]]:
    """Scale code and payload bits of the rowwise block of ``values``."""
    q = quantize_mxfp8_reference(_block(values), rule, product)
    return int(q.row_scales[0, 0]), q.row_data.view(torch.uint8)[0, : len(values)].tolist()


def test_max_norm_reciprocal_is_te_s_fp32_constant() -> None:
    assert MAX_NORM_RCP.dtype == torch.float32 and MAX_NORM_RCP.view(torch.int32).item() == 0x3B124925


@pytest.mark.parametrize("rule", list(ReciprocalRule))
def test_amax_448_is_code_127_and_payload_max(rule: ReciprocalRule) -> None:
    assert _row([448.0, -448.0, 1.0, 0.5], rule) == (127, [0x7E, 0xFE, 0x38, 0x30])


def test_amax_above_448_takes_the_next_code_and_rounds_to_even() -> None:
    # 450 (the BF16 after 448): code 128 halves it to 225, between E4M3 224 (0x76) and 240: 224
    assert _row([450.0, 17.0 * 2, 19.0 * 2]) == (128, [0x76, 0x58, 0x5A])  # 17 -> 16, 19 -> 20: ties to even


@pytest.mark.parametrize("rule", list(ReciprocalRule))
def test_zero_blocks_are_code_0_and_keep_the_sign_of_zero(rule: ReciprocalRule) -> None:
    assert _row([0.0, -0.0], rule) == (0, [0x00, 0x80])


def test_ties_at_the_bottom_of_e4m3() -> None:
    # code 127 (rcp 1): 2^-10 is half of E4M3's least subnormal 2^-9: to even, 0; 3 * 2^-10 -> 2 * 2^-9
    assert _row([448.0, 2.0**-10, 3 * 2.0**-10, -(2.0**-9)]) == (127, [0x7E, 0x00, 0x02, 0x81])


@pytest.mark.parametrize("rule", list(ReciprocalRule))
def test_nan_never_sets_the_scale_and_becomes_0x7f(rule: ReciprocalRule) -> None:
    # amax 1.0 (the NaN is skipped): 1/448 rounds up to 2^-8, code 119; 1.0 * 2^8 = 256 = 0x78
    assert _row([NAN, 1.0, -NAN], rule) == (119, [0x7F, 0x78, 0x7F])


def test_all_nan_block_is_code_0() -> None:
    assert _row([NAN] * 32) == (0, [0x7F] * 32)


def test_inf_block_under_the_exact_rule() -> None:
    # code 254; rcp 2^-127: inf saturates to 448, the largest BF16 becomes 2 - 2^-7 -> 2.0, 1.0 -> 0
    assert _row([INF, -INF, LARGEST_BF16, 1.0, -2.0], EXACT) == (254, [0x7E, 0xFE, 0x40, 0x00, 0x80])


def test_inf_block_under_te_2_9_s_rule() -> None:
    # code 254; rcp 0: inf * 0 is NaN, finite values become zeros of their sign
    assert _row([INF, -INF, LARGEST_BF16, 1.0, -2.0], SHIFT) == (254, [0x7F, 0x7F, 0x00, 0x00, 0x80])


def test_an_exactly_zero_product_is_plus_zero_under_fma() -> None:
    """The specialized kernels' fma(x, rcp, +0): -0 becomes +0; so does -2 * 0 (TE 2.9's rcp of an
    inf block); a negative product that underflows fp32 keeps its sign (fma rounds the exact sum)."""
    fma = ProductRule.FMA_ZERO
    assert _row([-0.0, 1.0], EXACT, fma) == (119, [0x00, 0x78])
    assert _row([-0.0, 1.0], EXACT, ProductRule.MUL) == (119, [0x80, 0x78])
    assert _row([INF, -2.0, 1.0], SHIFT, fma) == (254, [0x7F, 0x00, 0x00])
    assert _row([INF, -(2.0**-100)], EXACT, fma) == (254, [0x7E, 0x80])  # -2^-227 underflows to -0


def test_tiny_block_is_code_0_and_the_rules_differ() -> None:
    values = [2.0**-119, 2.0**-120, -(2.0**-130), 2.0**-133]  # amax / 448 < 2^-127
    assert _row(values, EXACT) == (0, [0x78, 0x70, 0xA0, 0x08])  # times 2^127: 256, 128, -2^-3, 2^-6
    assert _row(values, SHIFT) == (0, [0x00, 0x00, 0x80, 0x00])  # times 1: below E4M3's least value


def test_code_0_and_1_boundary() -> None:
    boundary = 1.75 * 2.0**-119  # 448 * 2^-127: v = 2^-127 exactly, code 0
    above = 1.7578125 * 2.0**-119  # one BF16 step up: v is an fp32 subnormal above 2^-127, code 1
    assert _row([boundary])[0] == 0 and _row([above])[0] == 1


def test_subnormal_fp32_scale_and_subnormal_payload() -> None:
    # amax 2^-118: v = 2^-118 / 448 is an fp32 subnormal in (2^-127, 2^-126): code 1, rcp 2^126;
    # 2^-133 (the least BF16) * 2^126 = 2^-7: E4M3 subnormal 4 * 2^-9 (0x04); 2^-125 * 2^126 = 2
    assert _row([2.0**-118, 2.0**-133, 2.0**-125]) == (1, [0x78, 0x04, 0x40])


def test_reciprocal_rules_per_code() -> None:
    codes = torch.tensor([0, 1, 126, 127, 128, 253, 254, 255], dtype=torch.uint8)
    shift = e8m0_reciprocal(codes, SHIFT).tolist()
    assert shift[:7] == [1.0, 2.0**126, 2.0, 1.0, 0.5, 2.0**-126, 0.0] and shift[7] == -INF
    exact = e8m0_reciprocal(codes, EXACT).tolist()
    assert exact[:7] == [2.0**127, 2.0**126, 2.0, 1.0, 0.5, 2.0**-126, 2.0**-127] and math.isnan(exact[7])


def test_columnwise_is_rowwise_of_the_transpose() -> None:
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 64, 96, generator=g) * torch.exp2(torch.randint(-20, 20, (3, 64, 96), generator=g))).bfloat16()
    x[0, 5, 7], x[1, 40, 3], x[2, 63, 95] = NAN, INF, -INF
    for rule in ReciprocalRule:
        q = quantize_mxfp8_reference(x, rule)
        t = quantize_mxfp8_reference(x.transpose(1, 2).contiguous(), rule)
        assert torch.equal(q.col_data.view(torch.uint8), t.row_data.view(torch.uint8).transpose(1, 2))
        assert torch.equal(q.col_scales, t.row_scales.transpose(1, 2))


def test_two_dimensional_input_keeps_its_dimensions() -> None:
    q = quantize_mxfp8_reference(torch.ones(64, 96, dtype=torch.bfloat16))
    assert [tuple(t.shape) for t in q] == [(64, 96), (64, 3), (64, 96), (2, 96)]
    assert q.row_scales.unique().tolist() == [119] and q.col_data.view(torch.uint8).unique().tolist() == [0x78]


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.zeros(32, 32), "expected a non-empty BF16 tensor"),
        (torch.zeros(2, 32, 48, dtype=torch.bfloat16), "divisible by 32"),
        (torch.zeros(40, 32, dtype=torch.bfloat16), "divisible by 32"),
        (torch.zeros(0, 32, 32, dtype=torch.bfloat16), "non-empty"),
        ([1.0], "expected a BF16 torch.Tensor"),
    ],
)
def test_bad_input_is_refused(x: object, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        quantize_mxfp8_reference(x)  # type: ignore[arg-type]


_finite_bf16 = st.integers(0, 0x7F7F).map(lambda b: torch.tensor([b], dtype=torch.int16).view(torch.bfloat16))


@settings(max_examples=300, deadline=None)
@given(_finite_bf16)
def test_code_is_the_smallest_power_of_two_scale(amax: torch.Tensor) -> None:
    value = Fraction(amax.item())
    code, _ = _row([amax.item()])
    assert code == code_oracle(value)


@settings(max_examples=60, deadline=None)
@given(st.lists(_finite_bf16, min_size=32, max_size=32), st.booleans())
def test_payload_is_the_nearest_e4m3_of_the_scaled_value(values: list[torch.Tensor], negate: bool) -> None:
    block = [(-1.0 if negate and i % 3 == 0 else 1.0) * v.item() for i, v in enumerate(values)]
    code, payload = _row(block)
    amax = max(abs(Fraction(v)) for v in block)
    assert code == code_oracle(amax)
    scale = Fraction(2) ** (127 - code)
    assert payload == [e4m3_oracle(Fraction(v) * scale, math.copysign(1.0, v) < 0) for v in block]


def _canonical(g: torch.Generator, shape: tuple[int, int, int], direction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A payload and scales the rule itself produces: codes 3..246 (so every value is a finite BF16),
    no NaN payload, and each block's largest payload above 224 (so the code is the one requantising
    finds)."""
    e, r, c = shape
    payload = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    payload = torch.where((payload & 0x7F) == 0x7F, payload ^ 0x01, payload)
    blocks = payload.view(e, r, c // 32, 32) if direction == "rowwise" else payload.view(e, r // 32, 32, c)
    top = torch.randint(0x77, 0x7F, blocks.select(-1 if direction == "rowwise" else 2, 0).shape, generator=g)
    sign = torch.randint(0, 2, top.shape, generator=g) * 0x80
    blocks.select(-1 if direction == "rowwise" else 2, 0).copy_((top | sign).to(torch.uint8))
    scales_shape = (e, r, c // 32) if direction == "rowwise" else (e, r // 32, c)
    return payload.view(torch.float8_e4m3fn), torch.randint(3, 247, scales_shape, dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
@pytest.mark.parametrize("rule", list(ReciprocalRule))
def test_quantize_inverts_dequantize_on_what_it_produces(direction: str, rule: ReciprocalRule) -> None:
    g = torch.Generator().manual_seed(11)
    payload, scales = _canonical(g, (3, 64, 128), direction)
    x = dequantize_mxfp8_reference(payload, scales, direction)  # type: ignore[arg-type]
    assert torch.equal(x.bfloat16().float(), x)  # exact in BF16
    q = quantize_mxfp8_reference(x.bfloat16(), rule)
    data, got = (q.row_data, q.row_scales) if direction == "rowwise" else (q.col_data, q.col_scales)
    assert torch.equal(got, scales) and torch.equal(data.view(torch.uint8), payload.view(torch.uint8))


def test_dequantize_is_payload_times_the_scale() -> None:
    payload = torch.tensor([[0x7E, 0x08, 0x80, 0x7F] + [0] * 28], dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales = torch.tensor([[127]], dtype=torch.uint8)
    got = dequantize_mxfp8_reference(payload, scales, "rowwise")[0, :4].tolist()
    assert got[:3] == [448.0, 2.0**-6, -0.0] and math.isnan(got[3])
    tiny = dequantize_mxfp8_reference(payload, torch.tensor([[0]], dtype=torch.uint8), "rowwise")
    assert tiny[0, 1].item() == 2.0**-133  # code 0 stands for 2^-127
    with pytest.raises(LayoutError, match="expected"):
        dequantize_mxfp8_reference(payload, scales.view(1, 1, 1), "columnwise")


def test_requantising_a_block_whose_payloads_stay_below_225_changes_it() -> None:
    """Where quantize(dequantize(q)) == q must fail: no payload above 224 means a smaller scale fits."""
    payload = torch.full((1, 32), 0x70, dtype=torch.uint8).view(torch.float8_e4m3fn)  # 128 each
    x = dequantize_mxfp8_reference(payload, torch.tensor([[130]], dtype=torch.uint8), "rowwise")
    assert _row(x[0].tolist()) == (129, [0x78] * 32)  # 128 * 2^3 = 2^10 -> code 129 and 256


# ------------------------------------------------------------------------------ saturation, whatever torch's cast does


class OverflowingE4M3Cast(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """torch's casts to float8_e4m3fn as torch once made them: NaN for ``|x| >= 464`` (what rounds
    beyond 448; infinities too), the conversion of c10/util/Float8_e4m3fn.h's
    ``fp8e4m3fn_from_fp32_value`` (``f_bits >= fp8_max`` gives 0x7F, the sign or-ed in). How torch
    casts an overflow is no contract of torch's: other releases saturate to +-448, so a reference
    that left saturation to torch would be right under one torch and NaN under another. TE's
    ``cvt.rn.satfinite`` saturates under any, so the reference is checked under both."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        casts = {torch.ops.aten._to_copy.default: 0, torch.ops.aten.copy_.default: 1}
        if func in casts and isinstance(out, torch.Tensor) and out.dtype == torch.float8_e4m3fn:
            source = args[casts[func]]
            if source.dtype != torch.float8_e4m3fn:
                bits = out.view(torch.uint8)
                overflow = source.to(torch.float32).abs() >= 464  # NaN compares False: left as cast
                bits.copy_(torch.where(overflow, (bits & 0x80) | 0x7F, bits))
        return out


CASTS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "torch's own cast": nullcontext,
    "a cast that overflows to NaN": OverflowingE4M3Cast,
}


def test_the_overflowing_cast_overflows() -> None:
    """The stand-in does what it stands for: NaN beyond 448's rounding range, nothing else changed."""
    x = torch.tensor([1000.0, -INF, 463.0, -3.0, NAN], dtype=torch.float32)
    with OverflowingE4M3Cast():  # type: ignore[no-untyped-call]
        bits = x.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert bits[:2] == [0x7F, 0xFF] and bits[2:4] == [0x7E, 0xC4] and bits[4] & 0x7F == 0x7F


def satfinite_oracle(value: float) -> int:
    """``cvt.rn.satfinite.e4m3`` of ``value``: NaN is 0x7F; infinities and values beyond 448
    become 448 of their sign; else the nearest E4M3 (ties to even)."""
    if math.isnan(value):
        return 0x7F
    negative = math.copysign(1.0, value) < 0
    if math.isinf(value):
        return (0x80 if negative else 0) | 0x7E
    return e4m3_oracle(Fraction(value), negative)


@pytest.mark.parametrize("cast", list(CASTS))
@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(width=32), min_size=1, max_size=64))
@example(values=[INF, -INF, 448.0, -449.0, 464.0, -1e30, 3.4e38, NAN])
def test_e4m3_saturates_whatever_torch_s_cast_does(cast: str, values: list[float]) -> None:
    """Every fp32 value cast as TE's ``cvt.rn.satfinite`` does: beyond 448 (infinities too) 448
    with its sign, never NaN; NaN the one E4M3 NaN."""
    x = torch.tensor(values, dtype=torch.float32)
    with CASTS[cast]():
        got = e4m3_satfinite(x).view(torch.uint8).tolist()
    assert got == [satfinite_oracle(float(v)) for v in x]


@pytest.mark.parametrize("cast", list(CASTS))
def test_an_inf_block_saturates_whatever_torch_s_cast_does(cast: str) -> None:
    """The exact rule's reciprocal of an infinite block's code keeps the infinities: they become
    +-448 (TE's satfinite), under any torch."""
    with CASTS[cast]():
        assert _row([INF, -INF, LARGEST_BF16, 1.0, -2.0], EXACT) == (254, [0x7E, 0xFE, 0x40, 0x00, 0x80])
        q = quantize_mxfp8_reference(_block([-INF] * 32).t().contiguous(), EXACT)
        assert q.col_data.view(torch.uint8)[:32, 0].tolist() == [0xFE] * 32
