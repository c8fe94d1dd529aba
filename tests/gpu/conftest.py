from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `nox -s live` on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(skip)
