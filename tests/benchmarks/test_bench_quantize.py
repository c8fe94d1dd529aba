"""The quantisation benchmark stays runnable: its dry run (CPU, tiny shapes, the torch reference)
sets up every column a GPU run times, checks the fused result, and writes the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import ROOT
from tests.benchmark_scripts import benchmark_script


def test_bench_quantize_dry_run_writes_every_column(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "benchmarks/bench_quantize.py", "--dry-run", "--no-te", "--runs", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["meta"]["runs"] == 2 and found["meta"]["kernel"]["QTILE_COLS"] == "256"
    (row,) = found["rows"]
    assert set(row["median_us"]) == {"g:copy", "g:fused", "fused", "g:fused/exp", "g:mok 2"}
    assert all(v > 0 for v in row["median_us"].values()) and len(row["runs"]) == 2
    assert row["equal"] == {"fused == mok 2": True, "expert 0 == reference": True}
    n = 2 * 64 * 96
    assert row["bytes_moved"] == 2 * n + 2 * n + 2 * (2 * 128 * 4)  # BF16 in, FP8 twice out, two layouts
    _check_table(out, row)


def _check_table(out: Path, row: dict[str, Any]) -> None:
    """results_tables' `quantize` kind shows every measured column as its ratio to the copy."""
    tables = benchmark_script("results_tables")
    header, _, line = tables.quantize(out)
    assert header.split(" | ")[2:] == ["fused, graph", "fused, eager", "per-expert table", "two steps (mok) |"]
    us = row["median_us"]
    want = [f"{us[c] / us['g:copy']:.2f}" for c in ("g:fused", "fused", "g:fused/exp", "g:mok 2")]
    assert line.strip("| ").split(" | ")[2:] == want
    flags = tables._quantize_flags(out, json.loads(out.read_text())["meta"])
    assert flags.endswith("--no-te") and "--runs 2" in flags
