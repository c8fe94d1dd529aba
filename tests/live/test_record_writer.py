"""CPU checks of the live-run tooling: the record writer, the support table's column, the evidence
helper's refusal of empty buffers, and matrix/gpu_live.sh (syntax, its copy of the stub)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from matrix import live_record, provenance, support
from tests.live.evidence import (
    AS_ALLOCATED,
    EVIDENCE_ENV,
    SEEDED,
    Evidence,
    merge_worker_evidence,
    worker_path,
    write_evidence,
)

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
    assert rec["record_format"] == 4 and rec["release"] == "2.20.2" and rec["notes"] == ["a note"]
    assert rec["bytes"] == {
        "tests.live.test_live_te::test_a[256-512]": "2 comparisons on seeded random bytes, fewest distinct values 240",
        "tests.live.test_live_te::test_b": "no byte comparison recorded (quantize_ left scales unchanged)",
    }
    assert rec["seeding"].startswith("TE's buffers filled with random bytes") and "64" in rec["seeding"]
    no_evidence = live_record.build_record(ENV, junit, None, [], {})
    assert no_evidence["bytes"] == {} and no_evidence["seeding"].startswith("unknown")


SELFTEST = {
    "ok": True,
    "checks": [
        {"name": "mok.te.mxfp8_split", "status": "passed", "why": "TE 2.20.2: 2 experts", "seconds": 0.2},
        {"name": "mok.te.mxfp8_dequantize", "status": "skipped", "why": "compute capability 9.0", "seconds": 0.0},
    ],
    "te_version": "2.20.2",
    "device": "NVIDIA H200 (compute capability 9.0)",
    "seconds": 0.2,
}


def test_the_record_holds_what_te_compat_selftest_printed(junit: Path, tmp_path: Path) -> None:
    test = {"comparisons": [], "notes": [], "selftest": SELFTEST}
    evidence = {**EVIDENCE, "tests": {**EVIDENCE["tests"], "tests/live/test_live_selftest.py::test_x": test}}
    rec = live_record.build_record(ENV, junit, evidence, [], {})
    assert rec["selftest"] == SELFTEST
    assert support._live(rec).endswith("; te-compat selftest ok: 1 passed, 0 failed, 1 skipped")
    assert live_record.build_record(ENV, junit, EVIDENCE, [], {})["selftest"] is None
    # the evidence helper carries it from the live test to that side file
    ev = Evidence("tests/live/test_live_selftest.py::test_x", 1)
    ev.selftest = SELFTEST
    write_evidence(tmp_path / "e.json", {ev.nodeid: ev})
    written = json.loads((tmp_path / "e.json").read_text())
    assert live_record.selftest_of(written) == SELFTEST


@pytest.mark.parametrize("path", sorted((ROOT / "matrix" / "live").glob("*.json")), ids=lambda p: p.name)
def test_every_committed_record_is_still_read(path: Path) -> None:
    """Records written before a field existed (record_format 1 to 3: no selftest) stay readable."""
    rec = json.loads(path.read_text())
    assert support._live(rec).startswith(f"{rec['passed']} passed") or rec.get("could_not_load")
    assert live_record.selftest_of(None) is None and ("selftest" in rec or rec.get("record_format", 1) < 4)


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


def test_support_column_of_a_new_record(junit: Path) -> None:
    rec = live_record.build_record(ENV, junit, EVIDENCE, [live_record.STUB_NOTE, "NVTE_X=1"], {})
    assert support._live(rec) == (
        "2 passed, 2 failed, 1 skipped on NVIDIA H200; 1 tests compared with TE on random bytes "
        "seeded into TE's buffers; cuBLASLt grouped stub preloaded: TE grouped GEMM unavailable"
    )
    assert support._live(None) == "not run"
    assert support._live(None, 12) == "not run (needs CUDA 12 libraries; the GPU machine has 13)"


def test_a_release_that_could_not_load_is_recorded_with_why_and_what_was_tried(junit: Path) -> None:
    failure = {"why": "TE did not import: undefined symbol: cublasLtX", "tried": ["the stub", "a build"]}
    alone = live_record.build_record(ENV, None, None, [], {}, failure)
    assert alone["could_not_load"] == failure and (alone["passed"], alone["failed"], alone["skipped"]) == (0, 0, 0)
    assert alone["ran"] == [] and alone["seeding"].startswith("unknown")
    assert support._live(alone) == (
        "could not load on NVIDIA H200: TE did not import: undefined symbol: cublasLtX (tried: the stub; a build)"
    )
    with_tests = live_record.build_record(ENV, junit, None, [], {}, failure)
    assert support._live(with_tests).endswith("; tests without TE: 2 passed, 2 failed, 1 skipped")
    assert "could_not_load" not in live_record.build_record(ENV, junit, None, [], {})


def test_the_record_names_its_commit_and_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI path matrix/gpu_live.sh takes when TE did not build: no junit, a release it names."""
    monkeypatch.delenv(live_record.NO_SEED_ENV, raising=False)
    monkeypatch.setenv(provenance.COMMIT_ENV, "0123456789abcdef")
    monkeypatch.setattr(live_record, "environment", lambda machine: {**ENV, "release": None})  # no TE read here
    why = ["--could-not-load", "the torch extension did not build: error: x", "--tried", "a build"]
    assert live_record.main(["--release", "9.8.7", "--out", str(tmp_path), *why]) == 0
    rec = json.loads((tmp_path / "9.8.7.json").read_text())
    assert rec["record_format"] == 4 and rec["release"] == "9.8.7" and rec["commit"] == "0123456789abcdef"
    assert rec["selftest"] is None  # no test ran: nothing printed it
    assert rec["code"] == provenance.disk_digests(provenance.ROOT) and set(rec["code"]) == {"mok", "te_compat", "tests"}
    assert rec["could_not_load"] == {"why": "the torch extension did not build: error: x", "tried": ["a build"]}
    assert support.live_columns(rec, 13, provenance.disk_digests(provenance.ROOT, provenance.CODE)).endswith(
        f"| {rec['date']} | 0123456789 | current"
    )
    moved = {"mok": "0" * 16, "te_compat": rec["code"]["te_compat"]}
    assert support.live_columns(rec, 13, moved).endswith("| stale: mok changed since")
    assert support.live_columns(None, 13, moved) == "not run | - | - | -"
    with pytest.raises(SystemExit, match="2"):  # neither a junit XML nor a reason why no test ran
        live_record.main(["--release", "9.8.7", "--out", str(tmp_path)])


