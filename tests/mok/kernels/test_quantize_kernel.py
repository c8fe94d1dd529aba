"""The MXFP8 quantisation kernel without a GPU: it compiles through NVRTC (cuda.core, the path users
take) and through nvcc without spills, its CPU emulation equals the torch reference byte for byte
(tests/emulator/emulate_quantize.py), and its Python side checks what it is given."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mok.backend import Backend
from mok.errors import LayoutError
from mok.kernels import quantize as Q
from mok.layout import layout_shape
from mok.plan.work import QuantizeWork
from mok.quantize_reference import ProductRule, ReciprocalRule
from tests.emulator import emulate_quantize as EQ

SOURCE = Path(Q.__file__).with_name(Q.SOURCE_NAME)
CASES = dict(EQ.cases())
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_kernel_compiles_with_nvrtc(arch: str) -> None:
    pytest.importorskip("cuda.core", reason="cuda.core is the 'cuda' extra (pip install te-compat[cuda])")
    cubin = bytes(Q.compile_quantize(arch).code)
    assert len(cubin) > 1000 and b"\0" + Q.KERNEL_NAME.encode() + b"\0" in cubin


def test_another_source_compiles_with_the_same_options(tmp_path: Path) -> None:
    """A benchmark compiles another version of the kernel (its text) as mok compiles its own."""
    pytest.importorskip("cuda.core", reason="cuda.core is the 'cuda' extra (pip install te-compat[cuda])")
    own = bytes(Q.compile_quantize("sm_90").code)
    assert bytes(Q.compile_quantize("sm_90", source=SOURCE.read_text()).code) == own
    renamed = SOURCE.read_text().replace(f" {Q.KERNEL_NAME}(", " other_quantize(")
    cubin = bytes(Q.compile_quantize("sm_90", source=renamed).code)
    assert b"\0other_quantize\0" in cubin and b"\0" + Q.KERNEL_NAME.encode() + b"\0" not in cubin
    (tmp_path / "other.cu").write_text(renamed)
    with pytest.raises(TypeError, match=r"^source: expected the kernel's text .*; found .*PosixPath"):
        Q.compile_quantize("sm_90", source=tmp_path / "other.cu")  # type: ignore[arg-type]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_kernel_compiles_with_nvcc_without_spills(tmp_path: Path, arch: str) -> None:
    config = Q.QuantizeConfig()
    defines = [f"-D{k}={v}" for k, v in config.macros()]
    cmd = ["nvcc", f"-arch={arch}", "-c", "-Xptxas", "-v", *defines, str(SOURCE), "-o", str(tmp_path / "q.o")]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    assert f"Compiling entry function '{Q.KERNEL_NAME}'" in report, report
    assert re.findall(r"(\d+) bytes spill stores", report) and not re.findall(r"[1-9]\d* bytes spill", report), report
    assert not re.findall(r"[1-9]\d* bytes stack frame", report), report
    used = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert used and max(used) * config.threads * config.min_blocks <= 65536, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernel_refuses_to_compile_without_the_abi_macros(tmp_path: Path) -> None:
    done = subprocess.run(["nvcc", "-c", str(SOURCE), "-o", str(tmp_path / "q.o")], capture_output=True, text=True)
    assert done.returncode != 0 and "QuantizeConfig.macros" in done.stderr


@pytest.mark.parametrize(("experts", "rows", "cols"), [(1, 32, 32), (3, 288, 160), (2, 352, 512), (8, 7168, 2048)])
def test_units_count_each_expert_s_128_row_groups_of_tile_columns(experts: int, rows: int, cols: int) -> None:
    """A launch's grid is at most its units: every (expert, 128-row group, tile column) once."""
    config = Q.QuantizeConfig()
    groups = {
        (e, r // 128, c // config.tile_cols)
        for e in range(experts)
        for r in range(0, rows, 32)
        for c in range(0, cols, 32)
    }
    assert config.units(experts, rows, cols) == len(groups)


def test_the_abi_macros_are_the_flags_and_the_shape() -> None:
    macros = dict(Q.QuantizeConfig().macros())
    assert macros == {
        "QTHREADS": "256",
        "QMIN_BLOCKS": "5",
        "QTILE_ROWS": "32",
        "QTILE_COLS": "256",
        "QF_ROWWISE": "1",
        "QF_COLWISE": "2",
        "QF_POINTERS": "4",
        "QF_RCP_SHIFT": "8",
        "QF_LOGICAL": "16",
        "QF_FMA_ZERO": "32",
    }
    source = SOURCE.read_text()
    assert not re.findall(r"#define\s+(QTHREADS|QMIN_BLOCKS|QTILE_\w+|QF_\w+)\b", source)
    with pytest.raises(ValueError, match="32 x 256 tiles and 1 to 8 blocks an SM; found 128 threads"):
        Q.QuantizeConfig(threads=128)
    with pytest.raises(ValueError, match="1 to 8 blocks an SM; found .* and 9 blocks an SM"):
        Q.QuantizeConfig(min_blocks=9)


RULES = [(rule, product) for rule in ReciprocalRule for product in ProductRule]


@needs_gxx
@pytest.mark.parametrize(("rule", "product"), RULES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernel_matches_the_reference(name: str, rule: ReciprocalRule, product: ProductRule) -> None:
    EQ.check(CASES[name](torch.Generator().manual_seed(len(name))), rule=rule, product=product, what=name)


@needs_gxx
@pytest.mark.parametrize("grid", [1, 5])
@pytest.mark.parametrize("swizzled", [True, False], ids=["layout", "logical"])
def test_emulated_kernel_with_fewer_blocks_and_logical_scales(grid: int, swizzled: bool) -> None:
    for name in ("grouped E=2 96x544 (rows and columns pad, partial tile)", "per-expert E=5 64x160, rows 192 apart"):
        EQ.check(CASES[name](torch.Generator().manual_seed(3)), swizzled=swizzled, grid=grid, what=name)


UNIT_CASES = [name for name in CASES if "128-row unit" in name]


@needs_gxx
@pytest.mark.parametrize("grid", [0, 1, 3])
@pytest.mark.parametrize("swizzled", [True, False], ids=["layout", "logical"])
@pytest.mark.parametrize("name", UNIT_CASES)
def test_emulated_kernel_with_partial_128_row_units(name: str, swizzled: bool, grid: int) -> None:
    """Rows not a multiple of 128 (a last unit of 1, 2 or 3 tiles, its missing rows the layout's
    padding), several experts, one block for everything (grid 1) or a few taking units in turn."""
    assert len(UNIT_CASES) == 3
    EQ.check(CASES[name](torch.Generator().manual_seed(5)), swizzled=swizzled, grid=grid, what=name)


# Lines of the kernel that write the layout's padding, each with a change that skips it, the output
# that then differs from the reference, and the case and grid that show it (1: a block converts
# every unit, so a word not cleared after a full unit leaves its codes in a partial unit's padding).
def _plant(folder: Path, line: str, change: str) -> None:
    """The kernel's source with ``line`` changed, in ``folder`` beside the header it includes."""
    planted = SOURCE.read_text().replace(line, change)
    assert planted != SOURCE.read_text()
    (folder / Q.SOURCE_NAME).write_text(planted)
    shutil.copy(SOURCE.with_name("async_copy.cuh"), folder)


PADDED = "grouped E=2 96x544 (rows and columns pad, partial tile)"
PLANTS = [
    ("j >= ((T.width + 127) & ~127)", "j >= T.width", "col_scales", PADDED, 0),  # columns past the matrix
    ("(g & ~3) * 32 >= T.width", "g * 32 >= T.width", "row_scales", PADDED, 0),  # row blocks past it
    ("word = 0;  // the next unit's tiles past", "//", "row_scales", UNIT_CASES[0], 1),  # rows past it
    ("word = 0;  // the next unit's row blocks past", "//", "col_scales", UNIT_CASES[0], 1),  # the same, columnwise
]


@needs_gxx
@pytest.mark.parametrize(("line", "change", "output", "name", "grid"), PLANTS)
def test_emulator_catches_an_unwritten_padding_byte(
    tmp_path: Path, line: str, change: str, output: str, name: str, grid: int
) -> None:
    """The comparison can fail: a kernel that skips part of the layout's padding is caught."""
    _plant(tmp_path, line, change)
    x = CASES[name](torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match=f"{output} differs"):
        EQ.check(x, grid=grid, kernel_dir=tmp_path)


@needs_gxx
def test_emulator_fails_a_divergent_shuffle_instead_of_hanging(tmp_path: Path) -> None:
    """A full-mask shuffle that only some lanes reach (a hang or undefined on the device) makes
    the emulated launch fail within its wait limit."""
    shuffle = "  gathered |= __shfl_xor_sync(0xFFFFFFFFu, gathered, 2);"
    _plant(tmp_path, shuffle, "  if (g * 32 < T.width)" + shuffle[1:])
    ctypes.c_int.in_dll(EQ.build(EQ.CONFIG, tmp_path), "emu_wait_ms").value = 200
    x = CASES[PADDED](torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match="violations of the emulated hardware's rules"):
        EQ.check(x, grid=1, kernel_dir=tmp_path)


def test_reference_run_fills_every_byte_and_matches_megatron_s_shapes() -> None:
    x = torch.randn(3, 96, 160).bfloat16()
    out = EQ.poisoned(3, 96, 160, swizzled=True)
    Q.prepare(x, out)()
    # Megatron's shapes: (E*rows/128, columns/128, 32, 16) and (E*columns/128, rows/128, 32, 16), padded
    assert [tuple(t.shape) for t in out] == [(3, 96, 160), (3, 2, 32, 16), (3, 96, 160), (6, 1, 32, 16)]
    assert tuple(out.row_scales.shape) == layout_shape(96, 5, 3)
    for t in out:
        assert not (t.view(torch.uint8) == EQ.POISON).any()
    per_expert = out.row_scales.view(3, -1)
    assert (per_expert[:, 511] == 0).all() and (per_expert[:, 513] == 0).all()  # S[127, 3], S[0, 5]: padding
    assert (per_expert[:, 0] != 0).all()  # S[0, 0]


BAD_SOURCES = [
    (torch.zeros(2, 64, 64), "non-empty BF16 tensor"),
    (torch.zeros(2, 64, 48, dtype=torch.bfloat16), "divisible by 32"),
    (torch.zeros(64, 64, 2, dtype=torch.bfloat16)[:, :, 0].unsqueeze(0), "rows of contiguous columns"),
    (torch.zeros(64 * 64 + 1, dtype=torch.bfloat16)[1:].view(1, 64, 64), "16-byte aligned start"),
    ([], "non-empty sequence"),
    ([torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(64, 96, dtype=torch.bfloat16)], "every expert of shape"),
    ("weights", "expected a BF16 tensor"),
]


@pytest.mark.parametrize(("src", "message"), BAD_SOURCES)
def test_bad_sources_are_refused(src: object, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        Q.prepare(src, Q.empty_outputs(1, 64, 64, "cpu"))  # type: ignore[arg-type]


def test_bad_outputs_are_refused_before_anything_is_written() -> None:
    x = torch.randn(2, 64, 64).bfloat16()
    good = Q.empty_outputs(2, 64, 64, "cpu")
    wrong_shape = good._replace(row_scales=torch.empty(2, 64, 2, dtype=torch.uint8))
    wrong_dtype = good._replace(col_data=torch.empty(2, 64, 64, dtype=torch.uint8))
    with pytest.raises(LayoutError, match=r"out.row_scales: expected a contiguous 16-byte aligned torch.uint8"):
        Q.prepare(x, wrong_shape)
    with pytest.raises(LayoutError, match=r"out.col_data: expected .* torch.float8_e4m3fn"):
        Q.prepare(x, wrong_dtype)
    with pytest.raises(LayoutError, match="expected a QuantizeOutputs"):
        Q.prepare(x, tuple(good))  # type: ignore[arg-type]
    shared = good._replace(col_data=good.row_data)
    with pytest.raises(LayoutError, match="overlaps"):
        Q.prepare(x, shared)
    assert Q.prepare(x, Q.empty_outputs(2, 64, 64, "cpu", swizzled=False), swizzled=False) is not None


def test_a_launch_needs_cuda_tensors() -> None:
    pytest.importorskip("cuda.core", reason="cuda.core is the 'cuda' extra")
    x = torch.randn(1, 64, 64).bfloat16()
    with pytest.raises(LayoutError, match="expected CUDA tensors"):
        Q.QuantizeLaunch(x, Q.empty_outputs(1, 64, 64, "cpu"))
    with pytest.raises(LayoutError, match="expected CUDA tensors"):  # a resolved cuda backend asks for the kernel
        Q.prepare(x, Q.empty_outputs(1, 64, 64, "cpu"), use_kernel=True)
    with pytest.raises(LayoutError, match="expected CUDA tensors"):
        QuantizeWork(x, Q.empty_outputs(1, 64, 64, "cpu")).prepared(Backend.CUDA)


def test_quantize_work_on_the_torch_backend_runs_the_reference() -> None:
    x = EQ.special_values(torch.Generator().manual_seed(3), (2, 64, 96))
    want, exact = Q.empty_outputs(2, 64, 96, "cpu"), Q.empty_outputs(2, 64, 96, "cpu")
    Q.run_reference(x, want, rule=ReciprocalRule.SHIFT)
    Q.run_reference(x, exact, rule=ReciprocalRule.EXACT)
    assert not torch.equal(want.row_data.view(torch.uint8), exact.row_data.view(torch.uint8))  # the rule shows
    out = EQ.poisoned(2, 64, 96, swizzled=True)
    run = QuantizeWork(x, out, ReciprocalRule.SHIFT).prepared(Backend.TORCH)
    assert all((t.view(torch.uint8) == EQ.POISON).all() for t in out)  # prepared, not yet run
    run()
    EQ.compare(out, want, "QuantizeWork on the torch backend")
