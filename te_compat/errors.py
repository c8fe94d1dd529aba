"""Exceptions of te_compat. Each message says what was expected and what was found."""

from __future__ import annotations


class TECompatError(Exception):
    """Base class of every te_compat error."""


class TENotFoundError(TECompatError, ImportError):
    """Transformer Engine is not installed, or is installed but cannot be imported."""


class TEVersionError(TECompatError):
    """The installed Transformer Engine is older than a feature needs."""


class UnsupportedTensorError(TECompatError, TypeError):
    """The object is not a tensor kind te_compat can read."""


class StorageValueError(UnsupportedTensorError):
    """A storage attribute holds a value of a type TE never stores there (a flag that is not a
    bool, a count that is not an int, a tensor slot holding something else)."""


class UnknownStorageNameError(TECompatError, ValueError):
    """A storage name is neither a TE attribute name nor a logical name of the tensor kind."""


class AmbiguousStorageNameError(TECompatError, ValueError):
    """A TE attribute name stands for different logical storage in different releases."""


class StorageNotFoundError(TECompatError, AttributeError):
    """A storage attribute the release table promises is missing from the object."""


class MissingFeatureError(TECompatError):
    """A capability the caller requires is not available in this process."""
