"""Host time of mok's views as users call them: a first view, a refresh, a layer refresh.

    python benchmarks/bench_host.py --source standins      # CPU: TE fakes (te_compat.testing)
    python benchmarks/bench_host.py --source te --out r.json   # GPU: a real TE

For E = 8, 32, 256 experts, per-expert Parameters ("split") and one grouped Parameter: the
median host microseconds (``time.perf_counter``, no synchronisation) of
  first view      planning a view from scratch (descriptor table upload included),
  refresh         ``cached=`` refresh of weights whose storage TE did not reassign,
  refresh row     the same with rowwise scales only,
  refresh, mok.weights  the same refresh through the drop-in (mok.weights' ``cached_view=``),
  layer           ``mok.LayerRefresh`` over fc1 and fc2 of the layer (split cases),
  TE-swizzled     a refresh of views over scales TE wrote in the GEMM layout (zero-copy),
  BF16 on the fly first views and refreshes of views of BF16 weights of the same shapes that
                  mok quantises to MXFP8 (split and grouped; the checked refresh's host cost
                  set against the MXFP8 path's).
With a real TE on a GPU it adds, on the same rowwise tensors in the same run, eager time per
call of mok's refresh (checked, and ``run_unchecked``), of TE 2.17+'s
``grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights`` and (latency
only) of TE's ``multi_tensor_swizzle_scales_for_gemm_``, two ways:
  (plain key)     latency: one call, then a synchronisation (host + device time, per call),
  "pipelined"     throughput: calls back to back, then one synchronisation, divided by the
                  calls (host and device overlap: what refreshing layer after layer pays).
On the CPU the stand-ins' conversion work (torch reference) is not run while timing: on a GPU it
is an asynchronous launch, so what is timed there is what a GPU user pays on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mok
import te_compat
from mok import weights
from te_compat.geometry import MXFP8

EXPERTS = (8, 32, 256)
STANDIN_RELEASE = "2.20.2"  # the TE release the CPU stand-ins are fakes of


def host_us(fn: Callable[[], object], repeats: int) -> float:
    """Median host microseconds of ``fn`` (after two warm-up calls)."""
    fn()
    fn()
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
        if torch.cuda.is_available() and i % 64 == 63:
            torch.cuda.synchronize()  # keep the launch queue short; outside the timed region
    return statistics.median(times)


def eager_us(fn: Callable[[], object], calls: int, before: Callable[[], object] | None = None) -> float:
    """Latency: mean microseconds of one call followed by a synchronisation (host time plus the
    device time of what it launched). ``before`` runs untimed ahead of each call."""
    fn()
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(calls):
        if before:
            before()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        total += time.perf_counter() - start
    return total / calls * 1e6


def pipelined_us(fns: Sequence[Callable[[], object]]) -> float:
    """Throughput: microseconds per call of ``fns`` called back to back, then one
    synchronisation. What a training step pays when it refreshes layer after layer: host and
    device work overlap, so a call costs the larger of the two."""
    fns[0]()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / len(fns) * 1e6


@contextlib.contextmanager
def conversion_not_run() -> Iterator[None]:
    """CPU only: skip the torch reference's work so that what is timed is mok's host path."""
    real = mok.plan.work.PreparedWork.run
    mok.plan.work.PreparedWork.run = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        mok.plan.work.PreparedWork.run = real  # type: ignore[method-assign]


# ------------------------------------------------------------------------------ weights


@contextlib.contextmanager
def standins_installed() -> Iterator[None]:
    """CPU: te_compat sees TE STANDIN_RELEASE installed (te_compat.testing), and the stand-ins'
    conversion work is not run (see conversion_not_run)."""
    from te_compat.testing import installed_release

    with installed_release(STANDIN_RELEASE), conversion_not_run():
        yield


def standin_weights(experts: int, rows: int, cols: int, columnwise: bool) -> tuple[list[Any], Any]:
    """Per-expert MXFP8 Parameters and one grouped Parameter (no members), te_compat.testing's
    fakes of TE STANDIN_RELEASE."""
    from te_compat.testing import fake_grouped, fake_mxfp8

    shape, release = (rows, cols), STANDIN_RELEASE
    split = [fake_mxfp8(shape, release=release, seed=e, columnwise=columnwise, param=True) for e in range(experts)]
    grouped = fake_grouped((experts, *shape), release=release, columnwise=columnwise, members=False, param=True)
    return split, grouped


def te_weights(experts: int, rows: int, cols: int, columnwise: bool) -> tuple[list[Any], Any]:
    """Real TE MXFP8 Parameters (one per expert) and, on TE 2.14+, one grouped Parameter."""
    import transformer_engine.pytorch  # noqa: F401  (transformer_engine_torch loads only after it)
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    q = MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=columnwise)
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    split = [torch.nn.Parameter(q(x), requires_grad=False) for _ in range(experts)]
    grouped = None
    try:
        from transformer_engine.pytorch.tensor.grouped_tensor import GroupedTensor

        grouped = GroupedTensor.make_grouped_tensor_with_shapes(
            num_tensors=experts, shapes=[(rows, cols)] * experts, quantizer=q, device="cuda"
        )
    except Exception as exc:  # older TE: no grouped tensors
        print(f"grouped: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    return split, grouped


# ------------------------------------------------------------------------------ cases


def split_case(params: list[Any], rows: int, cols: int, repeats: int) -> dict[str, float]:
    view = mok.split_weight_view(params, rows=rows, columns=cols, format="mxfp8")
    first = host_us(
        lambda: mok.split_weight_view(params, rows=rows, columns=cols, format="mxfp8"), max(5, repeats // 20)
    )
    refresh = host_us(
        lambda: mok.split_weight_view(params, rows=rows, columns=cols, format="mxfp8", cached=view), repeats
    )
    found = {"first view": first, "refresh": refresh, "plans": float(view.refresh_plan.plans)}
    if view.columnwise is not None:  # the drop-in's views hold both directions
        experts = tuple(params)
        routed = weights._native_split_weight_view(experts, rows=rows, columns=cols, use_mxfp8=True)
        found["refresh, mok.weights"] = host_us(
            lambda: weights._native_split_weight_view(
                experts, rows=rows, columns=cols, use_mxfp8=True, cached_view=routed
            ),
            repeats,
        )
    return found


def grouped_case(weight: Any, experts: int, rows: int, cols: int, repeats: int) -> dict[str, float]:
    kw = {"num_experts": experts, "rows": rows, "columns": cols, "format": "mxfp8"}
    view = mok.grouped_weight_view(weight, **kw)
    first = host_us(lambda: mok.grouped_weight_view(weight, **kw), max(5, repeats // 20))
    refresh = host_us(lambda: mok.grouped_weight_view(weight, cached=view, **kw), repeats)
    found = {"first view": first, "refresh": refresh}
    if view.columnwise is not None:  # the drop-in's 5-tuple holds both directions
        upstream = {"num_experts": experts, "rows": rows, "columns": cols, "use_mxfp8": True}  # Megatron's flag
        routed = weights._native_single_grouped_weight_view(weight, **upstream)
        found["refresh, mok.weights"] = host_us(
            lambda: weights._native_single_grouped_weight_view(weight, cached_view=routed, **upstream), repeats
        )
    return found


def bf16_case(experts: int, rows: int, cols: int, device: str, repeats: int) -> dict[str, float]:
    """Host us of views of BF16 weights mok quantises (the master weights of Megatron's
    ``fp8_param=False``): one Parameter per expert, and one grouped ``[E, R, C]`` Parameter."""
    split = [torch.nn.Parameter(torch.randn(rows, cols, dtype=torch.bfloat16, device=device)) for _ in range(experts)]
    grouped = torch.nn.Parameter(torch.randn(experts, rows, cols, dtype=torch.bfloat16, device=device))
    kw = {"rows": rows, "columns": cols, "format": "mxfp8"}
    view = mok.split_weight_view(split, **kw)
    gview = mok.grouped_weight_view(grouped, num_experts=experts, **kw)
    few = max(5, repeats // 20)
    return {
        "split first view, BF16 on the fly": host_us(lambda: mok.split_weight_view(split, **kw), few),
        "split refresh, BF16 on the fly": host_us(lambda: mok.split_weight_view(split, cached=view, **kw), repeats),
        "grouped first view, BF16 on the fly": host_us(
            lambda: mok.grouped_weight_view(grouped, num_experts=experts, **kw), few
        ),
        "grouped refresh, BF16 on the fly": host_us(
            lambda: mok.grouped_weight_view(grouped, num_experts=experts, cached=gview, **kw), repeats
        ),
    }


def layer_case(make: Callable[..., tuple[list[Any], Any]], experts: int, rows: int, cols: int, repeats: int) -> float:
    fc1, _ = make(experts, 2 * rows, cols, True)
    fc2, _ = make(experts, cols, rows, True)
    v1 = mok.split_weight_view(fc1, rows=2 * rows, columns=cols, format="mxfp8")
    v2 = mok.split_weight_view(fc2, rows=cols, columns=rows, format="mxfp8")
    layer = mok.LayerRefresh([(fc1, v1), (fc2, v2)])
    return host_us(layer, repeats)


def swizzled_standins(experts: int, rows: int, cols: int) -> list[Any]:
    """Stand-ins whose rowwise scales TE wrote in the GEMM layout (the 2.12+ flag set)."""
    params, _ = standin_weights(experts, rows, cols, False)
    for p in params:
        p._rowwise_scale_inv = mok.swizzle_mxfp8_scales(p._rowwise_scale_inv[:rows, : cols // MXFP8.block]).view(
            rows, -1
        )
        p._with_gemm_swizzled_scales = True
    return params


def swizzled_te(experts: int, rows: int, cols: int) -> list[Any] | str:
    """Real TE weights re-quantised after te_compat.request_gemm_layout_scales (TE 2.12+)."""
    params, _ = te_weights(experts, rows, cols, False)
    report = te_compat.request_gemm_layout_scales(params)
    if not report.enabled and not report.already_on:
        return f"n/a: {report}"
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    for p in params:
        p.quantize_(x)
    if not te_compat.mxfp8_storage(params[0]).scales_swizzled:
        return "n/a: TE did not set its swizzled flag after re-quantising"
    return params


def swizzled_refresh(params: list[Any] | str, rows: int, cols: int, repeats: int) -> float | str:
    """Host us of a refresh of views over TE-swizzled aligned scales (zero-copy: no kernel work)."""
    if isinstance(params, str):
        return params
    kw = {"rows": rows, "columns": cols, "format": "mxfp8"}
    view = mok.split_weight_view(params, **kw)
    assert view.rowwise.scales_zero_copy
    return host_us(lambda: mok.split_weight_view(params, cached=view, **kw), repeats)


def te_rowwise_peers(params: list[Any], rows: int, cols: int, calls: int) -> dict[str, float | str]:
    """Eager us per call, same rowwise tensors, same run: mok's refresh and TE's two swizzles,
    each as latency (a call, then a synchronisation) and as throughput (calls back to back)."""
    import transformer_engine_torch as tex

    kw = {"rows": rows, "columns": cols, "format": "mxfp8"}
    view = mok.split_weight_view(params, **kw)

    def refresh() -> object:
        return mok.split_weight_view(params, cached=view, **kw)

    out: dict[str, float | str] = {
        "kernel/exp": eager_us(refresh, calls),
        "kernel/exp unchecked": eager_us(view.refresh_plan.run_unchecked, calls),
        "kernel/exp pipelined": pipelined_us([refresh] * calls),
        "kernel/exp unchecked pipelined": pipelined_us([view.refresh_plan.run_unchecked] * calls),
    }
    data = [te_compat.storage_attr(p, "rowwise_data") for p in params]
    scales = [te_compat.storage_attr(p, "rowwise_scale_inv") for p in params]
    discrete = getattr(
        getattr(tex, "grouped_mlp_experimental", None), "swizzle_scales_and_pack_ptrs_for_discrete_weights", None
    )
    if discrete:

        def te_discrete() -> object:
            return discrete(data, scales, "mxfp8_rowwise", torch.device("cuda"))

        out["TE discrete"] = eager_us(te_discrete, calls)
        out["TE discrete pipelined"] = pipelined_us([te_discrete] * calls)
    else:
        out["TE discrete"] = (
            f"n/a: TE {te_compat.te_version()} has no grouped_mlp_experimental discrete swizzle (TE 2.17+)"
        )
    multi = getattr(tex, "multi_tensor_swizzle_scales_for_gemm_", None)
    if multi is None:
        out["TE multi"] = f"n/a: TE {te_compat.te_version()} has no multi_tensor_swizzle_scales_for_gemm_"
        return out
    # TE swizzles in place (reassigns the scales, sets its flag); each call gets fresh unswizzled
    # tensors sharing the same buffers, made untimed by TE's own detach
    fresh = [p.detach() for p in params]

    def reset() -> None:
        fresh[:] = [p.detach() for p in params]

    # latency only: back to back, every call would need fresh tensors made beforehand, and TE's
    # new scale buffers for all of them are then live at once (allocator growth, not the swizzle)
    out["TE multi"] = eager_us(lambda: multi(fresh, True, False), calls, before=reset)
    return out


def run(source: str, repeats: int) -> list[dict[str, Any]]:
    make = standin_weights if source == "standins" else te_weights
    rows, cols = (128, 256) if source == "standins" else (2048, 7168)
    results = []
    guard = standins_installed() if source == "standins" else contextlib.nullcontext()
    with guard:
        for experts in EXPERTS:
            for columnwise in (True, False):
                split, grouped = make(experts, rows, cols, columnwise)
                row: dict[str, Any] = {"case": f"E={experts} {rows}x{cols} {'row+col' if columnwise else 'row'}"}
                row.update({f"split {k}": v for k, v in split_case(split, rows, cols, repeats).items()})
                if grouped is not None:
                    row.update(
                        {f"grouped {k}": v for k, v in grouped_case(grouped, experts, rows, cols, repeats).items()}
                    )
                if columnwise:
                    row["layer refresh"] = layer_case(make, experts, rows // 2, cols, repeats)
                    row.update(bf16_case(experts, rows, cols, "cpu" if source == "standins" else "cuda", repeats))
                else:
                    swz = (
                        swizzled_standins(experts, rows, cols)
                        if source == "standins"
                        else swizzled_te(experts, rows, cols)
                    )
                    row["split refresh, TE-swizzled"] = swizzled_refresh(swz, rows, cols, repeats)
                if not columnwise and source == "te":
                    row.update(te_rowwise_peers(split, rows, cols, max(10, repeats // 10)))
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    keys = [k for k in results[0] if k != "case"] + sorted({k for r in results for k in r} - set(results[0]))
    lines = ["| case | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for r in results:
        cells = [f"{r[k]:.1f}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source", choices=("standins", "te"), default="te" if torch.cuda.is_available() else "standins"
    )
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = run(args.source, args.repeats)
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "te": STANDIN_RELEASE if args.source == "standins" else str(te_compat.te_version()),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "source": args.source,
        "unit": (
            "microseconds of host time per call (median); eager columns: us per call, a synchronisation "
            "after each call, or ('pipelined') one after all calls"
        ),
    }
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
