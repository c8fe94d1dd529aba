"""This checkout against another commit's code, in one run: bench_swizzle (device time) and
bench_host (host time), each tree's own script over its own packages, rounds interleaved.

    DIR=.baseline; mkdir -p $DIR; git archive COMMIT mok te_compat tests matrix benchmarks | tar -x -C $DIR
    python3 benchmarks/vs_baseline.py --baseline $DIR --host-source te --out vs.json   # GPU machine

Prints, per case and column, this checkout's value over the baseline's (each the minimum over the
rounds of that round's median): bench_swizzle's graph columns as ratios to the same-run copy
(so a ratio near 1.00 means the same device time per copied byte), bench_host's microseconds.
Writes every run of both trees into one JSON. ``--dry-run`` runs bench_swizzle's CPU check and
bench_host on stand-ins: it checks the script, it measures nothing that matters.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SWIZZLE_COLUMNS = ("g:kernel@default", "g:exp@default", "g:kcopy", "g:exp-kcopy", "kernel/exp@default")


def _run(tree: Path, script: str, args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"{tree.name}/{script} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _cells(kind: str, result: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(case, column) -> value: bench_swizzle's graph medians over the same run's copy, and its
    eager medians in us; bench_host's microseconds."""
    cells: dict[tuple[str, str], float] = {}
    for row in result["rows" if kind == "swizzle" else "results"]:
        case = row["case"]
        if kind == "swizzle":
            medians = row.get("median", {})
            copy = medians.get("g:copy")
            for column in SWIZZLE_COLUMNS:
                value = medians.get(column)
                if value is not None and copy:
                    cells[(case, column)] = float(value) / float(copy) if column.startswith("g:") else float(value)
            continue
        for column, value in row.items():
            if isinstance(value, (int, float)) and "plans" not in column:
                cells[(case, column)] = float(value)
    return cells


def _best(runs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], float]:
    best: dict[tuple[str, str], float] = {}
    for run in runs:
        for key, value in _cells(kind, run).items():
            best[key] = min(best.get(key, value), value)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the other commit's tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--host-source", default="te", choices=("te", "standins"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    trees = {"this": HERE, "baseline": args.baseline.resolve()}
    swizzle_args = ["--dry-run"] if args.dry_run else ["--runs", "3", "--shapes", "default"]
    host_args = ["--source", "standins" if args.dry_run else args.host_source]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {"swizzle": [], "host": []} for t in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name]["swizzle"].append(_run(tree, "bench_swizzle.py", swizzle_args))
            runs[name]["host"].append(_run(tree, "bench_host.py", host_args))
    lines = ["| bench | case | column | this | baseline | this / baseline |", "|---|---|---|---|---|---|"]
    for kind in ("swizzle", "host"):
        this, base = _best(runs["this"][kind], kind), _best(runs["baseline"][kind], kind)
        for key in sorted(this.keys() & base.keys()):
            ratio = this[key] / base[key] if base[key] else float("nan")
            lines.append(f"| {kind} | {key[0]} | {key[1]} | {this[key]:.3f} | {base[key]:.3f} | {ratio:.3f} |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"baseline": str(args.baseline), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
