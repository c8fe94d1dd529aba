"""The device-time benchmark stays runnable and keeps the JSON issue 15 asked for: its dry run
(CPU, tiny shapes, the torch backend) builds every job and writes every key a GPU run would."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT
from tests.benchmark_scripts import benchmark_script

KEYS = {"case", "g:kernel/copy", "g:exp/copy", "kernel/exp", "TE multi", "TE discrete", "runs", "median", "spread"}


def test_bench_swizzle_dry_run_writes_the_agreed_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "benchmarks/bench_swizzle.py", "--dry-run", "--no-te", "--runs", "2"]
    cmd += ["--shapes", "default,32x256", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["meta"]["runs"] == 2 and found["meta"]["shapes"] == "default,32x256"
    rows = found["rows"]
    kinds = [r["case"].split()[0] for r in rows]
    assert kinds.count("layer") == kinds.count("inverse") == 1 and len(rows) == 11
    for row in rows:
        assert KEYS <= row.keys(), f"{row['case']}: missing {KEYS - row.keys()}"
        assert len(row["runs"]) == 2
        assert row["equal"] == {"default": True, "32x256": True}
        assert row["g:kernel/copy"] == row["median"]["g:kernel@default/copy"] > 0
        columns = [f"g:{w}@{v}/copy" for v in ("default", "32x256") for w in ("kernel", "exp")]
        columns += [
            "g:kcopy/copy",
            "g:exp-kcopy/copy",
            "g:kcopy@32x256/copy",
            "g:exp-kcopy@32x256/copy",
        ]
        assert all(row["median"][c] > 0 for c in columns), f"{row['case']}: {set(columns) - row['median'].keys()}"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_vs_baseline_runs_each_benchmark_on_the_cpus_asked_for(tmp_path: Path) -> None:
    """``--cpus``: the benchmark process of either tree sees only those CPUs."""
    vs = benchmark_script("vs_baseline")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "where.py").write_text(
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'cpus': sorted(os.sched_getaffinity(0))}, open(out, 'w'))\n"
    )
    first = min(os.sched_getaffinity(0))
    assert vs._run(tmp_path, "where.py", [], {first}) == {"cpus": [first]}
    assert vs._run(tmp_path, "where.py", []) == {"cpus": sorted(os.sched_getaffinity(0))}


def test_vs_baseline_names_what_it_expected_of_cpus() -> None:
    vs = benchmark_script("vs_baseline")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected CPU numbers joined by commas \(2,3\); found 'x'"):
        vs._cpu_set("x")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected CPUs among \[.*\]; found \[4096\]"):
        vs._cpu_set("4096")
    assert vs._cpu_set(str(min(os.sched_getaffinity(0)))) == {min(os.sched_getaffinity(0))}


EXPORT_KEYS = {"case", "kind", "layout", "runs", "median", "spread", "kernel/copy", "export us", "refresh us"}


def test_bench_export_dry_run_writes_every_case(tmp_path: Path) -> None:
    """The export benchmark's dry run (CPU, tiny sizes, the torch reference) runs every kind and
    layout and writes each run, with the machine and versions."""
    out = tmp_path / "export.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "benchmarks/bench_export.py", "--dry-run", "--runs", "2", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernel/copy" in done.stdout
    found = json.loads(out.read_text())
    assert {"date", "machine", "torch", "args"} <= found["meta"].keys()
    rows = found["rows"]
    assert [(r["kind"], r["layout"]) for r in rows] == [
        (kind, layout) for kind in ("split", "grouped") for layout in ("compact", "deepgemm", "flashinfer")
    ]
    for row in rows:
        assert EXPORT_KEYS <= row.keys(), f"{row['case']}: missing {EXPORT_KEYS - row.keys()}"
        assert len(row["runs"]["kernel ms"]) == len(row["runs"]["copy ms"]) == 2
        assert row["kernel"] is False and row["bytes read"] > 0 and row["bytes written"] > 0
        assert row["export us"] > 0 and row["refresh us"] > 0
    bad = subprocess.run(
        [*cmd[:2], "--dry-run", "--layouts", "cutlass"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert (
        bad.returncode != 0
        and "expected some of compact,deepgemm,flashinfer joined by commas; found 'cutlass'" in bad.stderr
    )
