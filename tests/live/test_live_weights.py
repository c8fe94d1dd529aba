"""The drop-in (mok.weights) and the read-back of logical scales against a real TE.

TE's own swizzle is the oracle, as in test_live_te.py: random bytes are seeded into TE's
buffers through te_compat first (TE's MXFP8 quantizers write nothing on sm_90).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mok
import te_compat
from mok import weights as W
from tests.live.evidence import Evidence
from tests.live.test_live_te import (
    SHAPES,
    E,
    assert_same_layout,
    logical_mxfp8,
    mxfp8_init,
    seed_mxfp8,
    te,
    te_swizzle_or_skip,
)


def _te_params(m: int, k: int, evidence: Evidence) -> list[Any]:
    with mxfp8_init():
        layer = te().GroupedLinear(E, k, m, bias=False, params_dtype=torch.bfloat16, device="cuda")
    params = [getattr(layer, f"weight{e}") for e in range(E)]
    for p in params:
        seed_mxfp8(evidence, p)
    return params


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_dropin_split_view_matches_te_swizzle_on_both_paths(
    m: int, k: int, evidence: Evidence, monkeypatch: pytest.MonkeyPatch
) -> None:
    swizzle = te_swizzle_or_skip()
    params = _te_params(m, k, evidence)
    logical = [[x.clone() for x in logical_mxfp8(te_compat.mxfp8_storage(p), m, k)] for p in params]
    fast = W._native_split_weight_view(tuple(params), rows=m, columns=k, use_mxfp8=True)
    assert fast.expert_view is not None  # TE tensors with the module's own functions: one launch
    real = W._storage_view
    monkeypatch.setattr(W, "_storage_view", lambda *a, **kw: real(*a, **kw))  # upstream's composition
    composed = W._native_split_weight_view(tuple(params), rows=m, columns=k, use_mxfp8=True)
    assert composed.expert_view is None
    for p in params:
        swizzle(p)  # TE's own swizzle, in place
    for e, p in enumerate(params):
        st = te_compat.mxfp8_storage(p)
        evidence.compared(f"expert {e} rowwise scales", logical[e][0], evidence.label)
        evidence.compared(f"expert {e} columnwise scales", logical[e][1], evidence.label)
        for view in (fast, composed):
            assert_same_layout(st.rowwise_scale_inv, view.scale_tensors[e], m, k // 32, f"expert {e} rowwise")
            assert_same_layout(
                st.columnwise_scale_inv, view.transposed_scale_tensors[e], k, m // 32, f"expert {e} columnwise"
            )


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_logical_scales_read_back_te_gemm_layout(m: int, k: int, evidence: Evidence) -> None:
    """TE writes the GEMM layout (its own swizzle); mok reads the logical scales back exactly."""
    swizzle = te_swizzle_or_skip()
    params = _te_params(m, k, evidence)
    logical = [[x.clone() for x in logical_mxfp8(te_compat.mxfp8_storage(p), m, k)] for p in params]
    view = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8")
    for p in params:
        swizzle(p)
    for e, p in enumerate(params):
        assert te_compat.mxfp8_storage(p).scales_swizzled
        evidence.compared(f"expert {e} rowwise scales", logical[e][0], evidence.label)
        assert torch.equal(mok.logical_scales(p), logical[e][0]), f"expert {e} rowwise, read back from TE"
        assert torch.equal(mok.logical_scales(p, direction="columnwise"), logical[e][1]), f"expert {e} columnwise"
        assert torch.equal(mok.logical_scales(view)[e], logical[e][0]), f"expert {e} rowwise, read back from the view"
