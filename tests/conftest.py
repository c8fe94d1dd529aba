from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import te_compat  # noqa: E402
from te_compat import version as te_version_module  # noqa: E402


@pytest.fixture
def installed_te() -> Iterator[Callable[..., None]]:
    """Pretend a TE release is installed (as package metadata would say), or none (None)."""
    original = te_version_module._read_installed

    def pretend(raw: str | None, source: str = "transformer-engine") -> None:
        te_version_module._read_installed = lambda: (raw, source if raw is not None else None)  # type: ignore[assignment]
        te_compat.refresh()

    yield pretend
    te_version_module._read_installed = original  # type: ignore[assignment]
    te_compat.refresh()
