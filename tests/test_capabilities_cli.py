"""capabilities() as data, require(), and the command line, on a machine without TE."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import te_compat
from te_compat import MissingFeatureError
from te_compat.cli import main

ROOT = Path(__file__).resolve().parent.parent
Installer = Callable[..., None]


def test_without_te(installed_te: Installer) -> None:
    installed_te(None)
    c = te_compat.capabilities()
    assert not c.te_present and not c.te_usable and c.tensor_kinds == ()
    assert c.kernel_backend in ("torch", "cuda")
    assert c.missing("te", "mxfp8") == {
        "te": "transformer_engine is not installed",
        "mxfp8": "needs TE >= 2.0; found no TE",
    }
    with pytest.raises(MissingFeatureError, match="grouped: needs TE >= 2.13; found no TE"):
        c.require("grouped")


def test_kinds_follow_the_table(installed_te: Installer) -> None:
    installed_te("2.13.0")
    c = te_compat.capabilities(import_te=False)
    assert c.tensor_kinds == ("float8", "mxfp8", "float8_blockwise", "nvfp4", "grouped")
    assert c.swizzled_scale_flag and c.grouped_tensors and c.te_in_table
    installed_te("2.11.0")
    c = te_compat.capabilities(import_te=False)
    assert not c.swizzled_scale_flag and not c.grouped_tensors
    assert "needs TE >= 2.12; found 2.11.0" in c.missing("swizzled_scale_flag")["swizzled_scale_flag"]
    installed_te("2.99.1")
    assert not te_compat.capabilities(import_te=False).te_in_table


def test_unknown_feature() -> None:
    with pytest.raises(ValueError, match="unknown feature 'warp_drive'"):
        te_compat.capabilities(import_te=False).require("warp_drive")


def test_backend_choice_on_cpu() -> None:
    assert te_compat.kernel_backend("torch").name == "torch"
    with pytest.raises(MissingFeatureError, match="kernel backend 'cuda' was asked for, but"):
        te_compat.kernel_backend("cuda")
    with pytest.raises(ValueError, match="must be one of auto, cuda, torch; found 'fast'"):
        te_compat.kernel_backend("fast")
    c = te_compat.capabilities(import_te=False, backend="cuda")
    assert c.kernel_backend == "none" and "asked for" in c.kernel_backend_reason


def test_cli_report_text(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te(None)
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert "te present" in out and "transformer_engine is not installed" in out and "kernel backend" in out


def test_cli_report_json_and_require(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te(None)
    assert main(["report", "--json", "--require", "te", "grouped"]) == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["te_present"] is False and data["table_checked_through"] == te_compat.table.CHECKED_THROUGH
    assert "te: transformer_engine is not installed" in captured.err
    assert "grouped: needs TE >= 2.13" in captured.err


def test_cli_releases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases"]) == 0
    out = capsys.readouterr().out
    for row in te_compat.table.ROWS:
        assert row.introduced_by in out
    assert main(["releases", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(te_compat.table.ROWS)


def test_python_dash_m_and_exit_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "te_compat", "report", "--require", "mxfp8_hardware"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 1 and "te-compat report" in done.stdout and "mxfp8_hardware:" in done.stderr
