"""NVFP4 (TE 2.8+) and hybrid (TE 2.19+) weights against a real TE: TE's swizzle is the oracle.

TE's NVFP4 quantizer raises on sm_90, so the tensors come from TE's own ``make_empty`` (no
kernel) and their buffers are filled with random bytes before anything is compared. Each test
skips, saying why, until te_compat/mok offer the API it needs or where the release lacks the
format; it becomes live by itself once they do.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch

import mok
import te_compat
from te_compat import TensorKind
from tests.live.evidence import Evidence
from tests.live.test_live_te import E, assert_same_layout, grouped_tensor_class, mxfp8_quantizer, te_swizzle_or_skip

NVFP4_SHAPES = [(256, 512), (224, 320)]  # aligned; padded (rows to 256, K/16 = 20 to 24, M/16 = 14 to 16)


def te_api(name: str) -> Any:
    fn = getattr(te_compat, name, None)
    if fn is None:
        pytest.skip(f"the te_compat installed here has no {name} (a release before its NVFP4 support)")
    return fn


def mok_format_or_skip(fn: Any) -> None:
    if "format" not in inspect.signature(fn).parameters:
        pytest.skip(f"the mok installed here has no format= in {fn.__name__} (a release before NVFP4 views)")


def nvfp4_quantizer() -> Any:
    try:
        from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    except ImportError:
        pytest.skip(f"TE {te_compat.te_version()} has no NVFP4 (TE 2.8+)")
    return NVFP4Quantizer()  # E2M1, both usages, no RHT: TE's defaults


def nvfp4_param(m: int, k: int) -> torch.nn.Parameter:
    t = nvfp4_quantizer().make_empty((m, k), dtype=torch.bfloat16, device="cuda")
    return torch.nn.Parameter(t, requires_grad=False)


def seed_nvfp4(ev: Evidence, t: object, m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes into TE's payloads and padded scales; returns clones of the logical scale
    regions TE's swizzle reads (rowwise ``[:M, :K/16]``, stored-transposed ``[:K, :M/16]``)."""
    s = te_api("nvfp4_storage")(t)
    ev.fill_random_(s.rowwise_data, s.rowwise_scale_inv, s.columnwise_data, s.columnwise_scale_inv)
    return s.rowwise_scale_inv[:m, : k // 16].clone(), s.columnwise_scale_inv[:k, : m // 16].clone()


Pair = tuple[torch.Tensor, torch.Tensor]


def compare_nvfp4_member(ev: Evidence, t: object, logical: Pair, ours: Pair, m: int, k: int, what: str) -> None:
    """TE swizzles ``t`` in place; its new buffers must equal our layout byte for byte."""
    ev.compared(f"{what} rowwise scales", logical[0], ev.label)
    ev.compared(f"{what} columnwise scales", logical[1], ev.label)
    te_swizzle_or_skip()(t)
    s = te_compat.nvfp4_storage(t)  # type: ignore[attr-defined]
    assert s.scales_swizzled, f"{what}: TE's swizzle did not set the flag"
    assert_same_layout(s.rowwise_scale_inv, ours[0], m, k // 16, f"{what} rowwise")
    assert_same_layout(s.columnwise_scale_inv, ours[1], k, m // 16, f"{what} columnwise")


@pytest.mark.parametrize(("m", "k"), NVFP4_SHAPES)
def test_nvfp4_split_views_match_te_swizzle(m: int, k: int, evidence: Evidence) -> None:
    te_swizzle_or_skip()
    mok_format_or_skip(mok.split_weight_view)
    params = [nvfp4_param(m, k) for _ in range(E)]
    assert all(te_compat.tensor_kind(p) is TensorKind.NVFP4 for p in params)
    logical = [seed_nvfp4(evidence, p, m, k) for p in params]
    view = mok.split_weight_view(params, rows=m, columns=k, format="nvfp4")
    assert view.format == "nvfp4"
    assert view.rowwise.data_ptrs.tolist() == [te_compat.nvfp4_storage(p).rowwise_data.data_ptr() for p in params]  # type: ignore[attr-defined]
    ours = [(r.clone(), c.clone()) for r, c in zip(view.rowwise.scales, view.columnwise.scales, strict=True)]
    for e, p in enumerate(params):
        compare_nvfp4_member(evidence, p, logical[e], ours[e], m, k, f"expert {e}")


@pytest.mark.parametrize(("m", "k"), NVFP4_SHAPES)
def test_nvfp4_grouped_view_matches_te_swizzle(m: int, k: int, evidence: Evidence) -> None:
    te_swizzle_or_skip()
    mok_format_or_skip(mok.grouped_weight_view)
    quantizer = nvfp4_quantizer()
    w = grouped_tensor_class().make_grouped_tensor_with_shapes(
        E, [(m, k)] * E, quantizer=quantizer, device="cuda", dtype=torch.bfloat16
    )
    gs = te_compat.grouped_storage(w)
    assert gs.members is not None and all(te_compat.tensor_kind(x) is TensorKind.NVFP4 for x in gs.members)
    evidence.fill_random_(gs.rowwise_data, gs.rowwise_scale_inv, gs.columnwise_data, gs.columnwise_scale_inv)
    logical = []
    for member in gs.members:
        s = te_compat.nvfp4_storage(member)  # type: ignore[attr-defined]
        logical.append((s.rowwise_scale_inv[:m, : k // 16].clone(), s.columnwise_scale_inv[:k, : m // 16].clone()))
    v = mok.grouped_weight_view(w, num_experts=E, rows=m, columns=k, format="nvfp4")
    assert v.format == "nvfp4" and v.rowwise.data[0].data_ptr() == gs.rowwise_data.data_ptr()
    per_row, per_col = v.rowwise.scales[0].numel() // E, v.columnwise.scales[0].numel() // E
    rows_flat, cols_flat = v.rowwise.scales[0].reshape(-1).clone(), v.columnwise.scales[0].reshape(-1).clone()
    for e, member in enumerate(gs.members):
        ours = (rows_flat[e * per_row : (e + 1) * per_row], cols_flat[e * per_col : (e + 1) * per_col])
        compare_nvfp4_member(evidence, member, logical[e], ours, m, k, f"expert {e}")


def _hybrid_quantizer_or_skip() -> Any:
    try:
        from transformer_engine.pytorch.tensor.hybrid_tensor import HybridQuantizer
    except ImportError:
        pytest.skip(f"TE {te_compat.te_version()} has no hybrid tensors (TE 2.19+)")
    return HybridQuantizer(rowwise_quantizer=mxfp8_quantizer(), columnwise_quantizer=nvfp4_quantizer())


def test_hybrid_snapshot_holds_te_sub_storages() -> None:
    """te_compat's hybrid snapshot exposes TE's own sub-storages, whose buffers are the ones
    TE's ``get_data_tensors`` returns (rowwise MXFP8, columnwise NVFP4)."""
    hybrid_storage = te_api("hybrid_storage")
    m, k = 224, 320
    t = _hybrid_quantizer_or_skip().make_empty((m, k), dtype=torch.bfloat16, device="cuda")
    assert te_compat.tensor_kind(t) is TensorKind("hybrid")
    row_sub = te_compat.storage_field(t, "rowwise_storage")
    col_sub = te_compat.storage_field(t, "columnwise_storage")
    assert te_compat.tensor_kind(row_sub) is TensorKind.MXFP8 and te_compat.tensor_kind(col_sub) is TensorKind.NVFP4
    hs = hybrid_storage(t)
    held = [getattr(hs, f.name) for f in dataclasses.fields(hs)]
    assert any(x is row_sub for x in held) and any(x is col_sub for x in held), f"{hs} lacks TE's sub-storages"
    te_row_data, te_row_col, te_col_row, te_col_data = t.get_data_tensors()
    rs = te_compat.mxfp8_storage(row_sub)
    cs = te_api("nvfp4_storage")(col_sub)
    assert rs.rowwise_data is te_row_data and rs.columnwise_data is None is te_row_col
    assert cs.columnwise_data is te_col_data and cs.rowwise_data is None is te_col_row
    assert tuple(cs.columnwise_scale_inv.shape) == (384, 16)  # [roundup(K,128), roundup(M/16,4)], stored transposed
