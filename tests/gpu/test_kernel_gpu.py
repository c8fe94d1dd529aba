"""The CUDA kernel against the torch reference, byte for byte, on a real GPU, with each launch's
own shape and with each of the two shapes fixed for every launch (MOK_KERNEL_SHAPE).

Inputs are random bytes with 0xFF in TE's padding; outputs are poisoned with 0xAB before each
call and compared whole (zero padding included), so an unwritten or stray byte shows. Skipped
without a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mok
from mok.kernels.abi import FLAG_SLAB, MODE_COLS, MODE_ROWS
from mok.kernels.config import SHAPE_ENV, KernelConfig, LaunchShapes, launch_shapes
from mok.kernels.jobs import config_for, convert_job, copy_job
from mok.kernels.launch import Launch, _kernel
from mok.layout import swizzle_reference
from tests import te_objects as T
from tests.emulator import emulate
from tests.spec_oracle import spec_layout

pytestmark = pytest.mark.gpu
CUDA = "cuda"
POISON = 0xAB


@pytest.fixture(autouse=True)
def _needs_cuda_core() -> None:
    pytest.importorskip("cuda.core", reason="the cuda backend needs cuda.core (pip install te-compat[cuda])")


@pytest.fixture(params=["", "16,128", "32,256"], ids=["per-launch", "16x128", "32x256"])
def shape(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test that takes this fixture runs with each launch's own shape, then with each shape
    fixed for every launch (MOK_KERNEL_SHAPE, read afresh)."""
    monkeypatch.setenv(SHAPE_ENV, request.param)
    launch_shapes.cache_clear()
    yield request.param
    monkeypatch.undo()
    launch_shapes.cache_clear()


Work = list[tuple[torch.Tensor, torch.Tensor, bool]]  # (source, output, is an already-swizzled copy)


