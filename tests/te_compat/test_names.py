"""te_compat.names: TE attribute names back to logical names, raising and non-raising, and the
named errors for unknown and ambiguous names."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

import te_compat
from te_compat import (
    AmbiguousStorageNameError,
    TECompatError,
    TensorKind,
    UnknownStorageNameError,
    known_storage_name,
    logical_storage_name,
    names,
    table,
)
from tests import te_objects as T

Installer = Callable[..., None]


def test_the_lookup_has_the_promised_signature() -> None:
    sig = inspect.signature(known_storage_name)
    assert list(sig.parameters) == ["attr", "kind"]
    assert sig.parameters["kind"].default is None
    assert str(sig) == "(attr: 'str', kind: 'TensorKind | None' = None) -> 'str | None'"
    assert "known_storage_name" in te_compat.__all__ and te_compat.known_storage_name is known_storage_name


def test_known_names_agree_with_the_raising_lookup() -> None:
    for row in table.ROWS:
        for logical, attr in row.storage.items():
            for kind in (row.kind, None):
                for name in (attr, logical):
                    assert known_storage_name(name, kind) == logical_storage_name(name, kind), (row.span, name)
                assert row.storage[known_storage_name(attr, kind) or ""] == attr


@pytest.mark.parametrize(
    ("attr", "kind"),
    [
        ("_rowwise_scale_inv", TensorKind.FLOAT8),  # an MXFP8 attribute asked of Float8
        ("transpose", TensorKind.MXFP8),  # a Float8 logical name asked of MXFP8
        ("_hp_data", TensorKind.NVFP4),  # IdentityTensor's payload
        ("_rowwise_payload", None),
        ("", None),
    ],
)
def test_unknown_names(attr: str, kind: TensorKind | None) -> None:
    # independent expectation: no row of the kind (any row for None) has it as attribute or logical name
    rows = [r for r in table.ROWS if kind is None or r.kind is kind]
    assert not any(attr in r.storage or attr in r.storage.values() for r in rows)
    assert known_storage_name(attr, kind) is None
    with pytest.raises(UnknownStorageNameError, match=rf"{attr!r} is neither a TE storage attribute") as info:
        logical_storage_name(attr, kind)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TECompatError)


def test_a_name_of_another_kind_is_known_to_any_kind() -> None:
    assert known_storage_name("transpose", TensorKind.MXFP8) is None
    assert known_storage_name("transpose") == "transpose"
    assert known_storage_name("_scale_inv", TensorKind.MXFP8) is None
    assert known_storage_name("_scale_inv") == "scale_inv"


@pytest.fixture
def ambiguous_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    rows = (
        replace(table.ROWS[0], storage={"data": "_payload"}),
        replace(table.ROWS[1], storage={"transpose": "_payload"}),
    )
    monkeypatch.setattr(table, "ROWS", rows)
    names._inverse.cache_clear()
    names._logical_names.cache_clear()
    yield
    monkeypatch.undo()
    names._inverse.cache_clear()
    names._logical_names.cache_clear()


@pytest.mark.usefixtures("ambiguous_table")
def test_an_ambiguous_name_raises_from_both_lookups() -> None:
    for lookup in (known_storage_name, logical_storage_name):
        with pytest.raises(AmbiguousStorageNameError, match="'_payload' holds different storage") as info:
            lookup("_payload")
        assert isinstance(info.value, ValueError) and isinstance(info.value, TECompatError)


def test_a_probe_of_an_unknown_logical_name_is_a_named_error(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 64)
    with pytest.raises(UnknownStorageNameError, match="'transpose' is not a storage name of mxfp8 tensors"):
        te_compat.storage_attr(p, "transpose")
    with pytest.raises(ValueError, match="'bogus' is not a storage name of mxfp8"):
        te_compat.storage_field(p, "bogus")
