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


def _live(version: str) -> str:
    path = LIVE_DIR / f"{version}.json"
    if not path.exists():
        return "-"
    rec = json.loads(path.read_text())
    text = f"{rec['gpu']} {rec['date']}: {rec['passed']} passed, {rec['failed']} failed, {rec['skipped']} skipped"
    if any("needs a usable Transformer Engine" in why for why in rec["skipped_tests"].values()):
        text += " (TE did not import there; kernel tests only)"
    if rec.get("record_format", 1) >= 2:
        text += _on_which_bytes(rec)
    return text


def _on_which_bytes(rec: dict[str, Any]) -> str:
    """Records from format 2 say what TE was compared on and what the environment lacked."""
    compared = [line for line in rec.get("bytes", {}).values() if not line.startswith("no byte comparison")]
    seeded = "random bytes seeded into TE's buffers" if "random" in rec.get("seeding", "") else rec.get("seeding", "")
    text = f"; {len(compared)} tests compared with TE on {seeded}" if compared else "; no byte comparison with TE"
    notes = [n for n in rec.get("notes", []) if not n.startswith("NVTE_")]
    return text + "".join(f"; {n}" for n in notes)


def support_table() -> str:
    lines = [
        "| TE release | source check | kinds in the table | live run |",
        "|---|---|---|---|",
    ]
    for rel in matrix_releases():
        problems = check_release(rel.version)
        status = "agrees" if not problems else f"{len(problems)} disagreement(s)"
        if rel.source_from != rel.version:
            status += f" (source of {rel.source_from})"
        kinds = " ".join(SHORT[k.value] for k in table.kinds_in(Version(rel.version)) if k.value not in UNLISTED)
        lines.append(f"| {rel.version} | {status} | {kinds} | {_live(rel.version)} |")
    lines.append("")
    lines.append(
        "Kinds: F8 Float8, MX MXFP8, BW Float8 blockwise, FP4 NVFP4, G grouped, HY hybrid (experimental in "
        "TE), ID identity (high-precision data, a hybrid direction). Source check: "
        "`nox -s release`; live run: `nox -s live` on a GPU (records in `matrix/live/`)."
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
