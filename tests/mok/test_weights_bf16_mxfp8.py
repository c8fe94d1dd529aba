"""mok.weights with BF16 expert weights and ``use_mxfp8=True``: quantised to MXFP8 on the fly.

Ported from Megatron-LM's tests of this contract (tests/unit_tests/transformer/moe/
test_mok_weights.py, the version holding test_bf16_mxfp8_on_the_fly_*; see
notes/issue34-upstream-contract.md), on CPU tensors. Upstream compares with TE's
``MXFP8Quantizer(rowwise=True, columnwise=True)`` on a GPU; here the expected bytes come from
:func:`_mxfp8` below, the MXFP8 rule written out for finite inputs (the smallest power of two
``2^(e-127)`` with ``448 * 2^(e-127) >= amax`` per block of 32, payloads rounded to nearest even),
and the expected scale layout from tests/spec_oracle.py (the layout spec's formula).

Upstream's member checks of ``_single_grouped_mxfp8_scale_view`` run against the module as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mok import weights as W
from tests import te_objects as T
from tests.spec_oracle import spec_layout

BLOCK = 32
OTF_CASES = [(4, 128, 128), (4, 256, 128), (2, 256, 256)]  # upstream's _OTF_CASES
Installer = Callable[..., None]


# ---- the expected bytes ----


def _codes(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 code per block: the smallest e with 448 * 2^(e-127) >= amax (0 for an all-zero block),
    found from log2 and corrected both ways in exact double arithmetic."""
    a = amax.double()
    k = torch.ceil(torch.log2(a / 448.0))
    k = torch.where(448.0 * torch.exp2(k - 1) >= a, k - 1, k)
    k = torch.where(448.0 * torch.exp2(k) < a, k + 1, k)
    return torch.where(a == 0, 0, k + 127).to(torch.int64)


def _blocks(blocks: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes = _codes(blocks.abs().amax(dim=dim, keepdim=True))
    scaled = blocks * torch.exp2((127 - codes).to(torch.float32))  # exact; a zero keeps its sign (TE's x * 2^127)
    return scaled.clamp(-448, 448).to(torch.float8_e4m3fn), codes.squeeze(dim).to(torch.uint8)


def _mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row payload [E,R,C], row scales [E,R,C/32], column payload [E,R,C], column scales [E,R/32,C])."""
    e, r, c = x.shape
    f = x.float()
    row_data, row_scales = _blocks(f.view(e, r, c // BLOCK, BLOCK), 3)
    col_data, col_scales = _blocks(f.view(e, r // BLOCK, BLOCK, c), 2)
    return row_data.view(e, r, c), row_scales, col_data.view(e, r, c), col_scales


def _expected(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's 5-tuple without its flag: payloads, and the scales in the layout (columnwise:
    of the [E, C, R/32] transpose, the dgrad GEMM's view)."""
    row_data, row_scales, col_data, col_scales = _mxfp8(x)
    return row_data, spec_layout(row_scales), col_data, spec_layout(col_scales.transpose(1, 2))


def _weight(experts: int, rows: int, columns: int, seed: int = 0) -> torch.nn.Parameter:
    """BF16 master weights with one magnitude per row (so scales differ between blocks) and an
    all-zero block (scale code 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(experts, rows, columns, generator=g)
    x = x * torch.exp2(torch.randint(-6, 7, (experts, rows, 1), generator=g).float())
    x[0, :BLOCK, :BLOCK] = 0
    return torch.nn.Parameter(x.to(torch.bfloat16))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def test_the_local_rule_on_literals() -> None:
    """The expected-bytes helper itself, on values whose MXFP8 encoding is known by hand."""
    x = torch.zeros(1, 32, 32)
    x[0, 0, :] = 1.0  # amax 1: 448 * 2^-8 = 1.75 >= 1 > 0.875, so e - 127 = -8, payload 1 * 2^8 = 256
    x[0, 1, 0] = 448.0  # exactly 448: e - 127 = 0, payload 448
    x[0, 2, 0], x[0, 2, 1] = 3.0, -0.01  # amax 3: 2^-7 * 448 = 3.5, payload 3 * 128 = 384
    row_data, row_scales, _, col_scales = _mxfp8(x.to(torch.bfloat16))
    assert row_scales[0, :4, 0].tolist() == [127 - 8, 127, 127 - 7, 0]
    assert row_data[0, 0, 0].item() == 256.0 and row_data[0, 1, 0].item() == 448.0
    assert row_data[0, 2, 0].item() == 384.0 and row_data[0, 2, 1].item() == pytest.approx(-1.25)  # -1.28 -> -1.25
    assert col_scales[0, 0, 0].item() == 127  # column 0 holds 448


# ---- the grouped view (upstream's three tests) ----


@pytest.mark.parametrize(("experts", "rows", "columns"), OTF_CASES)
def test_bf16_mxfp8_on_the_fly_output_shapes(experts: int, rows: int, columns: int) -> None:
    weight = _weight(experts, rows, columns)
    result = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True, cached_view=None
    )
    row_data, row_scales, col_data, col_scales, flag = result
    assert flag is True
    assert tuple(row_data.shape) == tuple(col_data.shape) == (experts, rows, columns)
    assert row_data.dtype == col_data.dtype == torch.float8_e4m3fn
    assert tuple(row_scales.shape) == (experts * rows // 128, columns // 128, 32, 16)
    assert tuple(col_scales.shape) == (experts * columns // 128, rows // 128, 32, 16)
    assert row_scales.dtype == col_scales.dtype == torch.uint8


@pytest.mark.parametrize(("experts", "rows", "columns"), OTF_CASES)
def test_bf16_mxfp8_on_the_fly_numerical_equivalence(experts: int, rows: int, columns: int) -> None:
    weight = _weight(experts, rows, columns, seed=42)
    before = weight.detach().clone()
    result = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True
    )
    for name, got, want in zip(
        ("row data", "row scales", "col data", "col scales"), result, _expected(before), strict=False
    ):
        assert torch.equal(_bytes(got), _bytes(want)), name
    assert torch.equal(weight.detach(), before)  # the master weights are read, never written


def test_bf16_mxfp8_on_the_fly_cache_reuse() -> None:
    """Upstream asserts the scale buffers keep their addresses; the issue asks the same of all
    four buffers, refreshed in place with the new weights' bytes."""
    experts, rows, columns = 4, 128, 128
    weight = _weight(experts, rows, columns)
    first = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True, cached_view=None
    )
    addresses = [t.data_ptr() for t in first[:4]]
    with torch.no_grad():  # an optimizer step: new values in the same parameter
        weight.copy_(_weight(experts, rows, columns, seed=7))
    second = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True, cached_view=first
    )
    assert [t.data_ptr() for t in second[:4]] == addresses
    assert second[4] is True
    for got, want in zip(second, _expected(weight.detach()), strict=False):
        assert torch.equal(_bytes(got), _bytes(want))
    for got, want in zip(first, _expected(weight.detach()), strict=False):  # the cached view itself
        assert torch.equal(_bytes(got), _bytes(want))


