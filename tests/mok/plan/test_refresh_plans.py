"""mok's planner: refreshes of unchanged weights plan nothing, every change is still caught, and
NVFP4 weights go through the same planner (stand-ins built from matrix/records)."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

import mok
from mok import ExpertWeightError, RefreshError, grouped_weight_view, split_weight_view
from mok.plan import pipeline as mok_plan
from tests import te_objects as T
from tests.spec_oracle import spec_layout
from tests.standins import make_standin

Installer = Callable[..., None]
R, C = 128, 256  # aligned
PR, PC = 160, 96  # padded: 160 rows, 96/16 = 6 NVFP4 scale columns


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of every scale set the views plan (all planning goes through pipeline.plan_scales)."""
    calls: list[str] = []
    real = mok_plan.plan_scales

    def counting(*args: Any) -> Any:
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(mok_plan, "plan_scales", counting)
    return calls


def _prepared(v: Any) -> mok.plan.pipeline.PreparedRefresh:
    prepared = v.refresh_plan.prepared
    assert isinstance(prepared, mok.plan.pipeline.PreparedRefresh)
    return prepared


def _rows(buf: torch.Tensor, r: int, blocks: int) -> torch.Tensor:
    return buf[:r, :blocks]


# ------------------------------------------------------------------------ no planning, still safe


