"""This checkout against another commit's code, in one run: bench_swizzle (device time) and
bench_host (host time), each tree's own script over its own packages, rounds interleaved.

    DIR=.baseline; mkdir -p $DIR; git archive COMMIT mok te_compat tests matrix benchmarks | tar -x -C $DIR
    python3 benchmarks/vs_baseline.py --baseline $DIR --host-source te --out vs.json   # GPU machine

Prints, per case and column, this checkout's value over the baseline's, the minimum of the rounds
and the median of the rounds (each round's value is that run's median; the trees alternate which
runs first), and the spread of TE's own calls between the trees (the same code in both, so the
machine's noise in that run): bench_swizzle's graph
columns as ratios to the same-run copy (so a ratio near 1.00 means the same device time per copied
byte), bench_host's microseconds.
``--cpus 2,3`` runs every benchmark process on those CPUs only (Linux): both trees then share
the same cores, whose clocks and caches differ less between runs than the scheduler's choices do.
Writes every run of both trees into one JSON. ``--dry-run`` runs bench_swizzle's CPU check and
bench_host on stand-ins: it checks the script, it measures nothing that matters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SWIZZLE_COLUMNS = ("g:kernel@default", "g:exp@default", "g:kcopy", "g:exp-kcopy", "kernel/exp@default")


def _run(tree: Path, script: str, args: list[str], cpus: set[int] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        # each tree imports its own packages: first on the path, before an installed or PYTHONPATH copy
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))}
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, preexec_fn=pin)
        if done.returncode != 0:
            raise SystemExit(
                f"{tree.name}/{script} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _cpu_set(text: str) -> set[int]:
    """``2,3`` as {2, 3}: CPUs this machine has."""
    try:
        cpus = {int(part) for part in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU numbers joined by commas (2,3); found {text!r}") from None
    available = os.sched_getaffinity(0)
    if not cpus <= available:
        raise argparse.ArgumentTypeError(f"expected CPUs among {sorted(available)}; found {sorted(cpus - available)}")
    return cpus


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


def _per_round(runs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], list[float]]:
    found: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        for key, value in _cells(kind, run).items():
            found.setdefault(key, []).append(value)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the other commit's tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--host-source", default="te", choices=("te", "standins"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", choices=("swizzle", "host"), help="run one of the two benchmarks")
    parser.add_argument("--cpus", type=_cpu_set, help="run every benchmark on these CPUs, e.g. 2,3")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    trees = {"this": HERE, "baseline": args.baseline.resolve()}
    swizzle_args = ["--dry-run"] if args.dry_run else ["--runs", "3", "--shapes", "default"]
    host_args = ["--source", "standins" if args.dry_run else args.host_source]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {"swizzle": [], "host": []} for t in trees}
    kinds = [args.only] if args.only else ["swizzle", "host"]
    scripts = {"swizzle": ("bench_swizzle.py", swizzle_args), "host": ("bench_host.py", host_args)}
    for round_ in range(args.rounds):
        order = list(trees.items())
        for name, tree in order[:: 1 if round_ % 2 == 0 else -1]:  # A B, B A, ...: no tree always first
            for kind in kinds:
                runs[name][kind].append(_run(tree, *scripts[kind], args.cpus))
    lines = [
        "| bench | case | column | this (min) | baseline (min) | this / baseline: min | median of the rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    controls: list[float] = []
    for kind in kinds:
        this, base = _per_round(runs["this"][kind], kind), _per_round(runs["baseline"][kind], kind)
        for key in sorted(this.keys() & base.keys()):
            a, b = min(this[key]), min(base[key])
            med = statistics.median(this[key]) / statistics.median(base[key]) if statistics.median(base[key]) else 0
            lines.append(f"| {kind} | {key[0]} | {key[1]} | {a:.3f} | {b:.3f} | {a / b if b else 0:.3f} | {med:.3f} |")
            if kind == "host" and key[1].startswith("TE ") and med:
                controls.append(med)
    print("\n".join(lines))
    if controls:  # TE's own calls run the same code in both trees
        print(
            f"TE's own calls, the same code in both trees: median of the rounds {min(controls):.3f}-"
            f"{max(controls):.3f} (this / baseline); ratios inside that spread are the machine's, not the code's"
        )
    if args.out:
        cpus = sorted(args.cpus) if args.cpus is not None else None
        args.out.write_text(json.dumps({"baseline": str(args.baseline), "cpus": cpus, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
