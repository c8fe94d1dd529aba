"""Exceptions of mok. Each message names the tensor (or expert) and what was expected."""

from __future__ import annotations

from te_compat import TECompatError


class MokError(TECompatError):
    """Base class of mok's errors."""


class LayoutError(MokError, ValueError):
    """Scales or an output buffer do not fit the MXFP8 layout conversion."""


class ExpertWeightError(MokError, ValueError):
    """Expert weights do not match what the caller declared (shape, count, kind, storage)."""


class RefreshError(MokError, RuntimeError):
    """A cached view cannot be refreshed in place (storage moved, or nothing to refresh)."""
