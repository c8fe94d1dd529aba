"""Host time of a first per-expert view and of its checked refresh, this checkout or another
commit's packages, on CUDA stand-ins with real launches (no TE needed).

    DIR=$(mktemp -d); git archive COMMIT mok te_compat tests matrix | tar -x -C $DIR
    python3 benchmarks/probe_host_vs_baseline.py $DIR      # the other commit
    python3 benchmarks/probe_host_vs_baseline.py $PWD      # this checkout

Each prints one line: per E, the median host microseconds of a first view (20 calls) and of a
checked refresh (200 calls; the queue drained every 16 calls, outside the timed region). The
stand-ins are each tree's own (tests/te_objects), TE 2.20.2's MXFP8Tensor Parameters of
2048x7168. Run the two alternately, several times: the machine's noise is larger than a run's.
"""

import statistics
import sys
import time

root = sys.argv[1]
sys.path.insert(0, root)

import types  # noqa: E402

import torch  # noqa: E402

# te_compat reads the installed TE's version off an imported transformer_engine first: a module of
# that name stands for TE 2.20.2 in either tree (an older one predates te_compat.testing)
sys.modules["transformer_engine"] = types.SimpleNamespace(__version__="2.20.2")  # type: ignore[assignment]

import mok  # noqa: E402
from tests import te_objects as T  # noqa: E402

R, C = 2048, 7168


def med(fn, n):
    fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
        if i % 16 == 15:
            torch.cuda.synchronize()
    return statistics.median(ts)


out = []
for E in (8, 32, 256):
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, device="cuda") for e in range(E)]
    first = med(lambda ps=ps: mok.split_weight_view(ps, rows=R, columns=C, use_mxfp8=True), 20)
    v = mok.split_weight_view(ps, rows=R, columns=C, use_mxfp8=True)
    ref = med(lambda ps=ps, v=v: mok.split_weight_view(ps, rows=R, columns=C, use_mxfp8=True, cached=v), 200)
    out.append(f"E={E} first {first:.0f} refresh {ref:.1f}")
print(root, " | ".join(out))
