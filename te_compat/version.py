"""Which Transformer Engine is installed, without importing it.

The version comes from ``transformer_engine.__version__`` when TE is already imported, else
from package metadata (``__version__`` is missing before TE 1.5). Releases are compared on
their release segment only: a dev, pre, post or local build of 2.14 (``2.14.0.dev0+5fdd7bb``)
counts as 2.14, because it has 2.14's classes; a fork's ``0.1.0+te2.9.0`` counts as 2.9.0.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache

from packaging.version import InvalidVersion, Version

from te_compat.caches import on_refresh, refresh
from te_compat.errors import TENotFoundError, TEVersionError, describe

# Distributions that carry TE's Python package, in the order they are asked.
DISTRIBUTIONS = (
    "transformer-engine",
    "transformer-engine-cu13",
    "transformer-engine-cu12",
    "transformer-engine-torch",
)
_FORK_LOCAL = re.compile(r"te(\d+(?:\.\d+){1,2})")


@dataclass(frozen=True)
class TEStatus:
    """What is known of the installed TE. ``usable`` is None until an import was tried."""

    version: Version | None
    raw_version: str | None
    source: str | None  # "transformer_engine.__version__" or the distribution name
    usable: bool | None = None
    reason: str = ""

    @property
    def present(self) -> bool:
        return self.version is not None or self.raw_version is not None


def parse_te_version(raw: str) -> Version:
    """Parse a TE version string into the release it stands for (see the module docstring)."""
    if not isinstance(raw, str):
        raise TypeError(f"parse_te_version: expected a version string such as '2.14.1'; found {describe(raw)}")
    try:
        parsed = Version(raw.strip())
    except InvalidVersion as exc:
        raise TEVersionError(
            f"cannot read Transformer Engine version {raw!r}: expected a PEP 440 version "
            "such as '2.14.1' or '2.3.0.dev0+5fdd7bb'"
        ) from exc
    fork = _FORK_LOCAL.search(parsed.local or "")
    if fork:
        return Version(fork.group(1))
    return parsed


def release_of(version: Version) -> Version:
    """The plain release a build stands for: 2.14.0.dev0+abc -> 2.14.0."""
    return _plain_release(version.release)


@functools.lru_cache(maxsize=64)  # asked per quantised view; keyed by the segments as written (2.13 is not 2.13.0 here)
def _plain_release(parts: tuple[int, ...]) -> Version:
    return Version(".".join(map(str, parts)))


def _read_installed() -> tuple[str | None, str | None]:
    module = sys.modules.get("transformer_engine")
    raw = getattr(module, "__version__", None) if module is not None else None
    if isinstance(raw, str):
        return raw, "transformer_engine.__version__"
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist), dist
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        found = importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        found = False
    return (None, "transformer_engine (no version metadata)") if found else (None, None)


@dataclass(eq=False)
class _Pretence:
    """One :func:`pretend_installed` block: what te_status reports inside it, and whether it ended."""

    key: tuple[str | None, str | None]  # (raw version, source)
    ended: bool = False


# The pretend_installed blocks in force, innermost last, per context: a thread or asyncio task
# sees the blocks it entered and those of the context it was started from (asyncio copies it; a
# new thread starts from an empty one). A block that ends, in whatever order or context, is
# marked ended and no longer counts anywhere, so no block can end another's.
_pretended: ContextVar[tuple[_Pretence, ...]] = ContextVar("te_compat_pretended", default=())


@contextmanager
def pretend_installed(raw: str | None, source: str = "te_compat.testing") -> Iterator[None]:
    """Within the block, te_compat treats TE ``raw`` as installed (None: no TE at all).

    ``raw`` is read as package metadata would give it (``"2.20.2"``, a dev build, or a string
    te_compat cannot parse), and ``source`` is reported as where it came from. te_compat's caches
    are cleared (:func:`te_compat.refresh`) on entry and on exit; blocks nest and may end in any
    order (the newest block still open wins). The state is context-local (:mod:`contextvars`):
    other threads keep seeing what they saw. TE itself is neither imported nor changed. This is
    the hook behind ``te_compat.testing.installed_release``: use that one in tests.
    """
    entry = _Pretence((raw, source if raw is not None else None))
    _pretended.set((*_pretended.get(), entry))
    refresh()
    try:
        yield
    finally:
        entry.ended = True
        _pretended.set(tuple(e for e in _pretended.get() if not e.ended))
        refresh()


def _pretence() -> _Pretence | None:
    """The newest block still open in this context, if any."""
    for entry in reversed(_pretended.get()):
        if not entry.ended:
            return entry
    return None


def status_key() -> tuple[str | None, str | None] | None:
    """What identifies the TE te_compat sees in this context, cheaply, for caches that depend on
    it: None for the installed TE, else the pretended (raw version, source)."""
    entries = _pretended.get()
    if not entries:  # the common case, kept fast: resolve() asks on every storage read
        return None
    entry = entries[-1] if not entries[-1].ended else _pretence()
    return None if entry is None else entry.key


def te_status() -> TEStatus:
    """The installed TE (or, within ``te_compat.testing.installed_release``, the pretended one),
    cached; TE is not imported (see :func:`te_import_status`)."""
    entry = _pretence()
    return _installed_status() if entry is None else _status(*entry.key)


@cache
def _installed_status() -> TEStatus:
    return _status(*_read_installed())


@cache
def _status(raw: str | None, source: str | None) -> TEStatus:
    if raw is None:
        if source is None:
            return TEStatus(None, None, None, usable=False, reason="transformer_engine is not installed")
        return TEStatus(None, None, source, reason="transformer_engine is importable but has no version")
    try:
        version = parse_te_version(raw)
    except TEVersionError as exc:
        return TEStatus(None, raw, source, usable=False, reason=str(exc))
    return TEStatus(version, raw, source)


def te_import_status() -> TEStatus:
    """Like :func:`te_status`, after trying ``import transformer_engine.pytorch`` once.

    A TE whose import raises (an OSError from its native loader on a machine without CUDA,
    say) is reported present but unusable, with the reason; nothing is raised.
    """
    status = te_status()
    if not status.present and status.source is None:
        return status
    failure = _import_te()
    if failure is not None:
        return TEStatus(status.version, status.raw_version, status.source, usable=False, reason=failure)
    fresh = te_status()  # the module's own __version__ is now the best source
    return TEStatus(fresh.version, fresh.raw_version, fresh.source, usable=True, reason="imported")


@cache
def _import_te() -> str | None:
    """None once ``import transformer_engine.pytorch`` succeeded, else why it failed (tried once)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # any failure of TE's import makes it unusable, not us
        return f"import transformer_engine.pytorch failed: {type(exc).__name__}: {exc}"
    _installed_status.cache_clear()
    return None


