"""Exceptions of te_compat. Each message says what was expected and what was found."""

from __future__ import annotations

import enum
import numbers
import sys
from collections.abc import Mapping, Sequence, Set
from pathlib import PurePath
from typing import Any, cast


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


# ------------------------------------------------------------------------------ what was found

_TEXT_LIMIT = 60  # characters of a string, bytes or number shown before "..."
_ITEMS_SHOWN = 3  # items of a list, tuple or dict described one by one
_KEYS_SHOWN = 8  # keys of a dict named
# Values whose repr is short, safe and says what they are. Never a tensor's (TE's MXFP8Tensor
# dequantizes itself to print, and on GPUs without MXFP8 support that raises) nor a container's
# (its repr is the repr of every item).
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)
_LITERAL_CONTAINERS = (list, tuple, set, frozenset)


def _type_name(cls: type) -> str:
    """A builtin's bare name (``list``), any other class as ``module.Class``."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _tensor_text(value: Any) -> str | None:
    """``value`` as "a <class> of shape (...), dtype ..." if it is a torch.Tensor (TE's included),
    read from its metadata only; None for anything else."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    try:
        return f"a {type(value).__name__} of shape {tuple(value.shape)}, dtype {value.dtype}"
    except Exception:  # metadata a broken subclass cannot give: its class still says what it is
        return f"a {_type_name(type(value))} (a torch.Tensor)"


def _plain_text(value: object) -> str | None:
    """The repr of a plain value (None, bool, number, string, dtype, device, enum member, path)
    cut to a readable length; None for anything else, whose repr is never asked for."""
    torch = sys.modules.get("torch")
    safe = isinstance(value, (*_PLAIN, numbers.Number, enum.Enum, PurePath)) or (
        torch is not None and isinstance(value, (torch.dtype, torch.device))
    )
    if not safe:
        return None
    try:
        text = repr(value)
    except Exception:  # a subclass with a broken __repr__: its type still says what it is
        return None
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."


def _literal(value: object, depth: int = 0) -> str | None:
    """A plain value, or a list, tuple or set of them (a shape, a list of shapes or names), as
    Python would print it, built item by item; None for anything else or too long."""
    text = _plain_text(value)
    if text is not None or depth > 2 or (type(value) not in _LITERAL_CONTAINERS and not _is_size(value)):
        return text
    items = [_literal(v, depth + 1) for v in value]  # type: ignore[attr-defined]
    if any(t is None for t in items):
        return None
    inner = ", ".join(cast("list[str]", items))
    if isinstance(value, tuple):
        shown = f"({inner}{',' * (len(items) == 1)})"
    else:
        shown = f"{{{inner}}}" if isinstance(value, Set) else f"[{inner}]"
    return shown if len(shown) <= _TEXT_LIMIT else None


def _is_size(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and type(value) is torch.Size


def _is_sequence(value: object) -> bool:
    return isinstance(value, (Sequence, Set)) and not isinstance(value, (str, bytes, bytearray))


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _item(value: object) -> str:
    """One item of a container: as :func:`describe`, a nested container by type and size only."""
    if _literal(value) is None:
        if isinstance(value, Mapping):
            return f"a {_type_name(type(value))} of {_count(len(value), 'entry', 'entries')}"
        if _is_sequence(value):
            return f"a {_type_name(type(value))} of {_count(len(value), 'item', 'items')}"  # type: ignore[arg-type]
    return describe(value)


def _key(key: object) -> str:
    text = _plain_text(key)
    return text if text is not None else f"<{_type_name(type(key))}>"


def _sequence_text(value: Sequence[object] | Set[object]) -> str:
    items = list(value)
    kind = _type_name(type(value))
    if not items:
        return f"an empty {kind}"
    if isinstance(value, Set):
        parts = sorted({_item(v) for v in items})
        more = "; ..." if len(parts) > _ITEMS_SHOWN else ""
        return f"a {kind} of {_count(len(items), 'item', 'items')} ({'; '.join(parts[:_ITEMS_SHOWN])}{more})"
    parts = [f"[{i}] {_item(v)}" for i, v in enumerate(items[:_ITEMS_SHOWN])]
    more = f"; and {len(items) - _ITEMS_SHOWN} more" if len(items) > _ITEMS_SHOWN else ""
    return f"a {kind} of {_count(len(items), 'item', 'items')} ({'; '.join(parts)}{more})"


def _mapping_text(value: Mapping[object, object]) -> str:
    kind = _type_name(type(value))
    keys = list(value.keys())
    if not keys:
        return f"an empty {kind}"
    named = ", ".join(_key(k) for k in keys[:_KEYS_SHOWN]) + (", ..." if len(keys) > _KEYS_SHOWN else "")
    parts = [f"[{_key(k)}] {_item(value[k])}" for k in keys[:_ITEMS_SHOWN]]
    more = f"; and {len(keys) - _ITEMS_SHOWN} more" if len(keys) > _ITEMS_SHOWN else ""
    return f"a {kind} of {_count(len(keys), 'entry', 'entries')}, keys {named} ({'; '.join(parts)}{more})"


def describe(value: object) -> str:
    """``value`` as an error message's "found ...", without its repr or str.

    A tensor (torch's or TE's) by class, shape and dtype; a list, tuple, set or dict by type,
    length (a dict's keys too) and its first items each described so, with their index or key;
    a plain value (None, bool, number, string, dtype, device, enum member, path) as its short
    repr and type; any other object by its class. The repr of a TE tensor would dequantize it
    (and raise where the GPU cannot), and the repr of a container is that of each item; an
    object's own repr may print its tensors or fail, so it is never asked for.
    """
    tensor = _tensor_text(value)
    if tensor is not None:
        return tensor
    plain = _literal(value)
    if plain is not None:
        return f"{plain} ({type(value).__name__})"
    try:
        if isinstance(value, Mapping):
            return _mapping_text(value)
        if _is_sequence(value):
            return _sequence_text(value)  # type: ignore[arg-type]
    except Exception:  # a container whose len or items fail: its type still says what it is
        pass
    if isinstance(value, type):
        return f"the class {_type_name(value)}"
    return f"an object of class {_type_name(type(value))}"
