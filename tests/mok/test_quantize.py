"""BF16 weights quantised to MXFP8 on the fly: mok.quantize_mxfp8 and its torch op, and views of
BF16 weights through the one refresh pipeline (grouped, per expert, in a layer), refreshed in
place. Expected bytes: the torch reference of TE's rule (tests/mok/test_quantize_reference.py checks
it against hand-worked values) and the layout spec's formula (tests/spec_oracle.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
from mok.kernels.quantize import empty_outputs
from mok.plan import pipeline
from mok.quantize_reference import installed_rule, quantize_mxfp8_reference
from tests import te_objects as T
from tests.spec_oracle import spec_layout

Installer = Callable[..., None]


def _bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 9, (*shape[:-1], 1), generator=g).float())
    return x.to(torch.bfloat16)


def _expected(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Payload bytes [E, R, C] both ways, and both scales in the layout (columnwise of [C, R/32])."""
    qs = [quantize_mxfp8_reference(e, installed_rule()) for e in x]  # the rule mok follows
    return (
        torch.stack([q.row_data for q in qs]).view(torch.uint8),
        spec_layout(torch.stack([q.row_scales for q in qs])),
        torch.stack([q.col_data for q in qs]).view(torch.uint8),
        spec_layout(torch.stack([q.col_scales.t() for q in qs])),
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _check(got: tuple[torch.Tensor, ...], x: torch.Tensor) -> None:
    for name, a, b in zip(("row data", "row scales", "col data", "col scales"), got, _expected(x), strict=True):
        assert torch.equal(_bytes(a), b), name


# ------------------------------------------------------------------ mok.quantize_mxfp8


@pytest.mark.parametrize("shape", [(3, 128, 256), (2, 96, 160), (64, 32)], ids=str)
def test_quantize_mxfp8_is_tes_rule_in_the_layout(shape: tuple[int, ...]) -> None:
    x = _bf16(*shape)
    before = x.clone()
    got = mok.quantize_mxfp8(x)
    _check(tuple(got), x if x.dim() == 3 else x[None])
    assert torch.equal(x, before)  # the weights are read, never written


def test_quantize_mxfp8_writes_out_in_place() -> None:
    x = _bf16(2, 128, 128)
    out = empty_outputs(2, 128, 128, "cpu")
    for t in out:
        t.view(torch.uint8).fill_(0xAB)  # every byte, the layouts' padding too, must be written
    addresses = [t.data_ptr() for t in out]
    assert mok.quantize_mxfp8(x, out=out) is out
    assert [t.data_ptr() for t in out] == addresses
    _check(tuple(out), x)


def test_quantize_mxfp8_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(mok.LayoutError, match="divisible by 32; found shape \\(2, 48, 64\\)"):
        mok.quantize_mxfp8(torch.zeros(2, 48, 64, dtype=torch.bfloat16))
    with pytest.raises(mok.LayoutError, match="expected a non-empty BF16 tensor.*found dtype torch.float32"):
        mok.quantize_mxfp8(torch.zeros(2, 64, 64))
    with pytest.raises(TypeError, match="out: expected a QuantizeOutputs"):
        mok.quantize_mxfp8(torch.zeros(2, 64, 64, dtype=torch.bfloat16), out=(1, 2, 3, 4))  # type: ignore[arg-type]
    small = empty_outputs(1, 64, 64, "cpu")
    kept = [_bytes(t).clone() for t in small]
    with pytest.raises(mok.LayoutError, match="out.row_data: expected"):
        mok.quantize_mxfp8(torch.zeros(2, 64, 64, dtype=torch.bfloat16), out=small)
    assert all(torch.equal(_bytes(t), k) for t, k in zip(small, kept, strict=True))  # nothing written


def test_quantize_op_compiles_and_runs_on_fake_tensors() -> None:
    x = _bf16(2, 64, 96)
    out = empty_outputs(2, 64, 96, "cpu")
    compiled = torch.compile(lambda w, o: mok.quantize_mxfp8(w, out=o), fullgraph=True)
    compiled(x, out)
    _check(tuple(out), x)
    with FakeTensorMode():
        fake = mok.quantize_mxfp8(torch.empty(4, 256, 128, dtype=torch.bfloat16))
        assert fake.row_scales.shape == mok.layout_shape(256, 4, 4)
        assert fake.col_scales.shape == mok.layout_shape(128, 8, 4)
    # fake tensors and AOT dispatch (torch's schema check cannot compare float8 tensors on the CPU)
    torch.library.opcheck(
        torch.ops.mok.quantize_mxfp8.default,
        (x, *empty_outputs(2, 64, 96, "cpu")),
        test_utils=("test_faketensor", "test_aot_dispatch_dynamic"),
    )


# ------------------------------------------------------------------ views of BF16 weights


def test_a_grouped_bf16_view_quantises_and_refreshes_in_place() -> None:
    w = torch.nn.Parameter(_bf16(2, 128, 256))
    v = mok.grouped_weight_view(w, num_experts=2, rows=128, columns=256, format="mxfp8")
    assert v.quantized_on_the_fly and v.format is mok.Format.MXFP8
    _check((v.rowwise.data[0], v.rowwise.scales[0], v.columnwise.data[0], v.columnwise.scales[0]), w.detach())
    addresses = [
        v.rowwise.data[0].data_ptr(),
        v.rowwise.scales[0].data_ptr(),
        v.columnwise.data[0].data_ptr(),
        v.columnwise.scales[0].data_ptr(),
    ]
    with torch.no_grad():
        w.mul_(-3)  # an optimizer step: new values, same memory
    assert mok.grouped_weight_view(w, num_experts=2, rows=128, columns=256, format="mxfp8", cached=v) is v
    assert v.refresh_plan.plans == 1  # nothing moved: the prepared launch ran again
    assert [
        v.rowwise.data[0].data_ptr(),
        v.rowwise.scales[0].data_ptr(),
        v.columnwise.data[0].data_ptr(),
        v.columnwise.scales[0].data_ptr(),
    ] == addresses
    _check((v.rowwise.data[0], v.rowwise.scales[0], v.columnwise.data[0], v.columnwise.scales[0]), w.detach())


def test_a_split_bf16_view_follows_a_moved_parameter_into_the_same_buffers() -> None:
    ps = [torch.nn.Parameter(_bf16(128, 96, seed=e)) for e in range(3)]
    v = mok.split_weight_view(ps, rows=128, columns=96, format="mxfp8")
    assert v.quantized_on_the_fly and len(v.rowwise.scales) == 3 and v.rowwise.scale_ptrs is not None
    tables = [v.rowwise.data_ptrs.tolist(), v.rowwise.scale_ptrs.tolist()]
    ps[1].data = _bf16(128, 96, seed=9)  # the BF16 weight now lives elsewhere
    mok.split_weight_view(ps, rows=128, columns=96, format="mxfp8", cached=v)
    assert v.refresh_plan.plans == 2  # read again, quantised into the same buffers
    assert [v.rowwise.data_ptrs.tolist(), v.rowwise.scale_ptrs.tolist()] == tables
    want = _expected(torch.stack([p.detach() for p in ps]))
    assert torch.equal(_bytes(v.rowwise.data[1]), want[0][1])
    assert torch.equal(v.columnwise.scales[1], want[3][1:2])  # one 128-row tile of the [96, 4] transpose an expert


def test_a_te_bf16_group_quantises_its_rowwise_data(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=False, seed=4)
    v = mok.grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8")
    _check(
        (v.rowwise.data[0], v.rowwise.scales[0], v.columnwise.data[0], v.columnwise.scales[0]),
        g.rowwise_data.view(2, 128, 128),
    )
    g.rowwise_data = g.rowwise_data.clone().mul_(2)  # TE reassigned its buffer
    mok.grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8", cached=v)
    assert v.refresh_plan.plans == 2
    _check(
        (v.rowwise.data[0], v.rowwise.scales[0], v.columnwise.data[0], v.columnwise.scales[0]),
        g.rowwise_data.view(2, 128, 128),
    )


def test_a_layer_refreshes_quantised_and_te_views_together(installed_te: Installer) -> None:
    installed_te("2.20.2")
    fc1 = torch.nn.Parameter(_bf16(2, 128, 128))
    fc2 = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(2)]
    v1 = mok.grouped_weight_view(fc1, num_experts=2, rows=128, columns=128, format="mxfp8")
    v2 = mok.split_weight_view(fc2, rows=128, columns=256, format="mxfp8")
    layer = mok.LayerRefresh([(fc1, v1), (fc2, v2)])
    with torch.no_grad():
        fc1.add_(1)
    fc2[1]._rowwise_scale_inv.random_(0, 255)
    layer()
    layer()
    assert layer.plan.plans == 1
    _check((v1.rowwise.data[0], v1.rowwise.scales[0], v1.columnwise.data[0], v1.columnwise.scales[0]), fc1.detach())
    assert torch.equal(v2.rowwise.scales[1], spec_layout(fc2[1]._rowwise_scale_inv[:128, :8]))


