"""Live tests: a real Transformer Engine on a CUDA device is the oracle. Skipped, with the
reason, where either is missing (`nox -s live`)."""

from __future__ import annotations

import os

import pytest
import torch

# single grouped expert weights are opt-in (shared/te-releases/facts.md); read at construction
os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")


def _why_not_live() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    import te_compat

    caps = te_compat.capabilities()
    if not caps.te_usable:
        return f"needs a usable Transformer Engine: {caps.te_reason}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    live = [i for i in items if "tests/live/" in str(i.fspath)]
    if not live:
        return
    reason = _why_not_live()
    for item in live:
        item.add_marker(pytest.mark.live)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
