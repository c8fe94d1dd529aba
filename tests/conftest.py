from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from te_compat.testing import installed_release  # noqa: E402


@pytest.fixture
def installed_te() -> Iterator[Callable[..., None]]:
    """Pretend a TE release is installed (as package metadata would say), or none (None), until
    the test ends: ``installed_te("2.20.2")``, ``installed_te("2.11.0", "transformer-engine-cu13")``.
    A later call overrides an earlier one (te_compat.testing.installed_release, nested)."""
    with ExitStack() as stack:

        def pretend(raw: str | None, source: str = "transformer-engine") -> None:
            stack.enter_context(installed_release(raw, source=source))

        yield pretend
