"""``te_compat.selftest()``: checks of behaviour on this machine, each passed, failed or skipped with why.

``te-compat report`` says what the installed TE offers and ``te-compat verify`` that its source
agrees with the release table; the self-test runs code on this TE build and this device and
compares what comes out. Like the report's sections, the checks come from te_compat itself and
from every installed package that declares some under the entry-point group
``te_compat.selftest`` (mok declares its own; te_compat never imports it).

A check is a named zero-argument callable. It passes by returning (a string it returns is kept as
a note), is skipped by raising :class:`SkipCheck` with the reason, and fails by raising anything
else, its message saying what differed. An entry point names a zero-argument callable that returns
the package's checks: a mapping of name -> check (or an iterable of (name, check) pairs), in the
order they run. A package whose checks cannot be loaded fails one check named after its entry
point.

The result is cached for the process: the checks run once, at the first call (``refresh=True``
runs them again; so does the first call after :func:`te_compat.refresh`). TE, when present, is
imported before the first check, so its import time is not a check's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from packaging.version import Version

from te_compat.caches import on_refresh
from te_compat.device import cuda_device
from te_compat.errors import TECompatError
from te_compat.table import TensorKind, kinds_in
from te_compat.version import release_of, te_import_status, te_status

# Entry points of this group contribute checks: a zero-argument callable returning a mapping of
# name -> zero-argument check (mok.selftest:checks).
SELFTEST_CHECKS = "te_compat.selftest"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

Check = Callable[[], object]


class SkipCheck(Exception):
    """Raised by a check that cannot run on this machine; its message says why (what is missing)."""


@dataclass(frozen=True)
class CheckResult:
    """One check: ``status`` passed, failed or skipped; ``why`` what differed (failed), what is
    missing (skipped), or a note (passed)."""

    name: str
    status: str
    why: str
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "why": self.why, "seconds": round(self.seconds, 4)}


@dataclass(frozen=True)
class SelftestResult:
    """Every check's result, in the order they ran; ``ok``: no check failed."""

    checks: tuple[CheckResult, ...]
    te_version: str | None
    device: str
    seconds: float  # all the checks together (TE's import not included)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == FAILED)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [c.as_dict() for c in self.checks],
            "te_version": self.te_version,
            "device": self.device,
            "seconds": round(self.seconds, 4),
        }

    def summary(self) -> str:
        return (
            f"{self.count(PASSED)} passed, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped "
            f"in {self.seconds:.2f} s (TE {self.te_version or 'absent'}; {self.device})"
        )

    def failures(self) -> str:
        """One line naming every failed check and what differed ("" when none failed)."""
        if self.ok:
            return ""
        return f"{len(self.failed)} check(s) failed: " + "; ".join(f"{c.name}: {c.why}" for c in self.failed)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run_check(name: str, check: Check) -> CheckResult:
    """Run one check and say how it went; never raises (but for KeyboardInterrupt and its kin)."""
    start = time.perf_counter()
    try:
        note = check()
    except SkipCheck as exc:
        return CheckResult(name, SKIPPED, _one_line(str(exc)) or "skipped (no reason given)", _since(start))
    except Exception as exc:
        why = _one_line(str(exc)) or "(no message)"
        return CheckResult(name, FAILED, f"{type(exc).__name__}: {why}", _since(start))
    return CheckResult(name, PASSED, _one_line(note) if isinstance(note, str) else "", _since(start))


def _since(start: float) -> float:
    return time.perf_counter() - start


# --- te_compat's own checks --------------------------------------------------------------------


def _installed() -> Version:
    """The installed TE's release, or SkipCheck where there is none to check."""
    status = te_status()
    if not status.present:
        raise SkipCheck("no Transformer Engine installed")
    if status.version is None:
        raise SkipCheck(f"Transformer Engine's version is unreadable ({status.raw_version!r})")
    return release_of(status.version)


def check_verify() -> str:
    """The installed TE's own source agrees with the release table (te-compat verify)."""
    _installed()
    from te_compat.verify import verify_installed

    try:
        result = verify_installed()
    except TECompatError as exc:  # a source that cannot be read: verify's own exit 2
        raise SkipCheck(f"TE's source cannot be verified: {exc}") from None
    if not result.ok:
        shown = "; ".join(result.problems[:3])
        more = f" (and {len(result.problems) - 3} more)" if len(result.problems) > 3 else ""
        raise AssertionError(f"{result.verdict}: {shown}{more}")
    return result.verdict