def test_bf16_mxfp8_from_a_te_bf16_grouped_tensor(installed_te: Installer) -> None:
    """TE's own BF16 GroupedTensor (2.14+: its payload in rowwise_data) quantises the same way."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 256, mxfp8=False, seed=3)
    payload = g.rowwise_data.view(2, 128, 256).clone()
    result = W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=256, use_mxfp8=True)
    for got, want in zip(result, _expected(payload), strict=False):
        assert torch.equal(_bytes(got), _bytes(want))
    assert result[4] is True


def test_a_bf16_weight_mxfp8_cannot_hold_is_refused() -> None:
    """Rows not a multiple of 32: no MXFP8 block structure. A RuntimeError saying what was expected."""
    weight = torch.nn.Parameter(torch.randn(2, 48, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="32") as caught:
        W._native_single_grouped_weight_view(weight, num_experts=2, rows=48, columns=64, use_mxfp8=True)
    assert "expected" in str(caught.value)


def test_a_refresh_into_a_cached_view_of_another_shape_is_refused() -> None:
    small = W._native_single_grouped_weight_view(
        _weight(2, 128, 128), num_experts=2, rows=128, columns=128, use_mxfp8=True
    )
    kept = [_bytes(t).clone() for t in small[:4]]
    with pytest.raises(RuntimeError, match="expected"):
        W._native_single_grouped_weight_view(
            _weight(4, 128, 128), num_experts=4, rows=128, columns=128, use_mxfp8=True, cached_view=small
        )
    assert all(torch.equal(_bytes(t), k) for t, k in zip(small[:4], kept, strict=True))  # nothing half-written


# ---- one BF16 parameter per expert (not in upstream: what the grouped contract implies) ----


def test_bf16_split_weights_quantise_on_the_fly() -> None:
    experts, rows, columns = 3, 256, 128
    grouped = _weight(experts, rows, columns)
    params = [torch.nn.Parameter(grouped[e].detach().clone()) for e in range(experts)]
    view = W._native_split_weight_view(params, rows=rows, columns=columns, use_mxfp8=True)
    row_data, row_scales, col_data, col_scales = _expected(grouped.detach())
    assert view.native_columnwise is True
    for e in range(experts):
        assert torch.equal(_bytes(view.scale_tensors[e]), row_scales[e * rows // 128 : (e + 1) * rows // 128])
        t0, t1 = e * columns // 128, (e + 1) * columns // 128
        assert torch.equal(_bytes(view.transposed_scale_tensors[e]), col_scales[t0:t1])
    assert view.scale is view.scale_tensors[0] and view.transposed_scale is view.transposed_scale_tensors[0]
    # payloads: expert 0's as the representative tensor, every expert's address in the pointer tables
    assert torch.equal(_bytes(view.data), _bytes(row_data[0]))
    assert torch.equal(_bytes(view.transposed_data), _bytes(col_data[0]))
    for table, first in ((view.storage_table, view.data), (view.transposed_storage_table, view.transposed_data)):
        pointers = table.tolist()
        assert len(pointers) == experts == len(set(pointers)) and pointers[0] == first.data_ptr()

    addresses = [t.data_ptr() for t in (*view.scale_tensors, *view.transposed_scale_tensors)]
    with torch.no_grad():
        for p in params:
            p.mul_(-2)
    again = W._native_split_weight_view(params, rows=rows, columns=columns, use_mxfp8=True, cached_view=view)
    assert again is view
    assert [t.data_ptr() for t in (*view.scale_tensors, *view.transposed_scale_tensors)] == addresses
    refreshed = _expected(torch.stack([p.detach() for p in params]))
    assert torch.equal(_bytes(view.data), _bytes(refreshed[0][0]))
    for e in range(experts):
        assert torch.equal(_bytes(view.scale_tensors[e]), refreshed[1][e * rows // 128 : (e + 1) * rows // 128])


# ---- upstream's newer member checks of _single_grouped_mxfp8_scale_view ----


def _members(count: int, *, packed: bool = True, shape: tuple[int, int] = (4, 2)) -> SimpleNamespace:
    backing = torch.zeros(max(count, 1) * 2, *shape, dtype=torch.uint8)
    step = 1 if packed else 2
    return SimpleNamespace(
        quantized_tensors=[SimpleNamespace(_rowwise_scale_inv=backing[step * i]) for i in range(count)]
    )


def test_packed_members_give_one_zero_copy_view() -> None:
    group = _members(3)
    view = W._single_grouped_mxfp8_scale_view(group, "_rowwise_scale_inv", (3, 4, 2), name="fc1 rowwise")
    assert tuple(view.shape) == (3, 4, 2)
    assert view.data_ptr() == group.quantized_tensors[0]._rowwise_scale_inv.data_ptr()


@pytest.mark.parametrize(("count", "found"), [(3, 3), (1, 1), (0, 0)])
def test_a_member_count_other_than_e_is_refused(count: int, found: int) -> None:
    with pytest.raises(RuntimeError, match=f"expected 2 grouped members, got {found}"):
        W._single_grouped_mxfp8_scale_view(_members(count), "_rowwise_scale_inv", (2, 4, 2), name="fc1 rowwise")


def test_a_group_without_members_is_refused() -> None:
    with pytest.raises(RuntimeError, match="expected 2 grouped members, got 0"):
        W._single_grouped_mxfp8_scale_view(SimpleNamespace(), "_rowwise_scale_inv", (2, 4, 2), name="fc1 rowwise")


def _separate() -> SimpleNamespace:
    """Upstream's case: each member's scales in its own allocation."""
    return SimpleNamespace(
        quantized_tensors=[SimpleNamespace(_rowwise_scale_inv=torch.zeros(4, 2, dtype=torch.uint8)) for _ in range(2)]
    )


def _reversed() -> SimpleNamespace:
    backing = torch.zeros(2, 4, 2, dtype=torch.uint8)
    return SimpleNamespace(quantized_tensors=[SimpleNamespace(_rowwise_scale_inv=backing[1 - i]) for i in range(2)])


def _misshapen() -> SimpleNamespace:
    backing = torch.zeros(16, dtype=torch.uint8)
    return SimpleNamespace(
        quantized_tensors=[
            SimpleNamespace(_rowwise_scale_inv=backing[:8].view(4, 2)),
            SimpleNamespace(_rowwise_scale_inv=backing[8:].view(2, 4)),
        ]
    )


def _strided() -> SimpleNamespace:
    backing = torch.zeros(2, 2, 4, dtype=torch.uint8)
    return SimpleNamespace(quantized_tensors=[SimpleNamespace(_rowwise_scale_inv=backing[i].t()) for i in range(2)])


def _spread() -> SimpleNamespace:
    return _members(2, packed=False)  # one storage, a gap between the members


@pytest.mark.parametrize(
    ("group", "member"),
    [(_separate, 1), (_reversed, 1), (_misshapen, 1), (_spread, 1), (_strided, 0)],
    ids=["separate allocations", "reversed order", "a member of another shape", "gaps between members", "strided"],
)
def test_members_not_packed_expert_major_are_refused(group: Callable[[], Any], member: int) -> None:
    with pytest.raises(RuntimeError, match=f"member {member} scale is not packed expert-major"):
        W._single_grouped_mxfp8_scale_view(group(), "_rowwise_scale_inv", (2, 4, 2), name="fc1 rowwise")


# TE's own GroupedTensor goes through mok.grouped's reading of the group, whose words differ
def test_a_te_group_with_a_member_missing_is_refused_in_upstreams_words(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    g.quantized_tensors = g.quantized_tensors[:1]
    with pytest.raises(RuntimeError, match="expected 2 grouped members, got 1"):
        W._single_grouped_mxfp8_scale_view(g, "_rowwise_scale_inv", (2, 128, 4), name="fc1 rowwise")


def test_a_te_group_member_outside_the_buffer_is_refused_in_upstreams_words(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    member = g.quantized_tensors[1]
    member._rowwise_scale_inv = member._rowwise_scale_inv.clone()  # its own allocation
    with pytest.raises(RuntimeError, match="member 1 scale is not packed expert-major"):
        W._single_grouped_mxfp8_scale_view(g, "_rowwise_scale_inv", (2, 128, 4), name="fc1 rowwise")
