"""Benchmark the MXFP8 scale layout conversion on a GPU, under each launch shape asked for, in one run.

    python benchmarks/bench_swizzle.py --out results.json [--runs 5] [--repeats 20] [--shapes default,16x128]
    python benchmarks/bench_swizzle.py --dry-run          # CPU, tiny shapes, torch backend: checks the script

Public API only: mok.swizzle_mxfp8_scales / swizzle_mxfp8_scales_many and mok.kernels' job API
(jobs.convert_job, jobs.copy_job, launch.Launch); a shape is chosen as users do, through
MOK_KERNEL_SHAPE (read afresh for each shape). Every case is set
up once (buffers, CUDA graphs per shape), then timed ``--runs`` times with the cases interleaved;
each timing is the median of ``--repeats`` calls (CUDA events). Per case the JSON has every run
(``runs``), the median of the runs (``median``) and their spread (``spread``: [min, max]).

Columns (``g:`` = replay of a captured CUDA graph, device time; others eager, as users call it):
  g:copy         torch copy_ of the same logical bytes (the ceiling; same run)
  g:kcopy        the kernel's own copy path over the source buffer it reads (the TE-padded
                 grouped buffer): a copy with the same loads, the measured limit of that access
                 pattern
  g:slices       the per-expert path (pointer table) over slices of the grouped buffers, first
                 shape: the same memory as g:kernel, the same indirection as g:exp
  g:exp-copy     torch's multi-tensor copy (_foreach_copy_) of each expert's own TE-padded buffer:
                 a copy of the per-expert pattern (separate allocations)
  g:exp-kcopy    the kernel's copy path over the same buffers in one launch: one pointer-table
                 copy job, the same indirection as g:exp: the per-expert pattern's limit
  g:kcopy@S, g:exp-kcopy@S  the same two copies under shape S (shapes after the first)
                 (by default a copy-only launch runs at 16 x 128: mok.kernels.jobs.config_for)
  g:kernel@S     shape S over the grouped batch [E, R, C] (one launch); S is ``default`` (each
                 launch's own shape, or MOK_KERNEL_SHAPE as the script found it) or TILESxTHREADS
                 fixed for every launch (--shapes default,32x256)
  g:exp@S        shape S over E separate per-expert tensors (one launch, pointer table)
  kernel/exp@V   the same per-expert call, eager
  TE multi       TE's multi_tensor_swizzle_scales_for_gemm_ over E MXFP8 tensors (eager)
  TE discrete    TE 2.17+ grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights
                 (eager; g:TE discrete its graph replay)
The compat keys ``g:kernel/copy``, ``g:exp/copy`` and ``kernel/exp`` are the first shape's.
The ``inverse`` row (ROW_CASES[0]) times the inverse kernel bringing layouts back into TE's padded
rowwise buffers, in the same columns: ``kernel`` and ``exp`` are the inverse, grouped and per
expert; the copies copy the layout buffers it reads; no TE columns, no ``g:slices``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import mok
from mok.kernels.config import SHAPE_ENV, KernelConfig, launch_shapes
from mok.kernels.jobs import Job, convert_job, copy_job
from mok.kernels.launch import Launch
from mok.layout import swizzle_reference, unswizzle_reference
from mok.plan.work import ScaleWork, run_work
from te_compat.geometry import MXFP8

Fn = Callable[[], object]
ROW_CASES = [(256, 2048, 7168), (32, 4096, 7168), (8, 7168, 2048), (1, 65536, 7168), (256, 2080, 7200)]
COL_CASES = [(256, 2048, 7168), (32, 4096, 7168), (8, 7168, 2048), (256, 2080, 7200)]
LAYER = (256, 2048, 7168)  # E, ffn, hidden: fc1 [2*ffn, hidden], fc2 [hidden, ffn]
DRY = {256: 3, 32: 2, 8: 2, 1: 1}  # --dry-run: experts
STARTING_SHAPE = os.environ.get(SHAPE_ENV)  # the shape "default" stands for


def _sizes(e: int, m: int, k: int, dry: bool) -> tuple[int, int, int]:
    """A case's (E, M, K): as given, or a dry run's tiny ones (padded where the case is)."""
    return (DRY[e], m // 16 + (m % 128), k // 16 + (k % 128)) if dry else (e, m, k)


@dataclass
class Clock:
    """Median microseconds of a call: CUDA events on a GPU, the host clock in a dry run."""

    device: torch.device
    repeats: int

    def time(self, fn: Fn, before: Fn | None = None) -> float:
        cuda = self.device.type == "cuda"
        for _ in range(2):
            (before or (lambda: None))()
            fn()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            if before:
                before()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    def graph(self, fn: Fn) -> Fn:
        """``fn`` captured in a CUDA graph (after one eager call); its replay. A dry run returns fn."""
        fn()
        if self.device.type != "cuda":
            return fn
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        # the replay keeps fn (and every buffer it holds) alive: a graph holds addresses only
        return lambda g=graph, keep=fn: g.replay()


def _padded(e: int, r: int, c: int, pr: int, pc: int, device: torch.device) -> torch.Tensor:
    """TE-style scale buffer [E, pr, pc]: random bytes in [r, c], 0xFF padding."""
    buf = torch.full((e, pr, pc), 0xFF, dtype=torch.uint8, device=device)
    buf[:, :r, :c] = torch.randint(0, 256, (e, r, c), dtype=torch.uint8, device=device)
    return buf


def logical(kind: str, e: int, m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(logical scales [E, R, C], the TE buffer they are cut from: te_compat.geometry's)."""
    d = MXFP8.direction(kind)
    r, c = d.buffer_matrix(m, k)
    buf = _padded(e, r, c, *d.scale_buffer(m, k), device)
    return d.orient(buf[:, :r, :c]), buf


