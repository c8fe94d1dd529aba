"""The support table (docs/support.md) and its one-line summary (README.md), both generated from
matrix/ (releases, records, live runs).

    python -m matrix.support           # print the summary and the table
    python -m matrix.support --write   # replace them in docs/support.md and README.md

tests/matrix/test_matrix.py fails when either file differs from this output.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from matrix import provenance
from matrix.check import check_release
from matrix.releases import MatrixRelease, matrix_releases
from te_compat import table

ROOT = Path(__file__).resolve().parent.parent
LIVE_DIR = Path(__file__).resolve().parent / "live"
PAGE = ROOT / "docs" / "support.md"  # the table, between START and END
README = ROOT / "README.md"  # the summary, between SUMMARY_START and SUMMARY_END
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"
SUMMARY_START, SUMMARY_END = "<!-- support-summary:start -->", "<!-- support-summary:end -->"
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


@dataclass(frozen=True)
class Row:
    """One release as the table and the summary see it."""

    release: MatrixRelease
    problems: list[str]  # the static check's disagreements
    record: dict[str, Any] | None  # its live record (matrix/live/V.json), None where it has none
    fresh: provenance.Freshness | None  # that record against the code here


def rows() -> list[Row]:
    """Every matrix release, checked against the table, with its live record and its freshness."""
    now = provenance.disk_digests(ROOT, provenance.CODE)
    found = []
    for rel in matrix_releases():
        rec = _record(rel.version)
        fresh = provenance.freshness(rec, ROOT, now) if rec is not None else None
        found.append(Row(rel, check_release(rel.version), rec, fresh))
    return found


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


def live_columns(
    rec: dict[str, Any] | None, live_cuda: int, now: dict[str, str], fresh: provenance.Freshness | None = None
) -> str:
    """The live result, date, commit and code columns of one release (``now``: code digests here;
    ``fresh``: the record's freshness, when already known)."""
    if rec is None:
        return f"{_live(None, live_cuda)} | - | - | -"
    commit = rec["commit"][:10] if rec.get("commit") else "not recorded"
    fresh = fresh if fresh is not None else provenance.freshness(rec, ROOT, now)
    return f"{_live(rec, live_cuda)} | {rec['date']} | {commit} | {fresh.short}"


def _on_which_bytes(rec: dict[str, Any]) -> str:
    """Records from format 2 say what TE was compared on and what the environment lacked."""
    compared = [line for line in rec.get("bytes", {}).values() if not line.startswith("no byte comparison")]
    seeded = "random bytes seeded into TE's buffers" if "random" in rec.get("seeding", "") else rec.get("seeding", "")
    text = f"; {len(compared)} tests compared with TE on {seeded}" if compared else "; no byte comparison with TE"
    notes = [n for n in rec.get("notes", []) if not n.startswith("NVTE_")]
    return text + "".join(f"; {n}" for n in notes)


def support_table(found: list[Row] | None = None) -> str:
    """The table of every release and its key (``found``: :func:`rows`, computed when not given)."""
    found = rows() if found is None else found
    lines = [
        "| TE release | static check | kinds in the table | live result | date | commit | code |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in found:
        rel = row.release
        status = "agrees" if not row.problems else f"{len(row.problems)} disagreement(s)"
        if rel.source_from != rel.version:
            status += f" (source of {rel.source_from})"
        kinds = " ".join(SHORT[k.value] for k in table.kinds_in(Version(rel.version)) if k.value not in UNLISTED)
        live = live_columns(row.record, rel.live_cuda, {}, row.fresh)
        lines.append(f"| {rel.version} | {status} | {kinds} | {live} |")
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


def support_summary(found: list[Row] | None = None) -> str:
    """README's one line: the static check and the live runs, counted from the same rows as the table."""
    found = rows() if found is None else found
    first, last = found[0].release.version, found[-1].release.version
    disagree = sum(1 for r in found if r.problems)
    static = "all agree with te_compat's table" if not disagree else f"{disagree} disagree with te_compat's table"
    live = [r for r in found if r.release.live_cuda == 13]
    ran = [r for r in live if r.record is not None]
    gpus = sorted({str(r.record["gpu"]) for r in ran if r.record is not None})
    head = f"{len(found)} TE releases, {first} to {last}, checked from source: {static}."
    tail = "Per release: [docs/support.md](docs/support.md)."
    if not ran:
        return f"{head} None of the {len(live)} CUDA-13 releases has run live yet. {tail}"
    count = f"The {len(live)}" if len(ran) == len(live) else f"{len(ran)} of the {len(live)}"
    failed = sum(1 for r in ran if r.record is not None and r.record["failed"])
    unloaded = sum(1 for r in ran if r.record is not None and r.record.get("could_not_load"))
    problems = [f"{failed} with failures"] * bool(failed) + [f"{unloaded} where TE could not load"] * bool(unloaded)
    states = [r.fresh.state for r in ran if r.fresh is not None]
    fresh = f"{states.count('current')} of those records are current with mok/ and te_compat/ here, "
    fresh += f"{states.count('stale')} stale" + (f", {states.count('unknown')} unknown" if "unknown" in states else "")
    return (
        f"{head} {count} CUDA-13 releases ran live on {' and '.join(gpus)}, "
        f"{', '.join(problems) or 'none failed'}; {fresh}. {tail}"
    )


def between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between the lines ``start`` and ``end`` replaced by ``body``."""
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise ValueError(f"no {start} ... {end} in the text")
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def page_with_table(page: str, found: list[Row] | None = None) -> str:
    """docs/support.md's text with the table made again."""
    return between(page, START, END, support_table(found))


def readme_with_summary(readme: str, found: list[Row] | None = None) -> str:
    """README.md's text with the summary line made again."""
    return between(readme, SUMMARY_START, SUMMARY_END, support_summary(found))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.support", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/support.md's table and README.md's line")
    args = parser.parse_args(argv)
    found = rows()
    if args.write:
        page, readme = page_with_table(PAGE.read_text(), found), readme_with_summary(README.read_text(), found)
        PAGE.write_text(page)
        README.write_text(readme)
        print(f"updated {PAGE} and {README}")
    else:
        print(support_summary(found), support_table(found), sep="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
