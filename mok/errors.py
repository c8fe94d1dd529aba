"""Exceptions of mok. Each message names the tensor (or expert) and what was expected.

mok's errors are its own: ``MokError`` does not derive from te_compat's ``TECompatError``, so
``except TECompatError`` catches what te_compat says about TE (a release without some storage,
no TE installed) and never a layout or view error of mok's. te_compat's errors reach mok's
callers unchanged. Each mok error is also the builtin a caller would expect: a bad layout or
weight is a ``ValueError``, a refresh that cannot run a ``RuntimeError``.
"""

from __future__ import annotations


class MokError(Exception):
    """Base class of mok's errors."""


class LayoutError(MokError, ValueError):
    """Scales or an output buffer do not fit the MXFP8 layout conversion."""


class ExpertWeightError(MokError, ValueError):
    """Expert weights do not match what the caller declared (shape, count, kind, storage)."""


class RefreshError(MokError, RuntimeError):
    """A cached view cannot be refreshed in place (storage moved, or nothing to refresh)."""
