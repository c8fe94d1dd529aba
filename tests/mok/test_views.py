"""mok's views over grouped and per-expert weights, on stand-ins of real releases."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import mok
import te_compat
from mok import (
    ExpertWeightError,
    RefreshError,
    grouped_weight_view,
    split_weight_view,
    storage_view,
)
from tests import te_objects as T
from tests.spec_oracle import spec_layout

Installer = Callable[..., None]
GROUPED_RELEASES = ["2.13.0", "2.14.0", "2.20.2"]
# aligned, and padded (rows not a multiple of 128, columns/32 not a multiple of 4)
SHAPES = [(256, 128), (160, 96)]


def _logical_rows(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return buf[:rows, : cols // 32]


def _logical_cols_t(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return buf[: rows // 32, :cols].t()


def _members_scales(g: object, which: str) -> list[torch.Tensor]:
    return [getattr(m, which) for m in g.quantized_tensors]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------- grouped


@pytest.mark.parametrize("release", GROUPED_RELEASES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_grouped_mxfp8(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    e = 3
    g = T.grouped_tensor(release, e, rows, cols, mxfp8=True)
    v = grouped_weight_view(g, num_experts=e, rows=rows, columns=cols, format="mxfp8")
    payload = g.rowwise_data if release >= "2.14" else g.data
    assert v.rowwise.data[0].data_ptr() == payload.data_ptr() and v.rowwise.data[0].shape == (e, rows, cols)
    assert v.rowwise.data[0].dtype == torch.float8_e4m3fn
    assert v.columnwise.data[0] is not None and v.columnwise.data[0].data_ptr() == g.columnwise_data.data_ptr()
    want_rows = torch.stack([_logical_rows(s, rows, cols) for s in _members_scales(g, "_rowwise_scale_inv")])
    want_cols = torch.stack([_logical_cols_t(s, rows, cols) for s in _members_scales(g, "_columnwise_scale_inv")])
    assert torch.equal(v.rowwise.scales[0], spec_layout(want_rows))
    assert torch.equal(v.columnwise.scales[0], spec_layout(want_cols))
    assert not v.rowwise.scales_zero_copy
    # TE's padding holds 0xFF garbage; the layout's padding must be zero
    assert int((v.rowwise.scales[0] == 0xFF).sum()) == int((want_rows == 0xFF).sum())


@pytest.mark.parametrize("release", GROUPED_RELEASES)
def test_grouped_refresh_in_place(release: str, installed_te: Installer) -> None:
    installed_te(release)
    g = T.grouped_tensor(release, 2, 256, 128, mxfp8=True)
    v = grouped_weight_view(g, num_experts=2, rows=256, columns=128, format="mxfp8")
    addresses = (v.rowwise.scales[0].data_ptr(), v.columnwise.scales[0].data_ptr())
    g.scale_inv.random_(0, 255)  # TE re-quantised in place: new scale bytes, same buffers
    g.columnwise_scale_inv.random_(0, 255)
    again = grouped_weight_view(g, num_experts=2, rows=256, columns=128, format="mxfp8", cached=v)
    assert again is v and (v.rowwise.scales[0].data_ptr(), v.columnwise.scales[0].data_ptr()) == addresses
    want = torch.stack([_logical_rows(s, 256, 128) for s in _members_scales(g, "_rowwise_scale_inv")])
    assert torch.equal(v.rowwise.scales[0], spec_layout(want))


def test_grouped_bf16(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 4, 64, 32, mxfp8=False)
    v = grouped_weight_view(g, num_experts=4, rows=64, columns=32, format="bf16")
    assert v.rowwise.data[0].data_ptr() == g.rowwise_data.data_ptr()
    assert v.rowwise.data[0].shape == (4, 64, 32) and v.rowwise.data[0].dtype == torch.bfloat16
    assert v.rowwise.scales is None and v.columnwise is None
    assert torch.equal(v.rowwise.data[0][1], g.rowwise_data[64 * 32 : 2 * 64 * 32].view(64, 32))
    payload = v.rowwise.data[0]
    g.rowwise_data = g.rowwise_data.clone()  # TE moved the payload: a refresh points the view there
    assert grouped_weight_view(g, num_experts=4, rows=64, columns=32, format="bf16", cached=v) is v
    assert v.rowwise.data[0] is payload and payload.data_ptr() == g.rowwise_data.data_ptr()
    q = grouped_weight_view(g, num_experts=4, rows=64, columns=32, format="mxfp8")  # quantised by mok
    assert q.quantized_on_the_fly and q.rowwise.data[0].dtype == torch.float8_e4m3fn
    assert q.rowwise.data[0].data_ptr() != g.rowwise_data.data_ptr()  # mok's own buffers, not TE's
    with pytest.raises(ExpertWeightError, match="holds no quantized data"):  # NVFP4: TE's storage only
        grouped_weight_view(g, num_experts=4, rows=64, columns=32, format="nvfp4")


def test_grouped_already_swizzled_aligned_is_zero_copy(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True, swizzled=True)
    before = g.scale_inv.clone()
    v = grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8")
    assert v.rowwise.scales_zero_copy and v.rowwise.scales[0].data_ptr() == g.scale_inv.data_ptr()
    assert v.columnwise.scales_zero_copy and v.columnwise.scales[0].data_ptr() == g.columnwise_scale_inv.data_ptr()
    assert torch.equal(g.scale_inv, before)  # never swizzled a second time
    # TE moves its swizzled buffer: the view's scales (the same tensor) follow it, as a new view's would
    scales = v.rowwise.scales[0]
    g.scale_inv = torch.randint(0, 256, g.scale_inv.shape, dtype=torch.uint8)
    for e, m in enumerate(g.quantized_tensors):  # the members' views move with it
        m._rowwise_scale_inv = g.scale_inv[e * 512 : (e + 1) * 512].view(128, 4)
    grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8", cached=v)
    assert v.rowwise.scales[0] is scales and scales.data_ptr() == g.scale_inv.data_ptr()
    assert torch.equal(v.rowwise.scales[0].flatten(), g.scale_inv)
    # TE now holds unswizzled scales in its buffer: refusing beats corrupting TE's storage
    g._with_gemm_swizzled_scales = False
    with pytest.raises(RefreshError, match="exposes TE's own swizzled scale buffer"):
        grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8", cached=v)


def test_grouped_already_swizzled_padded_is_copied_not_converted(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 160, 96, mxfp8=True, swizzled=True)
    v = grouped_weight_view(g, num_experts=2, rows=160, columns=96, format="mxfp8")
    assert not v.rowwise.scales_zero_copy and v.rowwise.scales[0].data_ptr() != g.scale_inv.data_ptr()
    assert torch.equal(v.rowwise.scales[0].flatten(), g.scale_inv)


def test_grouped_members_not_packed(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 128, mxfp8=True)
    g.quantized_tensors[2]._rowwise_scale_inv = g.quantized_tensors[2]._rowwise_scale_inv.clone()
    with pytest.raises(ExpertWeightError, match="member 2 scale is not packed expert-major .rowwise.*outside it"):
        grouped_weight_view(g, num_experts=3, rows=128, columns=128, format="mxfp8")


@pytest.mark.parametrize(
    ("move", "message"),
    [
        ("none", "expert 1 has no rowwise scales"),
        (
            "swap",
            r"member 1 scale is not packed expert-major .rowwise scales in the grouped buffer.: expected "
            r"byte 512, found byte 1024 of it",
        ),
    ],
)
def test_grouped_members_out_of_place_are_named(move: str, message: str, installed_te: Installer) -> None:
    """Every member's scales where expert-major packing puts them pass in one pass; the first one
    elsewhere (or missing) is named, with where it is."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 128, mxfp8=True)
    members = g.quantized_tensors
    if move == "none":
        members[1]._rowwise_scale_inv = None
    else:  # members 1 and 2 hold each other's slice of the grouped buffer
        members[1]._rowwise_scale_inv, members[2]._rowwise_scale_inv = (
            members[2]._rowwise_scale_inv,
            members[1]._rowwise_scale_inv,
        )
    with pytest.raises(ExpertWeightError, match=message):
        grouped_weight_view(g, num_experts=3, rows=128, columns=128, format="mxfp8")


