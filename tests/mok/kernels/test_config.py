"""The kernel's configuration: which shapes are accepted, the environment read and checked in one
place (MOK_KERNEL_SHAPE), the kernel ABI written once, and what ``te-compat report`` shows of it."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import mok
import te_compat
from mok.kernels import abi
from mok.kernels.config import SHAPE_ENV, KernelConfig, LaunchShapes, launch_shapes
from te_compat import cli
from tests.entry_points import only_installed

RULE = "THREADS one of 64, 96, 128, 256 and TILES a multiple of THREADS/8 up to 64"


@pytest.fixture
def kernel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The variable unset, read afresh; read afresh again after the test."""
    monkeypatch.delenv(SHAPE_ENV, raising=False)
    te_compat.refresh()
    yield monkeypatch
    monkeypatch.undo()
    te_compat.refresh()


@pytest.mark.parametrize(
    ("tiles", "threads"),
    [(16, 192), (24, 100), (32, 512), (16, 256), (0, 0), (-16, 128), (128, 128), (12, 128), (16.0, 128)],
)
def test_unsupported_kernel_shapes_are_refused(tiles: int, threads: int) -> None:
    with pytest.raises(ValueError, match=f"unsupported kernel shape: expected {RULE}; found {tiles},{threads}$"):
        KernelConfig(tiles, threads)


@pytest.mark.parametrize(("tiles", "threads"), [(16, 128), (32, 256), (8, 64), (16, 64), (12, 96), (64, 256)])
def test_supported_kernel_shapes_give_their_macros(tiles: int, threads: int) -> None:
    config = KernelConfig(tiles, threads)
    slab = [("SLAB_BYTES", "30720")] if threads == 256 else []
    assert config.macros()[: 2 + len(slab)] == [("TILES_PER_UNIT", str(tiles)), ("THREADS", str(threads)), *slab]
    assert config.macros()[2 + len(slab) :] == abi.macros()
    assert KernelConfig.parse(f"{tiles}x{threads}", "x") == config and str(config) == f"{tiles}x{threads}"


def test_the_environment_fixes_one_shape_until_it_is_read_again(kernel_env: pytest.MonkeyPatch) -> None:
    assert launch_shapes() == LaunchShapes() == LaunchShapes(KernelConfig(32, 256), KernelConfig(16, 128))
    kernel_env.setenv(SHAPE_ENV, "32,256")
    assert launch_shapes() == LaunchShapes()  # read once: a change shows after te_compat.refresh()
    te_compat.refresh()
    assert launch_shapes() == LaunchShapes.fixed(KernelConfig(32, 256))
    kernel_env.setenv(SHAPE_ENV, "")  # empty: unset
    te_compat.refresh()
    assert launch_shapes() == LaunchShapes()


INVALID = [
    (SHAPE_ENV, "0,0", f"expected TILES,THREADS with {RULE} (e.g. 16,128 or 32,256)"),
    (SHAPE_ENV, "-16,128", "expected TILES,THREADS with"),
    (SHAPE_ENV, "16,192", "expected TILES,THREADS with"),
    (SHAPE_ENV, "32", "expected TILES,THREADS with"),
    (SHAPE_ENV, "16x128", "expected TILES,THREADS with"),
]


@pytest.mark.parametrize(("name", "value", "expected"), INVALID)
def test_invalid_kernel_variables_are_refused_where_they_are_read(
    kernel_env: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    kernel_env.setenv(name, value)
    with pytest.raises(ValueError, match=f"^environment variable {name}: {re.escape(expected)}.*; found '{value}'$"):
        launch_shapes()


@pytest.mark.parametrize(("name", "value", "expected"), INVALID)
def test_report_shows_an_invalid_kernel_variable(
    kernel_env: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    kernel_env.setenv(name, value)
    row = "kernel shape"
    rows = mok.backend.report()
    assert rows[row] == "invalid"
    assert f"environment variable {name}:" in str(rows[f"{row} reason"]) and repr(value) in str(rows[f"{row} reason"])
    assert rows["kernel backend"] in ("cuda", "torch")  # the backend is still reported


def test_report_shows_the_kernel_variables_values(kernel_env: pytest.MonkeyPatch) -> None:
    rows = mok.backend.report()
    assert rows["kernel shape"] == "per launch: 32x256 with a rowwise job, else 16x128"
    assert "kernel shape reason" not in rows and "kernel variant" not in rows
    kernel_env.setenv(SHAPE_ENV, "16,128")
    rows = mok.backend.report()
    assert rows["kernel shape"] == "16x128 for every launch"


def test_te_compat_report_has_the_kernel_variables(
    kernel_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mok_section = importlib.metadata.EntryPoint("mok", "mok.backend:report", "te_compat.report")
    only_installed(kernel_env, {"te_compat.report": [mok_section]})
    kernel_env.setenv(SHAPE_ENV, "-16,128")
    assert cli.main(["report", "--json", "--no-import"]) == 0
    section = json.loads(capsys.readouterr().out)["sections"]["mok"]
    assert section["kernel shape"] == "invalid" and "'-16,128'" in section["kernel shape reason"]


def test_no_kernel_module_reassigns_a_global() -> None:
    """Configuration is passed or read through a cache, never written into module globals."""
    for path in (Path(mok.__file__).parent / "kernels").glob("*.py"):
        found = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Global)]
        assert not found, f"{path.name}: global statement at line {found}"


# ------------------------------------------------------------------ the ABI, written once

SOURCE = Path(mok.__file__).parent / "kernels" / "mxfp8_swizzle.cu"
ABI_NAMES = re.compile(r"\b(COPY_CHUNK|MODE_[A-Z]+|FLAG_[A-Z_]+)\b")


def test_the_kernel_source_defines_no_abi_value_itself() -> None:
    """Modes, flags and the copy chunk come from mok/kernels/abi.py; the source only uses them."""
    defined = re.findall(r"^\s*#\s*define\s+(\w+)", SOURCE.read_text(), re.MULTILINE)
    assert not [name for name in defined if ABI_NAMES.fullmatch(name)]
    used = set(ABI_NAMES.findall(SOURCE.read_text()))
    assert used == {name for name, _ in abi.macros()}  # every ABI name the source uses is passed, and no more


def test_the_abi_values_are_distinct_bits_and_modes() -> None:
    values = dict(abi.macros())
    modes = [int(v) for k, v in values.items() if k.startswith("MODE_")]
    flags = [int(v) for k, v in values.items() if k.startswith("FLAG_")]
    assert sorted(modes) == list(range(len(modes)))
    assert all(f & (f - 1) == 0 and f > max(modes) for f in flags) and len(set(flags)) == len(flags)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_a_compile_without_the_abi_macros_stops_with_a_named_error(tmp_path: Path) -> None:
    shape = ["-DTILES_PER_UNIT=16", "-DTHREADS=128", "-D__global__=", "-D__device__=", "-D__shared__="]
    done = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-x", "c++", *shape, str(SOURCE)], capture_output=True, text=True
    )
    assert done.returncode != 0 and "the ABI macros come from mok/kernels/abi.py" in done.stderr
