"""``te_compat.selftest()``: checks of behaviour on this machine, each passed, failed or skipped with why.

``te-compat report`` says what the installed TE offers and ``te-compat verify`` that its source
agrees with the release table; the self-test runs code on this TE build and this device and
compares what comes out. Like the report's sections, the checks come from te_compat itself and
from every package that declares some (:mod:`te_compat.providers`): as entry points of the group
``te_compat.selftest`` of its installed distribution, or in a declaration file beside its code
found on sys.path, so that a checkout run from a path gets the checks an install gets (mok
declares its own both ways; te_compat never imports it).

A check is a named zero-argument callable. It passes by returning (a string it returns is kept as
a note), is skipped by raising :class:`SkipCheck` with the reason, and fails by raising anything
else, its message saying what differed. A provider names a zero-argument callable that returns
the package's checks: a mapping of name -> check (or an iterable of (name, check) pairs), in the
order they run. A provider whose checks cannot be loaded fails one check named after it, saying
where it was declared and what loading raised. A result is ok only where no check failed and at
least one passed: skipped checks alone show nothing about this machine.

The result is cached for the process: the checks run once, at the first call (``refresh=True``
runs them again; so does the first call after :func:`te_compat.refresh`). TE, when present, is
imported before the first check, so its import time is not a check's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from te_compat.caches import on_refresh
from te_compat.device import cuda_device
from te_compat.errors import TECompatError, describe
from te_compat.table import TensorKind, kinds_in
from te_compat.version import release_of, te_import_status, te_status

if TYPE_CHECKING:  # te_compat.providers is imported where checks are searched for, not with te_compat
    from te_compat.providers import Provider

# Providers of this group contribute checks: a zero-argument callable returning a mapping of
# name -> zero-argument check (te_compat.providers finds them).
SELFTEST_CHECKS = "te_compat.selftest"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

Check = Callable[[], object]


class SkipCheck(Exception):
    """Raised by a check that cannot run on this machine; its message says why (what is missing)."""


class ProviderError(RuntimeError):
    """Raised by the check that stands for a provider whose checks cannot be listed: which
    provider, where it was declared, and what loading or calling it raised."""


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
class ProviderResult:
    """One package's provider of checks: where it was declared, how many checks it listed, and
    why it listed none (``error``; its failing check says the same)."""

    name: str
    value: str
    origin: str
    checks: int
    error: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        if self.origin == OWN.origin:
            return f"{self.name}: {self.checks}"
        if self.error:
            return f"{self.name}: none, it could not be loaded ({self.value}, declared by {self.origin})"
        return f"{self.name}: {self.checks} ({self.value}, declared by {self.origin})"


# te_compat's own checks, first of the providers a result names
OWN = ProviderResult("te_compat", "te_compat.selfcheck:builtin_checks", "te_compat itself", 0, "")


@dataclass(frozen=True)
class SelftestResult:
    """Every check's result, in the order they ran; ``ok``: no check failed and one passed at least."""

    checks: tuple[CheckResult, ...]
    te_version: str | None
    device: str
    seconds: float  # all the checks together (TE's import not included)
    # where the checks came from: te_compat's own, then each provider found; None: the checks were
    # given, not searched for
    providers: tuple[ProviderResult, ...] | None = None

    @property
    def ok(self) -> bool:
        return not self.failed and self.count(PASSED) > 0

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == FAILED)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        providers = None if self.providers is None else [p.as_dict() for p in self.providers]
        return {
            "ok": self.ok,
            "failures": self.failures(),
            "checks": [c.as_dict() for c in self.checks],
            "providers": providers,
            "te_version": self.te_version,
            "device": self.device,
            "seconds": round(self.seconds, 4),
        }

    def summary(self) -> str:
        return (
            f"{self.count(PASSED)} passed, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped "
            f"in {self.seconds:.2f} s (TE {self.te_version or 'absent'}; {self.device})"
        )

    def verdict(self) -> str:
        """The result in a word: "ok", "FAILED" (a check failed) or "NOT OK" (none failed, none passed)."""
        return "ok" if self.ok else "FAILED" if self.failed else "NOT OK"

    def sources(self) -> str:
        """Where the checks came from: te_compat and each provider, with how many each gave
        ("" where the checks were given, not searched for)."""
        if self.providers is None:
            return ""
        parts = [p.describe() for p in self.providers]
        if all(p.name == OWN.name for p in self.providers):
            from te_compat.providers import where_declared

            parts.append(f"no other package provides checks ({where_declared(SELFTEST_CHECKS)})")
        return "; ".join(parts)

    def failures(self) -> str:
        """One line saying why the result is not ok ("" when it is): every failed check and what
        differed, or, where none failed, that none passed and what was expected."""
        if self.failed:
            return f"{len(self.failed)} check(s) failed: " + "; ".join(f"{c.name}: {c.why}" for c in self.failed)
        if self.ok:
            return ""
        expected = "expected at least one check to pass"
        if not self.checks:
            found = "no checks"
        else:
            shown = "; ".join(f"{c.name}: {c.why}" for c in self.checks[:3])
            more = f"; and {len(self.checks) - 3} more" if len(self.checks) > 3 else ""
            found = f"all {len(self.checks)} skipped ({shown}{more})"
        sources = self.sources()
        return f"no check passed: {expected}; found {found}" + (f"; checks from {sources}" if sources else "")


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
        raise ProviderError(why)

    return name, failed