def test_the_release_asked_for_must_be_the_one_te_compat_reads() -> None:
    assert live_record.which_release("2.18.0", "2.18.0") == "2.18.0"
    assert live_record.which_release(None, "2.18.0") == "2.18.0"
    assert live_record.which_release("2.18.0", None) == "2.18.0"
    with pytest.raises(SystemExit, match="te_compat reads TE 2.17.1 here, but --release says 2.18.0"):
        live_record.which_release("2.17.1", "2.18.0")


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
        pytest.skip(f"the reference copy of {name}, the GPU stub this script embeds, is not on this machine")
    embedded = re.search(rf"<<'{marker}'\n(.*?)\n{marker}\n", SCRIPT.read_text(), re.S)
    assert embedded is not None, f"matrix/gpu_live.sh has no {marker} here-document"
    assert embedded.group(1) + "\n" == shared.read_text()


def test_stage_replaces_parts_with_a_whole_slim_core(tmp_path: Path) -> None:
    """--stage copies every carried folder and source, and a whole core wheel drops core parts staged before."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    tree = tmp_path / "tree"
    (tree / "matrix").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "matrix" / "gpu_live.sh")
    shutil.copy(SCRIPT.with_name("te_torch_build.sh"), tree / "matrix")
    carried = tree / ".te-wheelhouse" / "2.99.0" / "sm90"
    carried.mkdir(parents=True)
    (carried / "CORE_NAME").write_text("te_cu13-2.99.0.whl\n")
    (carried / "te_cu13-2.99.0.whl").write_bytes(b"whole")
    sources = tree / ".te-wheelhouse" / "sources"
    sources.mkdir()
    (sources / "transformer_engine_torch-2.98.1.tar.gz").write_bytes(b"sdist")
    staged = tmp_path / "te" / "2.99.0"
    staged.mkdir(parents=True)
    (staged / "core.part0").write_bytes(b"old part")
    env = {"PATH": "/usr/bin:/bin", "TE_PARTS_ROOT": str(tmp_path / "te"), "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        [bash, str(tree / "matrix" / "gpu_live.sh"), "--stage"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in staged.iterdir()) == ["CORE_NAME", "te_cu13-2.99.0.whl"]
    assert "2.99.0: 0 core part(s)" in done.stdout
    assert [p.name for p in (tmp_path / "te" / "2.98.1").iterdir()] == ["transformer_engine_torch-2.98.1.tar.gz"]


def test_worker_parts_merge_into_one_side_file(tmp_path: Path) -> None:
    path = tmp_path / "r.evidence.json"
    for worker, nodeid in (("gw0", "a"), ("gw1", "b")):
        ev = Evidence(nodeid, seed=1)
        write_evidence(worker_path(path, worker), {nodeid: ev})
    merge_worker_evidence(path)
    assert sorted(json.loads(path.read_text())["tests"]) == ["a", "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.evidence.json"]
    write_evidence(worker_path(path, "gw0"), {"a": Evidence("a", seed=1)})
    write_evidence(worker_path(path, "gw1"), {"a": Evidence("a", seed=1)})
    with pytest.raises(ValueError, match=r"expected each test in one worker's part; found \['a'\] twice"):
        merge_worker_evidence(path)


XDIST_TEST = """
import torch
from tests.live.evidence import SEEDED


