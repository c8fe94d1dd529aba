"""The MXFP8 quantisation kernel on a real GPU against the torch reference, byte for byte.

Sources hold every kind of value (tests/emulator/emulate_quantize.special_values: NaN of both
signs, +-inf, zeros of both signs, BF16 subnormals, tiny blocks, scale boundaries). Each launch
writes into buffers poisoned twice with different bytes (0xFF, which no output holds, then 0x00),
and both results must equal the reference over their whole buffers: a byte the kernel leaves
unwritten would keep the poison in one run or the other. The hardware ``cvt.rn.satfinite`` of
sm_89+ is judged here (the CPU emulator uses the software conversion). Where a real TE quantises
MXFP8 on this GPU (sm_100+; on sm_90 it writes nothing), its output is compared too. Skipped
without a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

import te_compat
from mok.kernels import quantize as Q
from mok.quantize_reference import ProductRule, ReciprocalRule
from tests.emulator import emulate_quantize as EQ

pytestmark = pytest.mark.gpu
CUDA = "cuda"
CASES = dict(EQ.cases(CUDA))
Source = torch.Tensor | Sequence[torch.Tensor]


@pytest.fixture(autouse=True)
def _needs_cuda_core() -> None:
    pytest.importorskip("cuda.core", reason="the cuda backend needs cuda.core (pip install te-compat[cuda])")


def _cpu(src: Source) -> Source:
    return src.cpu() if isinstance(src, torch.Tensor) else [x.cpu() for x in src]


def _reference(
    src: Source, swizzled: bool, rule: ReciprocalRule, product: ProductRule = ProductRule.MUL
) -> Q.QuantizeOutputs:
    cpu = _cpu(src)
    source = Q.check_source(cpu)
    (rows, cols), experts = source.experts[0].shape, len(source.experts)
    want = EQ.poisoned(experts, rows, cols, swizzled=swizzled)
    Q.run_reference(cpu, want, rule=rule, product=product, swizzled=swizzled)
    return want


def _check(
    src: Source, *, rule: ReciprocalRule, swizzled: bool, what: str, product: ProductRule = ProductRule.MUL
) -> None:
    source = Q.check_source(src)
    (rows, cols), experts = source.experts[0].shape, len(source.experts)
    want = _reference(src, swizzled, rule, product)
    out = EQ.poisoned(experts, rows, cols, swizzled=swizzled, device=CUDA)
    _check_launch(Q.QuantizeLaunch(src, out, rule=rule, product=product, swizzled=swizzled), want, what)


def _check_launch(launch: Q.QuantizeLaunch, want: Q.QuantizeOutputs, what: str) -> None:
    """``launch`` writes ``want`` into its buffers, poisoned with 0xFF and then 0x00."""
    for poison in (0xFF, 0x00):
        for t in launch.out:
            t.view(torch.uint8).fill_(poison)
        launch()
        torch.cuda.synchronize()
        EQ.compare(Q.QuantizeOutputs(*(t.cpu() for t in launch.out)), want, f"{what}, poison {poison:#04x}")


@pytest.mark.parametrize("swizzled", [True, False], ids=["layout", "logical"])
@pytest.mark.parametrize("product", list(ProductRule), ids=str)
@pytest.mark.parametrize("rule", list(ReciprocalRule), ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_the_reference(name: str, rule: ReciprocalRule, product: ProductRule, swizzled: bool) -> None:
    x = CASES[name](torch.Generator().manual_seed(len(name)))
    _check(x, rule=rule, product=product, swizzled=swizzled, what=name)


@pytest.mark.parametrize(("experts", "rows", "cols"), [(4, 2048, 7168), (3, 7168, 2080), (2, 224, 4128)])
def test_kernel_matches_the_reference_at_megatron_like_shapes(experts: int, rows: int, cols: int) -> None:
    x = EQ.special_values(torch.Generator().manual_seed(rows + cols), (experts, rows, cols)).to(CUDA)
    _check(x, rule=ReciprocalRule.EXACT, swizzled=True, what=f"grouped {experts}x{rows}x{cols}")
    _check(list(x.unbind(0)), rule=ReciprocalRule.EXACT, swizzled=True, what="the same, one tensor per expert")


def test_hardware_conversion_of_every_bf16_value() -> None:
    """All 65536 BF16 bit patterns, 2048 blocks of 32, under codes the data itself sets."""
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(1, 2048, 32)
    other = x.view(32, 2048).t().contiguous().view(1, 2048, 32)  # other neighbours, other codes
    for rule in ReciprocalRule:
        for product in ProductRule:
            what = f"every BF16 value, rule {rule.value}, product {product.value}"
            _check(x.to(CUDA), rule=rule, product=product, swizzled=False, what=what)
            _check(other.to(CUDA), rule=rule, product=product, swizzled=True, what=f"{what}, transposed")


def test_a_launch_allocates_nothing_and_replays_in_a_cuda_graph() -> None:
    g = torch.Generator().manual_seed(5)
    x = EQ.special_values(g, (3, 256, 544)).to(CUDA)
    out = Q.empty_outputs(3, 256, 544, CUDA)
    launch = Q.QuantizeLaunch(x, out)
    launch()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    launch()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    x.copy_(EQ.special_values(g, (3, 256, 544)).to(CUDA))  # new weights in the same buffer
    for t in out:
        t.view(torch.uint8).fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    EQ.compare(Q.QuantizeOutputs(*(t.cpu() for t in out)), _reference(x, True, ReciprocalRule.EXACT), "graph replay")


def test_a_launch_runs_on_the_current_stream() -> None:
    x = EQ.special_values(torch.Generator().manual_seed(9), (2, 128, 256)).to(CUDA)
    out = Q.empty_outputs(2, 128, 256, CUDA)
    launch = Q.QuantizeLaunch(x, out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for t in out:
            t.view(torch.uint8).fill_(0xFF)
        launch()
        copies = Q.QuantizeOutputs(*(t.to("cpu", non_blocking=False) for t in out))
    EQ.compare(copies, _reference(x, True, ReciprocalRule.EXACT), "side stream")


def test_the_same_launch_runs_another_compiled_kernel_on_any_grid() -> None:
    """with_kernel (bench_quantize --other): another version of the source, under grids other than
    the launch's, writes every byte the reference does, and the launch itself is left as it was."""
    x = EQ.special_values(torch.Generator().manual_seed(11), (3, 96, 544)).to(CUDA)
    launch = Q.QuantizeLaunch(x, Q.empty_outputs(3, 96, 544, CUDA))
    source = Path(Q.__file__).with_name(Q.SOURCE_NAME).read_text().replace(f" {Q.KERNEL_NAME}(", " other_quantize(")
    major, minor = torch.cuda.get_device_capability()
    other = Q.compile_quantize(f"sm_{major}{minor}", source=source).get_kernel("other_quantize")
    want = _reference(x, True, ReciprocalRule.EXACT)
    for grid in (None, 1, 7, 64):  # 9 units (27 tiles): one block, several units a block, idle blocks
        relaunch = launch.with_kernel(other, grid)
        assert (relaunch.kernel, relaunch.grid) == (other, launch.grid if grid is None else grid)
        _check_launch(relaunch, want, f"other kernel, grid {grid}")
    assert launch.kernel is not other
    for bad in (0, Q.MAX_GRID + 1):
        with pytest.raises(ValueError, match="grid: expected a whole number of blocks"):
            launch.with_kernel(other, bad)
    for wrong in (2.0, True):
        with pytest.raises(TypeError, match="grid: expected an int number of blocks"):
            launch.with_kernel(other, wrong)  # type: ignore[arg-type]


