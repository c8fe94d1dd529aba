"""The export kernel (mok/kernels/mxfp8_export.cu) without a GPU: it compiles through NVRTC (the
path users take) and nvcc without spills, refuses to compile without its ABI, and its CPU
emulation (tests/emulator/emulate_export.py) writes exactly what the torch reference writes, byte
for byte over whole buffers, for every layout, split and grouped, padded shapes, both directions;
and the ``mok::mxfp8_export`` op's fake implementation checks its arguments and writes nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
from mok.errors import LayoutError
from mok.export_ops import export_shapes
from mok.kernels import export_launch as L
from mok.kernels.abi import export_macros
from mok.kernels.export_jobs import ExportConfig, describe, payload_job, scale_job
from mok.layout import layout_shape
from te_compat.testing import fake_grouped, fake_mxfp8
from tests.emulator import emulate_export as EE

Installer = Callable[..., None]
SOURCE = Path(L.__file__).with_name(L.SOURCE_NAME)
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
# padded: N not a multiple of 128, K not a multiple of 128, K/32 (5, 9) not a multiple of 4; N/32 (3, 5) neither;
# then aligned (N/32 and K/32 multiples of 4: compact rowwise scales stored as whole words)
SHAPES = [(96, 160), (160, 288), (128, 256)]
EXPERTS = 3


# ------------------------------------------------------------------------------------ compiles


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_export_kernel_compiles_with_nvrtc(arch: str) -> None:
    pytest.importorskip("cuda.core", reason="cuda.core is the 'cuda' extra (pip install te-compat[cuda])")
    cubin = bytes(L.compile_export(arch).code)
    assert len(cubin) > 1000 and b"\0" + L.KERNEL_NAME.encode() + b"\0" in cubin


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_export_kernel_compiles_with_nvcc_without_spills(tmp_path: Path, arch: str) -> None:
    config = ExportConfig()
    defines = [f"-D{k}={v}" for k, v in config.macros()]
    cmd = ["nvcc", f"-arch={arch}", "-c", "-Xptxas", "-v", *defines, str(SOURCE), "-o", str(tmp_path / "x.o")]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    assert f"Compiling entry function '{L.KERNEL_NAME}'" in report, report
    assert re.findall(r"(\d+) bytes spill stores", report) and not re.findall(r"[1-9]\d* bytes spill", report), report
    used = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert used and max(used) * 1024 <= 65536, report  # __launch_bounds__: 1024 threads an SM


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_export_kernel_refuses_to_compile_without_the_abi_macros() -> None:
    shape = [f"-D{k}={v}" for k, v in ExportConfig().macros()[:3]]
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-x", "c++", *shape, str(SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0 and "the ABI macros come from mok/kernels/abi.py" in done.stderr


def test_export_source_defines_no_abi_value_itself() -> None:
    defined = re.findall(r"^\s*#\s*define\s+(\w+)", SOURCE.read_text(), re.MULTILINE)
    assert not set(defined) & {name for name, _ in export_macros()}
    used = set(re.findall(r"\bEX_[A-Z_]+\b", SOURCE.read_text()))
    assert {name for name, _ in export_macros()} <= used


def test_export_config_is_checked() -> None:
    with pytest.raises(ValueError, match="unsupported export kernel shape: .* found threads=100"):
        ExportConfig(threads=100)
    with pytest.raises(ValueError, match="found threads=256, unit_pieces=1000"):
        ExportConfig(unit_pieces=1000)


# ------------------------------------------------------------------------------------ planning


def test_jobs_count_units_and_pick_access_widths() -> None:
    config = ExportConfig()
    job = payload_job(
        src=0x1000, src_es=2048 * 7168, src_rs=7168, indirect=False, rows=2048, cols=7168,
        dst=0x2000, dst_es=2048 * 7168, dst_rs=7168, out_rows=2048, out_cols=7168, experts=256,
    )  # fmt: skip
    assert job.units(config) == 256 * 448  # 2048 x 7168 bytes: 448 units of 32 KB an expert
    assert (job.flags >> 8) & 0xFF == 16 and (job.flags >> 16) & 0xFF == 16
    odd = job._replace(flags=0)._replace(**{})  # a copy: named tuples compare by value
    assert odd.units(config) == job.units(config)
    misaligned = payload_job(
        src=0x1004, src_es=96 * 160, src_rs=160, indirect=False, rows=96, cols=160,
        dst=0x2000, dst_es=96 * 160, dst_rs=160, out_rows=96, out_cols=160, experts=3,
    )  # fmt: skip
    assert (misaligned.flags >> 8) & 0xFF == 4
    scales = scale_job(kind="words", src=0x1000, src_es=2048 * 224, indirect=False, rows=2048, cols=224,
                       dst=0x3000, dst_es=4 * 2048 * 56, dst_rs=4, dst_cs=4 * 2048, experts=256)  # fmt: skip
    assert scales.units(config) == 256 * 14  # 16 x 56 tiles an expert, 64 a unit
    table = describe([job, scales], config)
    assert table.units == 256 * 448 + 256 * 14 and table.rows[1][-1] == 256 * 448


def test_jobs_refuse_what_the_kernel_cannot_do() -> None:
    base: dict[str, Any] = {"src": 0, "src_es": 0, "src_rs": 160, "indirect": True, "cols": 160, "dst": 0, "dst_es": 0}
    with pytest.raises(LayoutError, match="expected N a multiple of 32 to shuffle rows in blocks of 32; found N = 40"):
        payload_job(**base, rows=40, dst_rs=256, out_rows=128, out_cols=256, experts=2, shuffle=True)
    with pytest.raises(LayoutError, match=r"expected output \[32, 128\] .* to hold the source \[40, 160\]"):
        payload_job(**base, rows=40, dst_rs=128, out_rows=32, out_cols=128, experts=2)
    with pytest.raises(LayoutError, match="int32 words need 4-byte aligned outputs; found address 0x2"):
        scale_job(kind="words", src=0, src_es=0, indirect=True, rows=32, cols=4, dst=2, dst_es=0, dst_rs=4, experts=1)
    with pytest.raises(LayoutError, match="scale job kind: expected one of .*; found 'rows'"):
        scale_job(kind="rows", src=0, src_es=0, indirect=True, rows=32, cols=4, dst=0, dst_es=0, experts=1)


# ----------------------------------------------------------------------------------- emulation


def _export(kind: str, layout: str, n: int, k: int, seed: int = 0) -> mok.MXFP8Export:
    """A reference export (CPU) of fakes of TE 2.20.2's MXFP8 weights: its view and buffers."""
    if kind == "split":
        experts = [fake_mxfp8((n, k), param=True, seed=seed + e) for e in range(EXPERTS)]
        return mok.export_mxfp8(experts, rows=n, columns=k, layout=layout)
    grouped = fake_grouped((EXPERTS, n, k), format="mxfp8", param=True, seed=seed + 7)
    return mok.export_mxfp8(grouped, rows=n, columns=k, layout=layout, num_experts=EXPERTS)


