"""mok.export_mxfp8 on a CUDA device: the export kernel (one launch a call) writes exactly what the
CPU reference writes, byte for byte, for every layout, split and grouped, padded shapes; a
re-export into ``out=`` after the weights change keeps the addresses and equals a fresh export;
the prepared launch replays in a CUDA graph; TE's own GEMM-layout scales whose padding is not zero
export zeros past the logical scales."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import mok
from mok.export_ops import export_shapes
from te_compat.testing import fake_grouped, fake_mxfp8, installed_release

CUDA = "cuda"
EXPERTS = 3
# padded: N not a multiple of 128, K not of 128, K/32 (5, 9) and N/32 (3, 5) not of 4; then aligned
SHAPES = [(96, 160), (160, 288), (256, 512)]
MARK = 0xAB
LAYOUTS = mok.export.LAYOUTS


@pytest.fixture(autouse=True)
def _kernel_and_release() -> Iterator[None]:
    pytest.importorskip("cuda.core", reason="the export kernel needs cuda.core (pip install te-compat[cuda])")
    with installed_release("2.20.2"):
        yield


def _weights(kind: str, n: int, k: int, seed: int = 0) -> Any:
    if kind == "split":
        return [fake_mxfp8((n, k), param=True, seed=seed + e, device=CUDA) for e in range(EXPERTS)]
    return fake_grouped((EXPERTS, n, k), format="mxfp8", param=True, seed=seed + 7, device=CUDA)


def _export(weights: Any, layout: str, n: int, k: int, **kw: Any) -> mok.MXFP8Export:
    experts = None if isinstance(weights, list) else EXPERTS
    return mok.export_mxfp8(weights, rows=n, columns=k, layout=layout, num_experts=experts, **kw)


def _lists(result: mok.MXFP8Export) -> list[list[torch.Tensor]]:
    """The op's four input lists, from the export's view."""
    view = result.view
    assert view is not None
    directions = list(view.directions)[: 2 if result.columnwise_data is not None else 1]
    found: list[list[torch.Tensor]] = []
    for d in directions:
        assert d.scales is not None
        found += [list(d.data), list(d.scales)]
    return found + [[], []] * (2 - len(directions))


def _marked(t: torch.Tensor, device: str) -> torch.Tensor:
    """A tensor of ``t``'s shape, dtype and strides on ``device`` whose whole storage holds MARK."""
    size = t.untyped_storage().nbytes()
    storage = torch.full((size,), MARK, dtype=torch.uint8, device=device)
    return storage.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``'s whole storage, as uint8."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).to("cpu", copy=True)


def _cpu_reference(result: mok.MXFP8Export, marked: bool) -> list[torch.Tensor]:
    """The CPU reference (torch.ops.mok.mxfp8_export's CPU implementation) of the export's own
    inputs, copied to the CPU, into buffers like the export's (marked, or as export allocates)."""
    lists = [[t.cpu() for t in x] for x in _lists(result)]
    outs = [_marked(t, "cpu") if marked else _fresh_like(t) for t in result.tensors.values()]
    for t in outs:  # float8 payloads: the reference writes them as bytes
        assert t.device.type == "cpu"
    torch.ops.mok.mxfp8_export(*lists, outs, result.layout)
    return outs


