"""The CUDA kernel against the torch reference, byte for byte, on a real GPU.

Inputs carry 0xFF in TE's padding; outputs are poisoned with 0xAB before each call so an unwritten
byte shows. Skipped without a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mok
from mok.kernels import launcher
from tests import te_objects as T
from tests.spec_oracle import spec_layout

pytestmark = pytest.mark.gpu
CUDA = "cuda"


@pytest.fixture(autouse=True)
def _needs_cuda_core() -> None:
    pytest.importorskip("cuda.core", reason="the cuda backend needs cuda.core (pip install te-compat[cuda])")


def _count_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each kernel launch (its number of descriptor rows, after merging)."""
    launches: list[int] = []
    real = launcher.Launch.__call__

    def counting(self: launcher.Launch) -> None:
        launches.append(self.njobs)
        real(self)

    monkeypatch.setattr(launcher.Launch, "__call__", counting)
    return launches


def _padded_buffer(experts: int, rows: int, cols: int, pr: int, pc: int, g: torch.Generator) -> torch.Tensor:
    buf = torch.full((experts, pr, pc), 0xFF, dtype=torch.uint8)
    buf[:, :rows, :cols] = torch.randint(0, 255, (experts, rows, cols), dtype=torch.uint8, generator=g)
    return buf.to(CUDA)