def test_{n}(evidence):
    buf = torch.zeros(256, 8, dtype=torch.uint8)
    assert evidence.fill_random_(buf) == SEEDED
    evidence.compared("buf", buf, SEEDED)
"""


def test_evidence_of_xdist_workers_reaches_the_side_file(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text("from tests.live.conftest import evidence, pytest_sessionfinish  # noqa\n")
    for n in range(4):
        (tmp_path / f"test_x{n}.py").write_text(XDIST_TEST.format(n=n))
    junit = tmp_path / "j.xml"
    cmd = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(tmp_path), f"--junitxml={junit}"]
    env = {k: v for k, v in os.environ.items() if k != EVIDENCE_ENV}  # (gpu_live.sh sets it for the outer run)
    done = subprocess.run(
        [sys.executable, *cmd, f"--rootdir={tmp_path}"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    tests = json.loads(junit.with_suffix(".evidence.json").read_text())["tests"]
    assert len(tests) == 4 and all(t["comparisons"][0]["distinct"] >= 200 for t in tests.values()), tests
    assert not list(tmp_path.glob("*.gw*"))


@pytest.mark.parametrize(
    ("archive", "force"),
    [("transformer_engine_torch-2.9.0.tar.gz", "FALSE"), ("/x/transformer_engine_torch-2.10.0.tar.gz", "TRUE")],
)
def test_te_2_9_s_extension_is_built_unforced(archive: str, force: str) -> None:
    """TE 2.9's setup.py builds twice when forced and fails; both build scripts leave it unforced."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    shared = SCRIPT.with_name("te_torch_build.sh")
    for script in (SCRIPT, SCRIPT.with_name("prebuild_te_torch.sh")):
        assert 'source "$ROOT/matrix/te_torch_build.sh"' in script.read_text(), script
    done = subprocess.run(
        [bash, "-c", f'source "{shared}"; force_build {archive}'], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == force