def _fresh_like(t: torch.Tensor) -> torch.Tensor:
    storage = torch.zeros(t.untyped_storage().nbytes(), dtype=torch.uint8)
    return storage.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _equal_storages(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        gb, wb = _bytes(g), _bytes(w)
        assert gb.numel() == wb.numel(), (what, i)
        if not torch.equal(gb, wb):
            bad = (gb != wb).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{what}: buffer {i} differs at storage bytes {bad} ({int((gb != wb).sum())} bytes)")


def _export_launches(fn: Callable[[], object]) -> list[str]:
    """The names of the CUDA kernels ``fn`` launches that are mok's export kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if "mxfp8_export" in e.name]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_export_equals_the_cpu_reference(layout: str, kind: str, shape: tuple[int, int]) -> None:
    n, k = shape
    weights = _weights(kind, n, k)
    result = _export(weights, layout, n, k)
    assert result._prepared.use_kernel is True, "the export did not take mok's kernel"
    view = result.view
    assert view is not None
    for d in view.directions:
        assert d.scales is not None
        assert torch.unique(torch.cat([s.flatten() for s in d.scales])).numel() >= 64  # >= 64 distinct scales
    torch.cuda.synchronize()
    _equal_storages(list(result.tensors.values()), _cpu_reference(result, marked=False), f"{layout} {kind} {shape}")
    # into marked buffers through the op (the same kernel): every byte it must not write still MARK
    outs = [_marked(t, CUDA) for t in result.tensors.values()]
    torch.ops.mok.mxfp8_export(*_lists(result), outs, layout)
    torch.cuda.synchronize()
    _equal_storages(outs, _cpu_reference(result, marked=True), f"{layout} {kind} {shape} (op, marked)")


PAD = 0xFF  # E8M0's NaN: what TE may have left in the padding of a layout it swizzled itself


def _roundup(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def _layout_of(s: torch.Tensor, fill: int) -> torch.Tensor:
    """The 128x4 layout (flat bytes) of one logical [R, C], from the spec's byte offset, padding ``fill``."""
    r, c = s.shape
    rp, cp = _roundup(r, 128), _roundup(c, 4)
    rr, cc = torch.meshgrid(torch.arange(r), torch.arange(c), indexing="ij")
    offset = ((rr // 128) * (cp // 4) + cc // 4) * 512 + (rr % 32) * 16 + ((rr % 128) // 32) * 4 + cc % 4
    out = torch.full((rp * cp,), fill, dtype=torch.uint8)
    out[offset.flatten()] = s.cpu().flatten()
    return out


def _te_swizzled_with_padding(kind: str, n: int, k: int) -> Any:
    """TE-swizzled weights (2.12+'s flag) holding the payloads and logical scales of
    ``_weights(kind, n, k)``, their scales in the 128x4 layout with every padding byte PAD."""
    plain = _weights(kind, n, k)
    if kind == "split":
        weights = [fake_mxfp8((n, k), param=True, seed=e, device=CUDA, swizzled=True) for e in range(EXPERTS)]
        for p, q in zip(plain, weights, strict=True):
            rows = _layout_of(p._rowwise_scale_inv.view(torch.uint8)[:n, : k // 32], PAD)
            q._rowwise_scale_inv = rows.to(CUDA).view(q._rowwise_scale_inv.dtype).view(q._rowwise_scale_inv.shape)
            columns = _layout_of(p._columnwise_scale_inv.view(torch.uint8)[: n // 32, :k].t(), PAD)
            shape, dtype = q._columnwise_scale_inv.shape, q._columnwise_scale_inv.dtype
            q._columnwise_scale_inv = columns.to(CUDA).view(dtype).view(shape)
            assert torch.equal(p._rowwise_data.view(torch.uint8), q._rowwise_data.view(torch.uint8))
        return weights
    g = fake_grouped((EXPERTS, n, k), format="mxfp8", param=True, seed=7, device=CUDA, swizzled=True)
    rp, rc, cp, cc = _roundup(n, 128), _roundup(k // 32, 4), _roundup(n // 32, 4), _roundup(k, 128)
    rows = plain.scale_inv.view(torch.uint8).view(EXPERTS, rp, rc)[:, :n, : k // 32]
    columns = plain.columnwise_scale_inv.view(torch.uint8).view(EXPERTS, cp, cc)[:, : n // 32, :k]
    g.scale_inv.view(torch.uint8).copy_(torch.cat([_layout_of(x, PAD) for x in rows]).view(g.scale_inv.shape))
    layouts = torch.cat([_layout_of(x.t(), PAD) for x in columns])
    g.columnwise_scale_inv.view(torch.uint8).copy_(layouts.view(g.columnwise_scale_inv.shape))
    return g


@pytest.mark.parametrize("shape", [(96, 160), (160, 288)], ids=str)
@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_te_swizzled_padding_is_exported_as_zero(layout: str, kind: str, shape: tuple[int, int]) -> None:
    """TE's own GEMM-layout scales whose layout padding is 0xFF (rows past R, columns past C):
    the kernel exports them exactly as the same logical bytes in TE's plain buffers (which mok
    swizzles itself, padding 0), and as the CPU reference does: zeros past the logical matrix."""
    n, k = shape
    swizzled = _export(_te_swizzled_with_padding(kind, n, k), layout, n, k)
    assert swizzled._prepared.use_kernel is True, "the export did not take mok's kernel"
    assert swizzled.view is not None
    held = [t for d in swizzled.view.directions for t in d.scales or ()]
    assert any(bool((t == PAD).any()) for t in held)  # the view's layouts hold TE's padding
    plain = _export(_weights(kind, n, k), layout, n, k)
    torch.cuda.synchronize()
    what = f"{layout} {kind} {shape}"
    _equal_storages(list(swizzled.tensors.values()), list(plain.tensors.values()), f"{what}: 0xff padding vs plain")
    _equal_storages(list(swizzled.tensors.values()), _cpu_reference(swizzled, marked=False), f"{what} vs CPU")
    outs = [_marked(t, CUDA) for t in swizzled.tensors.values()]  # through the op, into marked buffers
    torch.ops.mok.mxfp8_export(*_lists(swizzled), outs, layout)
    torch.cuda.synchronize()
    _equal_storages(outs, _cpu_reference(swizzled, marked=True), f"{what} (op, marked)")


@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_launch_a_call(layout: str, kind: str) -> None:
    n, k = 160, 288
    weights = _weights(kind, n, k)
    first = _export(weights, layout, n, k)
    assert len(_export_launches(lambda: _export(weights, layout, n, k, out=first))) == 1


@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_re_export_keeps_addresses_and_equals_a_fresh_export(layout: str, kind: str) -> None:
    n, k = 96, 160
    weights = _weights(kind, n, k)
    first = _export(weights, layout, n, k)
    addresses = {name: t.data_ptr() for name, t in first.tensors.items()}
    before = [_bytes(t) for t in first.tensors.values()]
    g = torch.Generator(device=CUDA).manual_seed(5)
    te = weights if isinstance(weights, list) else [weights]
    for p in te:  # TE re-quantises in place: new payload and scale bytes in the same buffers
        for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
            t = getattr(p, name, None)
            if t is None:  # a grouped weight's names
                t = getattr(p, name.lstrip("_").replace("rowwise_scale_inv", "scale_inv"), None)
            if isinstance(t, torch.Tensor):
                bytes_ = t.view(torch.uint8)
                bytes_.copy_(torch.randint(0, 256, bytes_.shape, dtype=torch.uint8, device=CUDA, generator=g))
    if isinstance(weights, list):  # and reassigns expert 1's buffers (a re-quantisation that allocates)
        fresh = _weights("split", n, k, seed=50)
        for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
            setattr(weights[1], name, getattr(fresh[1], name))
    second = _export(weights, layout, n, k, out=first)
    assert second.layout == layout and {name: t.data_ptr() for name, t in second.tensors.items()} == addresses
    assert all(not torch.equal(b, _bytes(t)) for b, t in zip(before, second.tensors.values(), strict=True))
    again = _export(weights, layout, n, k)  # a fresh export into new buffers
    torch.cuda.synchronize()
    _equal_storages(list(second.tensors.values()), list(again.tensors.values()), f"{layout} {kind} re-export")
    _equal_storages(list(second.tensors.values()), _cpu_reference(second, marked=False), f"{layout} {kind} vs CPU")


def test_prepared_launch_replays_in_a_cuda_graph() -> None:
    n, k = 160, 288
    weights = _weights("split", n, k)
    result = _export(weights, "compact", n, k)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the launch reads torch's current stream: the capturing one
        result._prepared.launch()
    fresh = _weights("split", n, k, seed=30)
    for p, q in zip(weights, fresh, strict=True):  # TE writes new bytes in place
        for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
            getattr(p, name).copy_(getattr(q, name))
    view = mok.split_weight_view(weights, rows=n, columns=k, format="mxfp8", cached=result.view)  # type: ignore[arg-type]
    assert view is result.view
    graph.replay()
    torch.cuda.synchronize()
    _equal_storages(list(result.tensors.values()), _cpu_reference(result, marked=False), "graph replay")


def test_export_shapes_are_what_the_export_allocates() -> None:
    n, k = 96, 160
    result = _export(_weights("grouped", n, k), "deepgemm", n, k)
    shape, strides = export_shapes("deepgemm", EXPERTS, n, k)["scales"]
    assert tuple(result.scales.shape) == shape and result.scales.stride() == strides
