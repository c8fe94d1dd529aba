"""Reading TE storage off a tensor, a Parameter or ``.data``, without touching its values.

Only plain attribute reads happen here: no TE import, no ``__torch_dispatch__``, no
dequantisation. The attribute a class uses for a logical name is found once per
(class, name, TE release) and cached, so a later probe costs one dict lookup and one getattr.
"""

from __future__ import annotations

import operator
import sys
import warnings
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from packaging.version import Version

from te_compat import table
from te_compat.caches import on_refresh
from te_compat.errors import (
    StorageNotFoundError,
    TECompatError,
    TENotFoundError,
    UnknownStorageNameError,
    UnsupportedTensorError,
    describe,
)
from te_compat.source_facts import PACKAGE
from te_compat.table import StorageRow, TensorKind
from te_compat.version import release_of, status_key, te_status

if TYPE_CHECKING:
    import torch

_MISSING = object()
T = TypeVar("T")


class Resolution(NamedTuple):
    """How one logical name is read off one class under the installed TE."""

    kind: TensorKind
    release: Version
    row: StorageRow | None  # None: the release is newer than the table
    candidates: tuple[str, ...]  # attribute names to try, in order; () = no such storage


class StorageReader(NamedTuple):
    """Every storage value of one class, read by one C-level call.

    ``read(obj)`` returns the values of ``names`` (logical names, in that order) straight off the
    object's attributes (``operator.attrgetter``); it raises AttributeError for an object that
    keeps one of them only on ``.data``. Comparing two reads item by item with ``is`` tells
    whether TE reassigned anything: this is the cheap check behind a refresh of unchanged weights.
    """

    names: tuple[str, ...]
    read: Callable[[object], tuple[Any, ...]]
    # the bare C-level getter for exactly one name (the value itself, no tuple), else None
    read_one: Callable[[object], Any] | None = None


# Resolutions and readers depend on the TE te_compat sees, which a pretend_installed block makes
# context-local: they are cached per status_key too, so contexts that see different TEs never share.
StatusKey = tuple[str | None, str | None] | None
_kind_cache: dict[type, TensorKind | None] = {}
_resolution_cache: dict[tuple[type, str, StatusKey], Resolution] = {}
_warned: set[str] = set()
_reader_cache: dict[tuple[type, tuple[str, ...] | None, StatusKey], StorageReader] = {}


@on_refresh
def clear_caches() -> None:
    _kind_cache.clear()
    _resolution_cache.clear()
    _reader_cache.clear()
    _warned.clear()