def check_te_tensors() -> str:
    """Tensors made by the installed TE's own quantizers are read by te_compat as TE reads them:
    each snapshot's buffers are the very tensors TE's ``get_data_tensors`` returns."""
    release = _installed()
    if not {TensorKind.MXFP8, TensorKind.NVFP4} & set(kinds_in(release)):
        raise SkipCheck(f"TE {release} has no block-scaled tensors (MXFP8 from TE 2.0)")
    status = te_import_status()
    if not status.usable:
        raise SkipCheck(f"Transformer Engine {release} is not usable: {status.reason}")
    device, _, why = cuda_device()
    if device is None:
        raise SkipCheck(f"TE's quantizers allocate on a CUDA device: {why}")
    from te_compat.te_tensors import check_te_tensors as run

    return run(release)


def builtin_checks() -> dict[str, Check]:
    return {"te_compat.verify": check_verify, "te_compat.te_tensors": check_te_tensors}


# --- checks other packages contribute ----------------------------------------------------------


def _failed_load(name: str, why: str) -> tuple[str, Check]:
    def failed() -> None:
        raise RuntimeError(why)

    return name, failed


def _provided(name: str, value: str, load: Callable[[], object]) -> list[tuple[str, Check]]:
    """The checks one entry point provides; a provider that fails to load or to list its checks
    becomes one failing check named after the entry point."""
    try:
        provider = load()
    except Exception as exc:
        return [_failed_load(name, f"loading {value} raised {type(exc).__name__}: {exc}")]
    if not callable(provider):
        return [_failed_load(name, f"{value} is {type(provider).__name__}; expected a callable returning checks")]
    try:
        listed = provider()
    except Exception as exc:
        return [_failed_load(name, f"{value}() raised {type(exc).__name__}: {exc}")]
    pairs: Iterable[Any] = listed.items() if isinstance(listed, Mapping) else listed
    found: list[tuple[str, Check]] = []
    try:
        for pair in pairs:
            check_name, check = pair
            if not callable(check):
                found.append(_failed_load(str(check_name), f"{value}: {check_name!r} is {type(check).__name__}"))
            else:
                found.append((str(check_name), check))
    except (TypeError, ValueError) as exc:
        return [_failed_load(name, f"{value}() returned {type(listed).__name__}; expected a mapping of checks ({exc})")]
    return found


def contributed_checks() -> list[tuple[str, Check]]:
    """(name, check) of every ``te_compat.selftest`` entry point installed, by entry point name."""
    try:
        found = sorted(entry_points(group=SELFTEST_CHECKS), key=lambda ep: (ep.name, ep.value))
    except Exception as exc:
        return [_failed_load(SELFTEST_CHECKS, f"importlib.metadata.entry_points raised {type(exc).__name__}: {exc}")]
    checks: list[tuple[str, Check]] = []
    seen = set()
    for ep in found:
        if (ep.name, ep.value) in seen:  # one package installed twice (editable and on a path): once
            continue
        seen.add((ep.name, ep.value))
        checks += _provided(ep.name, ep.value, ep.load)
    return checks


def _unique(checks: list[tuple[str, Check]]) -> list[tuple[str, Check]]:
    seen: dict[str, int] = {}
    out = []
    for name, check in checks:
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name} ({seen[name]})", check))
    return out


def describe_device() -> str:
    name, cc, why = cuda_device()
    if name is None or cc is None:
        return f"no CUDA device ({why})"
    return f"{name} (compute capability {cc[0]}.{cc[1]})"


def run_selftest(checks: Iterable[tuple[str, Check]] | None = None) -> SelftestResult:
    """Run ``checks`` (default: te_compat's and every installed package's) now, uncached."""
    te_import_status()  # import TE once before timing anything: its import is no check's time
    status = te_status()
    listed = _unique([*builtin_checks().items(), *contributed_checks()] if checks is None else list(checks))
    start = time.perf_counter()
    results = tuple(run_check(name, check) for name, check in listed)
    elapsed = _since(start)
    version = str(status.version) if status.version is not None else status.raw_version
    return SelftestResult(results, version, describe_device(), elapsed)


_lock = threading.Lock()
_cached: list[SelftestResult] = []


def _forget() -> None:
    _cached.clear()


on_refresh(_forget)


def selftest(*, refresh: bool = False) -> SelftestResult:
    """The checks of behaviour on this machine (see the module doc): run once per process, the
    result kept; ``refresh=True`` runs them again. Never raises for a failing check: read
    ``result.ok`` and ``result.failures()``."""
    with _lock:
        if refresh or not _cached:
            result = run_selftest()
            _cached[:] = [result]
        return _cached[0]
