"""Where does the per-expert layer launch lose time against the grouped one (issue 15; GPU)?

    PYTHONPATH=$PWD python benchmarks/probe_layer_parts.py [--runs 5] [--shapes 16x128,32x256]

bench_swizzle.py's layer case (E=256, fc1 [4096, 7168] and fc2 [7168, 2048], rowwise and
columnwise scales) cut into its four job kinds, each launched alone, and the whole layer: for each
part the grouped conversion (``g``), the per-expert conversion (``exp``, one pointer-table job), and
the kernel's copy of the per-expert buffers (``exp-kcopy``, the same indirection without the
swizzle), each under every shape, as ratios to a torch copy of the same bytes in the same run.
Runs are interleaved; the table gives the median [min-max]. Every conversion is checked against
the torch reference first.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_swizzle import LAYER, Clock, _launch, _out, layer_parts, use_shape  # this folder is on sys.path

from mok.kernels.jobs import convert_job, copy_job
from mok.layout import swizzle_reference

Pairs = list[tuple[torch.Tensor, torch.Tensor]]


def parts(dev: torch.device) -> dict[str, tuple[Pairs, Pairs, list[torch.Tensor]]]:
    """name -> (grouped pairs, per-expert pairs, per-expert TE buffers)."""
    found: dict[str, tuple[Pairs, Pairs, list[torch.Tensor]]] = {}
    for name, batch, _, experts in layer_parts(*LAYER, dev):
        found[name] = (
            [(batch, _out(batch))],
            [(one, _out(one)) for one, _ in experts],
            [b.view(-1) for _, b in experts],
        )
    grouped, separate, buffers = [], [], []
    for g, s, b in found.values():
        grouped, separate, buffers = grouped + g, separate + s, buffers + b
    found["layer"] = (grouped, separate, buffers)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default="16x128,32x256", help="default and/or TILESxTHREADS, comma-separated")
    args = parser.parse_args()
    dev, shapes = torch.device("cuda"), args.shapes.split(",")
    clock = Clock(dev, args.repeats)
    fns: dict[tuple[str, str], object] = {}
    found = parts(dev)  # kept for the whole run: a graph's replay holds addresses, not tensors
    for name, (grouped, separate, buffers) in found.items():
        nbytes = sum(s.numel() for s, _ in grouped)
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        fns[name, "copy"] = clock.graph(lambda s=src, d=dst: d.copy_(s))
        copies = [torch.empty_like(b) for b in buffers]
        for v in shapes:
            use_shape(v)
            for col, pairs in (("g", grouped), ("exp", separate)):
                run = _launch([convert_job(s, o) for s, o in pairs], dev)
                for _, o in pairs:
                    o.fill_(0xAB)
                run()
                if not all(torch.equal(o, swizzle_reference(s, torch.empty_like(o))) for s, o in pairs):
                    raise SystemExit(f"{name} {col}@{v}: differs from the torch reference")
                fns[name, f"{col}@{v}"] = clock.graph(run)
            kcopy = _launch([copy_job(b, c) for b, c in zip(buffers, copies, strict=True)], dev)
            fns[name, f"exp-kcopy@{v}"] = clock.graph(lambda run=kcopy, keep=(buffers, copies): run())
        use_shape("default")
    runs = [{key: clock.time(fn) for key, fn in fns.items()} for _ in range(args.runs)]  # type: ignore[arg-type]
    cols = [f"{c}@{v}" for v in shapes for c in ("g", "exp", "exp-kcopy")]
    print(f"E, ffn, hidden = {LAYER}; ratio to a torch copy of the same bytes, median [min-max] of {args.runs} runs")
    print(f"{'part':22s} {'copy us':>8s} " + " ".join(f"{c:>26s}" for c in cols))
    for name in dict.fromkeys(n for n, _ in fns):
        copy_us = statistics.median(r[name, "copy"] for r in runs)
        cells = []
        for c in cols:
            ratios = [r[name, c] / r[name, "copy"] for r in runs]
            cells.append(f"{statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        print(f"{name:22s} {copy_us:8.1f} " + " ".join(f"{c:>26s}" for c in cells))


if __name__ == "__main__":
    main()
