"""One registry of te_compat's caches, so that forgetting what was learnt is one call.

Modules that cache facts about the process (the installed TE, resolved attribute names, the CUDA
device) register a clear function here at import; :func:`refresh` calls them all. Other packages
(mok's cache of layer plans) register theirs too, instead of reaching into private helpers.
"""

from __future__ import annotations

from collections.abc import Callable

from te_compat.errors import describe

_clearers: list[Callable[[], None]] = []


def on_refresh(clear: Callable[[], None]) -> Callable[[], None]:
    """Register ``clear`` to run at every :func:`refresh` (usable as a decorator)."""
    if not callable(clear):  # refused now: called at the next refresh, it would fail far from here
        raise TypeError(f"on_refresh: expected a callable taking no arguments; found {describe(clear)}")
    if clear not in _clearers:
        _clearers.append(clear)
    return clear


def refresh() -> None:
    """Forget every cached fact about the installed TE and device (after installing one in-process)."""
    for clear in tuple(_clearers):
        clear()
