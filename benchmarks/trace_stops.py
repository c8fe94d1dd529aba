"""The path of a view through mok's modules, traced: which module runs, in order, and how often
control comes back to a module it already left.

    python benchmarks/trace_stops.py            # the table docs/architecture.md quotes
    python benchmarks/trace_stops.py --path     # and each path, module by module

A stop is control entering one of the modules a view passes through on its way (:data:`PATH`:
the entry points, mok.door, mok.seams, the readers, the pipeline, its guard and its work), by a
call into it or a return to it; code of any other module (mok's helpers such as mok.checks and
mok.layout, te_compat, torch) belongs to the stop that called it. A return is a stop at a module
the path already left once.
``--all`` counts every module of mok and te_compat as a stop. The cases run on TE 2.20.2's stand-ins
(te_compat.testing) on the CPU, after one untraced view of other weights of the same kind, so
imports and per-class caches are warm as in a training step, and a case traces what every first
view pays, not what the process's first view pays once.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mok", "te_compat")
PATH = frozenset(
    {
        "mok/split.py",
        "mok/grouped.py",
        "mok/layer.py",
        "mok/export.py",
        "mok/weights.py",
        "mok/seams.py",
        "mok/door.py",
        "mok/read/readers.py",
        "mok/read/reading.py",
        "mok/plan/pipeline.py",
        "mok/plan/guard.py",
        "mok/plan/work.py",
    }
)
E, ROWS, COLUMNS = 4, 256, 512


def module_of(filename: str) -> str | None:
    """``mok/plan/pipeline.py`` for a file of mok or te_compat; None for any other file."""
    path = Path(filename)
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in PACKAGES and (Path(*parts[: i + 1]) / "__init__.py").exists():
            return "/".join(parts[i:])
    return None


class Trace(NamedTuple):
    path: tuple[str, ...]  # the stops, in order
    returns: int  # stops at a module already left
    reentries: Counter[str]  # per module: its returns

    @property
    def stops(self) -> int:
        return len(self.path)


def trace(call: Callable[[], object], stops: frozenset[str] | None = PATH) -> Trace:
    """The stops ``call`` makes (see the module's docstring) at the modules ``stops`` (None: any
    module of mok and te_compat)."""
    path: list[str] = []
    names: dict[str, str | None] = {}

    def where(frame: FrameType | None) -> str | None:
        while frame is not None:  # code of other packages belongs to the mok frame that called it
            filename = frame.f_code.co_filename
            if filename not in names:
                names[filename] = module_of(filename)
            found = names[filename]
            if found is not None:
                return found
            frame = frame.f_back
        return None

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            now = where(frame)
        elif event == "return":
            now = where(frame.f_back)
        else:
            return
        if now is not None and (stops is None or now in stops) and (not path or path[-1] != now):
            path.append(now)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)
    left: set[str] = set()
    reentries: Counter[str] = Counter()
    for i, module in enumerate(path):
        if module in left:
            reentries[module] += 1
        if i + 1 < len(path):
            left.add(module)
    return Trace(tuple(path), sum(reentries.values()), reentries)


def cases() -> dict[str, Callable[[], object]]:
    """Each case's traced call, its weights made (and a first view of other weights taken) here."""
    import mok
    import mok.weights as W
    from te_compat.testing import fake_grouped, fake_mxfp8

    def grouped() -> Any:
        return fake_grouped((E, ROWS, COLUMNS), format="mxfp8", param=True)

    def split() -> list[Any]:
        return [fake_mxfp8((ROWS, COLUMNS), param=True, seed=e) for e in range(E)]

    kw: dict[str, Any] = {"rows": ROWS, "columns": COLUMNS}
    mok.grouped_weight_view(grouped(), num_experts=E, format="mxfp8", **kw)
    W._native_single_grouped_weight_view(grouped(), num_experts=E, use_mxfp8=True, **kw)
    W._native_split_weight_view(split(), use_mxfp8=True, **kw)
    g1, g2, s1 = grouped(), grouped(), split()
    first = mok.grouped_weight_view(g1, num_experts=E, format="mxfp8", **kw)
    mok.grouped_weight_view(g1, num_experts=E, format="mxfp8", cached=first, **kw)  # its guard's checks made
    return {
        "a first grouped view (mok.grouped_weight_view)": lambda: mok.grouped_weight_view(
            g2, num_experts=E, format="mxfp8", **kw
        ),
        "the mok.weights path (_native_split_weight_view)": lambda: W._native_split_weight_view(
            s1, use_mxfp8=True, **kw
        ),
        "a refresh of an unchanged grouped view": lambda: mok.grouped_weight_view(
            g1, num_experts=E, format="mxfp8", cached=first, **kw
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="store_true", help="print each path, module by module")
    parser.add_argument("--all", action="store_true", help="count every module of mok and te_compat as a stop")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from te_compat.testing import installed_release

    with installed_release("2.20.2"):
        traced = {name: trace(call, None if args.all else PATH) for name, call in cases().items()}
    print(f"{'case':52} {'stops':>5} {'returns':>7}  most re-entered")
    for name, found in traced.items():
        top = ", ".join(f"{m} {n}" for m, n in found.reentries.most_common(3)) or "none"
        print(f"{name:52} {found.stops:5} {found.returns:7}  {top}")
        if args.path:
            print("    " + " > ".join(found.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
