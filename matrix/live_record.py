"""Record one live run (tests/gpu and tests/live against a real TE on a GPU) in matrix/live/.

    python -m matrix.live_record JUNIT.xml [--evidence FILE] [--out DIR] [--note TEXT]... [--build TEXT]
    python -m matrix.live_record [JUNIT.xml] --release V --could-not-load WHY [--tried TEXT]...

Writes ``<DIR>/<TE release>.json`` (``<release>.no-seed.json`` for a run with
TE_COMPAT_LIVE_NO_SEED=1): release, machine, date, the commit and a digest of the code that ran
(matrix/provenance.py), the TE build, environment notes, pass/fail/skip counts, which tests ran,
every skip and failure with its reason, for each comparison with TE the bytes it ran on, and what
``te-compat selftest --json`` printed (``selftest``; from format 4), all from the side file
tests/live/conftest.py writes, by default beside the junit XML as ``JUNIT.evidence.json``. With
--could-not-load the record says that TE did not build or import on the machine, why, and what
was tried (the tests, if any ran, are those that need no TE). Run it in the environment that ran
the tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any

from matrix import provenance

LIVE_DIR = Path(__file__).resolve().parent / "live"
# 1: counts and reasons only; 2: no commit nor code digest (records before 2026-12-04); 3: no
# "selftest" (what `te-compat selftest --json` printed in the run; None where it did not run)
RECORD_FORMAT = 4
STUB_LIBRARY = "cublaslt_grouped_stub"  # shared/gpu/cublaslt-grouped-stub.c, built by matrix/gpu_live.sh
STUB_NOTE = "cuBLASLt grouped stub preloaded: TE grouped GEMM unavailable"
NO_SEED_ENV = "TE_COMPAT_LIVE_NO_SEED"  # tests/live/evidence.py: leave TE's buffers as allocated
TE_DISTRIBUTIONS = (
    "transformer_engine",
    "transformer_engine_cu12",
    "transformer_engine_cu13",
    "transformer_engine_torch",
)


def junit_name(nodeid: str) -> str:
    """pytest's node id as junit names the test: ``tests/live/test_x.py::t[a]`` -> ``tests.live.test_x::t[a]``."""
    path, _, name = nodeid.partition("::")
    return f"{path.removesuffix('.py').replace('/', '.')}::{name}"


def summarize(junit: Path | None) -> dict[str, Any]:
    """Counts, and every test by outcome, from pytest's junit XML (all zero without one)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    ran: list[str] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    cases = ET.parse(junit).getroot().iter("testcase") if junit is not None else iter(())
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if problem is not None:
            counts["failed"] += 1
            failed[name] = (problem.get("message") or "").split("\n")[0][:300]
            ran.append(name)
        elif skip is not None:
            counts["skipped"] += 1
            skipped[name] = (skip.get("message") or "")[:300]
        else:
            counts["passed"] += 1
            ran.append(name)
    return {**counts, "ran": sorted(ran), "skipped_tests": skipped, "failed_tests": failed}


def describe_bytes(test: dict[str, Any]) -> str:
    """One line for one test's comparisons: how many, on which bytes, the fewest distinct values."""
    comparisons = test.get("comparisons", [])
    if not comparisons:
        return "no byte comparison recorded" + (f" ({'; '.join(test['notes'])})" if test.get("notes") else "")
    sources = sorted({c["bytes"] for c in comparisons})
    fewest = min(c["distinct"] for c in comparisons)
    text = f"{len(comparisons)} comparisons on {' and '.join(sources)} bytes, fewest distinct values {fewest}"
    return text + (f" ({'; '.join(test['notes'])})" if test.get("notes") else "")


def bytes_by_test(evidence: dict[str, Any] | None) -> dict[str, str]:
    if not evidence:
        return {}
    return {junit_name(nodeid): describe_bytes(test) for nodeid, test in evidence.get("tests", {}).items()}


def te_build(extra: str | None) -> dict[str, Any]:
    """The installed TE distributions (name -> version) and what the run was told about the build."""
    found = {}
    for name in TE_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"distributions": found, **({"how": extra} if extra else {})}


def environment_notes(notes: list[str], environ: dict[str, str]) -> list[str]:
    found = list(notes)
    if STUB_LIBRARY in environ.get("LD_PRELOAD", "") and STUB_NOTE not in found:
        found.append(STUB_NOTE)
    single = environ.get("NVTE_GROUPED_LINEAR_SINGLE_PARAM")
    if single:
        found.append(f"NVTE_GROUPED_LINEAR_SINGLE_PARAM={single}")
    return found


def environment(machine: str | None) -> dict[str, Any]:
    """What ran where: TE release (as te_compat reads it), GPU, torch and CUDA, the machine."""
    import torch

    import mok
    import te_compat

    caps = te_compat.capabilities()
    gpu = caps.cuda_device
    return {
        "release": caps.te_version,
        "te_source": caps.te_source,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "gpu": gpu,
        "machine": machine or f"{gpu or 'no GPU'}, {os.cpu_count()} CPU cores, {platform.machine()}",
        "compute_capability": caps.compute_capability,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "kernel_backend": mok.kernel_backend().name,
    }


