"""`te-compat selftest --json` on a GPU with a real TE: every check that can run here passes, and
what it printed goes into the release's live record (its evidence: matrix/live_record.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.entry_points import ROOT, environ
from tests.live.evidence import Evidence

# checks that need only what every live run has (a CUDA device, cuda.core, a usable 2.x TE)
MUST_RUN = ("te_compat.verify", "mok.layout.spec", "mok.views.fakes", "mok.kernel.swizzle", "mok.kernel.refresh")
MUST_RUN += ("mok.kernel.quantize", "mok.quantize.reference", "mok.quantize.rule", "mok.te.mxfp8_split", "mok.te.bf16")
BUDGET_S = 3.0  # every check together, TE's import not included (the bound on a GPU)


def test_te_compat_selftest_passes_here(evidence: Evidence, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "te_compat", "selftest", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ(tmp_path),
        timeout=600,
    )
    data = json.loads(done.stdout)
    evidence.selftest = data
    for check in data["checks"]:
        evidence.note(f"{check['name']}: {check['status']} in {check['seconds']} s: {check['why']}")
    assert done.returncode == 0 and data["ok"], done.stderr
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert not [n for n in MUST_RUN if status.get(n) != "passed"], {n: status.get(n) for n in MUST_RUN}
    skipped = {c["name"]: c["why"] for c in data["checks"] if c["status"] == "skipped"}
    # what may skip on a GPU with TE: what the release lacks, or what TE does only on 10.x
    allowed = ("has no", "TE 2.", "compute capability", "does not quantise MXFP8 here")
    assert not {n: w for n, w in skipped.items() if not any(a in w for a in allowed)}, skipped
    assert data["seconds"] <= BUDGET_S, f"the checks took {data['seconds']} s; expected at most {BUDGET_S} s"