def _launch(jobs: list[Job], device: torch.device) -> Fn:
    """A prepared launch of ``jobs``; a dry run (CPU) calls nothing."""
    if device.type == "cuda":
        return Launch(jobs, device)
    return lambda: None  # a dry run builds the jobs (the part that can fail on the CPU) only


def _out(src: torch.Tensor) -> torch.Tensor:
    return torch.full(
        mok.layout_shape(src.shape[1], src.shape[2], src.shape[0]), 0xAB, dtype=torch.uint8, device=src.device
    )


@dataclass
class Case:
    name: str
    nbytes: int
    fns: dict[str, Fn] = field(default_factory=dict)  # column -> call to time (graph replays included)
    checks: list[tuple[str, Fn, list[tuple[torch.Tensor, torch.Tensor]]]] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # column -> why it is missing
    runs: list[dict[str, float]] = field(default_factory=list)
    equal: dict[str, bool] = field(default_factory=dict)
    inverse: bool = False  # the checks' pairs are (layout, logical output)

    def reference(self, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The torch reference's result for one checked pair, written into ``out``."""
        return unswizzle_reference(src, out) if self.inverse else swizzle_reference(src, out)


def use_shape(spec: str) -> None:
    """Launches prepared from now on take ``spec``: ``default`` (each launch's own shape, or the
    MOK_KERNEL_SHAPE the script started with) or ``TILESxTHREADS`` (e.g. ``32x256``) for every
    launch, set as MOK_KERNEL_SHAPE and read afresh."""
    if spec == "default":
        value = STARTING_SHAPE
    else:
        config = KernelConfig.parse(spec, "x")
        value = f"{config.tiles_per_unit},{config.threads}"
    if value is None:
        os.environ.pop(SHAPE_ENV, None)
    else:
        os.environ[SHAPE_ENV] = value
    launch_shapes.cache_clear()


def _shape_columns(case: Case, clock: Clock, shapes: list[str], grouped: Fn, separate: Fn) -> None:
    for v in shapes:
        use_shape(v)
        case.fns[f"g:kernel@{v}"] = clock.graph(grouped)
        case.fns[f"g:exp@{v}"] = clock.graph(separate)
        # eager: each call plans and launches as a user's does, under shape v (chosen untimed)
        choose = lambda v=v: use_shape(v)  # noqa: E731
        case.fns[f"kernel/exp@{v}"] = _with_reset(lambda: separate(), choose)
        case.fns[f"kernel@{v}"] = _with_reset(lambda: grouped(), choose)
    use_shape("default")


def matrix_case(kind: str, e: int, m: int, k: int, clock: Clock, shapes: list[str], te: bool) -> Case:
    dev = clock.device
    batch, buf = logical(kind, e, m, k, dev)
    separate_te = [logical(kind, 1, m, k, dev) for _ in range(e)]  # separate allocations, like TE's
    per_expert = [view[0] for view, _ in separate_te]
    out, outs = _out(batch), [_out(p.unsqueeze(0)) for p in per_expert]
    backend = "cuda" if dev.type == "cuda" else "torch"
    case = Case(f"{kind} E={e} {m}x{k}", 2 * batch.numel())
    src = torch.randint(0, 256, (batch.numel(),), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    case.fns["g:copy"] = clock.graph(lambda: dst.copy_(src))
    _copy_columns(case, clock, shapes, [buf], [b for _, b in separate_te])
    grouped = lambda: mok.swizzle_mxfp8_scales(batch, out=out, backend=backend)  # noqa: E731
    separate = lambda: mok.swizzle_mxfp8_scales_many(per_expert, outs=outs, backend=backend)  # noqa: E731
    _shape_columns(case, clock, shapes, grouped, separate)
    # the pointer-table path over the grouped buffers (each expert a slice): placement or indirection?
    slices, slice_outs = list(batch.unbind(0)), list(torch.split(out, out.shape[0] // e))
    sliced = lambda: mok.swizzle_mxfp8_scales_many(slices, outs=slice_outs, backend=backend)  # noqa: E731
    case.fns["g:slices"] = clock.graph(sliced)
    pairs = [(batch, out)] + [(p.unsqueeze(0), o) for p, o in zip(per_expert, outs, strict=True)]
    case.checks = [(v, lambda: (grouped(), separate()), pairs) for v in shapes]
    case.checks.append((shapes[0], sliced, [(batch, out)]))
    if te and kind == "rowwise" and dev.type == "cuda":
        te_columns(case, e, m, k, clock)
    return case


def inverse_case(e: int, m: int, k: int, clock: Clock, shapes: list[str]) -> Case:
    """The inverse of the rowwise case: layouts (grouped, and one per expert) back into the logical
    regions of TE's padded buffers, bounded by copies of the layouts it reads."""
    dev = clock.device
    batch, _ = logical("rowwise", e, m, k, dev)
    per_expert = [logical("rowwise", 1, m, k, dev)[0] for _ in range(e)]
    backend = "cuda" if dev.type == "cuda" else "torch"
    layout = mok.swizzle_mxfp8_scales(batch, backend=backend)
    layouts = [mok.swizzle_mxfp8_scales(p, backend=backend) for p in per_expert]
    case = Case(f"inverse rowwise E={e} {m}x{k}", 2 * batch.numel(), inverse=True)
    src = torch.randint(0, 256, (batch.numel(),), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    case.fns["g:copy"] = clock.graph(lambda: dst.copy_(src))
    _copy_columns(case, clock, shapes, [layout], layouts)
    grouped = lambda: run_work([ScaleWork(layout, batch, inverse=True)], backend)  # noqa: E731
    items = [ScaleWork(la, p, inverse=True) for la, p in zip(layouts, per_expert, strict=True)]
    separate = lambda: run_work(items, backend)  # noqa: E731
    _shape_columns(case, clock, shapes, grouped, separate)
    pairs = [(layout, batch)] + [(la, p) for la, p in zip(layouts, per_expert, strict=True)]
    case.checks = [(v, lambda: (grouped(), separate()), pairs) for v in shapes]
    return case


def _copy_columns(
    case: Case, clock: Clock, shapes: list[str], buffers: list[torch.Tensor], expert_buffers: list[torch.Tensor]
) -> None:
    """The copies that bound each pattern: the grouped TE buffers copied by the kernel's copy path
    (``g:kcopy``); each expert's own TE buffer copied by torch's multi-tensor copy
    (``_foreach_copy_``) and by the kernel's copy path (its per-expert copies merge into one
    pointer-table job: the conversion's indirection, without the swizzle). The kernel's copies are
    timed under every shape (``@S``; the first shape's without a suffix), since a shape changes
    them too."""
    targets = [torch.empty_like(b).view(-1) for b in buffers]
    sames = [torch.empty_like(b).view(-1) for b in expert_buffers]
    flat = [b.view(-1) for b in expert_buffers]
    case.fns["g:exp-copy"] = clock.graph(lambda: torch._foreach_copy_(sames, flat))
    for i, v in enumerate(shapes):
        use_shape(v)
        tag = f"@{v}" if i else ""
        kcopy = _launch([copy_job(b.view(-1), t) for b, t in zip(buffers, targets, strict=True)], clock.device)
        ekcopy = _launch([copy_job(b, t) for b, t in zip(flat, sames, strict=True)], clock.device)
        # a graph holds addresses only: the replays keep the buffers alive
        case.fns[f"g:kcopy{tag}"] = clock.graph(lambda run=kcopy, keep=(targets, buffers): run())
        case.fns[f"g:exp-kcopy{tag}"] = clock.graph(lambda run=ekcopy, keep=(sames, flat): run())
    use_shape("default")


def te_columns(case: Case, e: int, m: int, k: int, clock: Clock) -> None:
    """TE's multi-tensor swizzle and TE 2.17+'s discrete-weights swizzle over E real MXFP8 tensors."""
    try:
        import transformer_engine.pytorch  # noqa: F401
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    except Exception as exc:
        case.notes["TE multi"] = case.notes["TE discrete"] = f"TE not importable ({type(exc).__name__})"
        return
    import te_compat

    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    tensors = [quantizer(torch.randn(m, k, dtype=torch.bfloat16, device="cuda")) for _ in range(e)]
    data = [te_compat.storage_attr(t, "rowwise_data") for t in tensors]
    scales = [te_compat.storage_attr(t, "rowwise_scale_inv") for t in tensors]
    # TE's multi-tensor swizzle works in place (new scale tensor, flag set): each timed call starts
    # from the tensors' original Python state, restored untimed.
    saved = [dict(vars(t)) for t in tensors]

    def reset() -> None:
        for t, state in zip(tensors, saved, strict=True):
            vars(t).update(state)

    fn = getattr(tex, "multi_tensor_swizzle_scales_for_gemm_", None)
    if fn is None:
        case.notes["TE multi"] = "this TE has no multi_tensor_swizzle_scales_for_gemm_"
    else:
        _try(case, "TE multi", lambda: (lambda: fn(tensors, True, False), reset))
    discrete = getattr(
        getattr(tex, "grouped_mlp_experimental", None), "swizzle_scales_and_pack_ptrs_for_discrete_weights", None
    )
    if discrete is None:
        case.notes["TE discrete"] = (
            "this TE has no grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights"
        )
        return
    call = lambda: discrete(data, scales, "mxfp8_rowwise", torch.device("cuda"))  # noqa: E731
    _try(case, "TE discrete", lambda: (call, None))
    _try(case, "g:TE discrete", lambda: (clock.graph(call), None))


def _try(case: Case, column: str, make: Callable[[], tuple[Fn, Fn | None]]) -> None:
    """Add ``column`` if its call works once; otherwise record why not."""
    try:
        fn, before = make()
        if before:
            before()
        fn()
        case.fns[column] = fn if before is None else _with_reset(fn, before)
    except Exception as exc:
        case.notes[column] = f"{type(exc).__name__}: {str(exc)[:120]}"


def _with_reset(fn: Fn, before: Fn) -> Fn:
    fn.before = before  # type: ignore[attr-defined]
    return fn


LayerPart = tuple[str, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]


def layer_parts(e: int, ffn: int, hidden: int, device: torch.device) -> list[LayerPart]:
    """The four job kinds of one MoE layer, fc1 [2*ffn, hidden] and fc2 [hidden, ffn], rowwise and
    columnwise: (name, grouped logical scales, their TE buffer, each expert's (scales, TE buffer))."""
    found = []
    for fc, (m, k) in (("fc1", (2 * ffn, hidden)), ("fc2", (hidden, ffn))):
        for kind in ("rowwise", "columnwise"):
            batch, buf = logical(kind, e, m, k, device)
            found.append((f"{fc} {kind}", batch, buf, [logical(kind, 1, m, k, device) for _ in range(e)]))
    return found


def layer_case(clock: Clock, shapes: list[str], dry: bool) -> Case:
    """fc1 and fc2 of one MoE layer, rowwise and columnwise, grouped and per-expert, one launch."""
    dev = clock.device
    e, ffn, hidden = (2, 128, 256) if dry else LAYER
    grouped: list[tuple[torch.Tensor, torch.Tensor]] = []
    separate: list[tuple[torch.Tensor, torch.Tensor]] = []
    buffers, expert_buffers = [], []
    for _, batch, buf, experts in layer_parts(e, ffn, hidden, dev):
        buffers.append(buf)
        grouped.append((batch, _out(batch)))
        separate += [(one, _out(one)) for one, _ in experts]
        expert_buffers += [own for _, own in experts]
    case = Case(f"layer E={e} fc1+fc2 row+col", sum(2 * b.numel() for b, _ in grouped))
    src = torch.randint(0, 256, (case.nbytes // 2,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    case.fns["g:copy"] = clock.graph(lambda: dst.copy_(src))
    _copy_columns(case, clock, shapes, buffers, expert_buffers)
    for v in shapes:
        use_shape(v)
        run_g = _launch([convert_job(s, o) for s, o in grouped], dev)
        run_s = _launch([convert_job(s, o) for s, o in separate], dev)
        case.fns[f"g:kernel@{v}"] = clock.graph(run_g)
        case.fns[f"g:exp@{v}"] = clock.graph(run_s)
        case.checks.append((v, lambda g=run_g, s=run_s: (g(), s()), grouped + separate))
    use_shape("default")
    return case


def check(case: Case, device: torch.device) -> None:
    """Byte identity of every shape's outputs (poisoned first) with the torch reference."""
    for shape, run, pairs in case.checks:
        for _, out in pairs:
            out.fill_(0xAB)
        if device.type == "cuda":
            use_shape(shape)  # for the calls that plan at each call
            run()
            use_shape("default")
            torch.cuda.synchronize()
        else:  # a dry run: the reference against itself, to exercise the comparison
            for s, o in pairs:
                case.reference(s, o)
        same = all(torch.equal(o, case.reference(s, torch.empty_like(o))) for s, o in pairs)
        case.equal[shape] = case.equal.get(shape, True) and same  # a shape may have several checks


def one_run(cases: list[Case], clock: Clock) -> None:
    for case in cases:
        row = {}
        for column, fn in case.fns.items():
            print(f"timing {case.name} {column}", file=sys.stderr, flush=True)
            row[column] = clock.time(fn, getattr(fn, "before", None))
        case.runs.append(row)
    use_shape("default")


def summary(case: Case, shapes: list[str]) -> dict[str, Any]:
    ratios = []
    for run in case.runs:
        r = dict(run)
        for v in shapes:
            for col in (f"g:kernel@{v}", f"g:exp@{v}"):
                r[f"{col}/copy"] = run[col] / run["g:copy"]
                r[f"{col}/kcopy"] = run[col] / run["g:kcopy"]
        r["g:kcopy/copy"] = run["g:kcopy"] / run["g:copy"]
        r["g:exp-copy/copy"] = run["g:exp-copy"] / run["g:copy"]
        if "g:slices" in run:
            r["g:slices/copy"] = run["g:slices"] / run["g:copy"]
        r["g:exp-kcopy/copy"] = run["g:exp-kcopy"] / run["g:copy"]
        for v in shapes[1:]:
            for col in (f"g:kcopy@{v}", f"g:exp-kcopy@{v}"):
                r[f"{col}/copy"] = run[col] / run["g:copy"]
        ratios.append(r)
    keys = list(ratios[0])
    median = {k: statistics.median(r[k] for r in ratios) for k in keys}
    spread = {k: [min(r[k] for r in ratios), max(r[k] for r in ratios)] for k in keys}
    d = shapes[0]
    return {
        "case": case.name,
        "bytes": case.nbytes,
        "g:kernel/copy": median[f"g:kernel@{d}/copy"],
        "g:exp/copy": median[f"g:exp@{d}/copy"],
        "kernel/exp": median.get(f"kernel/exp@{d}"),
        "TE multi": median.get("TE multi"),
        "TE discrete": median.get("TE discrete"),
        "g:TE discrete": median.get("g:TE discrete"),
        "missing": case.notes,
        "equal": case.equal,
        "median": median,
        "spread": spread,
        "runs": ratios,
    }


def print_table(rows: list[dict[str, Any]], shapes: list[str]) -> None:
    cols = ["g:kcopy/copy", "g:exp-copy/copy", "g:exp-kcopy/copy", "g:slices/copy"]
    cols += [f"g:{w}@{v}/copy" for v in shapes[1:] for w in ("kcopy", "exp-kcopy")]
    cols += [f"g:{w}@{v}/copy" for v in shapes for w in ("kernel", "exp")]
    cols += [f"kernel/exp@{v}" for v in shapes] + ["TE multi", "TE discrete", "g:TE discrete"]
    print("median of the runs [min-max] ; ratios against the same-run graph copy of the same bytes; times us")
    print(f"{'case':34s} " + " ".join(f"{c.replace('/copy', ''):>18s}" for c in cols) + "  equal")
    for r in rows:
        cells = []
        for c in cols:
            m, s = r["median"].get(c), r["spread"].get(c)
            cells.append("-" if m is None else f"{m:.2f} [{s[0]:.2f}-{s[1]:.2f}]" if m < 20 else f"{m:.0f}")
        ok = ",".join(f"{v}:{'yes' if r['equal'].get(v) else 'NO'}" for v in shapes)
        print(f"{r['case']:34s} " + " ".join(f"{c:>18s}" for c in cells) + f"  {ok}")


def meta(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    found: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "runs": args.runs,
        "repeats": args.repeats,
        "shapes": args.shapes,
        "dry_run": args.dry_run,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        found.update(
            gpu=props.name, sms=props.multi_processor_count, capability=list(torch.cuda.get_device_capability())
        )
    try:
        import cuda.core

        import te_compat

        found["te"] = str(te_compat.te_version())
        found["cuda.core"] = cuda.core.__version__
    except Exception as exc:
        found["versions_missing"] = repr(exc)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default="default,16x128", help="default and/or TILESxTHREADS, comma-separated")
    parser.add_argument("--out", help="write the JSON results here")
    parser.add_argument("--no-te", action="store_true", help="skip TE's own swizzles")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, torch backend: check the script")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    device = torch.device("cpu" if args.dry_run else "cuda")
    clock = Clock(device, 3 if args.dry_run else args.repeats)
    started = time.perf_counter()
    cases = []
    for kind, sizes in (("rowwise", ROW_CASES), ("columnwise", COL_CASES)):
        for e, m, k in sizes:
            cases.append(matrix_case(kind, *_sizes(e, m, k, args.dry_run), clock, shapes, not args.no_te))
    cases.append(inverse_case(*_sizes(*ROW_CASES[0], args.dry_run), clock, shapes))
    cases.append(layer_case(clock, shapes, args.dry_run))
    for case in cases:
        check(case, device)
    set_up = time.perf_counter() - started
    for _ in range(args.runs):
        one_run(cases, clock)
    rows = [summary(c, shapes) for c in cases]
    info = meta(args, device) | {"setup_s": round(set_up, 1), "total_s": round(time.perf_counter() - started, 1)}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"meta": info, "rows": rows}, fh, indent=1)
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    for r in rows:
        if r["missing"]:
            print(f"{r['case']}: missing {r['missing']}")
    print_table(rows, shapes)


if __name__ == "__main__":
    main()
