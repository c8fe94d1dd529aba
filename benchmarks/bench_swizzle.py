"""Benchmark the MXFP8 scale layout conversion on a GPU; prints a table, writes JSON.

    python benchmarks/bench_swizzle.py [--repeats 50] [--json results.json]

For each case (E experts of M x K weights): the median of ``--repeats`` timed calls (CUDA events,
after warm-up) of
  copy        a device-to-device copy of the same bytes (the ceiling; same run),
  kernel      mok's CUDA kernel over the grouped batch [E, R, C] (one launch),
  kernel/exp  mok's CUDA kernel over E separate per-expert tensors (one launch, pointer table),
  torch       the torch reference over the batch,
  torch/exp   the torch reference one expert at a time,
  TE multi    TE's multi_tensor_swizzle_scales_for_gemm_ (rowwise cases, when TE is importable).
Bytes count read + write of the logical scales. Rowwise cases read [M, K/32]; columnwise cases
read TE's untransposed [M/32, K] buffer as its transpose. "layer" refreshes fc1 and fc2 of a
MoE layer, rowwise and columnwise, in one launch (mok.refresh_layer's job list).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from collections.abc import Callable

import torch

import mok
from mok.kernels import launcher
from mok.layout import roundup
from mok.swizzle import ScaleWork, run_work

ROW_CASES = [(256, 2048, 7168), (32, 4096, 7168), (8, 7168, 2048), (1, 65536, 7168), (256, 2080, 7200)]
COL_CASES = [(256, 2048, 7168), (32, 4096, 7168), (8, 7168, 2048), (256, 2080, 7200)]
LAYER = (256, 2048, 7168)  # E, ffn, hidden: fc1 [E, 2*ffn, hidden], fc2 [E, hidden, ffn]


def timed(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median microseconds of ``fn`` over ``repeats`` calls (CUDA events, after warm-up)."""
    for _ in range(3):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def replayed(fn: Callable[[], object], repeats: int) -> float:
    """Median microseconds of replaying ``fn`` captured in a CUDA graph: device time without the
    host's per-call overhead (how a training step that graphs its refresh pays for it)."""
    fn()  # warm-up outside capture: compiles, uploads descriptor tables
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, repeats)


def padded_scales(experts: int, rows: int, cols: int, pr: int, pc: int) -> torch.Tensor:
    buf = torch.full((experts, pr, pc), 0xFF, dtype=torch.uint8, device="cuda")
    buf[:, :rows, :cols] = torch.randint(0, 255, (experts, rows, cols), dtype=torch.uint8, device="cuda")
    return buf


def te_multi_swizzle(experts: int, m: int, k: int, repeats: int) -> float | str:
    """TE's own multi-tensor swizzle over E real MXFP8 tensors (rowwise), or why it was skipped."""
    try:
        import transformer_engine.pytorch as te  # noqa: F401
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    except Exception as exc:
        return f"n/a ({type(exc).__name__})"
    import te_compat
    from te_compat.probe import resolve

    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    tensors = [quantizer(torch.randn(m, k, dtype=torch.bfloat16, device="cuda")) for _ in range(experts)]
    # TE swizzles in place: it reassigns the scale attribute and sets its flag. Undo that before
    # each call (untimed), through the names te_compat resolves for this release.
    scale_attr = resolve(type(tensors[0]), "rowwise_scale_inv").candidates[0]
    flag_attr = resolve(type(tensors[0]), "scales_swizzled").candidates[0]
    originals = [te_compat.storage_attr(t, "rowwise_scale_inv") for t in tensors]

    def reset() -> None:
        for t, s in zip(tensors, originals, strict=True):
            setattr(t, scale_attr, s)
            setattr(t, flag_attr, False)

    try:
        return timed(lambda: tex.multi_tensor_swizzle_scales_for_gemm_(tensors, True, False), repeats, reset)
    except Exception as exc:
        return f"n/a ({type(exc).__name__}: {str(exc)[:60]})"