def test_unchanged_split_refresh_plans_nothing_and_converts_new_values(
    installed_te: Installer, planned: list[str]
) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(5)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    assert planned == ["rowwise scales", "columnwise scales"]
    for p in ps:
        p._rowwise_scale_inv.random_(0, 255)
    for _ in range(3):
        assert split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v) is v
    assert len(planned) == 2 and v.refresh_plan.plans == 1
    assert torch.equal(v.rowwise.scales[4], spec_layout(_rows(ps[4]._rowwise_scale_inv, R, C // 32)))


def test_a_new_list_of_the_same_parameters_is_unchanged(installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    split_weight_view(tuple(ps), rows=R, columns=C, format="mxfp8", cached=v)
    assert len(planned) == 2


@pytest.mark.parametrize(
    "change",
    ["replace rowwise scales", "replace columnwise scales", "set swizzled flag", "swap a parameter"],
)
def test_each_storage_change_is_planned_again(change: str, installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    addresses = [t.data_ptr() for t in v.rowwise.scales]
    if change == "replace rowwise scales":
        ps[2]._rowwise_scale_inv = ps[2]._rowwise_scale_inv.clone().random_(0, 255)
    elif change == "replace columnwise scales":
        ps[0]._columnwise_scale_inv = ps[0]._columnwise_scale_inv.clone().random_(0, 255)
    elif change == "set swizzled flag":  # TE swizzled expert 1's rowwise scales in place
        done = spec_layout(_rows(ps[1]._rowwise_scale_inv, R, C // 32))
        ps[1]._rowwise_scale_inv = done.view(R, C // 32).clone()
        ps[1]._columnwise_scale_inv = (
            spec_layout(ps[1]._columnwise_scale_inv[: R // 32, :C].t()).view(R // 32, C).clone()
        )
        ps[1]._with_gemm_swizzled_scales = True
    else:
        ps[1] = T.mxfp8_tensor("2.20.2", R, C, seed=9, param=True, _rowwise_data=ps[1]._rowwise_data)
        ps[1]._columnwise_data = v.columnwise.data[1].view(torch.uint8) if v.columnwise.data else None
    assert split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v) is v
    assert len(planned) == 4 and v.refresh_plan.plans == 2  # planned again, both directions
    assert [t.data_ptr() for t in v.rowwise.scales] == addresses  # in place
    for e, p in enumerate(ps):
        want = spec_layout(_rows(p._rowwise_scale_inv, R, C // 32))
        if change == "set swizzled flag" and e == 1:
            want = p._rowwise_scale_inv.view(want.shape)  # copied as TE swizzled it, not converted again
        assert torch.equal(v.rowwise.scales[e], want)


@pytest.mark.parametrize("which", ["_rowwise_data", "_columnwise_data"])
def test_a_moved_payload_is_followed(which: str, installed_te: Installer) -> None:
    """A payload TE reassigned: the view's payload tensor (the same object) points at the new
    memory and its pointer table is rewritten in place, as a new view would list it."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    direction = v.rowwise if which == "_rowwise_data" else v.columnwise
    assert direction is not None and direction.data_ptrs is not None
    tensor, table = direction.data[1], direction.data_ptrs
    setattr(ps[1], which, getattr(ps[1], which).clone())
    assert split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v) is v
    assert direction.data[1] is tensor and tensor.data_ptr() == getattr(ps[1], which).data_ptr()
    assert direction.data_ptrs is table and table.tolist() == [getattr(p, which).data_ptr() for p in ps]
    assert torch.equal(tensor.view(torch.uint8), getattr(ps[1], which))


def test_grouped_with_more_than_256_experts_is_unchanged(installed_te: Installer, planned: list[str]) -> None:
    # num_tensors 300 is a new int object at each read (CPython caches -5..256): equal, not identical
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 300, 32, 128, mxfp8=True, members=False, columnwise=False)
    v = grouped_weight_view(g, num_experts=300, rows=32, columns=128, format="mxfp8")
    g.num_tensors = int("300")
    grouped_weight_view(g, num_experts=300, rows=32, columns=128, format="mxfp8", cached=v)
    assert planned == ["grouped rowwise scales"]


def test_the_layer_owns_its_plan(installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    fc1 = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    g = T.grouped_tensor("2.20.2", 2, C, R, mxfp8=True)
    v1 = split_weight_view(fc1, rows=R, columns=C, format="mxfp8")
    v2 = grouped_weight_view(g, num_experts=2, rows=C, columns=R, format="mxfp8")
    layer = mok.LayerRefresh([(fc1, v1), (g, v2)])
    del planned[:]
    layer()
    layer()
    assert len(planned) == 4 and layer.plan.plans == 1  # two directions of each view, once
    assert v1.refresh_plan.plans == 1 and v2.refresh_plan.plans == 1  # the views' own plans untouched
    g.scale_inv.random_(0, 255)
    layer()
    want = spec_layout(g.scale_inv.view(2, C, 4)[:, :C, : R // 32])
    assert torch.equal(v2.rowwise.scales[0], want)


# ------------------------------------------------------------------------------------- NVFP4


def _nvfp4_params(release: str, rows: int, cols: int, n: int, **kw: Any) -> list[Any]:
    return [T.nvfp4_tensor(release, rows, cols, seed=e, param=True, **kw) for e in range(n)]


@pytest.mark.parametrize("release", ["2.8.0", "2.12.0", "2.20.2"])
@pytest.mark.parametrize(("rows", "cols"), [(R, C), (PR, PC)])
def test_split_nvfp4_view(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    ps = _nvfp4_params(release, rows, cols, 3)
    v = split_weight_view(ps, rows=rows, columns=cols, format="nvfp4")
    assert v.format == "nvfp4"
    for e, p in enumerate(ps):
        assert v.rowwise.data[e].data_ptr() == p._rowwise_data.data_ptr() and v.rowwise.data[e].shape == (
            rows,
            cols // 2,
        )
        assert v.columnwise.data is not None and v.columnwise.data[e].shape == (
            cols,
            rows // 2,
        )  # TE's transposed payload
        assert v.columnwise.data[e].data_ptr() == p._columnwise_data.data_ptr()
        assert torch.equal(v.rowwise.scales[e], spec_layout(p._rowwise_scale_inv[:rows, : cols // 16]))
        assert v.columnwise.scales is not None
        assert torch.equal(v.columnwise.scales[e], spec_layout(p._columnwise_scale_inv[:cols, : rows // 16]))
        assert v.rowwise.amax is not None and v.rowwise.amax[e].data_ptr() == p._amax_rowwise.data_ptr()
        assert v.rowwise.amax[e] is not p._amax_rowwise  # the view's own tensor: a refresh may re-point it
    assert v.rowwise.amax_ptrs is not None and v.rowwise.amax_ptrs.tolist() == [p._amax_rowwise.data_ptr() for p in ps]


def test_split_nvfp4_refresh_and_swizzled(installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    ps = _nvfp4_params("2.20.2", R, C, 2, columnwise=False)
    v = split_weight_view(ps, rows=R, columns=C, format="nvfp4")
    ps[0]._rowwise_scale_inv.random_(0, 255)
    split_weight_view(ps, rows=R, columns=C, format="nvfp4", cached=v)
    assert planned == ["rowwise scales"]
    assert torch.equal(v.rowwise.scales[0], spec_layout(ps[0]._rowwise_scale_inv[:R, : C // 16]))
    done = [spec_layout(p._rowwise_scale_inv[:R, : C // 16]) for p in ps]
    swz = [T.nvfp4_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False, swizzled=True) for e in range(2)]
    for p, d in zip(swz, done, strict=True):
        p._rowwise_scale_inv = d.view(R, C // 16 // 4 * 4).clone()
    zv = split_weight_view(swz, rows=R, columns=C, format="nvfp4")
    assert zv.rowwise.scales_zero_copy and zv.rowwise.scales[1].data_ptr() == swz[1]._rowwise_scale_inv.data_ptr()


def test_nvfp4_needs_multiples_of_16(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = _nvfp4_params("2.20.2", 40, 64, 1)
    with pytest.raises(ExpertWeightError, match="positive multiples of 16 .NVFP4 has one scale per 16 values"):
        split_weight_view(ps, rows=40, columns=64, format="nvfp4")


def test_format_and_use_mxfp8_must_agree(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = _nvfp4_params("2.20.2", R, C, 1)
    with pytest.raises(ValueError, match="use_mxfp8=True contradicts format='nvfp4'"), pytest.deprecated_call():
        split_weight_view(ps, rows=R, columns=C, use_mxfp8=True, format="nvfp4")
    with pytest.raises(ValueError, match="format: expected one of 'bf16', 'mxfp8', 'nvfp4', 'hybrid'; found 'fp4'"):
        split_weight_view(ps, rows=R, columns=C, format="fp4")
    with pytest.raises(ExpertWeightError, match="expert 0: expected an MXFP8 parameter; found .*kind nvfp4"):
        split_weight_view(ps, rows=R, columns=C, format="mxfp8")


def _grouped_nvfp4(release: str, experts: int, rows: int, cols: int) -> Any:
    """A GroupedTensor of NVFP4 experts as TE 2.20.2's make_grouped_tensor allocates it: flat
    packed payloads, per-expert padded scales back to back, per-expert amax."""
    g = torch.Generator().manual_seed(7)
    row_pad = (T.roundup(rows, 128), T.roundup(cols // 16, 4))
    col_pad = (T.roundup(cols, 128), T.roundup(rows // 16, 4))
    rows_s = [T.garbage_padded(rows, cols // 16, *row_pad, g) for _ in range(experts)]
    cols_s = [T.garbage_padded(cols, rows // 16, *col_pad, g) for _ in range(experts)]
    n = experts * rows * cols // 2
    attrs = {
        "num_tensors": experts,
        "tensor_shapes": [(rows, cols)] * experts,
        "rowwise_data": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g),
        "columnwise_data": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g),
        "scale_inv": torch.cat([s.flatten() for s in rows_s]),
        "columnwise_scale_inv": torch.cat([s.flatten() for s in cols_s]),
        "scale_inv_offsets": [e * math.prod(row_pad) for e in range(experts + 1)],
        "columnwise_scale_inv_offsets": [e * math.prod(col_pad) for e in range(experts + 1)],
        "amax": torch.rand(experts, generator=g),
        "columnwise_amax": torch.rand(experts, generator=g),
        "quantizer": object(),
    }
    path = T.class_path(release, "GroupedTensor")
    return make_standin(release, path, attrs, shape=(experts, rows, cols)), rows_s, cols_s


@pytest.mark.parametrize(("rows", "cols"), [(R, C), (PR, PC)])
def test_grouped_nvfp4_view(rows: int, cols: int, installed_te: Installer) -> None:
    installed_te("2.20.2")
    g, rows_s, cols_s = _grouped_nvfp4("2.20.2", 3, rows, cols)
    v = grouped_weight_view(g, num_experts=3, rows=rows, columns=cols, format="nvfp4")
    assert v.rowwise.data[0].data_ptr() == g.rowwise_data.data_ptr() and v.rowwise.data[0].shape == (3, rows, cols // 2)
    assert v.columnwise.data[0] is not None and v.columnwise.data[0].shape == (3, cols, rows // 2)
    assert torch.equal(v.rowwise.scales[0], spec_layout(torch.stack([s[:rows, : cols // 16] for s in rows_s])))
    assert torch.equal(v.columnwise.scales[0], spec_layout(torch.stack([s[:cols, : rows // 16] for s in cols_s])))
    # facts.md: the group's amax is "amax" (rowwise) and "columnwise_amax"; a kernel reads each
    # direction's own for its GEMM
    assert (
        v.rowwise.amax[0].data_ptr() == g.amax.data_ptr()
        and v.columnwise.amax[0].data_ptr() == g.columnwise_amax.data_ptr()
    )
    g.columnwise_amax = g.columnwise_amax.clone()  # TE reassigned the amax: the view follows it
    grouped_weight_view(g, num_experts=3, rows=rows, columns=cols, format="nvfp4", cached=v)
    assert v.columnwise.amax[0].data_ptr() == g.columnwise_amax.data_ptr()
    g.columnwise_amax.untyped_storage().resize_(0)  # freed: refused, naming it
    freed = "grouped weight (amax )?columnwise( amax)?: its storage holds 0 bytes"
    with pytest.raises(mok.StorageFreedError, match=freed):
        grouped_weight_view(g, num_experts=3, rows=rows, columns=cols, format="nvfp4", cached=v)


def test_layer_mixes_mxfp8_and_nvfp4_in_one_plan(installed_te: Installer) -> None:
    installed_te("2.20.2")
    mx = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    fp4 = _nvfp4_params("2.20.2", R, C, 2)
    v1 = split_weight_view(mx, rows=R, columns=C, format="mxfp8")
    v2 = split_weight_view(fp4, rows=R, columns=C, format="nvfp4")
    for p in fp4:
        p._columnwise_scale_inv.random_(0, 255)
    mok.refresh_layer([(mx, v1), (fp4, v2)])
    assert v2.columnwise.scales is not None
    assert torch.equal(v2.columnwise.scales[1], spec_layout(fp4[1]._columnwise_scale_inv[:C, : R // 16]))


# ------------------------------------------------------------------------------------ backend


def test_backend_argument_and_variable_are_checked_on_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = torch.randint(0, 255, (128, 4), dtype=torch.uint8)
    for bad in ("garbage", 5):
        with pytest.raises(
            ValueError, match=f"backend: expected one of 'auto', 'cuda', 'torch' or None; found {bad!r}"
        ):
            mok.swizzle_mxfp8_scales(scales, backend=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("TE_COMPAT_KERNEL_BACKEND", "garbage")
    with pytest.raises(ValueError, match="environment variable TE_COMPAT_KERNEL_BACKEND: expected one of auto"):
        mok.swizzle_mxfp8_scales(scales)
    assert mok.backend.report()["kernel backend"] == "unavailable"
    assert "TE_COMPAT_KERNEL_BACKEND" in str(mok.backend.report()["kernel backend reason"])
    monkeypatch.setenv("TE_COMPAT_KERNEL_BACKEND", "torch")
    assert mok.kernel_backend().name == "torch"
    assert torch.equal(mok.swizzle_mxfp8_scales(scales), spec_layout(scales))


# ------------------------------------------------------------------------------ caller buffers


def test_many_writes_into_the_given_outs_and_refuses_overlaps() -> None:
    a, b = (torch.randint(0, 255, (128, 4), dtype=torch.uint8) for _ in range(2))
    outs = [torch.empty(1, 1, 32, 16, dtype=torch.uint8) for _ in range(2)]
    got = mok.swizzle_mxfp8_scales_many([a, b], outs=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    assert torch.equal(outs[0], spec_layout(a)) and torch.equal(outs[1], spec_layout(b))
    with pytest.raises(mok.LayoutError, match=r"outs\[0\] overlaps outs\[1\]"):
        mok.swizzle_mxfp8_scales_many([a, b], outs=[outs[0], outs[0]])
    shared = torch.empty(2, 1, 32, 16, dtype=torch.uint8)  # disjoint halves of one buffer are fine
    mok.swizzle_mxfp8_scales_many([a, b], outs=[shared[:1], shared[1:]])
    c = torch.randint(0, 255, (512,), dtype=torch.uint8)
    before = c.clone()
    with pytest.raises(mok.LayoutError, match=r"outs\[0\] overlaps scales\[1\]"):
        mok.swizzle_mxfp8_scales_many([a, c.view(128, 4)], outs=[c.view(1, 1, 32, 16), outs[1]])
    assert torch.equal(c, before)  # the input was not written
    with pytest.raises(TypeError, match=r"scales: expected a sequence"):
        mok.swizzle_mxfp8_scales_many(None)  # type: ignore[arg-type]


def test_cached_buffers_over_te_scales_are_refused(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    # a cached view whose layout buffer is expert 1's own TE scale buffer: writing would corrupt TE
    for owner in (1, 0):
        match = rf"rowwise scales: cached buffers\[1\] overlaps inputs\[{owner}\]"
        te_buffer = ps[owner]._rowwise_scale_inv
        scales = (v.rowwise.scales[0], te_buffer.view(1, 2, 32, 16))
        bad = replace(v, rowwise=replace(v.rowwise, scales=scales), refresh_plan=mok.RefreshPlan())
        before = te_buffer.clone()
        with pytest.raises(mok.LayoutError, match=match):
            split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=bad)
        assert torch.equal(te_buffer, before)


def test_a_rowwise_only_view_sees_te_store_columnwise_again(installed_te: Installer) -> None:
    """A view made while TE kept rowwise data only (an evaluation phase) still watches the
    columnwise storage: where some experts regain it, the refresh raises what a new view raises;
    where all do, a new view has a columnwise direction this view has no buffers for, so the
    refresh refuses, naming the change, and writes nothing."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    assert v.columnwise is None and v.refresh_plan.plans == 1
    before = [s.clone() for s in v.rowwise.scales or ()]
    for e in range(2):
        both = T.mxfp8_tensor("2.20.2", R, C, seed=5 + e)
        ps[e]._columnwise_data, ps[e]._columnwise_scale_inv = both._columnwise_data, both._columnwise_scale_inv
        if e == 0:
            with pytest.raises(ExpertWeightError, match="expert 1 has no columnwise data") as fresh:
                split_weight_view(ps, rows=R, columns=C, format="mxfp8")
            with pytest.raises(ExpertWeightError) as refreshed:
                split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)
            assert str(fresh.value) in str(refreshed.value)
    assert split_weight_view(ps, rows=R, columns=C, format="mxfp8").columnwise is not None
    with pytest.raises(mok.RefreshError, match="TE now stores columnwise data.*new view"):
        split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)
    assert v.columnwise is None and all(map(torch.equal, v.rowwise.scales or (), before))


# ------------------------------------------------------------------- scales TE already swizzled


def _te_swizzled(release: str, n: int) -> list[Any]:
    """Per-expert MXFP8 weights whose rowwise scales TE wrote in the GEMM layout (2.12+ flag)."""
    ps = [T.mxfp8_tensor(release, R, C, seed=e, param=True, columnwise=False) for e in range(n)]
    for p in ps:
        p._rowwise_scale_inv = spec_layout(p._rowwise_scale_inv[:R, : C // 32]).view(R, C // 32).clone()
        p._with_gemm_swizzled_scales = True
    return ps


def test_refresh_of_te_swizzled_aligned_scales_moves_no_byte(
    installed_te: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed_te("2.20.2")
    ps = _te_swizzled("2.20.2", 3)
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    assert v.rowwise.scales_zero_copy and _prepared(v).work.work == []
    runs: list[str] = []
    monkeypatch.setattr(mok.plan.work, "swizzle_reference", lambda *a: runs.append("convert"))
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *a, **k: runs.append("copy"))
    for p in ps:  # TE re-quantised in place, GEMM layout again: same buffers, new bytes
        p._rowwise_scale_inv.random_(0, 255)
    assert split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v) is v
    assert runs == [] and v.refresh_plan.plans == 1
    assert [t.data_ptr() for t in v.rowwise.scales] == [p._rowwise_scale_inv.data_ptr() for p in ps]


def test_te_swizzled_grouped_aligned_is_a_pointer_check(installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, R, C, mxfp8=True, swizzled=True, members=False, columnwise=False)
    v = grouped_weight_view(g, num_experts=2, rows=R, columns=C, format="mxfp8")
    assert v.rowwise.scales_zero_copy and v.rowwise.scales[0].data_ptr() == g.scale_inv.data_ptr()
    grouped_weight_view(g, num_experts=2, rows=R, columns=C, format="mxfp8", cached=v)
    assert planned == ["grouped rowwise scales"] and _prepared(v).work.work == []


# ------------------------------------------------------------------------------------ hybrid


@pytest.mark.parametrize(("row", "col"), [("mxfp8", "nvfp4"), ("nvfp4", "mxfp8"), ("mxfp8", None)])
def test_hybrid_experts_are_viewed_direction_by_direction(
    row: str, col: str | None, installed_te: Installer, planned: list[str]
) -> None:
    installed_te("2.20.2")
    ps = [T.hybrid_tensor("2.20.2", R, C, rowwise=row, columnwise=col, seed=3 * e, param=True) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="hybrid")
    found = (v.format, v.rowwise.format, None if v.columnwise is None else v.columnwise.format)
    assert found == ("hybrid", row, col)
    rs = ps[1]._rowwise_storage
    block = 32 if row == "mxfp8" else 16
    assert torch.equal(v.rowwise.scales[1], spec_layout(rs._rowwise_scale_inv[:R, : C // block]))
    if col is not None:
        cs = ps[1]._columnwise_storage
        logical = (
            cs._columnwise_scale_inv[: R // 32, :C].t() if col == "mxfp8" else cs._columnwise_scale_inv[:C, : R // 16]
        )
        assert v.columnwise.scales is not None and torch.equal(v.columnwise.scales[1], spec_layout(logical))
    n = len(planned)
    split_weight_view(ps, rows=R, columns=C, format="hybrid", cached=v)
    assert len(planned) == n  # unchanged: nothing planned
    rs._rowwise_scale_inv = rs._rowwise_scale_inv.clone().random_(0, 255)  # a buffer inside a sub-storage
    split_weight_view(ps, rows=R, columns=C, format="hybrid", cached=v)
    assert len(planned) > n
    assert torch.equal(v.rowwise.scales[1], spec_layout(rs._rowwise_scale_inv[:R, : C // block]))


def test_hybrid_with_another_format_names_both(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.hybrid_tensor("2.20.2", R, C, rowwise="mxfp8", columnwise="identity", param=True)]
    with pytest.raises(ExpertWeightError, match="rowwise mxfp8 and columnwise identity"):
        split_weight_view(ps, rows=R, columns=C, format="hybrid")


def test_run_unchecked_reruns_without_reading_te(installed_te: Installer, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    ps[0]._rowwise_scale_inv.random_(0, 255)
    monkeypatch.setattr(mok.plan.guard.StorageGuard, "unchanged", lambda *a: pytest.fail("the unchecked run read TE"))
    v.refresh_plan.run_unchecked()
    assert torch.equal(v.rowwise.scales[0], spec_layout(ps[0]._rowwise_scale_inv[:R, : C // 32]))
    with pytest.raises(RefreshError, match="nothing prepared yet"):
        mok.RefreshPlan().run_unchecked()


# ------------------------------------------------------------------ review findings, kept as tests


def test_a_buffer_pointed_at_new_memory_is_caught(installed_te: Installer, planned: list[str]) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    ps[1]._rowwise_scale_inv.data = ps[1]._rowwise_scale_inv.clone().random_(0, 255)  # same object
    split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)
    assert len(planned) == 2
    assert torch.equal(v.rowwise.scales[1], spec_layout(ps[1]._rowwise_scale_inv[:R, : C // 32]))
    ps[1]._rowwise_data.data = ps[1]._rowwise_data.clone()  # the payload moved under the same object
    split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)
    assert len(planned) == 3 and v.rowwise.data[1].data_ptr() == ps[1]._rowwise_data.data_ptr()
    assert v.rowwise.data_ptrs.tolist() == [p._rowwise_data.data_ptr() for p in ps]


def test_a_replaced_nvfp4_amax_is_followed(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = _nvfp4_params("2.20.2", R, C, 2, columnwise=False)
    v = split_weight_view(ps, rows=R, columns=C, format="nvfp4")
    ps[1]._amax_rowwise = ps[1]._amax_rowwise.clone()
    split_weight_view(ps, rows=R, columns=C, format="nvfp4", cached=v)
    assert v.rowwise.amax is not None and v.rowwise.amax[1].data_ptr() == ps[1]._amax_rowwise.data_ptr()
    assert v.rowwise.amax_ptrs is not None and v.rowwise.amax_ptrs.tolist() == [p._amax_rowwise.data_ptr() for p in ps]


def test_a_view_resolves_its_backend_once(installed_te: Installer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend is resolved when the view is built; its refreshes, planned again or not, keep
    it without reading the environment; a new view reads it, and an argument is checked."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    monkeypatch.setenv("TE_COMPAT_KERNEL_BACKEND", "torch")
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    monkeypatch.setenv("TE_COMPAT_KERNEL_BACKEND", "garbage")
    split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)  # reran
    ps[0]._rowwise_scale_inv = ps[0]._rowwise_scale_inv.clone().random_(0, 255)  # TE moved a buffer
    split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v)  # planned again
    assert v.refresh_plan.plans == 2 and _prepared(v).backend is mok.backend.Backend.TORCH
    assert torch.equal(v.rowwise.scales[0], spec_layout(_rows(ps[0]._rowwise_scale_inv, R, C // 32)))
    with pytest.raises(ValueError, match="environment variable TE_COMPAT_KERNEL_BACKEND"):
        split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    with pytest.raises(ValueError, match="backend: expected one of"):
        split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=v, backend="garbage")


@pytest.mark.parametrize("layout", ["one class", "a tensor where another has None", "two classes"])
@pytest.mark.parametrize("change", ["memory under the same object", "a new object", "None", "flag"])
def test_the_guard_catches_each_change_whatever_it_reads(
    layout: str, change: str, installed_te: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk read (one class) and the name-by-name read (the rest) catch the same changes."""
    installed_te("2.20.2")
    ws: list[Any] = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    if layout == "a tensor where another has None":
        ws[0]._columnwise_scale_inv = None
    elif layout == "two classes":
        ws[2] = _nvfp4_params("2.20.2", R, C, 1)[0]
    names = None if layout == "two classes" else mok.read.blocks.BLOCKS[mok.Format.MXFP8].storage_names
    guard = mok.plan.guard.StorageGuard(ws, [mok.read.reading.read_storage(ws, names)])
    assert guard.unchanged(list(ws))
    target = ws[1]
    if change == "memory under the same object":
        target._columnwise_scale_inv.data = target._columnwise_scale_inv.clone()
    elif change == "a new object":
        target._rowwise_data = target._rowwise_data.clone()
    elif change == "None":
        target._columnwise_data = None
    else:
        target._with_gemm_swizzled_scales = True
    assert not guard.unchanged(ws)


def test_work_on_two_devices_is_refused() -> None:
    src = torch.zeros(1, 128, 4, dtype=torch.uint8)
    dst = torch.empty(mok.layout_shape(128, 4), dtype=torch.uint8, device="meta")
    with pytest.raises(mok.LayoutError, match="scale work item 0 has tensors on cpu and meta"):
        mok.plan.work.PreparedWork([mok.plan.work.ScaleWork(src, dst)], "torch")


def test_the_guard_keeps_the_old_memory_alive(installed_te: Installer) -> None:
    """TE's clear() swaps a buffer's storage under the same tensor object; the old memory stays
    allocated while the guard lives, so no later buffer can reuse its address unnoticed."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    v = split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    scales = ps[1]._rowwise_scale_inv
    old = scales.data_ptr()
    scales.data = torch.empty(0, dtype=torch.uint8)  # what TE's clear() does
    gc.collect()
    assert any(st.data_ptr() == old and st.nbytes() > 0 for st in _prepared(v).guard.storages)
    assert not _prepared(v).guard.unchanged(ps)


def test_a_213_group_whose_members_turn_swizzled_is_planned_again(installed_te: Installer) -> None:
    """facts.md: TE 2.13's GroupedTensor keeps no swizzled flag; each MXFP8 member (2.12+) keeps
    its own. When TE swizzles the members' scales, a refresh must not convert them again."""
    installed_te("2.13.0")
    g = T.grouped_tensor("2.13.0", 2, 128, 128, mxfp8=True)
    v = grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8")
    grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8", cached=v)
    assert v.refresh_plan.plans == 1  # nothing changed: the prepared launch ran again
    logical = torch.stack([m._rowwise_scale_inv[:128, :4] for m in g.quantized_tensors])
    g.scale_inv.copy_(spec_layout(logical).flatten())  # TE wrote the GEMM layout in place ...
    for m in g.quantized_tensors:
        m._with_gemm_swizzled_scales = True  # ... and says so on each member
    grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8", cached=v)
    assert v.refresh_plan.plans == 2
    assert torch.equal(v.rowwise.scales[0], spec_layout(logical))  # copied as they are, not swizzled twice


def test_a_layer_with_a_213_group_sees_its_members_turn_swizzled(installed_te: Installer) -> None:
    """The same for a layer refresh: the layer's guard watches the members of a 2.13 group too."""
    installed_te("2.13.0")
    g = T.grouped_tensor("2.13.0", 2, 128, 128, mxfp8=True)
    v = grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8")
    layer = mok.LayerRefresh([(g, v)])
    layer()
    layer()
    assert layer.plan.plans == 1  # nothing changed: the prepared launch ran again
    logical = torch.stack([m._rowwise_scale_inv[:128, :4] for m in g.quantized_tensors])
    g.scale_inv.copy_(spec_layout(logical).flatten())
    for m in g.quantized_tensors:
        m._with_gemm_swizzled_scales = True
    layer()
    assert layer.plan.plans == 2
    assert torch.equal(v.rowwise.scales[0], spec_layout(logical))  # copied as they are, not swizzled twice