def selftest_of(evidence: dict[str, Any] | None) -> dict[str, Any] | None:
    """What `te-compat selftest --json` printed in the run (tests/live/test_live_selftest.py puts it
    in its evidence), or None where that test did not run."""
    for test in (evidence or {}).get("tests", {}).values():
        found = test.get("selftest")
        if isinstance(found, dict):
            return found
    return None


def seeding_text(evidence: dict[str, Any] | None) -> str:
    if evidence is None:
        return "unknown (no evidence file: the live tests did not run or wrote none)"
    if evidence.get("seeding"):
        least = evidence.get("min_distinct")
        return f"TE's buffers filled with random bytes before each comparison (>= {least} distinct values required)"
    return "TE's buffers left as allocated (TE_COMPAT_LIVE_NO_SEED=1)"


def code_ran(root: Path, commit: str | None = None) -> dict[str, Any]:
    """The commit the run's tree came from (None when nobody said) and its folders' digests."""
    return {"commit": commit or provenance.head_commit(root), "code": provenance.disk_digests(root)}


def build_record(
    env: dict[str, Any],
    junit: Path | None,
    evidence: dict[str, Any] | None,
    notes: list[str],
    build: dict[str, Any],
    could_not_load: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one run. ``evidence`` is the tests' side file (None when it is missing);
    ``could_not_load`` ({"why": ..., "tried": [...]}) when TE did not build or import there."""
    return {
        "record_format": RECORD_FORMAT,
        **env,
        "te_build": build,
        "notes": notes,
        **({"could_not_load": could_not_load} if could_not_load else {}),
        "seeding": seeding_text(evidence),
        **summarize(junit),
        "bytes": bytes_by_test(evidence),
        "selftest": selftest_of(evidence),
    }


def which_release(found: str | None, asked: str | None) -> str | None:
    """The release to record: what te_compat read, checked against what the caller said it installed."""
    if asked and found and found != asked:
        raise SystemExit(f"te_compat reads TE {found} here, but --release says {asked}: no record written")
    return found or asked


def no_seed_run(evidence: dict[str, Any] | None, environ: dict[str, str]) -> bool:
    """A run that left TE's buffers as allocated: its record must never replace a real one."""
    asked = environ.get(NO_SEED_ENV, "").strip().lower() in ("1", "true", "yes")
    return asked or (evidence is not None and not evidence.get("seeding"))


def record_path(out: Path, record: dict[str, Any], no_seed: bool) -> Path:
    return out / f"{record['release']}{'.no-seed' if no_seed else ''}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.live_record", description=__doc__.split("\n")[0])
    parser.add_argument("junit", type=Path, nargs="?", help="pytest's junit XML (none when no test ran)")
    parser.add_argument("--evidence", type=Path, help="the live tests' side file (default: JUNIT.evidence.json)")
    parser.add_argument("--out", type=Path, default=LIVE_DIR)
    parser.add_argument("--note", action="append", default=[], help="an environment note (repeatable)")
    parser.add_argument("--build", help="how TE was built, e.g. 'torch extension from sdist, NVTE_CUDA_ARCHS=90'")
    parser.add_argument("--machine", help="the machine, in words (default: GPU, CPU cores, architecture)")
    parser.add_argument("--release", help="the TE release that was installed (needed when it does not import)")
    parser.add_argument("--commit", help=f"the commit the tree came from (default: ${provenance.COMMIT_ENV}, else git)")
    parser.add_argument("--could-not-load", metavar="WHY", help="TE did not build or import here: why")
    parser.add_argument("--tried", action="append", default=[], help="what was tried to load it (repeatable)")
    args = parser.parse_args(argv)
    if args.junit is None and not args.could_not_load:
        parser.error("a junit XML is needed unless --could-not-load says why no test ran")
    evidence_file = args.evidence or (args.junit.with_suffix(".evidence.json") if args.junit else None)
    evidence = json.loads(evidence_file.read_text()) if evidence_file and evidence_file.exists() else None
    notes = environment_notes(args.note, dict(os.environ))
    env = environment(args.machine)
    env["release"] = which_release(env["release"], args.release)
    env.update(code_ran(provenance.ROOT, args.commit))
    failure = {"why": args.could_not_load, "tried": args.tried} if args.could_not_load else None
    record = build_record(env, args.junit, evidence, notes, te_build(args.build), failure)
    if record["release"] is None:  # e.g. `nox -s live` on a machine without TE: keep matrix/live/ as it is
        print("no Transformer Engine release is installed here (te_compat found none): no record", file=sys.stderr)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path = record_path(args.out, record, no_seed_run(evidence, dict(os.environ)))
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: {record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped")
    if failure:
        print(f"  TE {record['release']} could not load here: {failure['why']}")
    if record["commit"] is None:
        print(f"WARNING: the record names no commit (set ${provenance.COMMIT_ENV} on a tree without .git)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
