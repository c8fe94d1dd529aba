"""Benchmark BF16 -> MXFP8 quantisation of expert weights on a GPU (mok.kernels.quantize), in one run.

    python benchmarks/bench_quantize.py --out results.json [--runs 5] [--repeats 20] [--experts 32 256]
    python benchmarks/bench_quantize.py --dry-run          # CPU, tiny shapes, the torch reference
    python benchmarks/bench_quantize.py --other OLD.cu     # also another version of the kernel

Cases: E experts of [2048, 7168] and [7168, 2048] BF16 (Megatron-like fc1/fc2 shapes), grouped
``[E, R, C]``. Every case is set up once, then timed ``--runs`` times with the cases interleaved;
each timing is the median of ``--repeats`` calls (CUDA events). Per case the JSON has every run,
the median of the runs and their spread ([min, max]).

Columns (``g:`` = replay of a captured CUDA graph; others eager, as a refresh calls them):
  g:copy      torch copy_ moving as many bytes as the quantisation does: (BF16 read + FP8 payloads
              and scales written) / 2 bytes copied, so read + written bytes are the same (ceiling)
  g:fused     one QuantizeLaunch: both payloads and both scale layouts (grouped source)
  fused       the same launch, eager
  g:fused/exp the same over E per-expert tensors (device pointer table), one launch
  g:mok 2     mok's two steps: the same kernel writing logical scales, then mok's swizzle kernel
              converting both scale matrices to the layout (one launch each)
  g:other     --other's kernel source (another commit's mxfp8_quantize.cu, compiled with this
              commit's ABI macros and headers) on the same arguments and grid (every version of
              the kernel converts every tile under any grid); its output must equal g:fused's
  g:fused/mbN the kernel bounded for N resident blocks an SM (--min-blocks N), its own grid
  TE q        TE's MXFP8Quantizer(rowwise, columnwise).update_quantized on the [E*R, C] weight
  TE q+swz    the same, then TE's multi_tensor_swizzle_scales_for_gemm_ of its scales (two steps)
The TE columns need sm_100 or later: on sm_90 TE's MXFP8 quantizers run and write nothing, so they
are reported as not applicable there. Ratios are against g:copy of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_swizzle import Clock  # this folder is on sys.path when run as a script

import mok
from mok.kernels import quantize as Q
from mok.kernels.jobs import convert_job
from mok.kernels.launch import Launch
from te_compat.geometry import MXFP8

Fn = Callable[[], object]
SHAPES = [(2048, 7168), (7168, 2048)]
DRY = (2, 64, 96)  # --dry-run: E, R, C


@dataclass
class Case:
    name: str
    moved: int  # bytes read + written by the quantisation
    fns: dict[str, Fn] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    runs: list[dict[str, float]] = field(default_factory=list)
    equal: dict[str, bool] = field(default_factory=dict)


def _scale_bytes(out: Q.QuantizeOutputs) -> int:
    return out.row_scales.numel() + out.col_scales.numel()


@dataclass
class Options:
    te: bool
    other: Any = None  # the other source's compiled kernel
    min_blocks: tuple[int, ...] = ()


def _compile_other(path: str) -> Any:
    """``path`` (a version of mxfp8_quantize.cu) compiled for this GPU with this commit's macros
    and headers."""
    from cuda.core import Device

    Device(0).set_current()
    major, minor = torch.cuda.get_device_capability()
    return Q.compile_quantize(f"sm_{major}{minor}", source=Path(path).read_text()).get_kernel(Q.KERNEL_NAME)


def variants(
    case: Case, x: torch.Tensor, out: Q.QuantizeOutputs, fused: Q.QuantizeLaunch, clock: Clock, opts: Options
) -> None:
    """The --other and --min-blocks columns, each checked to write what g:fused writes."""
    columns: dict[str, Fn] = {}
    if opts.other is not None:
        columns["g:other"] = fused.with_kernel(opts.other)
    for n in opts.min_blocks:
        launch = Q.QuantizeLaunch(x, out, config=Q.QuantizeConfig(min_blocks=n))
        case.notes[f"g:fused/mb{n}"] = f"grid {launch.grid}"
        columns[f"g:fused/mb{n}"] = launch
    want = [t.clone() for t in out]
    for name, fn in columns.items():
        for t in out:
            t.view(torch.uint8).fill_(0xFF)
        fn()
        torch.cuda.synchronize()
        case.equal[f"{name} == fused"] = all(
            torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(out, want, strict=True)
        )
        case.fns[name] = clock.graph(fn)


def quantize_case(e: int, r: int, c: int, clock: Clock, opts: Options) -> Case:
    device = clock.device
    x = (torch.randn(e, r, c, device=device) * 0.02).to(torch.bfloat16)
    out = Q.empty_outputs(e, r, c, device)
    moved = x.numel() * 2 + 2 * x.numel() + _scale_bytes(out)
    case = Case(f"E={e} {r}x{c}", moved)
    src, dst = (torch.empty(moved // 2, dtype=torch.uint8, device=device) for _ in range(2))
    case.fns["g:copy"] = clock.graph(lambda: dst.copy_(src))
    fused = Q.prepare(x, out)
    case.fns["g:fused"] = clock.graph(fused)
    case.fns["fused"] = fused
    per_expert = Q.prepare(list(x.unbind(0)), out)
    case.fns["g:fused/exp"] = clock.graph(per_expert)
    logical = Q.QuantizeOutputs(
        out.row_data,
        torch.empty(e, r, c // MXFP8.block, dtype=torch.uint8, device=device),
        out.col_data,
        torch.empty(e, r // MXFP8.block, c, dtype=torch.uint8, device=device),
    )
    fresh = Q.empty_outputs(1, r, c, "meta")
    layouts = logical._replace(  # the two steps' own scale layouts, the payloads shared
        row_scales=torch.empty(
            e * fresh.row_scales.shape[0], *fresh.row_scales.shape[1:], dtype=torch.uint8, device=device
        ),
        col_scales=torch.empty(
            e * fresh.col_scales.shape[0], *fresh.col_scales.shape[1:], dtype=torch.uint8, device=device
        ),
    )
    two = _two_steps(x, logical, layouts)
    case.fns["g:mok 2"] = clock.graph(two)
    _check(case, x, out, layouts)
    if isinstance(fused, Q.QuantizeLaunch):
        variants(case, x, out, fused, clock, opts)
    if opts.te:
        te_columns(case, x, clock)
    return case


def _two_steps(x: torch.Tensor, logical: Q.QuantizeOutputs, layouts: Q.QuantizeOutputs) -> Fn:
    """mok's quantize-then-swizzle: the kernel writing logical scales, then one swizzle launch."""
    quantize = Q.prepare(x, logical, swizzled=False)
    rows, cols = logical.row_scales, logical.col_scales.transpose(1, 2)
    if x.is_cuda:
        swizzle: Fn = Launch([convert_job(rows, layouts.row_scales), convert_job(cols, layouts.col_scales)], x.device)
    else:

        def swizzle() -> None:
            mok.swizzle_mxfp8_scales(rows, out=layouts.row_scales)
            mok.swizzle_mxfp8_scales(cols, out=layouts.col_scales)

    kept = (logical, layouts)  # a Launch holds addresses only: its buffers must outlive it

    def both() -> None:
        assert kept
        quantize()
        swizzle()

    return both


