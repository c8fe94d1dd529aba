"""CPU checks of the live-run tooling: the record writer, the README column, the evidence
helper's refusal of empty buffers, and matrix/gpu_live.sh (syntax, its copy of the stub)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from matrix import live_record, support
from tests.live.evidence import AS_ALLOCATED, SEEDED, Evidence

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "matrix" / "gpu_live.sh"
SHARED_GPU = ROOT.parent / "shared" / "gpu"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="tests.live.test_live_te" name="test_a[256-512]" time="0.1"/>
<testcase classname="tests.live.test_live_te" name="test_b" time="0.1">
  <failure message="AssertionError: expert 0 rowwise&#10;second line">trace</failure></testcase>
<testcase classname="tests.live.test_live_te" name="test_c" time="0.1">
  <skipped type="pytest.skip" message="TE 2.12.0 has no GroupedTensor (TE 2.13+)">skip</skipped></testcase>
<testcase classname="tests.gpu.test_kernel_gpu" name="test_d" time="0.1">
  <error message="fixture broke">trace</error></testcase>
<testcase classname="tests.gpu.test_kernel_gpu" name="test_e" time="0.1"/>
</testsuite></testsuites>
"""

EVIDENCE: dict[str, Any] = {
    "seeding": True,
    "min_distinct": 64,
    "tests": {
        "tests/live/test_live_te.py::test_a[256-512]": {
            "comparisons": [
                {"what": "expert 0 rowwise scales", "bytes": SEEDED, "distinct": 251, "elements": 4096},
                {"what": "expert 0 columnwise scales", "bytes": SEEDED, "distinct": 240, "elements": 4096},
            ],
            "notes": [],
        },
        "tests/live/test_live_te.py::test_b": {"comparisons": [], "notes": ["quantize_ left scales unchanged"]},
    },
}
ENV = {"release": "2.20.2", "gpu": "NVIDIA H200", "date": "2026-12-03", "machine": "H200 box"}


@pytest.fixture
def junit(tmp_path: Path) -> Path:
    path = tmp_path / "live.xml"
    path.write_text(JUNIT)
    return path


def test_summary_counts_each_outcome_and_lists_what_ran(junit: Path) -> None:
    s = live_record.summarize(junit)
    assert (s["passed"], s["failed"], s["skipped"]) == (2, 2, 1)
    assert s["ran"] == [
        "tests.gpu.test_kernel_gpu::test_d",
        "tests.gpu.test_kernel_gpu::test_e",
        "tests.live.test_live_te::test_a[256-512]",
        "tests.live.test_live_te::test_b",
    ]
    assert s["failed_tests"] == {
        "tests.live.test_live_te::test_b": "AssertionError: expert 0 rowwise",
        "tests.gpu.test_kernel_gpu::test_d": "fixture broke",
    }
    assert s["skipped_tests"] == {"tests.live.test_live_te::test_c": "TE 2.12.0 has no GroupedTensor (TE 2.13+)"}


def test_junit_name_matches_what_junit_writes() -> None:
    node = "tests/live/test_live_te.py::test_a[256-512]"
    assert live_record.junit_name(node) == "tests.live.test_live_te::test_a[256-512]"


def test_record_says_on_which_bytes_each_test_compared(junit: Path) -> None:
    build = {"distributions": {"transformer_engine": "2.20.2"}}
    rec = live_record.build_record(ENV, junit, EVIDENCE, ["a note"], build)
    assert rec["record_format"] == 2 and rec["release"] == "2.20.2" and rec["notes"] == ["a note"]
    assert rec["bytes"] == {
        "tests.live.test_live_te::test_a[256-512]": "2 comparisons on seeded random bytes, fewest distinct values 240",
        "tests.live.test_live_te::test_b": "no byte comparison recorded (quantize_ left scales unchanged)",
    }
    assert rec["seeding"].startswith("TE's buffers filled with random bytes") and "64" in rec["seeding"]
    no_evidence = live_record.build_record(ENV, junit, None, [], {})
    assert no_evidence["bytes"] == {} and no_evidence["seeding"].startswith("unknown")


def test_a_no_seed_run_never_replaces_the_real_record(tmp_path: Path) -> None:
    rec = {"release": "2.20.2"}
    assert not live_record.no_seed_run(EVIDENCE, {})
    assert live_record.no_seed_run({**EVIDENCE, "seeding": False}, {})
    assert live_record.no_seed_run(None, {live_record.NO_SEED_ENV: "1"})
    assert live_record.record_path(tmp_path, rec, True).name == "2.20.2.no-seed.json"
    assert live_record.record_path(tmp_path, rec, False).name == "2.20.2.json"


def test_environment_notes_name_the_stub_and_the_grouped_switch() -> None:
    env = {"LD_PRELOAD": "/root/te/libcublaslt_grouped_stub.so", "NVTE_GROUPED_LINEAR_SINGLE_PARAM": "1"}
    assert live_record.environment_notes(["x"], env) == [
        "x",
        "cuBLASLt grouped stub preloaded: TE grouped GEMM unavailable",
        "NVTE_GROUPED_LINEAR_SINGLE_PARAM=1",
    ]
    assert live_record.environment_notes([], {}) == []


def test_support_column_of_a_new_record(junit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = live_record.build_record(ENV, junit, EVIDENCE, [live_record.STUB_NOTE, "NVTE_X=1"], {})
    (tmp_path / "2.20.2.json").write_text(json.dumps(rec))
    monkeypatch.setattr(support, "LIVE_DIR", tmp_path)
    assert support._live("2.20.2") == (
        "NVIDIA H200 2026-12-03: 2 passed, 2 failed, 1 skipped; 1 tests compared with TE on random bytes "
        "seeded into TE's buffers; cuBLASLt grouped stub preloaded: TE grouped GEMM unavailable"
    )
    assert support._live("9.9.9") == "-"


def test_evidence_refuses_a_comparison_on_empty_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    ev = Evidence("t", seed=1)
    buf = torch.zeros(256, 8, dtype=torch.uint8)
    with pytest.raises(AssertionError, match="only 1 distinct values"):
        ev.compared("zeros", buf, AS_ALLOCATED)
    assert ev.fill_random_(buf, None) == SEEDED and ev.seeded_buffers == 1
    ev.compared("seeded", buf, SEEDED)  # 2048 random bytes: about 256 distinct values
    assert ev.comparisons[-1]["distinct"] >= 200
    monkeypatch.setenv(live_record.NO_SEED_ENV, "1")
    untouched = torch.zeros(256, 8, dtype=torch.uint8)
    assert ev.fill_random_(untouched) == AS_ALLOCATED and not untouched.any()


def test_gpu_live_script_parses() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    subprocess.run([bash, "-n", str(SCRIPT)], check=True)


STUB_FILES = [("cublaslt-grouped-stub.c", "STUB_C"), ("cublaslt-grouped-stub.map", "STUB_MAP")]


@pytest.mark.parametrize(("name", "marker"), STUB_FILES)
def test_gpu_live_script_carries_the_shared_stub_verbatim(name: str, marker: str) -> None:
    shared = SHARED_GPU / name
    if not shared.exists():
        pytest.skip(f"{shared} is not beside this checkout")
    embedded = re.search(rf"<<'{marker}'\n(.*?)\n{marker}\n", SCRIPT.read_text(), re.S)
    assert embedded is not None, f"matrix/gpu_live.sh has no {marker} here-document"
    assert embedded.group(1) + "\n" == shared.read_text()