def test_grouped_shapes_name_the_first_expert_that_differs(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 128, mxfp8=True)
    g.tensor_shapes = [(128, 128), (128, 128), (64, 128)]
    with pytest.raises(
        ExpertWeightError, match=r"expected every expert of shape \(128, 128\); expert 2 has \(64, 128\)"
    ):
        grouped_weight_view(g, num_experts=3, rows=128, columns=128, format="mxfp8")


def test_grouped_offsets_not_expert_major(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 128, mxfp8=True)
    g.scale_inv_offsets = [0, 600, 1024, 1536]
    with pytest.raises(ExpertWeightError, match="expert 1 starts at byte 600, expected 512"):
        grouped_weight_view(g, num_experts=3, rows=128, columns=128, format="mxfp8")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_experts": 4, "rows": 128, "columns": 64}, "expected 4 experts; found 3"),
        (
            {"num_experts": 3, "rows": 64, "columns": 128},
            r"expected every expert of shape \(64, 128\); expert 0 has \(128, 64\)",
        ),
    ],
)
def test_grouped_declared_shape_mismatch(kwargs: dict[str, int], message: str, installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 64, mxfp8=True)
    with pytest.raises(ExpertWeightError, match=message):
        grouped_weight_view(g, format="mxfp8", **kwargs)