def _distinct(inputs: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> None:
    """The inputs exercise the conversion: at least 64 distinct scale values each direction."""
    for _, scales in inputs:
        assert torch.unique(torch.cat([s.flatten() for s in scales])).numel() >= 64


@needs_gxx
@pytest.mark.parametrize("config", EE.CONFIGS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
def test_emulated_export_matches_the_reference(
    installed_te: Installer, layout: str, kind: str, shape: tuple[int, int], config: ExportConfig
) -> None:
    """The jobs export_mxfp8 launches (a split view's own pointer tables, a grouped view's
    tensors), one block a unit and 3 blocks taking every unit in turn."""
    installed_te("2.20.2")
    n, k = shape
    result = _export(kind, layout, n, k)
    assert result.view is not None
    columnwise = result.columnwise_data is not None
    assert columnwise == (layout == "compact")
    inputs = EE.lists_of(result.view, columnwise)
    _distinct(inputs)
    operands = EE.operands_of(result.view, columnwise)
    assert (operands[0].data_table is None) == (kind == "grouped")
    for grid in (0, 3):
        what = f"{kind} {n}x{k}"
        EE.check(layout, inputs, list(result.tensors.values()), operands=operands, config=config, grid=grid, what=what)


def _unaligned_inputs(
    n: int, k: int, offsets: list[int], seed: int
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per-expert payloads at the given byte offsets from 16-byte alignment (each expert its own)
    and layouts at those offsets rounded down to 4 bytes (the torch reference reads DeepGEMM's
    words as int32), random bytes: both directions."""
    g = torch.Generator().manual_seed(seed)
    found = []
    for r, c in ((n, k // 32), (k, n // 32)):
        data, scales = [], []
        for off in offsets:
            buf = torch.randint(0, 256, (n * k + 64,), dtype=torch.uint8, generator=g)
            data.append(buf[off : off + n * k].view(n, k))
            shape = layout_shape(r, c, 1)
            size = shape[0] * shape[1] * 512
            lay = torch.randint(0, 256, (size + 64,), dtype=torch.uint8, generator=g)
            scales.append(lay[off & ~3 : (off & ~3) + size].view(shape))
        found.append((data, scales))
    return found


def _outs(layout: str, e: int, n: int, k: int, directions: int) -> list[torch.Tensor]:
    outs = []
    for name, (shape, strides) in list(export_shapes(layout, e, n, k).items())[: 2 * directions]:
        dtype = torch.uint8 if name.endswith("data") or layout != "deepgemm" else torch.int32
        t = torch.empty(shape, dtype=dtype)
        if strides is not None:
            t = torch.empty(shape[0] * strides[0], dtype=dtype).as_strided(shape, strides)
        outs.append(t)
    return outs


@needs_gxx
@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
def test_emulated_export_of_unaligned_per_expert_tensors(layout: str) -> None:
    """Per-expert sources 1, 4, 8 and 0 bytes past 16-byte alignment: the kernel narrows its loads
    per expert (the host's access width is from strides alone), which the emulator checks."""
    n, k = 96, 160
    inputs = _unaligned_inputs(n, k, [1, 4, 8, 0], seed=len(layout))
    directions = 2 if layout == "compact" else 1
    inputs = inputs[:directions]
    _distinct(inputs)
    for config in EE.CONFIGS:
        EE.check(layout, inputs, _outs(layout, 4, n, k, directions), config=config, what="unaligned")


PAD = 0xFF  # E8M0's NaN: what TE may have left in the padding of a layout it swizzled itself


def _layout_of(s: torch.Tensor, fill: int) -> torch.Tensor:
    """The 128x4 layout [Rp/128, Cp/4, 32, 16] of one logical [R, C], from the spec's byte offset
    ``((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``, padding ``fill``."""
    r, c = s.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    rr, cc = torch.meshgrid(torch.arange(r), torch.arange(c), indexing="ij")
    offset = ((rr // 128) * (cp // 4) + cc // 4) * 512 + (rr % 32) * 16 + ((rr % 128) // 32) * 4 + cc % 4
    out = torch.full((rp * cp,), fill, dtype=torch.uint8)
    out[offset.flatten()] = s.flatten()
    return out.view(layout_shape(r, c))


def _inputs_with_padding(
    kind: str, n: int, k: int, directions: int, fill: int, seed: int = 5
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Random payloads and logical scales of EXPERTS weights [n, k] (the same for any ``fill``),
    their layouts' padding bytes ``fill``: a split weight's lists of one tensor an expert, or a
    grouped weight's one [E, N, K] payload and one layout; ``directions`` 1 (rowwise) or 2."""
    g = torch.Generator().manual_seed(seed)
    found = []
    for r, c in [(n, k // 32), (k, n // 32)][:directions]:
        data = torch.randint(0, 256, (EXPERTS, n, k), dtype=torch.uint8, generator=g)
        logical = torch.randint(0, 255, (EXPERTS, r, c), dtype=torch.uint8, generator=g)  # no 0xFF: PAD shows
        layouts = [_layout_of(s, fill) for s in logical]
        if kind == "grouped":
            found.append(([data], [torch.cat(layouts)]))
        else:
            found.append((list(data.clone().unbind(0)), layouts))
    return found


@needs_gxx
@pytest.mark.parametrize("shape", [(96, 160), (160, 288)], ids=str)
@pytest.mark.parametrize("kind", ["split", "grouped"])
@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
def test_emulated_export_writes_zeros_for_the_layouts_padding(layout: str, kind: str, shape: tuple[int, int]) -> None:
    """Layouts whose padding is 0xFF (TE's own GEMM-layout scales hold whatever TE left there)
    export exactly as the same logical scales with zero padding (the owners' references: zeros
    past R and C), by the kernel and by the reference alike, whole buffers compared."""
    n, k = shape
    directions = 2 if layout == "compact" else 1
    padded = _inputs_with_padding(kind, n, k, directions, PAD)
    zero = _inputs_with_padding(kind, n, k, directions, 0)
    assert all(int((s == PAD).sum()) > 0 for _, scales in padded for s in scales)
    outs = _outs(layout, EXPERTS, n, k, directions)
    for config in EE.CONFIGS:
        what = f"{kind} {n}x{k}"
        got = EE.check(layout, padded, outs, config=config, what=f"{what}, padding 0xff")
        want = EE.check(layout, zero, outs, config=config, what=f"{what}, padding 0")
        EE.compare(got, want, f"{what} ({layout}, {config}): padding 0xff against padding 0")


# Faults planted in a copy of the kernel, each with the layout whose check must show it.
PLANTS = [
    ("((lane & 3) * 8 + (lane >> 2))", "((lane & 7) * 4 + (lane >> 3))", "flashinfer"),  # the lane permutation
    ("(n & ~31u) | (n & 7u) << 2 | (n >> 3 & 3u)", "(n & ~31u) | (n & 3u) << 3 | (n >> 2 & 7u)", "flashinfer"),
    ("      if (r >= R) continue;\n", "", "deepgemm"),  # DeepGEMM's gap rows written
    ("if (4 * g + x < C) store_global", "store_global", "compact"),  # scales past C
    ("if (n >= (unsigned)J.rows || c >= K) continue;", "if (c >= K) continue;", "flashinfer"),  # padding rows read
    # compact rowwise scales as whole words (K/32 a multiple of 4 only): their byte order
    ("        store_global(out, w);\n", "        store_global(out, w >> 8 | w << 24);\n", "compact", (128, 256)),
]


@needs_gxx
@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_fault_is_caught(tmp_path: Path, installed_te: Installer, plant: tuple[Any, ...]) -> None:
    installed_te("2.20.2")
    line, change, layout, (n, k) = (*plant, (96, 160)) if len(plant) == 3 else plant
    planted = SOURCE.read_text().replace(line, change)
    assert planted != SOURCE.read_text(), line
    (tmp_path / L.SOURCE_NAME).write_text(planted)
    result = _export("split", layout, n, k)
    assert result.view is not None
    columnwise = result.columnwise_data is not None
    inputs = EE.lists_of(result.view, columnwise)
    with pytest.raises(AssertionError, match="differs at|violations"):
        EE.check(layout, inputs, list(result.tensors.values()), kernel_dir=tmp_path, what="planted")


# Faults in the masking of the layout's padding, each with the layout whose check must show it
# on inputs of 96 x 160 whose padding is 0xFF (rowwise [96, 5]: a partial slab and a partial column).
PADDING_PLANTS = [
    ("w & cmask);", "w);", "deepgemm"),  # a row's last word copied whole
    ("if (128 * b + 128 > R || cmask != ~0u) {", "if (false) {", "flashinfer"),  # edge tiles copied whole
    ("w.w = r + 96 < R ? w.w & cmask : 0u;", "w.w = w.w & cmask;", "flashinfer"),  # rows past R copied
    ("w.y = r + 32 < R ? w.y & cmask : 0u;", "w.y = r + 32 < R ? w.y : 0u;", "flashinfer"),  # columns past C
]


@needs_gxx
@pytest.mark.parametrize("plant", PADDING_PLANTS)
def test_a_planted_padding_fault_is_caught(tmp_path: Path, plant: tuple[str, str, str]) -> None:
    line, change, layout = plant
    planted = SOURCE.read_text().replace(line, change)
    assert planted != SOURCE.read_text(), line
    (tmp_path / L.SOURCE_NAME).write_text(planted)
    inputs = _inputs_with_padding("split", 96, 160, 1, PAD)
    with pytest.raises(AssertionError, match="differs at"):
        EE.check(layout, inputs, _outs(layout, EXPERTS, 96, 160, 1), kernel_dir=tmp_path, what="planted")


# ---------------------------------------------------------------------------------------- the op


def _op_args(layout: str, e: int = 2, n: int = 96, k: int = 160, device: str = "cpu") -> list[Any]:
    inputs = _unaligned_inputs(n, k, [0] * e, seed=1)
    directions = 2 if layout == "compact" else 1
    lists: list[Any] = [x for d, s in inputs[:directions] for x in (d, s)]
    if directions == 1:
        lists += [[], []]
    outs = _outs(layout, e, n, k, directions)
    if device != "cpu":  # the same shapes, strides and dtypes on ``device`` (fake tensors: no memory)

        def on(t: torch.Tensor) -> torch.Tensor:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

        lists = [[on(t) for t in x] for x in lists]
        outs = [on(t) for t in outs]
    return [*lists, outs, layout]


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
def test_export_op_on_the_cpu_equals_the_reference_and_passes_opcheck(layout: str) -> None:
    args = _op_args(layout)
    torch.ops.mok.mxfp8_export(*args)
    want = [EE.marked_like(t) for t in args[4]]
    from mok.export_ops import _export_args, export_reference

    export_reference(_export_args(args[0], args[1], args[2], args[3], want, layout))
    for got, w in zip(args[4], want, strict=True):
        assert torch.equal(
            got.view(torch.uint8) if got.element_size() == 1 else got,
            w if w.element_size() != 1 else w.view(torch.uint8),
        )
    result = torch.library.opcheck(torch.ops.mok.mxfp8_export.default, tuple(_op_args(layout)))
    assert set(result.values()) == {"SUCCESS"}, result


def test_export_op_fake_checks_arguments_and_writes_nothing() -> None:
    with FakeTensorMode():
        args = _op_args("deepgemm", device="cuda")
        torch.ops.mok.mxfp8_export(*args)  # checks pass, nothing launched
        bad = list(args)
        bad[4] = [args[4][0], torch.empty(args[4][1].shape, dtype=torch.int32, device="cuda")]
        with pytest.raises(
            LayoutError, match=r"out \(scales\): expected torch.int32 \(2, 96, 2\) \(strides \(192, 1, 96\)\)"
        ):
            torch.ops.mok.mxfp8_export(*bad)
        bad = list(args)
        bad[1] = [args[1][0]]
        with pytest.raises(LayoutError, match="scales: expected 2 layout buffers, as many as the payloads; found 1"):
            torch.ops.mok.mxfp8_export(*bad)
        compact = _op_args("compact", device="cuda")
        compact[3] = compact[3][:1]
        with pytest.raises(LayoutError, match="columnwise_scales: expected 2 layout buffers"):
            torch.ops.mok.mxfp8_export(*compact)
        flash = _op_args("flashinfer", device="cuda")
        flash[2], flash[3] = _op_args("compact", device="cuda")[2:4]
        with pytest.raises(LayoutError, match="layout 'flashinfer' holds the forward \\(rowwise\\) operand only"):
            torch.ops.mok.mxfp8_export(*flash)
    args = _op_args("compact")
    before = [t.clone() for t in args[4]]
    meta = [[t.to("meta") for t in x] for x in args[:4]]
    torch.ops.mok.mxfp8_export(*meta, [t.to("meta") for t in args[4]], "compact")
    assert all(torch.equal(a, b) for a, b in zip(args[4], before, strict=True))
    with pytest.raises(ValueError, match="layout: expected one of 'compact', 'deepgemm', 'flashinfer'; found 'x'"):
        torch.ops.mok.mxfp8_export(*args[:5], "x")


def test_export_op_refuses_inputs_on_another_device_or_of_another_dtype() -> None:
    """The CUDA implementation launches on addresses: scales, or a columnwise direction, on
    another device than the payloads would be read there as device memory. And the reference
    copies payloads with copy_, which converts values between dtypes: a columnwise payload of
    another dtype than the rowwise one (whose dtype the outputs have) would be converted."""
    with FakeTensorMode():  # the checks the CUDA implementation runs
        args = _op_args("deepgemm", device="cuda")
        args[1] = [torch.empty_like(t, device="cpu") for t in args[1]]
        with pytest.raises(LayoutError, match=r"scales\[0\]: expected .* on cuda"):
            torch.ops.mok.mxfp8_export(*args)
        args = _op_args("compact", device="cuda")
        args[2] = [torch.empty_like(t, device="cpu") for t in args[2]]
        with pytest.raises(LayoutError, match=r"columnwise_data: expected payloads like data .* on cuda"):
            torch.ops.mok.mxfp8_export(*args)
        args = _op_args("compact", device="cuda")
        args[3] = [torch.empty_like(t, device="cpu") for t in args[3]]
        with pytest.raises(LayoutError, match=r"columnwise_scales\[0\]: expected .* on cuda"):
            torch.ops.mok.mxfp8_export(*args)
    args = _op_args("compact")
    args[2] = [t.view(torch.float8_e4m3fn) for t in args[2]]  # rowwise uint8, columnwise float8
    with pytest.raises(LayoutError, match=r"columnwise_data: expected payloads like data \(torch.uint8"):
        torch.ops.mok.mxfp8_export(*args)


def test_a_launch_captured_in_a_cuda_graph_is_never_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.ops.mok.mxfp8_export's prepared launches are kept in an LRU cache; a CUDA graph that
    captured one reads its descriptor table at every replay, so the launch (and the table) must
    outlive any number of later exports into other buffers, not be evicted and freed."""
    import weakref

    made = [0]

    class Launch:  # ExportLaunch without a device: counts the launches prepared
        def __init__(self, jobs: Any, device: torch.device, **kw: Any) -> None:
            made[0] += 1

    monkeypatch.setattr(L, "ExportLaunch", Launch)
    monkeypatch.setattr(L, "_launches", type(L._launches)())
    monkeypatch.setattr(L, "_captured", {})
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    inputs = [([torch.zeros(2, 32, 32, dtype=torch.uint8)], [torch.zeros(layout_shape(32, 1, 2), dtype=torch.uint8)])]

    def export(outs: list[torch.Tensor]) -> Any:
        return L.cached_launch("compact", inputs, outs, experts=2, rows=32, cols=32)

    captured_outs = _outs("compact", 2, 32, 32, 1)
    first = export(captured_outs)  # prepared before capture
    capturing[0] = True
    assert export(captured_outs) is first  # the launch a graph captures
    capturing[0] = False
    alive = weakref.ref(first)
    del first
    others = [_outs("compact", 2, 32, 32, 1) for _ in range(L._CACHE_SIZE + 8)]
    for outs in others:  # later exports into other buffers
        export(outs)
    assert made[0] == 1 + len(others)
    assert alive() is not None, "the captured launch was evicted: a graph replay would read a freed table"
    assert export(captured_outs) is alive()
