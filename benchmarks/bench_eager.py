"""Host time of one eager conversion call, this checkout against another: what a call through
mok's torch library op (its dispatch, and the checks it runs) costs a user who converts eagerly.

    python benchmarks/bench_eager.py [--baseline DIR] [--runs 5] [--out results.json]

Cases, on CUDA tensors with the kernel backend (CPU tensors with the torch reference where there
is no GPU), each the median host microseconds of a call without synchronisation (the queue is
drained every 64 calls, outside the timed region: bench_host.host_us):
  one matrix    swizzle_mxfp8_scales(s [2048, 224], out=o)
  grouped       swizzle_mxfp8_scales(s [8, 2048, 224], out=o)
  many          swizzle_mxfp8_scales_many(8 x [2048, 224], outs=...)
  allocating    swizzle_mxfp8_scales(s [8, 2048, 224]), a new layout each call
With ``--baseline DIR`` (another commit's packages, e.g. ``git archive COMMIT mok te_compat |
tar -x -C DIR``) each run measures both, one subprocess each, interleaved, and the table shows
the growth in microseconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = ("one matrix", "grouped", "many", "allocating")


def measure(repeats: int) -> dict[str, float]:
    """Host us of each case with the mok found first on sys.path."""
    import torch
    from bench_host import host_us

    import mok

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (8, 2048, 224), dtype=torch.uint8, generator=g).to(device)
    out = mok.swizzle_mxfp8_scales(batch)
    one, one_out = batch[0].clone(), mok.swizzle_mxfp8_scales(batch[0])
    many = list(batch.clone())
    many_outs = [mok.swizzle_mxfp8_scales(m) for m in many]
    calls = {
        "one matrix": lambda: mok.swizzle_mxfp8_scales(one, out=one_out),
        "grouped": lambda: mok.swizzle_mxfp8_scales(batch, out=out),
        "many": lambda: mok.swizzle_mxfp8_scales_many(many, outs=many_outs),
        "allocating": lambda: mok.swizzle_mxfp8_scales(batch),
    }
    return {name: host_us(calls[name], repeats) for name in CASES}


def _child(packages: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(packages), str(HERE)])}
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--measure", str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=packages,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def table(rows: dict[str, dict[str, float]]) -> str:
    head = "| case | " + " | ".join(rows) + (" | growth, us |" if len(rows) == 2 else " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for case in CASES:
        values = [rows[side][case] for side in rows]
        growth = f" {values[0] - values[1]:+.1f} |" if len(values) == 2 else ""
        lines.append(f"| {case} | " + " | ".join(f"{v:.1f}" for v in values) + " |" + growth)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a folder holding another commit's mok and te_compat")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    sides = {"this checkout": HERE.parent, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.runs):
        for side, packages in sides.items():
            runs[side].append(_child(packages, args.repeats))
    medians = {side: {c: statistics.median(r[c] for r in found) for c in CASES} for side, found in runs.items()}
    print(table(medians))
    if args.out:
        meta: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
            "host": platform.node(),
            "python": platform.python_version(),
            "runs": args.runs,
            "repeats": args.repeats,
            "baseline": str(args.baseline) if args.baseline else None,
        }
        args.out.write_text(json.dumps({"meta": meta, "runs": runs, "median": medians}, indent=2))


if __name__ == "__main__":
    main()