def te_version() -> Version | None:
    """The installed TE release (see the module docstring for dev builds), or None."""
    return te_status().version


def te_min_version(version: str) -> bool:
    """True when TE is installed and its release is at least ``version``.

    Only the release segment counts: a dev build of 2.14 passes ``te_min_version("2.14")``, and
    "2.14" equals "2.14.0". A ``version`` that is not a PEP 440 string raises, TE or not.
    """
    if not isinstance(version, str):
        raise TypeError(f"te_min_version: expected a version string such as '2.14'; found {describe(version)}")
    try:
        wanted = release_of(Version(version))
    except InvalidVersion as exc:
        raise ValueError(f"te_min_version: expected a PEP 440 version such as '2.14'; found {version!r}") from exc
    installed = te_version()
    return installed is not None and release_of(installed) >= wanted


def require_te(min_version: str | None = None, feature: str | None = None) -> Version:
    """Return the installed TE release, or raise an error naming what was found and needed."""
    for name, value, example in (("min_version", min_version, "'2.14'"), ("feature", feature, "'grouped tensors'")):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"require_te: {name}: expected a str such as {example} or None; found {describe(value)}")
    status = te_status()
    what = f" for {feature}" if feature else ""
    need = f" >= {min_version}" if min_version else ""
    if status.version is None:
        found = status.reason or "no transformer_engine"
        raise TENotFoundError(f"Transformer Engine{need} is required{what}; found: {found}")
    if min_version is not None and not te_min_version(min_version):
        raise TEVersionError(
            f"Transformer Engine{need} is required{what}; found {status.raw_version} (from {status.source})"
        )
    return status.version


on_refresh(_installed_status.cache_clear)
on_refresh(_import_te.cache_clear)