def class_path(cls: type) -> str:
    """``module.Class``: how the release table and error messages name a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def is_torch_tensor(cls: type) -> bool:
    """``cls`` is a torch.Tensor subclass; False while torch is not imported (nothing is one then)."""
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(cls, torch.Tensor)


def find_in_lineage(cls: type, by_path: Mapping[str, T]) -> tuple[T, type, bool] | None:
    """(value, class, found by bare name) for the first class of ``cls.__mro__`` that ``by_path``
    (``module.Class`` -> value) names; else the first Transformer Engine class whose bare name
    some entry has (a TE that moved the class to another module; third item True); else None.

    The MRO is the order Python's attribute lookup follows, so a subclass's own entry wins over
    its bases' (the same order :func:`te_compat.source_facts.lineage` gives TE's source).
    """
    mro = cls.__mro__
    for klass in mro:
        found = by_path.get(class_path(klass))
        if found is not None:
            return found, klass, False
    by_name = {path.rsplit(".", 1)[-1]: value for path, value in by_path.items()}
    for klass in mro:
        if klass.__module__.startswith(f"{PACKAGE}.") and klass.__qualname__ in by_name:
            return by_name[klass.__qualname__], klass, True
    return None


def _kind_of_class(cls: type) -> TensorKind | None:
    found = find_in_lineage(cls, table.class_index())
    if found is not None:
        kind, klass, moved = found
        if moved:
            _warn_once(
                f"moved:{class_path(klass)}",
                f"te_compat: {class_path(klass)} is not at any module path the release table "
                f"knows; reading it as {kind} by its class name",
            )
        return kind
    bases = {path for path, _, _ in table.QUANTIZED_BASES}
    if any(class_path(k) in bases for k in cls.__mro__):
        return TensorKind.OTHER_QUANTIZED
    return TensorKind.PLAIN if is_torch_tensor(cls) else None


def tensor_kind(obj: object) -> TensorKind:
    """The storage kind of a tensor, Parameter or ``.data``, from its class hierarchy alone.

    Only classes already imported are looked at (TE is never imported here). A TE quantized
    class the table does not cover is ``OTHER_QUANTIZED``; a non-tensor raises.
    """
    kind = _kind_cache.get(type(obj))  # a class seen before: one lookup (a view asks per expert)
    if kind is None:
        kind = tensor_kind_or_none_of_class(type(obj))
    if kind is None:
        raise UnsupportedTensorError(
            f"expected a torch.Tensor, a torch.nn.Parameter or a Transformer Engine tensor; found {describe(obj)}"
        )
    return kind


def _installed_release(kind: TensorKind, cls: type) -> Version:
    status = te_status()
    if status.version is None:
        raise TENotFoundError(
            f"cannot read the storage of a {kind} tensor ({class_path(cls)}): the release table "
            f"is keyed by TE release, and no Transformer Engine version was found "
            f"({status.reason})"
        )
    return release_of(status.version)


def tensor_kind_of_class(cls: type) -> TensorKind:
    """:func:`tensor_kind` of an instance of ``cls``; raises for a class that is no tensor."""
    kind = tensor_kind_or_none_of_class(cls)
    if kind is None:
        raise UnsupportedTensorError(
            f"expected a torch.Tensor, a torch.nn.Parameter or a Transformer Engine tensor; "
            f"found an object of class {class_path(cls)}"
        )
    return kind


def tensor_kind_or_none_of_class(cls: type) -> TensorKind | None:
    """The kind of an instance of ``cls``, or None for a class that is no tensor (cached)."""
    kind = _kind_cache.get(cls, _MISSING)
    if kind is _MISSING:
        kind = _kind_cache[cls] = _kind_of_class(cls)
    return cast("TensorKind | None", kind)


def tensor_kind_or_none(obj: object) -> TensorKind | None:
    """:func:`tensor_kind`, or None where that raises: for asking whether ``obj`` is a tensor at all."""
    return tensor_kind_or_none_of_class(type(obj))


def resolve(cls: type, logical: str) -> Resolution:
    """Which attribute of ``cls`` holds ``logical`` under the installed TE (cached)."""
    logical = table.name_text(logical, "name")  # a StorageName or a plain string
    key = (cls, logical, status_key())
    found = _resolution_cache.get(key)
    if found is not None:
        return found
    kind = tensor_kind_of_class(cls)
    if kind in (TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED):
        raise UnsupportedTensorError(
            f"expected a Transformer Engine tensor of a kind in the release table "
            f"({', '.join(k.value for k in TensorKind if k not in (TensorKind.PLAIN, TensorKind.OTHER_QUANTIZED))}); "
            f"found {class_path(cls)}, of kind {kind}"
        )
    known = table.logical_names(kind)
    if logical not in known:
        raise UnknownStorageNameError(
            f"{logical!r} is not a storage name of {kind} tensors; expected one of {', '.join(known)}"
        )
    release = _installed_release(kind, cls)
    row = table.row_for(kind, release)
    if row is not None and release <= table.checked_through():
        attr = row.storage.get(logical)
        resolution = Resolution(kind, release, row, (attr,) if attr else ())
    elif release > table.checked_through():
        verified = verified_rows(release).get(kind)
        if verified is not None:
            attr = verified.storage.get(logical)
            resolution = Resolution(kind, release, verified, (attr,) if attr else ())
        else:
            resolution = Resolution(kind, release, row, table.all_names(kind, logical))
    else:
        first = table.rows_for(kind)[0].since
        raise UnsupportedTensorError(
            f"{class_path(cls)} is a {kind} tensor, but the installed Transformer Engine "
            f"{release} predates every {kind} row of the release table (first: TE {first})"
        )
    _resolution_cache[key] = resolution
    return resolution


@cache
def verified_rows(release: Version) -> dict[TensorKind, StorageRow]:
    """For a TE newer than the table: the rows its own source verified (te_compat.verify), by
    kind, with one warning giving the verdict. Empty when it did not verify: every attribute name
    any release used is then probed, newest first."""
    from te_compat.verify import verify_installed

    try:
        verification = verify_installed()
        verdict, ok, used = verification.verdict, verification.ok, set(verification.rows)
    except TECompatError as exc:
        verdict, ok, used = f"its source could not be verified ({exc})", False, set()
    what_next = "" if ok else "; probing every attribute name any release used (details: te-compat verify)"
    warnings.warn(
        f"te_compat: Transformer Engine {release} is newer than the release table (checked through "
        f"{table.CHECKED_THROUGH}): {verdict}{what_next}",
        RuntimeWarning,
        stacklevel=4,
    )
    if not ok:
        return {}
    return {row.kind: row for row in table.ROWS if f"{row.kind} {row.span}" in used}


on_refresh(verified_rows.cache_clear)


def _read(obj: object, resolution: Resolution) -> Any:
    for attr in resolution.candidates:
        value = getattr(obj, attr, _MISSING)
        if value is not _MISSING:
            return value
    return _MISSING


def storage_field(obj: object, name: str) -> Any:
    """Read logical storage ``name`` (a tensor, flag, count or list) off ``obj``.

    Returns None when the installed release has no such storage for the object's kind.
    Looks on the object (a Parameter of a TE class is that class) and then on ``.data``.
    """
    try:
        resolution = resolve(type(obj), name)
    except UnsupportedTensorError:
        tensor_kind(obj)  # an object that is no tensor at all: refused naming the object itself
        raise
    if not resolution.candidates:
        return None
    value = _read(obj, resolution)
    if value is not _MISSING:
        return value
    # .data of a TE Parameter is a new wrapper sharing the same buffers; reading it goes through
    # torch's detach, so it is only the fallback for an attribute the object itself lacks.
    inner = getattr(obj, "data", _MISSING) if is_torch_tensor(type(obj)) else _MISSING
    if inner is not _MISSING and inner is not obj and tensor_kind_of_class(type(inner)) is resolution.kind:
        value = _read(inner, resolve(type(inner), name))
        if value is not _MISSING:
            return value
    row = resolution.row
    where = f"row {row.kind} {row.span}" if row else "every known row (newer than the table)"
    raise StorageNotFoundError(
        f"{class_path(type(obj))} has no attribute {' or '.join(map(repr, resolution.candidates))} "
        f"for {resolution.kind} storage {name!r} (TE {resolution.release}, {where}), "
        f"neither on the object nor on its .data"
    )


def storage_reader(obj: object, names: tuple[str, ...] | None = None) -> StorageReader:
    """The :class:`StorageReader` of ``obj``'s class under the installed TE (cached per class).

    ``names``: the logical names to read (default: every one the kind has). Names the release
    has no storage for are left out. For a TE newer than the table, each name reads the first
    candidate attribute that ``obj`` has.
    """
    cls = type(obj)
    names = None if names is None else table.names_text(names, "names")
    key = (cls, names, status_key())
    found = _reader_cache.get(key)
    if found is not None:
        return found
    kept: list[str] = []
    attrs: list[str] = []
    kind = tensor_kind(obj)  # refuses an object that is no tensor, naming it
    for name in names if names is not None else table.logical_names(kind):
        candidates = resolve(cls, name).candidates
        present = [a for a in candidates if hasattr(obj, a)] or list(candidates[:1])
        if present:
            kept.append(str(name))
            attrs.append(present[0])
    one = operator.attrgetter(attrs[0]) if len(attrs) == 1 else None
    reader = _reader_cache[key] = StorageReader(tuple(kept), _tuple_getter(attrs), one)
    return reader


def _tuple_getter(attrs: list[str]) -> Callable[[object], tuple[Any, ...]]:
    """``operator.attrgetter`` that always returns a tuple (it returns a bare value for one name)."""
    if len(attrs) > 1:
        return operator.attrgetter(*attrs)
    if attrs:
        get = operator.attrgetter(attrs[0])
        return lambda obj: (get(obj),)
    return lambda obj: ()


def storage_fingerprint(obj: object) -> tuple[Any, ...]:
    """What identifies ``obj``'s storage right now: for every storage name its release has, the
    tensor's identity and address (or the value of a flag or count, or the identity of anything
    else). Equal fingerprints mean TE reassigned nothing since; values may have changed in place.
    """
    resolution_kind = tensor_kind(obj)
    parts: list[Any] = [id(obj), type(obj)]
    for name in table.logical_names(resolution_kind):
        value = storage_field(obj, name)
        if value is None or isinstance(value, (bool, int, str)):
            parts.append(value)
        elif is_torch_tensor(type(value)):
            parts.append((id(value), value.data_ptr()))
        else:
            parts.append(id(value))
    return tuple(parts)


def storage_attr(param: object, name: str) -> torch.Tensor | None:
    """THE probe: the tensor holding logical storage ``name``, or None where there is none.

    ``name`` is logical (``rowwise_data``, ``rowwise_scale_inv``, ``columnwise_data``,
    ``columnwise_scale_inv``, ``data``, ``transpose``, ``scale_inv``, ...): the release table
    turns it into the attribute the installed release uses. Never materialises the tensor.
    """
    value = storage_field(param, name)
    if value is None or is_torch_tensor(type(value)):
        return cast("torch.Tensor | None", value)
    raise UnsupportedTensorError(
        f"{name!r} of {class_path(type(param))} is expected to be a torch.Tensor or None; "
        f"found {describe(value)} (use storage_field for flags, counts and lists)"
    )