def _te_quantizer() -> object:
    try:
        import transformer_engine.pytorch  # noqa: F401
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    except Exception as exc:
        pytest.skip(f"TE is not importable here ({type(exc).__name__})")
    if torch.cuda.get_device_capability() < (10, 0):
        pytest.skip("TE's MXFP8 quantizers write nothing on GPUs of compute capability below 10.0 (before sm_100)")
    return MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=True)


@pytest.mark.parametrize(("rows", "cols"), [(256, 544), (256, 512), (128, 1024)])
def test_te_quantizer_agrees_with_the_reference_under_one_rule(rows: int, cols: int) -> None:
    """TE's own MXFP8Quantizer, into buffers filled with random bytes first, equals the reference
    under one reciprocal and product rule (the test prints which: run with -s), payloads and scales,
    the scales read as TE marks them (logical, or already in the layout). Shapes whose columns are
    a multiple of 256 may go to TE's specialized cast-only kernels, the others to the generic one."""

    quantizer = _te_quantizer()
    x = EQ.special_values(torch.Generator().manual_seed(21), (rows, cols)).to(CUDA)
    tensor = quantizer.make_empty((rows, cols), dtype=torch.bfloat16, device=CUDA)  # type: ignore[attr-defined]
    names = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")
    found = [te_compat.storage_attr(tensor, n) for n in names]
    buffers = [b for b in found if b is not None]
    assert len(buffers) == 4, f"TE's MXFP8 tensor lacks one of {names}"
    for b in buffers:
        b.view(torch.uint8).copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8))
    quantizer.update_quantized(x, tensor)  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    swizzled = bool(getattr(tensor, "_with_gemm_swizzled_scales", False))
    if swizzled:
        got_scales = (buffers[1].view(torch.uint8).view(-1).cpu(), buffers[3].view(torch.uint8).view(-1).cpu())
    else:
        got_scales = (
            te_compat.scale_matrix(buffers[1], rows, cols).cpu(),
            te_compat.scale_matrix(buffers[3], rows, cols, direction="columnwise").t().cpu(),
        )
    payloads = (buffers[0].view(torch.uint8).cpu(), buffers[2].view(torch.uint8).cpu())
    matches = []
    for rule, product in [(r, p) for r in ReciprocalRule for p in ProductRule]:
        want = Q.empty_outputs(1, rows, cols, "cpu", swizzled=swizzled)
        Q.run_reference(x.cpu(), want, rule=rule, product=product, swizzled=swizzled)
        want_scales = (
            (want.row_scales.view(-1), want.col_scales.view(-1))
            if swizzled
            else (
                want.row_scales[0],
                want.col_scales[0],
            )
        )
        same = torch.equal(payloads[0], want.row_data[0].view(torch.uint8))
        same = same and torch.equal(payloads[1], want.col_data[0].view(torch.uint8))
        if same and all(torch.equal(a, b) for a, b in zip(got_scales, want_scales, strict=True)):
            matches.append(f"{rule.value}/{product.value}")
    te = te_compat.te_version()
    assert matches, f"TE {te} ({rows}x{cols}) agrees with the reference under no reciprocal/product rule"
    print(f"TE {te} quantises {rows}x{cols} under the rule(s) {matches} (reciprocal/product), swizzled={swizzled}")