def case(kind: str, experts: int, m: int, k: int, repeats: int, with_te: bool) -> dict[str, object]:
    if kind == "rowwise":
        r, c = m, k // 32
        buf = padded_scales(experts, r, c, roundup(r, 128), roundup(c, 4))
        batch = buf[:, :r, :c]
    else:  # TE's columnwise buffer [M/32, K] read as the transpose [K, M/32]
        buf = padded_scales(experts, m // 32, k, roundup(m // 32, 4), roundup(k, 128))
        batch = buf[:, : m // 32, :k].transpose(1, 2)
        r, c = k, m // 32
    out = torch.empty(mok.layout_shape(r, c, experts), dtype=torch.uint8, device="cuda")
    per_expert = [batch[e] for e in range(experts)]
    outs = list(out.chunk(experts, dim=0))
    src = torch.randint(0, 255, (experts * r * c,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2 * experts * r * c
    row: dict[str, object] = {"case": f"{kind} E={experts} {m}x{k}", "bytes": nbytes}
    grouped = lambda: mok.swizzle_mxfp8_scales(batch, out=out, backend="cuda")  # noqa: E731
    separate = lambda: mok.swizzle_mxfp8_scales_many(per_expert, outs=outs, backend="cuda")  # noqa: E731
    row["copy"] = timed(lambda: dst.copy_(src), repeats)
    row["kernel"] = timed(grouped, repeats)
    row["kernel/exp"] = timed(separate, repeats)
    row["g:copy"] = replayed(lambda: dst.copy_(src), repeats)
    row["g:kernel"] = replayed(grouped, repeats)
    row["g:kernel/exp"] = replayed(separate, repeats)
    row["torch"] = timed(lambda: mok.swizzle_mxfp8_scales(batch, out=out, backend="torch"), max(5, repeats // 5))
    row["torch/exp"] = timed(
        lambda: [mok.swizzle_mxfp8_scales(b, out=o, backend="torch") for b, o in zip(per_expert, outs, strict=True)],
        max(3, repeats // 10),
    )
    ref = mok.swizzle_mxfp8_scales(batch, backend="torch")
    mok.swizzle_mxfp8_scales(batch, out=out, backend="cuda")
    row["equal"] = bool(torch.equal(out, ref))
    if with_te and kind == "rowwise":
        row["TE multi"] = te_multi_swizzle(experts, m, k, max(5, repeats // 5))
    return row


def layer(repeats: int) -> dict[str, object]:
    """fc1 and fc2 of one MoE layer, rowwise and columnwise scales of every expert, one launch."""
    experts, ffn, hidden = LAYER
    work = []
    for m, k in ((2 * ffn, hidden), (hidden, ffn)):  # fc1 [2*ffn, hidden], fc2 [hidden, ffn]
        rows = padded_scales(experts, m, k // 32, roundup(m, 128), roundup(k // 32, 4))[:, :m, : k // 32]
        cols = padded_scales(experts, m // 32, k, roundup(m // 32, 4), roundup(k, 128))[:, : m // 32, :k]
        for logical in (rows, cols.transpose(1, 2)):
            out = torch.empty(
                mok.layout_shape(logical.shape[1], logical.shape[2], experts), dtype=torch.uint8, device="cuda"
            )
            work.append(ScaleWork(logical, out))
    total = sum(2 * w.src.numel() for w in work)
    src = torch.randint(0, 255, (total // 2,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    jobs = [launcher.convert_job(w.src, w.dst) for w in work]
    per_expert = [ScaleWork(w.src[e : e + 1], w.dst.chunk(experts, 0)[e]) for w in work for e in range(experts)]
    return {
        "case": f"layer E={experts} fc1+fc2 row+col ({len(jobs)} jobs)",
        "bytes": total,
        "copy": timed(lambda: dst.copy_(src), repeats),
        "kernel": timed(lambda: run_work(work, "cuda"), repeats),
        "kernel/exp": timed(lambda: run_work(per_expert, "cuda"), repeats),
        "g:copy": replayed(lambda: dst.copy_(src), repeats),
        "g:kernel": replayed(lambda: run_work(work, "cuda"), repeats),
        "g:kernel/exp": replayed(lambda: run_work(per_expert, "cuda"), repeats),
    }


SWEEP = [(32, 128), (32, 256), (16, 128), (16, 64), (64, 256)]  # (tiles per unit, threads per block)
SWEEP_CASES = [
    ("rowwise", 256, 2048, 7168),
    ("rowwise", 256, 2080, 7200),
    ("rowwise", 1, 65536, 7168),
    ("columnwise", 256, 2048, 7168),
    ("columnwise", 256, 2080, 7200),
]


def logical_case(kind: str, experts: int, m: int, k: int) -> torch.Tensor:
    if kind == "rowwise":
        return padded_scales(experts, m, k // 32, roundup(m, 128), roundup(k // 32, 4))[:, :m, : k // 32]
    buf = padded_scales(experts, m // 32, k, roundup(m // 32, 4), roundup(k, 128))
    return buf[:, : m // 32, :k].transpose(1, 2)


def sweep(repeats: int) -> list[dict[str, object]]:
    """Graph-replay time of each kernel shape (launcher.configure) on the large cases."""
    rows = []
    for kind, experts, m, k in SWEEP_CASES:
        batch = logical_case(kind, experts, m, k)
        out = torch.empty(mok.layout_shape(batch.shape[1], batch.shape[2], experts), dtype=torch.uint8, device="cuda")
        ref = mok.swizzle_mxfp8_scales(batch, backend="torch")
        src = torch.empty(batch.numel(), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_time = replayed(lambda d=dst, s=src: d.copy_(s), repeats)
        row: dict[str, object] = {"case": f"{kind} E={experts} {m}x{k}", "g:copy": copy_time}
        for tiles, threads in SWEEP:
            launcher.configure(tiles_per_unit=tiles, threads=threads)
            t = replayed(lambda b=batch, o=out: mok.swizzle_mxfp8_scales(b, out=o, backend="cuda"), repeats)
            row[f"{tiles}x{threads}"] = t / copy_time
            row[f"{tiles}x{threads} ok"] = bool(torch.equal(out, ref))
        rows.append(row)
    launcher.configure()
    print("kernel shape sweep: graph-replay time / graph-replay copy of the same bytes (lower is better)")
    print(f"{'case':36s} " + " ".join(f"{f'{a}x{b}':>9s}" for a, b in SWEEP))
    for r in rows:
        cells = [f"{r[f'{a}x{b}']:8.2f}{'' if r[f'{a}x{b} ok'] else '!'}" for a, b in SWEEP]
        print(f"{r['case']:36s} " + " ".join(f"{c:>9s}" for c in cells))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-te", action="store_true", help="skip TE's own swizzle")
    parser.add_argument("--sweep", action="store_true", help="also time every kernel shape (launcher.configure)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "repeats": args.repeats,
    }
    try:
        import te_compat

        meta["te"] = str(te_compat.te_version())
        import cuda.core

        meta["cuda.core"] = cuda.core.__version__
    except Exception:
        pass
    sweep_rows = sweep(args.repeats) if args.sweep else []
    rows = [case("rowwise", *c, args.repeats, not args.no_te) for c in ROW_CASES]
    rows += [case("columnwise", *c, args.repeats, False) for c in COL_CASES]
    rows.append(layer(args.repeats))
    for r in rows:
        r["g:kernel/copy"] = r["g:kernel"] / r["g:copy"]
        r["g:exp/copy"] = r["g:kernel/exp"] / r["g:copy"]
        r["g:GB/s"] = r["bytes"] / (r["g:kernel"] * 1e-6) / 1e9
        for name in ("torch", "torch/exp"):
            if isinstance(r.get(name), float):
                r[f"{name} / g:kernel"] = r[name] / r["g:kernel"]
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    cols = [
        "copy",
        "kernel",
        "kernel/exp",
        "torch",
        "torch/exp",
        "TE multi",
        "g:copy",
        "g:kernel",
        "g:kernel/exp",
        "g:kernel/copy",
        "g:exp/copy",
        "g:GB/s",
    ]
    print(f"{'case':42s} {'MB':>6s} " + " ".join(f"{c:>12s}" for c in cols) + "  equal")
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:12.2f}" if isinstance(v, float) else f"{str(v)[:12]:>12s}")
        print(f"{r['case']:42s} {r['bytes'] / 1e6:6.1f} " + " ".join(cells) + f"  {r.get('equal', '')}")
    print("median microseconds per call (CUDA events); g: = replay of a captured CUDA graph (device time);")
    print("MB = bytes read + written; ratios are against the same-run copy of the same bytes")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows, "sweep": sweep_rows}, fh, indent=1)


if __name__ == "__main__":
    main()
