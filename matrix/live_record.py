"""Record one live run (tests/live and tests/gpu against a real TE on a GPU) in matrix/live/.

    python -m matrix.live_record JUNIT.xml [--out DIR]

Writes ``<DIR>/<TE release>.json``: release, date, GPU, torch, CUDA, pass/fail/skip counts, and
every skip and failure with its reason. Run in the environment that ran the tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

LIVE_DIR = Path(__file__).resolve().parent / "live"


def summarize(junit: Path) -> dict[str, Any]:
    root = ET.parse(junit).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if problem is not None:
            counts["failed"] += 1
            failed[name] = (problem.get("message") or "").split("\n")[0][:300]
        elif skip is not None:
            counts["skipped"] += 1
            skipped[name] = (skip.get("message") or "")[:300]
        else:
            counts["passed"] += 1
    return {**counts, "skipped_tests": skipped, "failed_tests": failed}


def environment() -> dict[str, Any]:
    import torch

    import te_compat

    caps = te_compat.capabilities()
    return {
        "release": caps.te_version,
        "te_source": caps.te_source,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "gpu": caps.cuda_device,
        "compute_capability": caps.compute_capability,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "kernel_backend": caps.kernel_backend,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.live_record", description=__doc__.split("\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--out", type=Path, default=LIVE_DIR)
    args = parser.parse_args(argv)
    record = {**environment(), **summarize(args.junit)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{record['release']}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: {record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