def _convert(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    batch = batch if batch.dim() == 3 else batch.unsqueeze(0)
    shape = mok.layout_shape(batch.shape[1], batch.shape[2], batch.shape[0])
    return batch, torch.full(shape, POISON, dtype=torch.uint8, device=batch.device), False


def _run_and_check(work: Work) -> None:
    """ONE launch of every item (mok.kernels' job API), then each output against the reference."""
    jobs = [copy_job(s, d) if copy else convert_job(s, d) for s, d, copy in work]
    Launch(jobs, work[0][0].device)()
    torch.cuda.synchronize()
    for i, (src, dst, copy) in enumerate(work):
        want = src.clone() if copy else swizzle_reference(src, torch.empty_like(dst))
        assert torch.equal(dst, want), f"work item {i}: {tuple(src.shape)} strides {src.stride()}"


def _count_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each kernel launch (its number of descriptor rows, after merging)."""
    launches: list[int] = []
    real = Launch.__call__

    def counting(self: Launch) -> None:
        launches.append(self.njobs)
        real(self)

    monkeypatch.setattr(Launch, "__call__", counting)
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
def test_rowwise_matches_reference(experts: int, m: int, k: int, shape: str) -> None:
    g = torch.Generator().manual_seed(m * 7 + k)
    buf = _padded_buffer(experts, m, k // 32, T.roundup(m, 128), T.roundup(k // 32, 4), g)
    out, ref = _both(buf[:, :m, : k // 32])
    assert torch.equal(out, ref)


@pytest.mark.parametrize(("experts", "m", "k"), ROWWISE_CASES)
def test_columnwise_transpose_read_directly(experts: int, m: int, k: int, shape: str) -> None:
    g = torch.Generator().manual_seed(m + k)
    buf = _padded_buffer(experts, m // 32, k, T.roundup(m // 32, 4), T.roundup(k, 128), g)
    logical = buf[:, : m // 32, :k].transpose(1, 2)  # [E, K, M/32], no copy
    job = convert_job(logical, torch.empty(mok.layout_shape(k, m // 32, experts), dtype=torch.uint8))
    assert job.mode == (MODE_COLS if m > 32 else MODE_ROWS)  # one column: either way
    out, ref = _both(logical)
    assert torch.equal(out, ref)


def test_small_against_the_spec(shape: str) -> None:
    s = torch.randint(0, 256, (200, 6), dtype=torch.uint8)
    out, _ = _both(s.to(CUDA))
    assert torch.equal(out.cpu(), spec_layout(s))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    experts=st.integers(1, 6),
    rows=st.integers(1, 700),
    cols=st.integers(1, 300),
    layout=st.sampled_from(["rows", "cols", "gather", "offset"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz(experts: int, rows: int, cols: int, layout: str, seed: int, shape: str) -> None:
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


def test_many_in_one_launch(monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
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


def test_copy_jobs_match(shape: str) -> None:
    src = torch.randint(0, 256, (3 * 16384 + 5,), dtype=torch.uint8, device=CUDA)
    dst = torch.zeros_like(src)
    Launch([copy_job(src, dst)], src.device)()
    assert torch.equal(dst, src)
    src2, dst2 = src[1:], torch.zeros(src.numel() - 1, dtype=torch.uint8, device=CUDA)  # misaligned
    Launch([copy_job(src2, dst2)], src.device)()
    assert torch.equal(dst2, src2)


@pytest.mark.parametrize("misaligned", [False, True])
def test_per_expert_copies_of_one_size(shape: str, misaligned: bool) -> None:
    # one pointer-table copy job: the emulator's case, on the GPU
    _run_and_check(emulate._expert_copies(misaligned, CUDA)(torch.Generator().manual_seed(11)))


def test_graph_capture_and_replay(shape: str) -> None:
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


def _randint(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(CUDA)


def _te_rowwise(experts: int, m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Logical rowwise scales [E, M, K/32] cut out of TE's padded buffer (0xFF padding)."""
    c = k // 32
    return _padded_buffer(experts, m, c, T.roundup(m, 128), T.roundup(c, 4), g)[:, :m, :c]


def _te_columnwise(experts: int, m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Logical columnwise scales [E, K, M/32]: TE's [M/32, K] buffer read as its transpose."""
    r = m // 32
    return _padded_buffer(experts, r, k, T.roundup(r, 4), T.roundup(k, 128), g)[:, :r, :k].transpose(1, 2)


@pytest.mark.parametrize(
    ("rows", "cols", "stride", "offset", "vec"),
    [
        (300, 224, 224, 0, 16),
        (300, 225, 228, 0, 4),  # the last piece holds 1 byte (TE's 2080x7200 rows)
        (130, 34, 36, 0, 4),  # ... 2 bytes
        (130, 71, 72, 0, 4),  # ... a word and 3 bytes
        (130, 38, 48, 0, 16),  # 16-byte rows, a partial last piece
        (130, 101, 112, 0, 16),  # 16-byte rows a slab a unit (over 16 tiles), a partial last word
        (300, 82, 84, 4, 4),  # slabs that start 4 bytes past a 16-byte boundary: a head and a tail
        (131, 82, 84, 12, 4),  # ... 12 and 8 bytes past, a last slab of 3 rows
        (1, 100, 100, 12, 4),  # one row a matrix, 12 and 0 bytes past
        (200, 13, 13, 0, 1),
        (260, 12, 12, 4, 4),
        (130, 64, 80, 1, 1),
    ],
)
def test_rowwise_load_widths(rows: int, cols: int, stride: int, offset: int, vec: int, shape: str) -> None:
    # MODE_ROWS with 16-, 4- and 1-byte rows (the job records the width the kernel may use)
    g = torch.Generator().manual_seed(rows + cols + offset)
    base = _randint((2 * rows * stride + offset + 64,), g)
    batch = base[offset : offset + 2 * rows * stride].view(2, rows, stride)[:, :, :cols]
    item = _convert(batch)
    job = convert_job(item[0], item[1])
    assert (job.mode, job.vec) == (MODE_ROWS, vec)
    slab = vec >= 4 and cols > 64  # the rows these cases give slab units (in the rowwise launch shape)
    assert bool(job.row(0, LaunchShapes().rowwise)[8] & FLAG_SLAB) == slab
    _run_and_check([item])


@pytest.mark.parametrize(("experts", "m", "k"), [(4, 2080, 7200), (3, 4096 + 32, 7168 + 32), (2, 160, 96)])
def test_padded_shapes_rowwise_and_columnwise(experts: int, m: int, k: int, shape: str) -> None:
    g = torch.Generator().manual_seed(m + k)
    _run_and_check([_convert(_te_rowwise(experts, m, k, g)), _convert(_te_columnwise(experts, m, k, g))])


@pytest.mark.parametrize(("experts", "m", "k"), [(300, 128, 256), (37, 2080, 7200), (256, 256, 2048), (2, 2048, 7168)])
def test_per_expert_pointer_tables(experts: int, m: int, k: int, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # separate same-shaped tensors (TE's one parameter per expert): one pointer-table job per usage
    g = torch.Generator().manual_seed(experts * 31 + m)
    rows = [_convert(_te_rowwise(1, m, k, g)) for _ in range(experts)]
    cols = [_convert(_te_columnwise(1, m, k, g)) for _ in range(experts)]
    launches = _count_launches(monkeypatch)
    _run_and_check(rows + cols)
    assert launches == [2]


def test_whole_layer_with_mixed_jobs_in_one_launch(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a MoE layer: grouped fc1 (rows + columns), per-expert fc2 (rows + columns), scales TE already
    # swizzled (copies, aligned and not), and odd matrices (gather, misaligned, 1-column)
    g = torch.Generator().manual_seed(11)
    experts = 8
    work = [_convert(_te_rowwise(experts, 1024, 7168, g)), _convert(_te_columnwise(experts, 1024, 7168, g))]
    work += [_convert(_te_rowwise(1, 7168, 2080, g)) for _ in range(experts)]
    work += [_convert(_te_columnwise(1, 7168, 2080, g)) for _ in range(experts)]
    swizzled = _randint((3 * 16384 + 512,), g)
    work.append((swizzled, torch.full_like(swizzled, POISON), True))
    work.append((swizzled[3:-5], torch.full((swizzled.numel() - 8,), POISON, dtype=torch.uint8, device=CUDA), True))
    work.append(_convert(_randint((2, 90, 60), g)[:, ::3, ::2]))  # gather
    work.append(_convert(_randint((3 * 200 * 13 + 1,), g)[1:].view(3, 200, 13)[:, :, :12]))  # misaligned rows
    work.append(_convert(_randint((1, 300, 1), g)))
    work.append(_convert(_randint((2, 130, 1040), g)[:, :, :1000]))  # rows too wide for a slab unit
    launches = _count_launches(monkeypatch)
    _run_and_check(work)
    assert len(launches) == 1


def test_graph_capture_and_replay_of_a_prepared_launch(shape: str) -> None:
    g = torch.Generator().manual_seed(5)
    work = [_convert(_te_rowwise(4, 2080, 7200, g)), _convert(_te_columnwise(4, 2080, 7200, g))]
    work += [_convert(_te_rowwise(1, 256, 2048, g)) for _ in range(20)]
    jobs = [convert_job(s, d) for s, d, _ in work]
    prepared = Launch(jobs, torch.device(CUDA))
    prepared()  # outside capture first, as users must
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepared()
    for _ in range(3):
        for src, dst, _ in work:
            src.random_(0, 256)
            dst.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        for src, dst, _ in work:
            assert torch.equal(dst, swizzle_reference(src, torch.empty_like(dst)))


def test_launches_take_the_environment_shape_or_the_one_given(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst, _ = _convert(torch.randint(0, 256, (1, 128, 4), dtype=torch.uint8, device=CUDA))
    jobs = [convert_job(src, dst)]
    want = KernelConfig.parse(shape) if shape else LaunchShapes().rowwise  # a rowwise job
    prepared = Launch(jobs, torch.device(CUDA))
    given = Launch(jobs, torch.device(CUDA), KernelConfig(16, 64))
    assert (prepared.config, given.config) == (want, KernelConfig(16, 64))
    given()
    torch.cuda.synchronize()
    assert torch.equal(dst, swizzle_reference(src, torch.empty_like(dst)))
    monkeypatch.setenv(SHAPE_ENV, "16,128" if want != KernelConfig(16, 128) else "32,256")
    launch_shapes.cache_clear()
    assert Launch(jobs, torch.device(CUDA)).config != want
    assert prepared.config == want  # a prepared launch keeps its configuration


def test_capture_without_warm_up_is_refused() -> None:
    src = torch.randint(0, 256, (1, 384, 12), dtype=torch.uint8, device=CUDA)
    out = torch.empty(mok.layout_shape(384, 12), dtype=torch.uint8, device=CUDA)
    _kernel(torch.cuda.current_device(), config_for([convert_job(src, out)], launch_shapes()))  # compiled, never seen
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(mok.LayoutError, match="never converted outside CUDA-graph capture"):
        with torch.cuda.graph(graph):
            mok.swizzle_mxfp8_scales(src, out=out, backend="cuda")


def test_refresh_allocates_nothing_and_never_syncs(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 256, 512, seed=e, param=True, device=CUDA) for e in range(8)]
    view = mok.split_weight_view(ps, rows=256, columns=512, format="mxfp8", backend="cuda")
    mok.split_weight_view(ps, rows=256, columns=512, format="mxfp8", cached=view, backend="cuda")  # warm
    for p in ps:
        p._rowwise_scale_inv.random_(0, 255)
    torch.cuda.synchronize()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        mok.split_weight_view(ps, rows=256, columns=512, format="mxfp8", cached=view, backend="cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations
    for e, p in enumerate(ps):
        logical = p._rowwise_scale_inv[:256, :16]
        assert torch.equal(view.rowwise.scales[e], mok.swizzle_mxfp8_scales(logical, backend="torch"))


def test_split_view_cuda_matches_torch(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 160, 96, seed=e, param=True, device=CUDA) for e in range(5)]
    fast = mok.split_weight_view(ps, rows=160, columns=96, format="mxfp8", backend="cuda")
    slow = mok.split_weight_view(ps, rows=160, columns=96, format="mxfp8", backend="torch")
    assert fast.rowwise.scale_ptrs.device.type == "cuda"
    mine = fast.rowwise.scales + fast.columnwise.scales
    for a, b in zip(mine, slow.rowwise.scales + slow.columnwise.scales, strict=True):
        assert torch.equal(a, b)


def test_refresh_layer_is_one_launch(installed_te, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    fc1 = T.grouped_tensor("2.20.2", 4, 512, 256, mxfp8=True, device=CUDA)
    fc2 = [T.mxfp8_tensor("2.20.2", 256, 256, seed=e, param=True, device=CUDA) for e in range(4)]
    v1 = mok.grouped_weight_view(fc1, num_experts=4, rows=512, columns=256, format="mxfp8", backend="cuda")
    v2 = mok.split_weight_view(fc2, rows=256, columns=256, format="mxfp8", backend="cuda")
    launches = _count_launches(monkeypatch)
    fc1.scale_inv.random_(0, 255)
    fc1.columnwise_scale_inv.random_(0, 255)
    mok.refresh_layer([(fc1, v1), (fc2, v2)], backend="cuda")
    # one launch; fc2's four experts per usage merge into one pointer-table job each
    assert launches == [2 + 2]
    want = mok.grouped_weight_view(fc1, num_experts=4, rows=512, columns=256, format="mxfp8", backend="torch")
    assert torch.equal(v1.rowwise.scales[0], want.rowwise.scales[0])
    assert torch.equal(v1.columnwise.scales[0], want.columnwise.scales[0])


def test_bad_input_is_refused_before_launch() -> None:
    cpu = torch.zeros(128, 4, dtype=torch.uint8)
    gpu = torch.zeros(128, 4, dtype=torch.uint8, device=CUDA)
    with pytest.raises(mok.LayoutError, match="scales\\[1\\] is on cuda:0; expected every matrix on cpu"):
        mok.swizzle_mxfp8_scales_many([cpu, gpu], backend="cuda")
    with pytest.raises(mok.LayoutError, match="device cuda:0 \\(found cpu\\)"):
        mok.swizzle_mxfp8_scales(gpu, out=torch.zeros(1, 1, 32, 16, dtype=torch.uint8), backend="cuda")
    with pytest.raises(mok.LayoutError, match="expected uint8"):
        mok.swizzle_mxfp8_scales(gpu.float(), backend="cuda")


# ---- The inverse (mxfp8_unswizzle_jobs): the layout back into logical scales, through run_work as
# mok's public functions call it. Outputs lie in buffers of their own filled with a marker (and 64
# bytes past them), compared whole, so an unwritten byte or a write outside the view shows.


def _run_inverse(pairs: emulate.Pairs, what: str) -> None:
    """ONE inverse launch of ``pairs`` (layout, output), each output's whole buffer against the
    reference's."""
    wants = emulate.inverse_reference(pairs)
    mok.plan.work.run_work(
        [mok.plan.work.ScaleWork(layout, out, inverse=True) for layout, out in pairs], backend="cuda"
    )
    torch.cuda.synchronize()
    emulate.compare_buffers(pairs, wants, what)


@pytest.mark.parametrize("case", range(len(emulate.INVERSE_CASES)), ids=[n for n, _ in emulate.INVERSE_CASES])
def test_inverse_matches_reference(case: int, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the emulator's inverse cases, on the GPU: rows and columns, padded, per-expert, gather
    name, make = emulate.inverse_cases(CUDA)[case]
    launches = _count_launches(monkeypatch)
    _run_inverse(make(torch.Generator().manual_seed(case)), name)
    assert len(launches) == 1


@pytest.mark.parametrize(("experts", "m", "k"), [(4, 2080, 7200), (2, 4096 + 32, 7168 + 32), (8, 2048, 7168)])
def test_inverse_of_te_shaped_scales(experts: int, m: int, k: int, shape: str) -> None:
    """Back into TE's padded buffers: rowwise [M, K/32] in [Mp, Kp/32], columnwise [K, M/32] as the
    transpose of [Mp/32, Kp] (the padding columns, other data between rows, stay untouched)."""
    g = torch.Generator().manual_seed(m + k)
    rows, cols = k // 32, m // 32
    row_stride, col_stride = T.roundup(rows, 4), T.roundup(k, 128)
    rowwise = (
        emulate._layout(g, experts, m, rows, CUDA),
        emulate.marked((experts, m, rows), (T.roundup(m, 128) * row_stride, row_stride, 1), 0, CUDA),
    )
    columnwise = (
        emulate._layout(g, experts, k, cols, CUDA),
        emulate.marked((experts, k, cols), (T.roundup(cols, 4) * col_stride, 1, col_stride), 0, CUDA),
    )
    _run_inverse([rowwise], f"rowwise {experts}x{m}x{k}")
    _run_inverse([columnwise], f"columnwise {experts}x{m}x{k}")


@pytest.mark.parametrize(("experts", "m", "k"), [(256, 256, 2048), (37, 2080, 7200)])
def test_inverse_per_expert_is_one_launch(
    experts: int, m: int, k: int, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a view's experts, each its own buffers: one pointer-table job per direction, one launch
    pairs = emulate.inverse_per_expert(experts, m, k // 32, False, CUDA)(torch.Generator().manual_seed(experts))
    launches = _count_launches(monkeypatch)
    _run_inverse(pairs, f"per-expert {experts}x{m}x{k}")
    assert launches == [2]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    experts=st.integers(1, 6),
    rows=st.integers(1, 700),
    cols=st.integers(1, 300),
    layout=st.sampled_from(["rows", "cols", "gather", "offset", "padded"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_round_trip(experts: int, rows: int, cols: int, layout: str, seed: int, shape: str) -> None:
    """Random logical bytes swizzled by the kernel and brought back by the inverse kernel into an
    output of another layout: the same bytes, nothing written outside them."""
    g = torch.Generator().manual_seed(seed)
    logical = torch.randint(0, 256, (experts, rows, cols), dtype=torch.uint8, generator=g).to(CUDA)
    swizzled = mok.swizzle_mxfp8_scales(logical, backend="cuda")
    strides = {
        "rows": (rows * cols, cols, 1),
        "cols": (rows * cols, 1, rows),
        "gather": (rows * cols * 6, cols * 6, 3),
        "offset": (rows * (cols + 1), cols + 1, 1),
        "padded": (rows * (cols + 5), cols + 5, 1),
    }[layout]
    out = emulate.marked((experts, rows, cols), strides, 1 if layout == "offset" else 0, CUDA)
    _run_inverse([(swizzled, out)], f"{layout} {experts}x{rows}x{cols}")
    assert torch.equal(out, logical)


def test_inverse_graph_capture_and_replay(shape: str) -> None:
    g = torch.Generator().manual_seed(7)
    pairs = emulate.inverse_rows(4, 2080, 225, 228, 0, CUDA)(g) + emulate.inverse_columns(4, 7200, 65, 7296, CUDA)(g)
    work = [mok.plan.work.ScaleWork(layout, out, inverse=True) for layout, out in pairs]
    prepared = mok.plan.work.PreparedWork(work, backend="cuda")
    prepared.run()  # outside capture first, as users must
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepared.run()
    for _ in range(2):
        for layout, _ in pairs:
            layout.random_(0, 256)
        wants = emulate.inverse_reference(pairs)
        graph.replay()
        torch.cuda.synchronize()
        emulate.compare_buffers(pairs, wants, "graph replay")


def test_a_launch_of_both_directions_is_refused() -> None:
    logical = torch.randint(0, 256, (1, 128, 4), dtype=torch.uint8, device=CUDA)
    layout = mok.swizzle_mxfp8_scales(logical, backend="cuda")
    back = torch.empty_like(logical)
    work = [
        mok.plan.work.ScaleWork(logical, torch.empty_like(layout)),
        mok.plan.work.ScaleWork(layout, back, inverse=True),
    ]
    with pytest.raises(mok.LayoutError, match="not both"):
        mok.plan.work.run_work(work, backend="cuda")
