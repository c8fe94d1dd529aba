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


@pytest.fixture(scope="module", params=["compiled", "python"])
def memory_reader(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each of mok's readers of tensors' memory (mok.read.fingerprint) for the module's tests in
    turn: the compiled one (skipped, saying so, where it is not built) and the Python one."""
    from mok.read import fingerprint

    with pytest.MonkeyPatch.context() as patch:
        if request.param == "python":
            patch.setenv(fingerprint.ENV, "python")
        fingerprint.compiled.cache_clear()
        if request.param == "compiled" and fingerprint.compiled() is None:
            pytest.skip("mok's compiled memory reader is not built here (it needs a C compiler at install)")
        yield request.param
    fingerprint.compiled.cache_clear()
