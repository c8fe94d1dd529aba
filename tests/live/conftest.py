"""Live tests: a real Transformer Engine on a CUDA device is the oracle. Skipped, with the
reason, where either is missing (`nox -s live`, or matrix/gpu_live.sh on the GPU machine).

Only the ``test_live_*.py`` files are live; the others here (the record writer's) run on CPU.
Each live test gets an ``evidence`` fixture (tests/live/evidence.py) that seeds TE's buffers
and records what every comparison ran on; the session writes it beside the junit XML.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tests.live.evidence import Evidence, evidence_path, merge_worker_evidence, seed_for, worker_path, write_evidence

# single grouped expert weights are opt-in (shared/te-releases/facts.md); read at construction
os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")

_EVIDENCE: dict[str, Evidence] = {}


def _is_live(item: pytest.Item) -> bool:
    return "tests/live/" in str(item.fspath) and item.fspath.basename.startswith("test_live_")


def _why_not_live() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    import te_compat

    caps = te_compat.capabilities()
    if not caps.te_usable:
        return f"needs a usable Transformer Engine: {caps.te_reason}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    live = [i for i in items if _is_live(i)]
    if not live:
        return
    reason = _why_not_live()
    for item in live:
        item.add_marker(pytest.mark.live)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def evidence(request: pytest.FixtureRequest) -> Iterator[Evidence]:
    """Seeds TE's buffers and records the bytes each comparison ran on (see evidence.py)."""
    ev = Evidence(request.node.nodeid, seed_for(request.node.nodeid))
    _EVIDENCE[request.node.nodeid] = ev
    yield ev


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = evidence_path(getattr(session.config.option, "xmlpath", None))
    if path is None:
        return
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if worker is not None:  # a pytest-xdist worker: its part; the controller merges them
        write_evidence(worker_path(path, worker), _EVIDENCE)
    elif session.config.pluginmanager.has_plugin("dsession"):  # the controller of pytest-xdist workers
        merge_worker_evidence(path)
    else:  # also when no live test ran: the file still says whether seeding was on
        write_evidence(path, _EVIDENCE)