def test_grouped_quantized_but_bf16_requested(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 64, mxfp8=True)
    with pytest.raises(ExpertWeightError, match="is quantized"):
        grouped_weight_view(g, num_experts=2, rows=128, columns=64, format="bf16")


def test_grouped_refresh_follows_a_moved_payload(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 64, mxfp8=True)
    v = grouped_weight_view(g, num_experts=2, rows=128, columns=64, format="mxfp8")
    payload = v.rowwise.data[0]
    g.rowwise_data = g.rowwise_data.clone()
    grouped_weight_view(g, num_experts=2, rows=128, columns=64, format="mxfp8", cached=v)
    assert v.rowwise.data[0] is payload and payload.data_ptr() == g.rowwise_data.data_ptr()
    with pytest.raises(RefreshError, match=r"= \(3, 128, 64\), as asked for; found one of \(2, 128, 64\)"):
        grouped_weight_view(
            T.grouped_tensor("2.20.2", 3, 128, 64, mxfp8=True),
            num_experts=3,
            rows=128,
            columns=64,
            format="mxfp8",
            cached=v,
        )


# ------------------------------------------------------------------------------ per expert


@pytest.mark.parametrize("release", ["2.1.0", "2.11.0", "2.12.0", "2.20.2"])
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_split_mxfp8(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    ps = [T.mxfp8_tensor(release, rows, cols, seed=e, param=True) for e in range(3)]
    v = split_weight_view(ps, rows=rows, columns=cols, format="mxfp8")
    assert [t.data_ptr() for t in v.rowwise.data] == [p._rowwise_data.data_ptr() for p in ps]
    assert v.rowwise.data_ptrs.tolist() == [p._rowwise_data.data_ptr() for p in ps]
    assert v.columnwise.data_ptrs is not None and v.columnwise.data_ptrs.tolist() == [
        p._columnwise_data.data_ptr() for p in ps
    ]
    assert v.rowwise.scale_ptrs.tolist() == [s.data_ptr() for s in v.rowwise.scales]
    assert v.columnwise.scale_ptrs is not None and v.columnwise.scales is not None
    assert v.columnwise.scale_ptrs.tolist() == [s.data_ptr() for s in v.columnwise.scales]
    for e, p in enumerate(ps):
        assert torch.equal(v.rowwise.scales[e], spec_layout(_logical_rows(p._rowwise_scale_inv, rows, cols)))
        assert torch.equal(v.columnwise.scales[e], spec_layout(_logical_cols_t(p._columnwise_scale_inv, rows, cols)))


def test_split_refresh_keeps_addresses_and_picks_up_values(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(4)]
    v = split_weight_view(ps, rows=128, columns=256, format="mxfp8")
    ptrs = v.rowwise.scale_ptrs.clone()
    for p in ps:
        p._rowwise_scale_inv.random_(0, 255)
    assert split_weight_view(ps, rows=128, columns=256, format="mxfp8", cached=v) is v
    assert torch.equal(v.rowwise.scale_ptrs, ptrs)
    assert [s.data_ptr() for s in v.rowwise.scales] == ptrs.tolist()
    for e, p in enumerate(ps):
        assert torch.equal(v.rowwise.scales[e], spec_layout(_logical_rows(p._rowwise_scale_inv, 128, 256)))


def test_unchanged_refresh_reruns_its_prepared_work(installed_te: Installer, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_te("2.20.2")
    from mok.plan import pipeline as plan

    ps = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(3)]
    g = T.grouped_tensor("2.20.2", 2, 256, 128, mxfp8=True)
    sv = split_weight_view(ps, rows=128, columns=256, format="mxfp8")
    gv = grouped_weight_view(g, num_experts=2, rows=256, columns=128, format="mxfp8")
    planned: list[str] = []
    real_plan = plan.plan_scales
    monkeypatch.setattr(plan, "plan_scales", lambda *a: (planned.append(a[2].split()[0]), real_plan(*a))[1])
    for p in ps:
        p._rowwise_scale_inv.random_(0, 255)  # new values in the same buffers
    g.scale_inv.random_(0, 255)
    split_weight_view(ps, rows=128, columns=256, format="mxfp8", cached=sv)
    grouped_weight_view(g, num_experts=2, rows=256, columns=128, format="mxfp8", cached=gv)
    assert planned == []  # nothing re-planned ...
    assert torch.equal(sv.rowwise.scales[2], spec_layout(_logical_rows(ps[2]._rowwise_scale_inv, 128, 256)))
    assert torch.equal(
        gv.rowwise.scales[0],
        spec_layout(torch.stack([_logical_rows(s, 256, 128) for s in _members_scales(g, "_rowwise_scale_inv")])),
    )  # ... values fresh
    ps[1]._columnwise_scale_inv = ps[1]._columnwise_scale_inv.clone()  # TE moved one buffer
    split_weight_view(ps, rows=128, columns=256, format="mxfp8", cached=sv)
    assert planned == ["rowwise", "columnwise"]  # the split view re-planned (both directions)
    mok.refresh_layer([(g, gv), (ps, sv)])  # first layer refresh plans; the second reruns
    mok.refresh_layer([(g, gv), (ps, sv)])
    assert planned == ["rowwise", "columnwise"] + ["grouped"] * 2 + ["rowwise", "columnwise"]


def test_split_refresh_follows_a_moved_payload(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    v = split_weight_view(ps, rows=128, columns=128, format="mxfp8")
    ps[1]._rowwise_data = ps[1]._rowwise_data.clone()
    split_weight_view(ps, rows=128, columns=128, format="mxfp8", cached=v)
    assert v.rowwise.data_ptrs.tolist() == [p._rowwise_data.data_ptr() for p in ps]


def test_split_mixed_swizzled_experts(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(3)]
    done = spec_layout(_logical_rows(ps[1]._rowwise_scale_inv, 128, 128))
    ps[1]._rowwise_scale_inv = done.view(128, 4).clone()  # TE swizzled expert 1 in place
    ps[1]._with_gemm_swizzled_scales = True
    v = split_weight_view(ps, rows=128, columns=128, format="mxfp8")
    assert torch.equal(v.rowwise.scales[1], done)  # copied as-is, not converted twice
    assert torch.equal(v.rowwise.scales[0], spec_layout(_logical_rows(ps[0]._rowwise_scale_inv, 128, 128)))


def test_split_all_swizzled_aligned_is_zero_copy(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [
        T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True, columnwise=False, _with_gemm_swizzled_scales=True)
        for e in range(2)
    ]
    v = split_weight_view(ps, rows=128, columns=128, format="mxfp8")
    assert v.rowwise.scales_zero_copy
    assert v.rowwise.scale_ptrs.tolist() == [p._rowwise_scale_inv.data_ptr() for p in ps]
    assert v.columnwise is None


def test_split_wrong_expert_kind_names_expert_and_quantizer(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, param=True), T.float8_tensor("2.20.2", 128, 128, param=True)]
    ps[1]._quantizer = type("Float8CurrentScalingQuantizer", (), {})()
    with pytest.raises(
        ExpertWeightError,
        match="expert 1: expected an MXFP8 parameter; found Float8Tensor "
        r"\(kind float8, quantizer Float8CurrentScalingQuantizer\)",
    ):
        split_weight_view(ps, rows=128, columns=128, format="mxfp8")


def test_split_errors(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    with pytest.raises(ExpertWeightError, match=r"expert 0: expected shape \(128, 256\); found \(128, 128\)"):
        split_weight_view(ps, rows=128, columns=256, format="mxfp8")
    with pytest.raises(ExpertWeightError, match="at least one expert"):
        split_weight_view([], rows=128, columns=128, format="mxfp8")
    with pytest.raises(ExpertWeightError, match="multiples of 32 .MXFP8 has one scale per 32 values.; found rows=100"):
        split_weight_view(ps, rows=100, columns=128, format="mxfp8")
    no_col = [ps[0], T.mxfp8_tensor("2.20.2", 128, 128, param=True, columnwise=False)]
    with pytest.raises(ExpertWeightError, match="expert 1 has no columnwise data"):
        split_weight_view(no_col, rows=128, columns=128, format="mxfp8")
    with pytest.raises(ExpertWeightError, match="expert 0: expected a plain"):
        split_weight_view(ps, rows=128, columns=128, format="bf16")


def test_split_bf16(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [torch.nn.Parameter(torch.randn(64, 32, dtype=torch.bfloat16)) for _ in range(3)]
    v = split_weight_view(ps, rows=64, columns=32, format="bf16")
    assert v.rowwise.data_ptrs.tolist() == [p.data_ptr() for p in ps]
    assert all(t.data_ptr() == p.data_ptr() and not t.requires_grad for t, p in zip(v.rowwise.data, ps, strict=False))
    table = v.rowwise.data_ptrs
    for p in ps:  # FSDP between steps: freed, then regathered into new memory
        p.untyped_storage().resize_(0)
    with pytest.raises(mok.StorageFreedError, match="expert 0 weight: its storage holds 0 bytes"):
        split_weight_view(ps, rows=64, columns=32, format="bf16", cached=v)
    for p in ps:
        p.untyped_storage().resize_(64 * 32 * 2)
    assert split_weight_view(ps, rows=64, columns=32, format="bf16", cached=v) is v
    assert v.rowwise.data_ptrs is table and table.tolist() == [p.data_ptr() for p in ps]
    with pytest.raises(ExpertWeightError, match=r"expert 2: expected shape \(64, 32\); found \(32, 64\)"):
        split_weight_view([*ps[:2], torch.nn.Parameter(torch.randn(32, 64))], rows=64, columns=32, format="bf16")


# ------------------------------------------------------------------------------ storage_view


def test_storage_view() -> None:
    buf = torch.randint(0, 256, (2 * 64 * 32,), dtype=torch.uint8)
    v = storage_view(buf, (2, 64, 32), dtype=torch.float8_e4m3fn, name="w")
    assert v.data_ptr() == buf.data_ptr() and v.dtype == torch.float8_e4m3fn
    with pytest.raises(ExpertWeightError, match=r"w: expected 4000 elements for shape \(4000,\); found 4096"):
        storage_view(buf, (4000,), dtype=torch.uint8, name="w")
    with pytest.raises(ExpertWeightError, match="w: expected contiguous storage"):
        storage_view(buf.view(64, 64).t(), (64, 64), dtype=torch.uint8, name="w")
    with pytest.raises(ExpertWeightError, match="w: expected dtype torch.bfloat16; found torch.float32"):
        storage_view(torch.zeros(4), (4,), dtype=torch.bfloat16, name="w")
    with pytest.raises(ExpertWeightError, match=r"w: expected a torch.Tensor; found \[1, 2\] \(list\)"):
        storage_view([1, 2], (2,), dtype=torch.uint8, name="w")  # type: ignore[arg-type]


def test_the_scale_matrix_checks_divisibility_and_size() -> None:
    with pytest.raises(ValueError, match="rows: expected a multiple of 32 .*; found 100"):
        te_compat.scale_matrix(torch.zeros(4, 128, dtype=torch.uint8), 100, 128, direction="columnwise")
    with pytest.raises(ValueError, match=r"at least \[4, 256\]"):
        te_compat.scale_matrix(torch.zeros(4, 128, dtype=torch.uint8), 128, 256, direction="columnwise")