def test_a_parameter_moved_while_planning_is_quantised_next_time(monkeypatch: pytest.MonkeyPatch) -> None:
    ps = [torch.nn.Parameter(_bf16(64, 64, seed=e)) for e in range(2)]
    real = pipeline._prepare

    def racing(*args: Any) -> None:
        ps[0].data = _bf16(64, 64, seed=5)  # after the read, before the guard is made
        monkeypatch.setattr(pipeline, "_prepare", real)
        real(*args)

    monkeypatch.setattr(pipeline, "_prepare", racing)
    v = mok.split_weight_view(ps, rows=64, columns=64, format="mxfp8")
    mok.split_weight_view(ps, rows=64, columns=64, format="mxfp8", cached=v)
    assert v.refresh_plan.plans == 2
    assert torch.equal(_bytes(v.rowwise.data[0]), _expected(ps[0].detach()[None])[0][0])


def test_bf16_views_refuse_what_mxfp8_cannot_hold_and_mixed_views() -> None:
    with pytest.raises(mok.ExpertWeightError, match="multiples of 32"):
        mok.grouped_weight_view(
            torch.zeros(2, 48, 64, dtype=torch.bfloat16), num_experts=2, rows=48, columns=64, format="mxfp8"
        )
    with pytest.raises(mok.ExpertWeightError, match="expected dtype torch.bfloat16"):
        mok.grouped_weight_view(torch.zeros(2, 64, 64), num_experts=2, rows=64, columns=64, format="mxfp8")
    w = _bf16(2, 64, 64)
    v = mok.grouped_weight_view(w, num_experts=2, rows=64, columns=64, format="mxfp8")
    with pytest.raises(mok.RefreshError, match="as asked for; found one of"):
        mok.grouped_weight_view(_bf16(4, 64, 64), num_experts=4, rows=64, columns=64, format="mxfp8", cached=v)
