"""Every row of the release table, exercised on stand-ins of the releases it covers."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from packaging.version import Version

import te_compat
from matrix.releases import release_versions
from te_compat import StorageNotFoundError, TensorKind, UnsupportedTensorError, storage_attr, storage_field
from te_compat.probe import class_path, find_in_lineage, tensor_kind_or_none
from te_compat.table import ROWS, StorageRow
from tests import te_objects as T
from tests.standins import StandInDispatched, assigned_names, make_standin, standin_class

Installer = Callable[..., None]


def _row_releases(row: StorageRow) -> list[str]:
    """The oldest and newest matrix release each row covers."""
    covered = [v for v in release_versions() if row.covers(Version(v))]
    assert covered, f"row {row.kind} {row.span} covers no release in the matrix"
    return sorted({covered[0], covered[-1]}, key=Version)


ROW_CASES = [(row, v) for row in ROWS for v in _row_releases(row)]


def _make(kind: TensorKind, release: str) -> tuple[object, dict[str, object]]:
    """A stand-in Parameter of ``kind`` and, per logical name, the object facts.md says holds it."""
    if kind is TensorKind.FLOAT8:
        p = T.float8_tensor(release, 64, 128, param=True)
        return p, {"data": p._data, "scale_inv": p._scale_inv, "transpose": p._transpose}
    if kind is TensorKind.MXFP8:
        p = T.mxfp8_tensor(release, 64, 128, param=True)
        return p, {
            "rowwise_data": p._rowwise_data,
            "rowwise_scale_inv": p._rowwise_scale_inv,
            "columnwise_data": p._columnwise_data,
            "columnwise_scale_inv": p._columnwise_scale_inv,
        }
    if kind is TensorKind.GROUPED:
        g = T.grouped_tensor(release, 2, 128, 64, mxfp8=True)
        data = g.rowwise_data if Version(release) >= T.GROUPED_RENAME_SINCE else g.data
        return g, {
            "rowwise_data": data,
            "data": data,
            "rowwise_scale_inv": g.scale_inv,
            "scale_inv": g.scale_inv,
            "columnwise_data": g.columnwise_data,
        }
    if kind is TensorKind.HYBRID:  # sub-storages as tensors, so storage_attr can read them
        h = T.hybrid_tensor(release, 128, 256, sub_storage=False, param=True)
        return h, {"rowwise_storage": h._rowwise_storage, "columnwise_storage": h._columnwise_storage}
    if kind is TensorKind.IDENTITY:
        ident = T.hybrid_direction(release, "identity", 64, 128, rowwise=True, storage=False)
        return ident, {"data": ident._hp_data}
    # blockwise and NVFP4: the facts.md names, filled with marker tensors
    names = {
        "rowwise_data": "_rowwise_data",
        "columnwise_data": "_columnwise_data",
        "rowwise_scale_inv": "_rowwise_scale_inv",
        "columnwise_scale_inv": "_columnwise_scale_inv",
    }
    if kind is TensorKind.NVFP4:
        names |= {"amax_rowwise": "_amax_rowwise", "amax_columnwise": "_amax_columnwise"}
    attrs = {attr: torch.full((2,), i, dtype=torch.uint8) for i, attr in enumerate(names.values())}
    cls = "Float8BlockwiseQTensor" if kind is TensorKind.FLOAT8_BLOCKWISE else "NVFP4Tensor"
    t = make_standin(release, T.class_path(release, cls), attrs, shape=(64, 128))
    return torch.nn.Parameter(t, requires_grad=False), {k: attrs[v] for k, v in names.items()}


# ../shared/te-releases/facts.md, "Storage attributes", written out by hand: logical name ->
# attribute, per kind and release. Independent of te_compat's table, which must agree with it.
_MX_FACTS = {
    "rowwise_data": "_rowwise_data",
    "columnwise_data": "_columnwise_data",
    "rowwise_scale_inv": "_rowwise_scale_inv",
    "columnwise_scale_inv": "_columnwise_scale_inv",
    "quantizer": "_quantizer",  # the quantizer API of 2.0 (_get_quantizer)
}
_SWIZZLED_FACT = {"scales_swizzled": "_with_gemm_swizzled_scales"}  # 2.12+
_GROUPED_FACTS = {
    "columnwise_data": "columnwise_data",
    "rowwise_scale_inv": "scale_inv",
    "scale_inv": "scale_inv",
    "columnwise_scale_inv": "columnwise_scale_inv",
    "rowwise_scale_inv_offsets": "scale_inv_offsets",
    "columnwise_scale_inv_offsets": "columnwise_scale_inv_offsets",
    "quantized_tensors": "quantized_tensors",
    "num_tensors": "num_tensors",
    "quantizer": "quantizer",
}


def _facts(kind: TensorKind, release: str) -> tuple[dict[str, str], set[str]]:
    """(logical name -> attribute, logical names the release has no storage for), from facts.md
    and, for what facts.md does not list, the TE source notes in tests/te_objects.py."""
    v = Version(release)
    swizzled = _SWIZZLED_FACT if v >= Version("2.12") else {}
    unswizzled = set() if swizzled else {"scales_swizzled"}
    if kind is TensorKind.FLOAT8:
        plain = {"data": "_data", "scale_inv": "_scale_inv", "transpose": "_transpose"}
        return (plain, {"quantizer"}) if v < Version("2.0") else ({**plain, "quantizer": "_quantizer"}, set())
    if kind is TensorKind.MXFP8:
        return {**_MX_FACTS, **swizzled}, unswizzled
    if kind is TensorKind.FLOAT8_BLOCKWISE:  # _data_format (GEMM_READY or COMPACT) 2.5-2.11 only
        fmt = {"data_format": "_data_format"} if Version("2.5") <= v < Version("2.12") else {}
        return {**_MX_FACTS, "is_2d_scaled": "_is_2D_scaled", **fmt}, set() if fmt else {"data_format"}
    if kind is TensorKind.NVFP4:  # 2.16 _row_scaled_nvfp4; 2.17 4over6 (_nvfp4_e4m3_max, _nvfp4_use_4over6)
        extra = {"amax_rowwise": "_amax_rowwise", "amax_columnwise": "_amax_columnwise", **swizzled}
        if v >= Version("2.16"):
            extra["row_scaled_nvfp4"] = "_row_scaled_nvfp4"
        if v >= Version("2.17"):
            extra |= {"nvfp4_e4m3_max": "_nvfp4_e4m3_max", "nvfp4_use_4over6": "_nvfp4_use_4over6"}
        return {**_MX_FACTS, **extra}, unswizzled
    if kind is TensorKind.HYBRID:  # te_objects.py: HybridQuantizedTensorStorage.__new__
        hybrid = {"rowwise_storage": "_rowwise_storage", "columnwise_storage": "_columnwise_storage"}
        return {**hybrid, "quantizer": "_quantizer"}, set()
    if kind is TensorKind.IDENTITY:  # te_objects.py: IdentityTensorStorage keeps _hp_data
        return {"data": "_hp_data", "quantizer": "_quantizer"}, set()
    if v < Version("2.14"):  # 2.13: public data and shape
        return {**_GROUPED_FACTS, "rowwise_data": "data", "data": "data", "tensor_shapes": "shape"}, {"scales_swizzled"}
    renamed = {"rowwise_data": "rowwise_data", "data": "rowwise_data", "tensor_shapes": "tensor_shapes"}
    return {**_GROUPED_FACTS, **renamed, **swizzled}, set()


@pytest.mark.parametrize(("row", "release"), ROW_CASES, ids=[f"{r.kind}-{r.span}-TE{v}" for r, v in ROW_CASES])
def test_row(row: StorageRow, release: str, installed_te: Installer) -> None:
    installed_te(release)
    obj, expected = _make(row.kind, release)
    facts, absent = _facts(row.kind, release)
    # every fact must be in the row (names the row has beyond these: the matrix check's job)
    assert set(facts) <= set(row.storage), f"the row lacks {sorted(set(facts) - set(row.storage))}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "moved class" or "newer than table" warning
        assert te_compat.tensor_kind(obj) is row.kind
        for logical, tensor in expected.items():
            assert storage_attr(obj, logical) is tensor, logical
        # put a distinct marker in every attribute facts.md names: each logical name must read
        # exactly the attribute facts.md gives it, on this release's own class (matrix/records)
        assigned = assigned_names(release, f"{type(obj).__module__}.{type(obj).__qualname__}")
        markers = {attr: object() for attr in facts.values()}
        for attr, marker in markers.items():
            assert attr in assigned, f"facts.md's {attr} is not assigned by TE {release}'s {type(obj).__qualname__}"
            setattr(obj, attr, marker)
        for logical, attr in facts.items():
            assert storage_field(obj, logical) is markers[attr], (logical, attr)
        for logical in absent:
            assert storage_field(obj, logical) is None, logical


@pytest.mark.parametrize("release", ["2.11.0", "2.12.0", "2.20.2"])
def test_data_wrapper_is_new_but_shares_buffers(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.mxfp8_tensor(release, 64, 128, param=True)
    inner = p.data
    assert type(inner) is type(p) and inner is not p
    assert storage_attr(inner, "rowwise_data") is storage_attr(p, "rowwise_data")
    assert te_compat.tensor_kind(inner) is TensorKind.MXFP8


def test_attribute_only_on_data_is_found(installed_te: Installer) -> None:
    # On the Parameter first, then on .data: an object lacking the attribute whose .data has it.
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    inner = T.mxfp8_tensor("2.20.2", 64, 128, seed=3)

    class ParamLike(type(p)):  # type: ignore[misc]
        data = property(lambda self: inner)

    obj = torch.Tensor._make_wrapper_subclass(ParamLike, (64, 128), dtype=torch.bfloat16)
    obj.__dict__.update({k: v for k, v in p.__dict__.items() if k != "_rowwise_data"})
    assert storage_attr(obj, "rowwise_data") is inner._rowwise_data
    assert storage_attr(obj, "columnwise_data") is p._columnwise_data  # the object's own wins


def test_missing_attribute_names_attr_class_release(installed_te: Installer) -> None:
    installed_te("2.14.1")
    p = T.mxfp8_tensor("2.14.1", 64, 128, param=False)
    del p.__dict__["_rowwise_scale_inv"]
    with pytest.raises(StorageNotFoundError) as err:
        storage_attr(p, "rowwise_scale_inv")
    msg = str(err.value)
    assert "'_rowwise_scale_inv'" in msg and "MXFP8Tensor" in msg and "TE 2.14.1" in msg


def test_probing_never_dispatches(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128, param=True)
    with pytest.raises(StandInDispatched):
        p + 1  # the stand-in's dispatch really is armed
    for name in te_compat.table.logical_names(TensorKind.MXFP8):
        storage_field(p, name)
    te_compat.mxfp8_storage(p)


def test_second_probe_uses_the_cache(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128, param=True)
    storage_attr(p, "rowwise_data")
    from te_compat import probe

    calls = []
    original = probe.table.row_for
    probe.table.row_for = lambda *a: calls.append(a) or original(*a)  # type: ignore[assignment]
    try:
        q = T.mxfp8_tensor("2.20.2", 64, 128, param=True, seed=1)
        assert storage_attr(q, "rowwise_data") is q._rowwise_data
    finally:
        probe.table.row_for = original  # type: ignore[assignment]
    assert calls == []


def test_newer_release_warns_once_and_probes_every_name(installed_te: Installer) -> None:
    installed_te("2.99.0")
    p = T.mxfp8_tensor("2.20.2", 64, 128, param=True)
    with pytest.warns(RuntimeWarning, match="2.99.0 is newer than the release table"):
        assert storage_attr(p, "rowwise_data") is p._rowwise_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert storage_attr(p, "columnwise_data") is p._columnwise_data


def test_newer_release_tries_the_newest_name_first(installed_te: Installer) -> None:
    # A 2.14+ GroupedTensor is a torch.Tensor: it has TE's rowwise_data AND torch's .data (a new
    # wrapper) and .shape (a torch.Size). Under a TE newer than the table, the newest row's
    # names (rowwise_data, tensor_shapes) must win over 2.13's (data, shape).
    installed_te("2.99.0")
    g = T.grouped_tensor("2.20.2", 2, 128, 64, mxfp8=True, param=True)
    with pytest.warns(RuntimeWarning, match="newer than the release table"):
        assert storage_attr(g, "rowwise_data") is g.rowwise_data
    assert storage_attr(g, "data") is g.rowwise_data
    assert storage_field(g, "tensor_shapes") == [(128, 64), (128, 64)]


def test_newer_release_grouped_probes_old_and_new_names(installed_te: Installer) -> None:
    installed_te("3.0.0")
    g = T.grouped_tensor("2.13.0", 2, 128, 64, mxfp8=True)  # only "data": found by the old name
    with pytest.warns(RuntimeWarning):
        assert storage_attr(g, "rowwise_data") is g.data


def test_moved_class_is_read_by_name_with_a_warning(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    moved = type(
        "MXFP8Tensor",
        (torch.Tensor,),
        {
            "__module__": "transformer_engine.pytorch.somewhere_new",
            "__torch_dispatch__": classmethod(lambda *a, **k: NotImplemented),
        },
    )
    obj = torch.Tensor._make_wrapper_subclass(moved, (64, 128), dtype=torch.bfloat16)
    obj.__dict__.update(p.__dict__)
    with pytest.warns(RuntimeWarning, match="not at any module path the release table knows"):
        assert te_compat.tensor_kind(obj) is TensorKind.MXFP8


def test_the_nearest_class_of_the_mro_decides() -> None:
    # a class deriving from two table classes reads as the one Python's attribute lookup meets
    # first; a TE class at an unknown module path is matched by name; a non-TE one is not
    mx = type("MXFP8Tensor", (), {"__module__": "transformer_engine.pytorch.tensor.mxfp8_tensor"})
    fp4 = type("NVFP4Tensor", (), {"__module__": "transformer_engine.pytorch.tensor.nvfp4_tensor"})
    by_path = {class_path(mx): "mxfp8", class_path(fp4): "nvfp4"}
    both = type("Both", (fp4, mx), {"__module__": "user"})
    assert find_in_lineage(both, by_path) == ("nvfp4", fp4, False)
    assert find_in_lineage(type("Both", (mx, fp4), {}), by_path) == ("mxfp8", mx, False)
    moved = type("MXFP8Tensor", (), {"__module__": "transformer_engine.pytorch.elsewhere"})
    assert find_in_lineage(moved, by_path) == ("mxfp8", moved, True)
    assert find_in_lineage(type("MXFP8Tensor", (), {"__module__": "not_te"}), by_path) is None


def test_kind_or_none_answers_without_raising(installed_te: Installer) -> None:
    installed_te("2.20.2")
    assert tensor_kind_or_none("weight") is None and tensor_kind_or_none(None) is None
    assert tensor_kind_or_none(torch.zeros(1)) is TensorKind.PLAIN
    assert tensor_kind_or_none(T.mxfp8_tensor("2.20.2", 32, 32)) is TensorKind.MXFP8


def test_uncovered_te_quantized_class(installed_te: Installer) -> None:
    # a quantized tensor of a recipe no row covers: a subclass of TE's own QuantizedTensor
    installed_te("2.20.2")
    base = standin_class("2.20.2", "transformer_engine.pytorch.quantized_tensor.QuantizedTensor")
    custom = type("CustomRecipeTensor", (base,), {"__module__": "my_recipe.tensor"})
    obj = torch.Tensor._make_wrapper_subclass(custom, (4, 4), dtype=torch.bfloat16)
    assert te_compat.tensor_kind(obj) is TensorKind.OTHER_QUANTIZED
    with pytest.raises(UnsupportedTensorError, match="my_recipe.tensor.CustomRecipeTensor, of kind other_quantized"):
        storage_attr(obj, "rowwise_data")


def test_plain_tensor_and_non_tensor(installed_te: Installer) -> None:
    installed_te("2.20.2")
    assert te_compat.tensor_kind(torch.zeros(2)) is TensorKind.PLAIN
    assert te_compat.tensor_kind(torch.nn.Parameter(torch.zeros(2))) is TensorKind.PLAIN
    with pytest.raises(UnsupportedTensorError, match=r"found 'weight' \(str\)"):
        te_compat.tensor_kind("weight")
    with pytest.raises(UnsupportedTensorError, match="of kind plain"):
        storage_attr(torch.zeros(2), "rowwise_data")


def test_unknown_logical_name(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    with pytest.raises(ValueError, match="'rowwise_dta' is not a storage name of mxfp8 tensors; expected one of"):
        storage_attr(p, "rowwise_dta")


def test_storage_attr_refuses_non_tensor_fields(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    with pytest.raises(UnsupportedTensorError, match="use storage_field"):
        storage_attr(p, "scales_swizzled")
    assert storage_field(p, "scales_swizzled") is False


def test_probe_without_te_installed(installed_te: Installer) -> None:
    installed_te(None)
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    with pytest.raises(te_compat.TENotFoundError, match="no Transformer Engine version was found"):
        storage_attr(p, "rowwise_data")


def test_kind_older_than_its_first_row(installed_te: Installer) -> None:
    installed_te("1.13.0")
    p = T.mxfp8_tensor("2.20.2", 64, 128)
    with pytest.raises(UnsupportedTensorError, match="predates every mxfp8 row"):
        storage_attr(p, "rowwise_data")


def test_storage_names_enum_covers_the_table() -> None:
    from te_compat import StorageName

    every = {name for row in ROWS for name in row.storage}
    assert {n.value for n in StorageName} == every


def test_storage_name_enum_and_string_agree(installed_te: Installer) -> None:
    from te_compat import StorageName

    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128, param=True)
    assert storage_attr(p, StorageName.ROWWISE_SCALE_INV) is storage_attr(p, "rowwise_scale_inv")


def test_storage_fingerprint(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 128, param=True)
    before = te_compat.storage_fingerprint(p)
    p._rowwise_scale_inv.fill_(7)  # values change in place: same storage
    assert te_compat.storage_fingerprint(p) == before
    p._with_gemm_swizzled_scales = True  # TE's flag flips
    flagged = te_compat.storage_fingerprint(p)
    assert flagged != before
    p._columnwise_data = p._columnwise_data.clone()  # TE reassigns a buffer
    assert te_compat.storage_fingerprint(p) != flagged


@pytest.mark.parametrize(("release", "payload"), [("2.13.0", "data"), ("2.20.2", "rowwise_data")])
def test_grouped_storage_fingerprint(release: str, payload: str, installed_te: Installer) -> None:
    # payload: the attribute facts.md names for the grouped rowwise payload in that release
    installed_te(release)
    g = T.grouped_tensor(release, 2, 128, 64, mxfp8=True)
    before = te_compat.storage_fingerprint(g)
    g.scale_inv.fill_(3)  # values change in place: same storage
    assert te_compat.storage_fingerprint(g) == before
    assert te_compat.storage_fingerprint(T.grouped_tensor(release, 2, 128, 64, mxfp8=True, seed=1)) != before
    setattr(g, payload, getattr(g, payload).clone())  # TE reassigns the payload
    moved = te_compat.storage_fingerprint(g)
    assert moved != before
    g.columnwise_scale_inv = g.columnwise_scale_inv.clone()  # and then the columnwise scales
    assert te_compat.storage_fingerprint(g) != moved
