"""mok's torch library ops on a CUDA device: torch.compile(fullgraph=True) equal to eager,
torch.library.opcheck, fake tensors that launch nothing, CUDA-graph capture, and the inverse."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
from mok.plan import work
from tests.spec_oracle import spec_layout

CUDA = "cuda"
SHAPES = [(1, 128, 4), (2, 300, 7), (8, 2048, 224), (3, 33, 1)]


def _scales(e: int, r: int, c: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (e, r, c), dtype=torch.uint8, generator=g).to(CUDA)


@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_conversions_equal_eager_and_spec(shape: tuple[int, int, int]) -> None:
    e, r, c = shape
    s = _scales(e, r, c)
    want = spec_layout(s.cpu())

    def round_trip(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layout = mok.swizzle_mxfp8_scales(scales, backend="cuda")
        return layout, mok.unswizzle_mxfp8_scales(layout, rows=r, columns=32 * c, experts=e, backend="cuda")

    torch._dynamo.reset()
    layout, back = torch.compile(round_trip, fullgraph=True)(s)
    eager_layout, eager_back = round_trip(s)
    assert torch.equal(layout.cpu(), want) and torch.equal(eager_layout.cpu(), want)
    assert torch.equal(back, s) and torch.equal(eager_back, s)


@pytest.mark.parametrize("shape", SHAPES)
def test_opcheck_on_cuda(shape: tuple[int, int, int]) -> None:
    e, r, c = shape
    s = _scales(e, r, c, seed=1)
    out = torch.empty(mok.layout_shape(r, c, e), dtype=torch.uint8, device=CUDA)
    layout = spec_layout(s.cpu()).to(CUDA)
    for op, args in (
        (torch.ops.mok.swizzle_mxfp8_scales.default, (s, out, "cuda")),
        (
            torch.ops.mok.unswizzle_mxfp8_scales.default,
            (layout, torch.empty(e, r, c, dtype=torch.uint8, device=CUDA), "cuda"),
        ),
        (
            torch.ops.mok.swizzle_mxfp8_scales_many.default,
            (
                [s[0], s[-1]],
                [torch.empty(mok.layout_shape(r, c), dtype=torch.uint8, device=CUDA) for _ in range(2)],
                "cuda",
            ),
        ),
    ):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_fake_tensors_launch_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work.PreparedWork, "run", lambda self: pytest.fail("ran a conversion"))
    with FakeTensorMode():
        s = torch.empty(8, 2048, 224, dtype=torch.uint8, device=CUDA)
        layout = mok.swizzle_mxfp8_scales(s, backend="cuda")
        assert layout.shape == mok.layout_shape(2048, 224, 8) and layout.device.type == "cuda"


def test_ops_in_a_cuda_graph() -> None:
    e, r, c = 8, 2048, 224
    s = _scales(e, r, c, seed=2)
    out = torch.empty(mok.layout_shape(r, c, e), dtype=torch.uint8, device=CUDA)
    back = torch.empty(e, c, r, dtype=torch.uint8, device=CUDA).transpose(1, 2)  # a strided output
    mok.swizzle_mxfp8_scales(s, out=out, backend="cuda")  # first calls upload the descriptor tables
    mok.unswizzle_mxfp8_scales(out, rows=r, columns=32 * c, experts=e, out=back, backend="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mok.swizzle_mxfp8_scales(s, out=out, backend="cuda")
        mok.unswizzle_mxfp8_scales(out, rows=r, columns=32 * c, experts=e, out=back, backend="cuda")
    s.copy_(_scales(e, r, c, seed=3))
    back.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), spec_layout(s.cpu())) and torch.equal(back, s)


def test_a_captured_conversion_outlives_the_table_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph holds its descriptor table's address only: the table must survive the cache's
    eviction of older tables, and the allocator's reuse of their memory."""
    from mok.kernels import launch

    monkeypatch.setattr(launch, "_TABLE_CACHE_SIZE", 4)
    s = _scales(2, 256, 8, seed=4)
    out = torch.empty(mok.layout_shape(256, 8, 2), dtype=torch.uint8, device=CUDA)
    mok.swizzle_mxfp8_scales(s, out=out, backend="cuda")  # uploads the table
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mok.swizzle_mxfp8_scales(s, out=out, backend="cuda")
    for i in range(3 * 4):  # more new tables than the cache holds: the old ones are evicted
        mok.swizzle_mxfp8_scales(_scales(1, 128 + i, 4, seed=i), backend="cuda")
    litter = [torch.full((n,), -1, dtype=torch.int64, device=CUDA) for n in range(8, 400, 8)]  # reuse freed memory
    s.copy_(_scales(2, 256, 8, seed=5))
    out.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), spec_layout(s.cpu())), (
        f"{len(litter)} allocations later, the replay read a stale table"
    )