def _check_name(name: object) -> str:
    """A provider's name for a check: its string, or a description of whatever else it gave."""
    return name if isinstance(name, str) else describe(name)


def _listed(provider: Provider) -> tuple[list[tuple[str, Check]], str]:
    """The checks one provider lists, and why it listed none ("" where it did). A check that is
    not callable fails by its own name."""
    value = provider.value
    try:
        loaded = provider.load()
    except Exception as exc:
        return [], f"loading {value} raised {type(exc).__name__}: {exc}"
    if not callable(loaded):
        return [], f"{value} is {type(loaded).__name__}; expected a callable returning checks"
    try:
        listed = loaded()
    except Exception as exc:
        return [], f"{value}() raised {type(exc).__name__}: {exc}"
    pairs: Iterable[Any] = listed.items() if isinstance(listed, Mapping) else listed
    found: list[tuple[str, Check]] = []
    try:
        for pair in pairs:
            check_name, check = pair
            named = _check_name(check_name)
            if not callable(check):
                found.append(_failed_load(named, f"{value}: {named!r} is {type(check).__name__}"))
            else:
                found.append((named, check))
    except (TypeError, ValueError) as exc:
        return [], f"{value}() returned {type(listed).__name__}; expected a mapping of checks ({exc})"
    return found, ""


def _contributed() -> tuple[list[tuple[str, Check]], tuple[ProviderResult, ...]]:
    """The checks every provider of ``te_compat.selftest`` lists, and each provider's outcome. One
    that lists none (it cannot be loaded, or returns no mapping) fails one check named after it,
    saying where it was declared."""
    from te_compat import providers

    checks: list[tuple[str, Check]] = []
    outcomes = []
    for provider in providers.find(SELFTEST_CHECKS):
        listed, error = _listed(provider)
        if error:
            where = f"provider {provider.name} of {SELFTEST_CHECKS}, declared by {provider.origin}"
            listed = [_failed_load(provider.name, f"{where}: {error}")]
        checks += listed
        count = 0 if error else len(listed)
        outcomes.append(ProviderResult(provider.name, provider.value, provider.origin, count, error))
    return checks, tuple(outcomes)


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
    """Run ``checks`` (default: te_compat's and every provider's) now, uncached."""
    te_import_status()  # import TE once before timing anything: its import is no check's time
    status = te_status()
    providers: tuple[ProviderResult, ...] | None = None
    if checks is None:
        own = builtin_checks()
        contributed, found = _contributed()
        providers = (dataclasses.replace(OWN, checks=len(own)), *found)
        listed = _unique([*own.items(), *contributed])
    else:
        listed = _unique(list(checks))
    start = time.perf_counter()
    results = tuple(run_check(name, check) for name, check in listed)
    elapsed = _since(start)
    version = str(status.version) if status.version is not None else status.raw_version
    return SelftestResult(results, version, describe_device(), elapsed, providers)


_lock = threading.Lock()
_cached: list[SelftestResult] = []


def _forget() -> None:
    _cached.clear()


on_refresh(_forget)


def selftest(*, refresh: bool = False) -> SelftestResult:
    """The checks of behaviour on this machine (see the module doc): run once per process, the
    result kept; ``refresh=True`` runs them again. Never raises for a failing check: read
    ``result.ok`` and ``result.failures()``."""
    if not isinstance(refresh, bool):
        raise TypeError(f"selftest: refresh: expected a bool (True or False); found {describe(refresh)}")
    with _lock:
        if refresh or not _cached:
            result = run_selftest()
            _cached[:] = [result]
        return _cached[0]
