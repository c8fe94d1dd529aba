"""TE's own storage attribute names, translated back to te_compat's logical names.

Callers written against one TE release name storage by that release's attribute
(``"_rowwise_scale_inv"`` on MXFP8, ``"scale_inv"`` or ``"data"`` on a GroupedTensor). Asking
te_compat for the logical name keeps them working on every release: the release table already
says, row by row, which attribute holds which logical storage, so this module only inverts it.
"""

from __future__ import annotations

from functools import cache

from te_compat import table
from te_compat.errors import AmbiguousStorageNameError, UnknownStorageNameError, describe
from te_compat.table import StorageRow, TensorKind


def _rows(kind: TensorKind | None) -> tuple[StorageRow, ...]:
    return table.ROWS if kind is None else table.rows_for(kind)


@cache
def _inverse(kind: TensorKind | None) -> dict[str, frozenset[str]]:
    """attribute -> every logical name some row of ``kind`` (all kinds: None) stores in it."""
    found: dict[str, set[str]] = {}
    for row in _rows(kind):
        for logical, attr in row.storage.items():
            found.setdefault(attr, set()).add(logical)
    return {attr: frozenset(names) for attr, names in found.items()}


@cache
def _logical_names(kind: TensorKind | None) -> frozenset[str]:
    return frozenset(name for row in _rows(kind) for name in row.storage)


def _aliases(attr: str, names: frozenset[str], kind: TensorKind | None) -> bool:
    """True when every row that stores anything in ``attr`` stores all of ``names`` there:
    the names are aliases (grouped ``data``/``rowwise_data``), so any of them reads the same."""
    return all(
        all(row.storage.get(name) == attr for name in names) for row in _rows(kind) if attr in row.storage.values()
    )


def _what(kind: TensorKind | None) -> str:
    return "tensors of any kind" if kind is None else f"{kind} tensors"


def known_storage_name(attr: str, kind: TensorKind | None = None) -> str | None:
    """The logical name :func:`logical_storage_name` would return for ``attr``, or None where
    ``attr`` is neither a TE attribute name nor a logical name of ``kind`` (of any kind when
    ``kind`` is None): the lookup for callers that try a kind's names before every kind's.

    A TE attribute that stands for different storage in different rows still raises
    :class:`AmbiguousStorageNameError`: no single answer exists, and None would mean "unknown".
    """
    attr = table.name_text(attr, "attr")  # a StorageName or a plain string
    if kind is not None and not isinstance(kind, TensorKind):
        raise TypeError(f"kind: expected a te_compat.TensorKind or None; found {describe(kind)}")
    names = _inverse(kind).get(attr)
    if names and len(names) == 1:
        return next(iter(names))
    if names and _aliases(attr, names, kind):
        return attr if attr in names else sorted(names)[0]
    if names:
        raise AmbiguousStorageNameError(
            f"TE attribute {attr!r} holds different storage in different rows of the release table "
            f"for {_what(kind)}: it stands for {', '.join(sorted(names))}; pass a logical name "
            "(or the tensor kind) instead"
        )
    return attr if attr in _logical_names(kind) else None


def logical_storage_name(attr: str, kind: TensorKind | None = None) -> str:
    """The logical storage name (for ``storage_attr``) of TE attribute ``attr``.

    ``attr`` is an attribute some release in the table uses for ``kind``'s storage (every kind
    when ``kind`` is None), public or private, or already a logical name (returned as it is).
    When several logical names share the attribute as aliases, ``attr`` itself is preferred if it
    is one of them (grouped ``"scale_inv"``), else the first in sorted order. Raises
    :class:`UnknownStorageNameError` (a ValueError), naming ``attr`` and listing the known names,
    for an unknown name, and :class:`AmbiguousStorageNameError` (a ValueError) for an ambiguous one.
    """
    found = known_storage_name(attr, kind)
    if found is not None:
        return found
    raise UnknownStorageNameError(
        f"{str(attr)!r} is neither a TE storage attribute nor a logical storage name of {_what(kind)} "
        f"in the release table; known attributes: {', '.join(sorted(_inverse(kind)))}; logical names: "
        f"{', '.join(sorted(_logical_names(kind)))}"
    )