def _both(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch = scales if scales.dim() == 3 else scales.unsqueeze(0)
    shape = mok.layout_shape(batch.shape[1], batch.shape[2], batch.shape[0])
    out = torch.full(shape, 0xAB, dtype=torch.uint8, device=CUDA)
    mok.swizzle_mxfp8_scales(scales, out=out, backend="cuda")
    ref = mok.swizzle_mxfp8_scales(scales, backend="torch")
    return out, ref


ROWWISE_CASES = [  # (E, M, K): rowwise logical [M, K/32] sliced out of TE's padded buffer
    (1, 128, 128),
    (1, 32, 32),
    (3, 96, 160),
    (2, 160, 224),
    (8, 2048, 7168),
    (1, 65536 // 8, 7168),
    (300, 128, 256),
    (5, 4096 + 32, 7168 + 32),
    (17, 32, 4096),
    (1, 128 * 33, 32 * 4 * 33),
]


@pytest.mark.parametrize(("experts", "m", "k"), ROWWISE_CASES)
def test_rowwise_matches_reference(experts: int, m: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 7 + k)
    buf = _padded_buffer(experts, m, k // 32, T.roundup(m, 128), T.roundup(k // 32, 4), g)
    out, ref = _both(buf[:, :m, : k // 32])
    assert torch.equal(out, ref)


@pytest.mark.parametrize(("experts", "m", "k"), ROWWISE_CASES)
def test_columnwise_transpose_read_directly(experts: int, m: int, k: int) -> None:
    g = torch.Generator().manual_seed(m + k)
    buf = _padded_buffer(experts, m // 32, k, T.roundup(m // 32, 4), T.roundup(k, 128), g)
    logical = buf[:, : m // 32, :k].transpose(1, 2)  # [E, K, M/32], no copy
    job = launcher.convert_job(logical, torch.empty(mok.layout_shape(k, m // 32, experts), dtype=torch.uint8))
    assert job.mode == (launcher.MODE_COLS if m > 32 else launcher.MODE_ROWS)  # one column: either way
    out, ref = _both(logical)
    assert torch.equal(out, ref)


def test_small_against_the_spec() -> None:
    s = torch.randint(0, 256, (200, 6), dtype=torch.uint8)
    out, _ = _both(s.to(CUDA))
    assert torch.equal(out.cpu(), spec_layout(s))


@settings(max_examples=80, deadline=None)
@given(
    experts=st.integers(1, 6),
    rows=st.integers(1, 700),
    cols=st.integers(1, 300),
    layout=st.sampled_from(["rows", "cols", "gather", "offset"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz(experts: int, rows: int, cols: int, layout: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    if layout == "cols":
        base = torch.randint(0, 256, (experts, cols + 3, rows + 5), dtype=torch.uint8, generator=g).to(CUDA)
        scales = base[:, :cols, :rows].transpose(1, 2)
    elif layout == "gather":
        base = torch.randint(0, 256, (experts, rows * 2, cols * 3), dtype=torch.uint8, generator=g).to(CUDA)
        scales = base[:, ::2, ::3]
    elif layout == "offset":  # misaligned start and row stride: 1-byte loads
        base = torch.randint(0, 256, (experts * rows * (cols + 1) + 1,), dtype=torch.uint8, generator=g).to(CUDA)
        scales = base[1:].view(experts, rows, cols + 1)[:, :, :cols]
    else:
        scales = torch.randint(0, 256, (experts, rows, cols), dtype=torch.uint8, generator=g).to(CUDA)
    out, ref = _both(scales)
    assert torch.equal(out, ref)


def test_many_in_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(1)
    mats = [
        torch.randint(0, 256, (int(r), int(c)), dtype=torch.uint8, generator=g).to(CUDA)
        for r, c in zip(
            torch.randint(1, 400, (300,), generator=g), torch.randint(1, 70, (300,), generator=g), strict=True
        )
    ]
    launches = _count_launches(monkeypatch)
    outs = mok.swizzle_mxfp8_scales_many(mats, backend="cuda")
    assert len(launches) == 1
    for m, o in zip(mats, outs, strict=True):
        assert torch.equal(o, mok.swizzle_mxfp8_scales(m, backend="torch"))


def test_copy_jobs_match() -> None:
    src = torch.randint(0, 256, (3 * 16384 + 5,), dtype=torch.uint8, device=CUDA)
    dst = torch.zeros_like(src)
    launcher.launch_jobs([launcher.copy_job(src, dst)], src.device)
    assert torch.equal(dst, src)
    src2, dst2 = src[1:], torch.zeros(src.numel() - 1, dtype=torch.uint8, device=CUDA)  # misaligned
    launcher.launch_jobs([launcher.copy_job(src2, dst2)], src.device)
    assert torch.equal(dst2, src2)


def test_graph_capture_and_replay() -> None:
    g = torch.Generator().manual_seed(3)
    src = _padded_buffer(16, 2048, 224, 2048, 224, g)
    out = torch.empty(mok.layout_shape(2048, 224, 16), dtype=torch.uint8, device=CUDA)
    mok.swizzle_mxfp8_scales(src, out=out, backend="cuda")  # warm-up: compiles, uploads the table
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mok.swizzle_mxfp8_scales(src, out=out, backend="cuda")
    for _ in range(3):
        src.random_(0, 255)
        out.fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mok.swizzle_mxfp8_scales(src, backend="torch"))


def test_capture_without_warm_up_is_refused() -> None:
    src = torch.randint(0, 256, (1, 384, 12), dtype=torch.uint8, device=CUDA)
    out = torch.empty(mok.layout_shape(384, 12), dtype=torch.uint8, device=CUDA)
    launcher._kernel(src.device)  # compiled, but this buffer pair was never seen
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(mok.LayoutError, match="never converted outside CUDA-graph capture"):
        with torch.cuda.graph(graph):
            mok.swizzle_mxfp8_scales(src, out=out, backend="cuda")


def test_refresh_allocates_nothing_and_never_syncs(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 256, 512, seed=e, param=True, device=CUDA) for e in range(8)]
    view = mok.split_weight_view(ps, rows=256, columns=512, use_mxfp8=True, backend="cuda")
    mok.split_weight_view(ps, rows=256, columns=512, use_mxfp8=True, cached=view, backend="cuda")  # warm
    for p in ps:
        p._rowwise_scale_inv.random_(0, 255)
    torch.cuda.synchronize()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        mok.split_weight_view(ps, rows=256, columns=512, use_mxfp8=True, cached=view, backend="cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations
    for e, p in enumerate(ps):
        logical = p._rowwise_scale_inv[:256, :16]
        assert torch.equal(view.row_scales[e], mok.swizzle_mxfp8_scales(logical, backend="torch"))


def test_split_view_cuda_matches_torch(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 160, 96, seed=e, param=True, device=CUDA) for e in range(5)]
    fast = mok.split_weight_view(ps, rows=160, columns=96, use_mxfp8=True, backend="cuda")
    slow = mok.split_weight_view(ps, rows=160, columns=96, use_mxfp8=True, backend="torch")
    assert fast.row_scale_ptrs.device.type == "cuda"
    for a, b in zip(fast.row_scales + fast.col_scales, slow.row_scales + slow.col_scales, strict=True):
        assert torch.equal(a, b)


def test_refresh_layer_is_one_launch(installed_te, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    fc1 = T.grouped_tensor("2.20.2", 4, 512, 256, mxfp8=True, device=CUDA)
    fc2 = [T.mxfp8_tensor("2.20.2", 256, 256, seed=e, param=True, device=CUDA) for e in range(4)]
    v1 = mok.grouped_weight_view(fc1, num_experts=4, rows=512, columns=256, use_mxfp8=True, backend="cuda")
    v2 = mok.split_weight_view(fc2, rows=256, columns=256, use_mxfp8=True, backend="cuda")
    launches = _count_launches(monkeypatch)
    fc1.scale_inv.random_(0, 255)
    fc1.columnwise_scale_inv.random_(0, 255)
    mok.refresh_layer([(fc1, v1), (fc2, v2)], backend="cuda")
    # one launch; fc2's four experts per usage merge into one pointer-table job each
    assert launches == [2 + 2]
    want = mok.grouped_weight_view(fc1, num_experts=4, rows=512, columns=256, use_mxfp8=True, backend="torch")
    assert torch.equal(v1.row_scales, want.row_scales) and torch.equal(v1.col_scales, want.col_scales)


def test_bad_input_is_refused_before_launch() -> None:
    cpu = torch.zeros(128, 4, dtype=torch.uint8)
    gpu = torch.zeros(128, 4, dtype=torch.uint8, device=CUDA)
    with pytest.raises(mok.LayoutError, match="scales\\[1\\] is on cuda:0; expected every matrix on cpu"):
        mok.swizzle_mxfp8_scales_many([cpu, gpu], backend="cuda")
    with pytest.raises(mok.LayoutError, match="device cuda:0 \\(found cpu\\)"):
        mok.swizzle_mxfp8_scales(gpu, out=torch.zeros(1, 1, 32, 16, dtype=torch.uint8), backend="cuda")
    with pytest.raises(mok.LayoutError, match="expected uint8"):
        mok.swizzle_mxfp8_scales(gpu.float(), backend="cuda")
