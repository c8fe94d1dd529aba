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
    """A cached view cannot be refreshed in place (another shape or format, a direction TE no
    longer stores, buffers of its own that were freed, nothing to refresh, or a "view" that is
    none, or of the other kind: grouped beside per-expert weights, or the reverse)."""


class StorageFreedError(ExpertWeightError, RefreshError):
    """A tensor the view reads has lost its memory: its storage holds fewer bytes than the tensor
    spans (Megatron-FSDP and torch FSDP2 free unsharded weights with ``resize_(0)`` between
    steps). A new view and a refresh raise it alike, naming the tensor; a view or refresh after
    the next all-gather sees the memory again."""
