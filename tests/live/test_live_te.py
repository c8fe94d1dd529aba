"""te_compat and mok against a real TE: TE's own accessors and TE's own swizzle are the oracle.

Before every byte comparison TE's buffers are filled with random bytes through te_compat's
snapshots (TE's MXFP8 quantizers write nothing on sm_90), and the compared region must hold many
distinct values (tests/live/evidence.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import mok
import te_compat
from te_compat import TensorKind
from tests.live.evidence import WRITTEN_BY_TE, Evidence
from tests.spec_oracle import spec_layout

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


def seed_mxfp8(ev: Evidence, t: object) -> te_compat.MXFP8Storage:
    """Random bytes into every buffer of ``t`` (payloads and padded scales), via te_compat."""
    s = te_compat.mxfp8_storage(t)
    ev.fill_random_(s.rowwise_data, s.rowwise_scale_inv, s.columnwise_data, s.columnwise_scale_inv)
    return s


def logical_mxfp8(s: te_compat.MXFP8Storage, m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logical scale regions TE's swizzle reads (whole buffers when already swizzled)."""
    if s.scales_swizzled:
        return s.rowwise_scale_inv.reshape(-1), s.columnwise_scale_inv.reshape(-1)
    return s.rowwise_scale_inv[:m, : k // 32], s.columnwise_scale_inv[: m // 32, :k]


def assert_same_layout(te_out: torch.Tensor, ours: torch.Tensor, rows: int, cols: int, what: str) -> None:
    """Byte identity of two layout buffers of a logical [rows, cols] matrix; on a mismatch, say
    whether the logical positions (the spec's offsets) agree and only the padding differs."""
    # bytes, whatever 1-byte dtype TE keeps its scales in (2.13's NVFP4 scales are float8_e4m3fn)
    a, b = te_out.reshape(-1).view(torch.uint8), ours.reshape(-1).view(torch.uint8)
    assert a.numel() == b.numel(), f"{what}: TE's layout has {a.numel()} bytes, ours {b.numel()}"
    if torch.equal(a, b):
        return
    mask = spec_layout(torch.ones(rows, cols, dtype=torch.uint8)).reshape(-1).bool().to(a.device)
    logical = "agree (only padding differs)" if torch.equal(a[mask], b[mask]) else "differ too"
    raise AssertionError(
        f"{what}: TE's layout differs from ours at {int((a != b).sum())} of {a.numel()} bytes; "
        f"the logical positions {logical}"
    )


def test_capabilities_agree_with_te() -> None:
    caps = te_compat.capabilities()
    import transformer_engine

    assert caps.te_usable and caps.te_present
    assert te_compat.te_version() == te_compat.parse_te_version(transformer_engine.__version__)
    assert caps.compute_capability == torch.cuda.get_device_capability()
    assert "mxfp8" in caps.tensor_kinds and "float8" in caps.tensor_kinds
    assert caps.swizzled_scale_flag == te_compat.te_min_version("2.12")
    assert caps.grouped_tensors == te_compat.te_min_version("2.13")
    backend = mok.kernel_backend()
    assert backend.name == "cuda", backend.reason


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
def test_split_views_match_te_swizzle(m: int, k: int, evidence: Evidence) -> None:
    swizzle = te_swizzle_or_skip()
    with mxfp8_init():
        layer = te().GroupedLinear(E, k, m, bias=False, params_dtype=torch.bfloat16, device="cuda")
    params = [getattr(layer, f"weight{e}") for e in range(E)]
    assert all(te_compat.tensor_kind(p) is TensorKind.MXFP8 for p in params)
    logical = []
    for p in params:
        source = seed_mxfp8(evidence, p)
        logical.append([x.clone() for x in logical_mxfp8(source, m, k)])
    view = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8")
    assert view.rowwise.data_ptrs.tolist() == [p.get_data_tensors()[0].data_ptr() for p in params]
    assert view.columnwise.data_ptrs.tolist() == [p.get_data_tensors()[1].data_ptr() for p in params]
    ours_row = [s.clone() for s in view.rowwise.scales]
    ours_col = [s.clone() for s in view.columnwise.scales]
    for p in params:
        swizzle(p)  # TE's own swizzle, in place: new scale buffers, flag set
    for e, p in enumerate(params):
        st = te_compat.mxfp8_storage(p)
        assert st.scales_swizzled
        evidence.compared(f"expert {e} rowwise scales", logical[e][0], evidence.label)
        evidence.compared(f"expert {e} columnwise scales", logical[e][1], evidence.label)
        assert_same_layout(st.rowwise_scale_inv, ours_row[e], m, k // 32, f"expert {e} rowwise")
        assert_same_layout(st.columnwise_scale_inv, ours_col[e], k, m // 32, f"expert {e} columnwise")
    # refresh after TE swizzled: TE's buffers are used as they are (copied to our addresses)
    addresses = view.rowwise.scale_ptrs.tolist()
    mok.split_weight_view(params, rows=m, columns=k, format="mxfp8", cached=view)
    assert view.rowwise.scale_ptrs.tolist() == addresses
    assert all(torch.equal(a, b) for a, b in zip(view.rowwise.scales, ours_row, strict=True))
    # a fresh view of TE-swizzled aligned scales is zero-copy
    fresh = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8")
    aligned = m % 128 == 0 and (k // 32) % 4 == 0
    assert fresh.rowwise.scales_zero_copy == aligned


def _requantize_or_seed(params: list[torch.nn.Parameter], m: int, k: int, ev: Evidence) -> str:
    """TE re-quantises every expert in place; where its quantizer wrote no byte (sm_90), the
    new bytes TE would have written are seeded into its buffers instead. Returns their label."""
    before = [[x.clone() for x in logical_mxfp8(te_compat.mxfp8_storage(p), m, k)] for p in params]
    for p in params:
        p.quantize_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda") * 8)
    after = [logical_mxfp8(te_compat.mxfp8_storage(p), m, k) for p in params]
    pairs = [(b, a) for old, new in zip(before, after, strict=True) for b, a in zip(old, new, strict=True)]
    wrote = all(not torch.equal(b, a) for b, a in pairs)
    if wrote:
        ev.note(f"TE {te_compat.te_version()}'s quantize_ rewrote every expert's scales")
        return WRITTEN_BY_TE
    ev.note(
        f"TE {te_compat.te_version()}'s quantize_ left scales unchanged on this GPU "
        f"(sm_{''.join(map(str, torch.cuda.get_device_capability()))}); new bytes seeded into TE's buffers in place"
    )
    for p in params:
        seed_mxfp8(ev, p)
    return ev.label


def test_refresh_after_te_requantizes_in_place(evidence: Evidence) -> None:
    m, k = SHAPES[1]
    q = mxfp8_quantizer()
    params = [
        torch.nn.Parameter(q(torch.randn(m, k, dtype=torch.bfloat16, device="cuda")), requires_grad=False)
        for _ in range(E)
    ]
    for p in params:
        seed_mxfp8(evidence, p)
    view = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8")
    addresses = (view.rowwise.scale_ptrs.tolist(), view.columnwise.scale_ptrs.tolist())
    old_row = [s.clone() for s in view.rowwise.scales]
    label = _requantize_or_seed(params, m, k, evidence)
    mok.split_weight_view(params, rows=m, columns=k, format="mxfp8", cached=view)
    assert (view.rowwise.scale_ptrs.tolist(), view.columnwise.scale_ptrs.tolist()) == addresses
    for e, p in enumerate(params):
        st = te_compat.mxfp8_storage(p)
        assert not st.scales_swizzled, "this test re-quantises compact (unswizzled) scales"
        row, col = logical_mxfp8(st, m, k)
        evidence.compared(f"expert {e} rowwise scales after re-quantisation", row, label)
        evidence.compared(f"expert {e} columnwise scales after re-quantisation", col, label)
        assert not torch.equal(view.rowwise.scales[e], old_row[e]), f"expert {e}: the refresh left the old layout"
        want_row = spec_layout(row.cpu()).to(row.device)  # the spec's offsets, independent of mok
        want_col = spec_layout(col.t().contiguous().cpu()).to(col.device)
        assert torch.equal(view.rowwise.scales[e].reshape(-1), want_row.reshape(-1)), f"expert {e} rowwise"
        assert torch.equal(view.columnwise.scales[e].reshape(-1), want_col.reshape(-1)), f"expert {e} columnwise"


def test_uninitialised_padding_never_reaches_the_layout(evidence: Evidence) -> None:
    m, k = 224, 160  # TE pads rows to 256 and 5 scale columns to 8, uninitialised since 2.7
    t = mxfp8_quantizer()(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    s = seed_mxfp8(evidence, t)
    s.rowwise_scale_inv[m:, :].fill_(0xFF)  # make sure the padding is garbage
    s.rowwise_scale_inv[:, k // 32 :].fill_(0xFF)
    logical = s.rowwise_scale_inv[:m, : k // 32]
    evidence.compared("rowwise scales (padding 0xFF)", logical, evidence.label)
    out = mok.swizzle_mxfp8_scales(logical)
    assert torch.equal(out.reshape(-1).cpu(), spec_layout(logical.cpu()).reshape(-1))


def test_gemm_layout_request_makes_te_requantise_into_a_zero_copy_view() -> None:
    request = getattr(te_compat, "request_gemm_layout_scales", None)
    if request is None:
        pytest.skip("the te_compat installed here has no request_gemm_layout_scales (an older release)")
    m, k = SHAPES[0]  # aligned: TE's swizzled buffers are exactly the layout
    params = []
    for _ in range(E):  # one quantizer each, so that each parameter reports "enabled"
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        params.append(torch.nn.Parameter(mxfp8_quantizer()(x), requires_grad=False))
    report = request(params)
    if not te_compat.te_min_version("2.12"):
        assert len(report.unsupported) == E, str(report)
        return
    assert len(report.enabled) == E, str(report)
    assert not any(te_compat.mxfp8_storage(p).scales_swizzled for p in params), "swizzled before TE re-quantised"
    for p in params:  # on sm_90 no byte is written; TE still marks the layout (facts.md)
        p.quantize_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    storages = [te_compat.mxfp8_storage(p) for p in params]
    assert all(s.scales_swizzled for s in storages), "TE re-quantised without GEMM-layout scales"
    view = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8")
    assert view.rowwise.scales_zero_copy and view.columnwise.scales_zero_copy
    assert view.rowwise.scale_ptrs.tolist() == [s.rowwise_scale_inv.data_ptr() for s in storages]
    assert view.columnwise.scale_ptrs.tolist() == [s.columnwise_scale_inv.data_ptr() for s in storages]
    for p in params:
        p.quantize_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    again = mok.split_weight_view(params, rows=m, columns=k, format="mxfp8", cached=view)
    assert again.rowwise.scale_ptrs.tolist() == [
        te_compat.mxfp8_storage(p).rowwise_scale_inv.data_ptr() for p in params
    ]


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


def grouped_tensor_class() -> type:
    """TE's GroupedTensor: 2.13 a plain class in tensor/storage, 2.14+ a tensor subclass."""
    if not te_compat.te_min_version("2.13"):
        pytest.skip(f"TE {te_compat.te_version()} has no GroupedTensor (TE 2.13+)")
    try:
        from transformer_engine.pytorch.tensor.grouped_tensor import GroupedTensor
    except ImportError:  # 2.13
        from transformer_engine.pytorch.tensor.storage.grouped_tensor import GroupedTensor
    return GroupedTensor


def test_grouped_bf16_view_is_zero_copy() -> None:
    m, k = SHAPES[0]
    w = _grouped_layer(m, k, mxfp8=False)
    assert te_compat.tensor_kind(w) is TensorKind.GROUPED
    v = mok.grouped_weight_view(w, num_experts=E, rows=m, columns=k, format="bf16")
    assert v.rowwise.data[0].data_ptr() == te_compat.storage_attr(w, "rowwise_data").data_ptr()
    assert v.rowwise.data[0].shape == (E, m, k) and v.rowwise.data[0].dtype == torch.bfloat16


def check_grouped_mxfp8_against_te(w: object, m: int, k: int, ev: Evidence) -> None:
    """Seed the grouped buffers, view them, then compare each expert with TE's swizzle of the
    member TE made for it."""
    swizzle = te_swizzle_or_skip()
    gs = te_compat.grouped_storage(w)
    assert gs.quantized and gs.num_tensors == E and gs.members is not None
    label = ev.fill_random_(gs.rowwise_data, gs.rowwise_scale_inv, gs.columnwise_data, gs.columnwise_scale_inv)
    logical = [[x.clone() for x in logical_mxfp8(te_compat.mxfp8_storage(mem), m, k)] for mem in gs.members]
    v = mok.grouped_weight_view(w, num_experts=E, rows=m, columns=k, format="mxfp8")
    assert v.rowwise.data[0].data_ptr() == gs.rowwise_data.data_ptr()
    assert v.columnwise.data[0] is not None and v.columnwise.data[0].data_ptr() == gs.columnwise_data.data_ptr()
    per_row = v.rowwise.scales[0].numel() // E
    per_col = v.columnwise.scales[0].numel() // E
    for e, member in enumerate(gs.members):
        ev.compared(f"expert {e} rowwise scales", logical[e][0], label)
        ev.compared(f"expert {e} columnwise scales", logical[e][1], label)
        swizzle(member)  # TE swizzles each member's scales into a new buffer
        st = te_compat.mxfp8_storage(member)
        ours_row = v.rowwise.scales[0].reshape(-1)[e * per_row : (e + 1) * per_row]
        ours_col = v.columnwise.scales[0].reshape(-1)[e * per_col : (e + 1) * per_col]
        assert_same_layout(st.rowwise_scale_inv, ours_row, m, k // 32, f"expert {e} rowwise")
        assert_same_layout(st.columnwise_scale_inv, ours_col, k, m // 32, f"expert {e} columnwise")


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_grouped_mxfp8_view_matches_te_swizzle(m: int, k: int, evidence: Evidence) -> None:
    te_swizzle_or_skip()
    check_grouped_mxfp8_against_te(_grouped_layer(m, k, mxfp8=True), m, k, evidence)


@pytest.mark.parametrize(("m", "k"), SHAPES)
def test_grouped_tensor_made_by_te_matches_te_swizzle(m: int, k: int, evidence: Evidence) -> None:
    """TE's own GroupedTensor factory (2.13+): the 2.13 storage (``data``) and 2.14+ (``rowwise_data``)."""
    te_swizzle_or_skip()
    grouped = grouped_tensor_class()
    w = grouped.make_grouped_tensor_with_shapes(
        E, [(m, k)] * E, quantizer=mxfp8_quantizer(), device="cuda", dtype=torch.bfloat16
    )
    assert te_compat.tensor_kind(w) is TensorKind.GROUPED
    check_grouped_mxfp8_against_te(w, m, k, evidence)
