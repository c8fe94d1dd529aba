"""te_compat and mok against a real TE: TE's own accessors and TE's own swizzle are the oracle."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import mok
import te_compat
from te_compat import TensorKind

# shapes: aligned, and padded (multiples of 32, not of 128; K/32 not a multiple of 4)
SHAPES = [(256, 512), (224, 160)]
E = 4


def te() -> object:
    import transformer_engine.pytorch as tep

    return tep


def tex() -> object:
    import transformer_engine_torch

    return transformer_engine_torch


def mxfp8_quantizer(rowwise: bool = True, columnwise: bool = True) -> object:
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    return MXFP8Quantizer(tex().DType.kFloat8E4M3, rowwise=rowwise, columnwise=columnwise)


def te_swizzle_or_skip() -> object:
    fn = getattr(tex(), "swizzle_scales_for_gemm_", None)
    if fn is None:
        pytest.skip(f"TE {te_compat.te_version()} has no swizzle_scales_for_gemm_ (TE 2.12+)")
    return fn


@contextlib.contextmanager
def mxfp8_init() -> Iterator[None]:
    from transformer_engine.common.recipe import MXFP8BlockScaling

    init = getattr(te(), "quantized_model_init", None) or te().fp8_model_init
    with init(enabled=True, recipe=MXFP8BlockScaling()):
        yield


def test_capabilities_agree_with_te() -> None:
    caps = te_compat.capabilities()
    import transformer_engine

    assert caps.te_usable and caps.te_present
    assert te_compat.te_version() == te_compat.parse_te_version(transformer_engine.__version__)
    assert caps.compute_capability == torch.cuda.get_device_capability()
    assert "mxfp8" in caps.tensor_kinds and "float8" in caps.tensor_kinds
    assert caps.swizzled_scale_flag == te_compat.te_min_version("2.12")
    assert caps.grouped_tensors == te_compat.te_min_version("2.13")
    assert caps.kernel_backend == "cuda", caps.kernel_backend_reason


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_mxfp8_probe_agrees_with_te(m: int, k: int) -> None:
    t = mxfp8_quantizer()(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    assert te_compat.tensor_kind(t) is TensorKind.MXFP8
    row, col = t.get_data_tensors()
    s = te_compat.mxfp8_storage(t)
    assert s.rowwise_data is row and s.columnwise_data is col and s.shape == (m, k)
    assert type(te_compat.storage_field(t, "quantizer")) is type(t._get_quantizer())
    p = torch.nn.Parameter(t, requires_grad=False)
    assert te_compat.tensor_kind(p) is TensorKind.MXFP8 and te_compat.tensor_kind(p.data) is TensorKind.MXFP8
    assert te_compat.storage_attr(p.data, "rowwise_data").data_ptr() == row.data_ptr()
    assert s.scales_swizzled is False


def test_float8_probe_agrees_with_te() -> None:
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    q = Float8CurrentScalingQuantizer(tex().DType.kFloat8E4M3, device="cuda")
    t = q(torch.randn(128, 256, dtype=torch.bfloat16, device="cuda"))
    data, transpose = t.get_data_tensors()
    s = te_compat.float8_storage(torch.nn.Parameter(t, requires_grad=False))
    assert s.data is data and s.transpose is transpose and s.scale_inv.numel() == 1


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_split_views_match_te_swizzle(m: int, k: int) -> None:
    swizzle = te_swizzle_or_skip()
    with mxfp8_init():
        layer = te().GroupedLinear(E, k, m, bias=False, params_dtype=torch.bfloat16, device="cuda")
    params = [getattr(layer, f"weight{e}") for e in range(E)]
    assert all(te_compat.tensor_kind(p) is TensorKind.MXFP8 for p in params)
    view = mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True)
    assert view.row_data_ptrs.tolist() == [p.get_data_tensors()[0].data_ptr() for p in params]
    assert view.col_data_ptrs.tolist() == [p.get_data_tensors()[1].data_ptr() for p in params]
    ours_row = [s.clone() for s in view.row_scales]
    ours_col = [s.clone() for s in view.col_scales]
    for p in params:
        swizzle(p)  # TE's own swizzle, in place: new scale buffers, flag set
    for e, p in enumerate(params):
        st = te_compat.mxfp8_storage(p)
        assert st.scales_swizzled
        assert torch.equal(st.rowwise_scale_inv.flatten(), ours_row[e].flatten()), f"expert {e} rowwise"
        assert torch.equal(st.columnwise_scale_inv.flatten(), ours_col[e].flatten()), f"expert {e} columnwise"
    # refresh after TE swizzled: TE's buffers are used as they are (copied to our addresses)
    addresses = view.row_scale_ptrs.tolist()
    mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True, cached=view)
    assert view.row_scale_ptrs.tolist() == addresses
    assert all(torch.equal(a, b) for a, b in zip(view.row_scales, ours_row, strict=True))
    # a fresh view of TE-swizzled aligned scales is zero-copy
    fresh = mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True)
    aligned = m % 128 == 0 and (k // 32) % 4 == 0
    assert fresh.row_scales_zero_copy == aligned


def test_refresh_after_te_requantizes_in_place() -> None:
    m, k = SHAPES[1]
    q = mxfp8_quantizer()
    params = [
        torch.nn.Parameter(q(torch.randn(m, k, dtype=torch.bfloat16, device="cuda")), requires_grad=False)
        for _ in range(E)
    ]
    view = mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True)
    addresses = (view.row_scale_ptrs.tolist(), view.col_scale_ptrs.tolist())
    te_before = [te_compat.mxfp8_storage(p).rowwise_scale_inv[:m, : k // 32].clone() for p in params]
    for p in params:
        p.quantize_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda") * 8)
    te_after = [te_compat.mxfp8_storage(p).rowwise_scale_inv[:m, : k // 32] for p in params]
    changed = [not torch.equal(a, b) for a, b in zip(te_before, te_after, strict=True)]
    if not any(changed):  # seen with TE 2.12.0 and 2.20.2 on an H200: nothing to refresh
        pytest.skip(f"TE {te_compat.te_version()}: quantize_ into an existing MXFP8 tensor left its scales unchanged")
    mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True, cached=view)
    assert (view.row_scale_ptrs.tolist(), view.col_scale_ptrs.tolist()) == addresses
    want = mok.split_weight_view(params, rows=m, columns=k, use_mxfp8=True, backend="torch")
    for e in range(E):
        assert torch.equal(view.row_scales[e], want.row_scales[e]), f"expert {e} rowwise (TE changed: {changed[e]})"
        assert torch.equal(view.col_scales[e], want.col_scales[e]), f"expert {e} columnwise"


def test_uninitialised_padding_never_reaches_the_layout() -> None:
    m, k = 224, 160  # TE pads rows to 256 and 5 scale columns to 8, uninitialised since 2.7
    t = mxfp8_quantizer()(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    s = te_compat.mxfp8_storage(t)
    s.rowwise_scale_inv[m:, :].fill_(0xFF)  # make sure the padding is garbage
    s.rowwise_scale_inv[:, k // 32 :].fill_(0xFF)
    out = mok.swizzle_mxfp8_scales(s.rowwise_scale_inv[:m, : k // 32])
    ref = torch.zeros(256, 8, dtype=torch.uint8, device="cuda")
    ref[:m, : k // 32] = s.rowwise_scale_inv[:m, : k // 32]
    assert torch.equal(out, mok.swizzle_mxfp8_scales(ref, backend="torch"))


def _grouped_layer(m: int, k: int, mxfp8: bool) -> torch.nn.Parameter:
    if not te_compat.te_min_version("2.14"):
        pytest.skip(f"TE {te_compat.te_version()}: single grouped weights are Parameters from TE 2.14")
    ctx = mxfp8_init() if mxfp8 else contextlib.nullcontext()
    with ctx:
        layer = te().GroupedLinear(
            E, k, m, bias=False, params_dtype=torch.bfloat16, device="cuda", single_grouped_weight=True
        )
    weight = getattr(layer, "weight", None)
    if weight is None:
        pytest.skip("GroupedLinear registered no single 'weight' (NVTE_GROUPED_LINEAR_SINGLE_PARAM unset?)")
    return weight


def test_grouped_bf16_view_is_zero_copy() -> None:
    m, k = SHAPES[0]
    w = _grouped_layer(m, k, mxfp8=False)
    assert te_compat.tensor_kind(w) is TensorKind.GROUPED
    v = mok.grouped_weight_view(w, num_experts=E, rows=m, columns=k, use_mxfp8=False)
    assert v.row_data.data_ptr() == te_compat.storage_attr(w, "rowwise_data").data_ptr()
    assert v.row_data.shape == (E, m, k) and v.row_data.dtype == torch.bfloat16


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_grouped_mxfp8_view_matches_te_swizzle(m: int, k: int) -> None:
    swizzle = te_swizzle_or_skip()
    w = _grouped_layer(m, k, mxfp8=True)
    gs = te_compat.grouped_storage(w)
    assert gs.quantized and gs.num_tensors == E and gs.members is not None
    v = mok.grouped_weight_view(w, num_experts=E, rows=m, columns=k, use_mxfp8=True)
    assert v.row_data.data_ptr() == gs.rowwise_data.data_ptr()
    assert v.col_data is not None and v.col_data.data_ptr() == gs.columnwise_data.data_ptr()
    per_row = v.row_scales.numel() // E
    per_col = v.col_scales.numel() // E
    for e, member in enumerate(gs.members):
        swizzle(member)  # TE swizzles each member's scales into a new buffer
        st = te_compat.mxfp8_storage(member)
        assert torch.equal(st.rowwise_scale_inv.flatten(), v.row_scales.flatten()[e * per_row : (e + 1) * per_row])
        assert torch.equal(st.columnwise_scale_inv.flatten(), v.col_scales.flatten()[e * per_col : (e + 1) * per_col])
