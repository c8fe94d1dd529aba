"""Launches of the layout kernel for Nsight Compute to compare (issue 15; GPU): why is the
per-expert path slower than the grouped one over the SAME memory?

    PYTHONPATH=$PWD ncu --kernel-name mxfp8_swizzle_jobs --launch-skip 5 --launch-count 5 --set full \
        --csv --page details python benchmarks/probe_kernel_ncu.py > ncu.csv

Each case is launched twice (warm-up, then the launch to profile), in this order (arguments:
the case numbers to run, default all):
rowwise E=256 2048x7168 grouped, the same as per-expert slices (one pointer-table launch over
slices of the grouped buffers: bench_swizzle.py's ``g:slices``), rowwise E=256 2080x7200
(padded) grouped, columnwise E=256 2080x7200 (padded) grouped, rowwise E=32 4096x7168 grouped.
Each result is checked against the torch reference, so a profile of a wrong kernel shows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from bench_swizzle import _out, logical  # this folder is on sys.path when run as a script

import mok
from mok.layout import swizzle_reference


def cases(dev: torch.device) -> list[tuple[str, Callable[[], None], list[tuple[torch.Tensor, torch.Tensor]]]]:
    found = []
    for kind, e, m, k, sliced in [
        ("rowwise", 256, 2048, 7168, False),
        ("rowwise", 256, 2048, 7168, True),
        ("rowwise", 256, 2080, 7200, False),
        ("columnwise", 256, 2080, 7200, False),
        ("rowwise", 32, 4096, 7168, False),
    ]:
        batch, _ = logical(kind, e, m, k, dev)
        out = _out(batch)
        name = f"{kind} E={e} {m}x{k} {'slices' if sliced else 'grouped'}"
        if sliced:
            srcs, outs = list(batch.unbind(0)), list(torch.split(out, out.shape[0] // e))
            run = lambda s=srcs, o=outs: mok.swizzle_mxfp8_scales_many(s, outs=o)  # noqa: E731
        else:
            run = lambda b=batch, o=out: mok.swizzle_mxfp8_scales(b, out=o)  # noqa: E731
        found.append((name, run, [(batch, out)]))
    return found


def main() -> None:
    dev = torch.device("cuda")
    only = sys.argv[1:]  # case numbers to run (default: all)
    for i, (name, run, pairs) in enumerate(cases(dev)):
        if only and str(i) not in only:
            continue
        run()  # warm-up (compiles, uploads the table)
        run()  # the launch to profile
        torch.cuda.synchronize()
        for src, out in pairs:
            if not torch.equal(out, swizzle_reference(src, torch.empty_like(out))):
                raise SystemExit(f"{name}: the kernel's output differs from the reference")
        print(f"launched twice: {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