def _check(case: Case, x: torch.Tensor, out: Q.QuantizeOutputs, layouts: Q.QuantizeOutputs) -> None:
    """The fused launch's scales equal the two steps' (an independent layout path), and its first
    expert equals the torch reference."""
    case.fns["g:fused"]()
    case.fns["g:mok 2"]()
    if x.is_cuda:
        torch.cuda.synchronize()
    case.equal["fused == mok 2"] = torch.equal(out.row_scales, layouts.row_scales) and torch.equal(
        out.col_scales, layouts.col_scales
    )
    want = Q.empty_outputs(1, *x.shape[1:], "cpu")
    Q.run_reference(x[:1].cpu(), want)
    e = x.shape[0]
    case.equal["expert 0 == reference"] = all(
        torch.equal(got.view(e, -1)[0].view(torch.uint8).cpu(), ref.view(-1).view(torch.uint8))
        for got, ref in zip(out, want, strict=True)
    )


def te_columns(case: Case, x: torch.Tensor, clock: Clock) -> None:
    """TE's quantizer into one MXFP8 tensor [E*R, C], alone and followed by TE's swizzle."""
    try:
        import transformer_engine.pytorch  # noqa: F401
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    except Exception as exc:
        case.notes["TE q"] = case.notes["TE q+swz"] = f"TE not importable ({type(exc).__name__})"
        return
    if x.device.type != "cuda" or torch.cuda.get_device_capability() < (10, 0):
        case.notes["TE q"] = case.notes["TE q+swz"] = (
            "not applicable: TE's MXFP8 quantizers write nothing before sm_100"
        )
        return
    e, r, c = x.shape
    flat = x.view(e * r, c)
    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=True)
    tensor = quantizer.make_empty((e * r, c), dtype=torch.bfloat16, device=x.device)
    saved = dict(vars(tensor))
    _try(case, "TE q", lambda: lambda: quantizer.update_quantized(flat, tensor))
    swizzle = getattr(tex, "multi_tensor_swizzle_scales_for_gemm_", None)
    if swizzle is None:
        case.notes["TE q+swz"] = "this TE has no multi_tensor_swizzle_scales_for_gemm_"
        return

    def both() -> None:
        vars(tensor).update(saved)  # TE's swizzle replaces the scales in place: start each call afresh
        quantizer.update_quantized(flat, tensor)
        swizzle([tensor], True, True)

    _try(case, "TE q+swz", lambda: both)


