"""The README's support table, generated from matrix/ (releases, records, live runs).

    python -m matrix.support           # print the table
    python -m matrix.support --write   # replace it in README.md

tests/test_matrix.py fails when README.md's table differs from this output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packaging.version import Version

from matrix import provenance
from matrix.check import check_release
from matrix.releases import matrix_releases
from te_compat import table

ROOT = Path(__file__).resolve().parent.parent
LIVE_DIR = Path(__file__).resolve().parent / "live"
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"
SHORT = {
    "float8": "F8",
    "mxfp8": "MX",
    "float8_blockwise": "BW",
    "nvfp4": "FP4",
    "grouped": "G",
    "hybrid": "HY",
    "identity": "ID",
}
UNLISTED = ("plain", "other_quantized")  # not storage kinds of a release


def _record(version: str) -> dict[str, Any] | None:
    path = LIVE_DIR / f"{version}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _live(rec: dict[str, Any] | None, live_cuda: int = 13) -> str:
    """The live-result column: counts and what they ran on, why TE could not load, or not run."""
    if rec is None:
        return "not run" if live_cuda == 13 else f"not run (needs CUDA {live_cuda} libraries; the GPU machine has 13)"
    counts = f"{rec['passed']} passed, {rec['failed']} failed, {rec['skipped']} skipped"
    if rec.get("could_not_load"):
        text = f"could not load on {rec['gpu']}: {rec['could_not_load']['why']}"
        tried = rec["could_not_load"].get("tried") or []
        text += f" (tried: {'; '.join(tried)})" if tried else ""
        return text + (f"; tests without TE: {counts}" if rec["ran"] or rec["skipped"] else "")
    text = f"{counts} on {rec['gpu']}"
    if any("needs a usable Transformer Engine" in why for why in rec["skipped_tests"].values()):
        text += " (TE did not import there; kernel tests only)"
    if rec.get("record_format", 1) >= 2:
        text += _on_which_bytes(rec)
    return text + _selftest(rec.get("selftest"))


def _selftest(found: object) -> str:
    """Records from format 4 hold what `te-compat selftest --json` printed (None: it did not run)."""
    if not isinstance(found, dict) or not isinstance(found.get("checks"), list):
        return ""
    counts = {s: sum(c.get("status") == s for c in found["checks"]) for s in ("passed", "failed", "skipped")}
    verdict = "ok" if found.get("ok") else "FAILED"
    tally = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"; te-compat selftest {verdict}: {tally}"


def live_columns(rec: dict[str, Any] | None, live_cuda: int, now: dict[str, str]) -> str:
    """The live result, date, commit and code columns of one release (``now``: code digests here)."""
    if rec is None:
        return f"{_live(None, live_cuda)} | - | - | -"
    commit = rec["commit"][:10] if rec.get("commit") else "not recorded"
    return f"{_live(rec, live_cuda)} | {rec['date']} | {commit} | {provenance.freshness(rec, ROOT, now).short}"


def _on_which_bytes(rec: dict[str, Any]) -> str:
    """Records from format 2 say what TE was compared on and what the environment lacked."""
    compared = [line for line in rec.get("bytes", {}).values() if not line.startswith("no byte comparison")]
    seeded = "random bytes seeded into TE's buffers" if "random" in rec.get("seeding", "") else rec.get("seeding", "")
    text = f"; {len(compared)} tests compared with TE on {seeded}" if compared else "; no byte comparison with TE"
    notes = [n for n in rec.get("notes", []) if not n.startswith("NVTE_")]
    return text + "".join(f"; {n}" for n in notes)


def support_table() -> str:
    lines = [
        "| TE release | static check | kinds in the table | live result | date | commit | code |",
        "|---|---|---|---|---|---|---|",
    ]
    now = provenance.disk_digests(ROOT, provenance.CODE)
    for rel in matrix_releases():
        problems = check_release(rel.version)
        status = "agrees" if not problems else f"{len(problems)} disagreement(s)"
        if rel.source_from != rel.version:
            status += f" (source of {rel.source_from})"
        kinds = " ".join(SHORT[k.value] for k in table.kinds_in(Version(rel.version)) if k.value not in UNLISTED)
        lines.append(
            f"| {rel.version} | {status} | {kinds} | {live_columns(_record(rel.version), rel.live_cuda, now)} |"
        )
    lines.append("")
    lines.append(
        "Kinds: F8 Float8, MX MXFP8, BW Float8 blockwise, FP4 NVFP4, G grouped, HY hybrid (experimental in "
        "TE), ID identity (high-precision data, a hybrid direction). Static check: `nox -s release` (TE's "
        "source against the table); live result: `nox -s live` on a GPU, or `matrix/gpu_live.sh` on the "
        "offline H200 (records in `matrix/live/`); commit: the one the run's tree came from; code: current "
        "while mok/ and te_compat/ are the code the run had, stale once they change (`nox -s live_status` "
        "lists the commits since)."
    )
    return "\n".join(lines)


def readme_with_table(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{support_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.support", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args(argv)
    if args.write:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_table(readme.read_text()))
        print(f"updated {readme}")
    else:
        print(support_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
