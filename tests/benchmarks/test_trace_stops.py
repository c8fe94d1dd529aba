"""The path of a view stays short: benchmarks/trace_stops.py's counts (docs/architecture.md
quotes them) within what the one door was built for."""

from __future__ import annotations

from typing import Any

import pytest

from te_compat.testing import installed_release
from tests.benchmark_scripts import benchmark_script

trace_stops = benchmark_script("trace_stops")
MOST = {"a first grouped view": 20, "the mok.weights path": 22, "a refresh of an unchanged grouped view": 9}


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    with installed_release("2.20.2"):
        return {name: trace_stops.trace(call) for name, call in trace_stops.cases().items()}


def test_each_path_makes_few_stops_and_reenters_no_module_often(traced: dict[str, Any]) -> None:
    assert len(traced) == len(MOST)
    for name, found in traced.items():
        most = next(limit for case, limit in MOST.items() if name.startswith(case))
        assert found.stops <= most, f"{name}: {found.stops} stops, expected at most {most}: {' > '.join(found.path)}"
        module, times = found.reentries.most_common(1)[0]
        assert times <= 4, f"{name}: {module} re-entered {times} times, expected at most 4: {' > '.join(found.path)}"


CALLERS = {"mok/split.py", "mok/grouped.py", "mok/layer.py", "mok/export.py", "mok/seams.py", "mok/weights.py"}


def test_the_door_is_entered_once_per_view(traced: dict[str, Any]) -> None:
    """Entered: called from the entry points (the door's readers and pipeline only return to it)."""
    for name, found in traced.items():
        path = found.path
        entries = [i for i, m in enumerate(path) if m == "mok/door.py" and (i == 0 or path[i - 1] in CALLERS)]
        assert len(entries) == 1, f"{name}: entered the door {len(entries)} times: {' > '.join(path)}"


def test_a_stop_is_counted_at_every_module_with_all() -> None:
    with installed_release("2.20.2"):
        call = next(iter(trace_stops.cases().values()))
        everything, path_only = trace_stops.trace(call, None), trace_stops.trace(call)
    assert everything.stops > path_only.stops and set(path_only.path) <= set(everything.path)
    assert "te_compat/probe.py" in everything.path and "te_compat/probe.py" not in path_only.path