def _try(case: Case, column: str, make: Callable[[], Fn]) -> None:
    """Add ``column`` if its call works once; otherwise record why not."""
    try:
        fn = make()
        fn()
        case.fns[column] = fn
    except Exception as exc:
        case.notes[column] = f"{type(exc).__name__}: {str(exc)[:120]}"


def one_run(cases: list[Case], clock: Clock) -> None:
    for case in cases:
        case.runs.append({name: clock.time(fn) for name, fn in case.fns.items()})


def summary(case: Case) -> dict[str, Any]:
    names = list(case.runs[0])
    median = {n: statistics.median(run[n] for run in case.runs) for n in names}
    spread = {n: [min(run[n] for run in case.runs), max(run[n] for run in case.runs)] for n in names}
    copy = median["g:copy"]
    return {
        "case": case.name,
        "bytes_moved": case.moved,
        "median_us": median,
        "spread_us": spread,
        "ratio_to_copy": {n: median[n] / copy for n in names},
        "copy_GBps": case.moved / copy / 1e3,
        "runs": case.runs,
        "notes": case.notes,
        "equal": case.equal,
    }


COLUMNS = ["g:copy", "g:fused", "fused", "g:fused/exp", "g:mok 2", "g:other", "TE q", "TE q+swz"]


def print_table(rows: list[dict[str, Any]]) -> None:
    print("median of the runs, microseconds (x the same-run graph copy of the same bytes)")
    extra = sorted({c for row in rows for c in row["median_us"]} - set(COLUMNS))
    columns = COLUMNS + extra
    print(f"{'case':20s} " + " ".join(f"{c:>18s}" for c in columns) + "  checks")
    for row in rows:
        cells = []
        for c in columns:
            m = row["median_us"].get(c)
            cells.append("n/a" if m is None else f"{m:.0f} ({row['ratio_to_copy'][c]:.2f}x)")
        checks = ",".join(f"{k}:{'yes' if v else 'NO'}" for k, v in row["equal"].items())
        print(f"{row['case']:20s} " + " ".join(f"{c:>18s}" for c in cells) + f"  {checks}")
    for row in rows:
        for column, why in row["notes"].items():
            print(f"{row['case']}: {column}: {why}")


def meta(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    found: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "runs": args.runs,
        "repeats": args.repeats,
        "experts": args.experts,
        "dry_run": args.dry_run,
        "kernel": dict(Q.QuantizeConfig().macros()),
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
    parser.add_argument("--experts", type=int, nargs="*", default=[32, 256])
    parser.add_argument("--out", help="write the JSON results here")
    parser.add_argument("--no-te", action="store_true", help="skip TE's quantizer")
    parser.add_argument("--other", help="another mxfp8_quantize.cu to time beside this one (g:other)")
    parser.add_argument("--min-blocks", type=int, nargs="*", default=[], help="also the kernel bounded for N blocks")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, the torch reference")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    clock = Clock(device, 3 if args.dry_run else args.repeats)
    started = time.perf_counter()
    sizes = [DRY] if args.dry_run else [(e, r, c) for e in args.experts for r, c in SHAPES]
    opts = Options(not args.no_te, _compile_other(args.other) if args.other else None, tuple(args.min_blocks))
    cases = [quantize_case(e, r, c, clock, opts) for e, r, c in sizes]
    set_up = time.perf_counter() - started
    for _ in range(args.runs):
        one_run(cases, clock)
    rows = [summary(c) for c in cases]
    info = meta(args, device) | {"setup_s": round(set_up, 1), "total_s": round(time.perf_counter() - started, 1)}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"meta": info, "rows": rows}, fh, indent=1)
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print_table(rows)


if __name__ == "__main__":
    main()
