"""Typed snapshots: the right buffers, the swizzled flag, and named errors for missing pieces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

import te_compat
from matrix.check import lineage
from matrix.extract import load_record
from matrix.releases import matrix_release
from te_compat import (
    StorageNotFoundError,
    StorageValueError,
    UnknownStorageNameError,
    UnsupportedTensorError,
)
from te_compat.storage import StorageSnapshot
from tests import te_objects as T
from tests.standins import make_standin

Installer = Callable[..., None]


@pytest.mark.parametrize("release", ["2.1.0", "2.11.0", "2.12.0", "2.20.2"])
def test_mxfp8_storage(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.mxfp8_tensor(release, 96, 160, param=True)
    s = te_compat.mxfp8_storage(p)
    assert s.shape == (96, 160)
    assert s.rowwise_data is p._rowwise_data and s.columnwise_scale_inv is p._columnwise_scale_inv
    assert s.scales_swizzled is False


def test_mxfp8_swizzled_flag_2_12(installed_te: Installer) -> None:
    installed_te("2.12.0")
    p = T.mxfp8_tensor("2.12.0", 128, 128, _with_gemm_swizzled_scales=True)
    assert te_compat.mxfp8_storage(p).scales_swizzled is True


def test_flag_does_not_exist_before_2_12() -> None:
    with pytest.raises(AttributeError, match="never assigns"):
        T.mxfp8_tensor("2.11.0", 128, 128, _with_gemm_swizzled_scales=True)


SWIZZLE_ATTR = "_with_gemm_swizzled_scales"
FLAG_CASES = [("MXFP8Tensor", v) for v in T.releases_with("MXFP8Tensor")] + [
    ("NVFP4Tensor", v) for v in T.releases_with("NVFP4Tensor")
]


def _record_has_flag(release: str, name: str) -> bool:
    """Whether the release's class (with its TE bases) assigns the flag, per its record alone."""
    classes = load_record(matrix_release(release).source_from)["classes"]
    return any(SWIZZLE_ATTR in classes[c]["assigns"] for c in lineage(classes, T.class_path(release, name)))


def _snapshot(name: str, release: str, swizzled: bool) -> tuple[object, Callable[[object], object]]:
    if name == "MXFP8Tensor":
        extra = {SWIZZLE_ATTR: swizzled} if swizzled else {}
        return T.mxfp8_tensor(release, 128, 128, param=True, **extra), te_compat.mxfp8_storage
    return T.nvfp4_tensor(release, 128, 128, param=True, swizzled=swizzled), te_compat.storage.nvfp4_storage


@pytest.mark.parametrize(("name", "release"), FLAG_CASES, ids=[f"{n}-{v}" for n, v in FLAG_CASES])
def test_swizzled_flag_follows_the_record(name: str, release: str, installed_te: Installer) -> None:
    installed_te(release)
    if _record_has_flag(release, name):
        for value in (True, False):
            p, snapshot = _snapshot(name, release, value)
            assert snapshot(p).scales_swizzled is value  # type: ignore[attr-defined]
            assert snapshot(p.data).scales_swizzled is value  # type: ignore[attr-defined]
        return
    # The release has no such flag: te_compat must answer False without reading one, even when
    # a stray attribute of that name sits on the object.
    p, snapshot = _snapshot(name, release, False)
    p.__dict__[SWIZZLE_ATTR] = True
    assert snapshot(p).scales_swizzled is False  # type: ignore[attr-defined]


def test_mxfp8_rowwise_only(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 64, columnwise=False)
    s = te_compat.mxfp8_storage(p)
    assert s.columnwise_data is None
    with pytest.raises(
        StorageNotFoundError, match=r"holds no columnwise_data \(attribute '_columnwise_data'.*TE 2.20.2"
    ):
        s.need("columnwise_data")


def test_mxfp8_with_no_data_at_all(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 64, 64, columnwise=False, _rowwise_data=None)
    with pytest.raises(StorageNotFoundError, match="MXFP8Tensor holds no rowwise_data"):
        te_compat.mxfp8_storage(p)


@pytest.mark.parametrize("release", ["1.9.0", "1.12.0", "2.8.0", "2.20.2"])
def test_float8_storage(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.float8_tensor(release, 32, 48, param=True)
    s = te_compat.float8_storage(p)
    assert s.data is p._data and s.transpose is p._transpose and s.scale_inv is p._scale_inv
    assert s.shape == (32, 48) and s.transpose.shape == (48, 32)


def test_float8_1x_keeps_scale_in_the_shared_dict(installed_te: Installer) -> None:
    installed_te("1.13.0")
    p = T.float8_tensor("1.13.0", 32, 48, param=True)
    assert "_scale_inv" in p._fp8_attrs and "_scale_inv" not in p.__dict__
    assert te_compat.float8_storage(p.data).scale_inv is p._fp8_attrs["_scale_inv"]


@pytest.mark.parametrize("release", ["2.13.0", "2.14.0", "2.20.2"])
def test_grouped_storage(release: str, installed_te: Installer) -> None:
    installed_te(release)
    g = T.grouped_tensor(release, 3, 256, 96, mxfp8=True)
    s = te_compat.grouped_storage(g)
    assert s.num_tensors == 3 and s.tensor_shapes == ((256, 96),) * 3
    assert s.quantized and s.members is not None and len(s.members) == 3
    assert s.rowwise_scale_inv_offsets == tuple(e * 256 * 4 for e in range(4))
    assert s.rowwise_data.numel() == 3 * 256 * 96 and not s.scales_swizzled


@pytest.mark.parametrize(
    "shapes",
    [
        [(256, 96), (256, 96)],
        [[256, 96], [256, 96]],
        [torch.Size([256, 96])] * 2,
        [(np.int64(256), 96), (256, np.int32(96))],
        torch.tensor([[256, 96], [256, 96]]),
        ((256, 96) for _ in range(2)),
    ],
    ids=["tuples", "lists", "torch.Size", "numpy ints", "a tensor", "a generator"],
)
def test_grouped_shapes_are_tuples_of_ints(shapes: object, installed_te: Installer) -> None:
    """However TE holds a group's shapes, the snapshot has tuples of Python ints."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 256, 96, mxfp8=True)
    g.tensor_shapes = shapes
    found = te_compat.grouped_storage(g).tensor_shapes
    assert found == ((256, 96), (256, 96)) and {type(d) for s in found for d in s} == {int}
    assert {type(s) for s in found} == {tuple}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("tensor_shapes", [(256.0, 96), (256, 96)], "a list of shapes, each a sequence of ints"),
        ("tensor_shapes", [(256, 96.5), (256, 96)], "a list of shapes, each a sequence of ints"),
        ("tensor_shapes", 2, "a list of shapes, each a sequence of ints"),
        ("tensor_shapes", ["256x96", "256x96"], "a list of shapes, each a sequence of ints"),
        ("scale_inv_offsets", [0.0, 1.5, 3.0], "a sequence of ints or an integer tensor"),
        ("scale_inv_offsets", torch.tensor([0.0, 1.5, 3.0]), "a sequence of ints or an integer tensor"),
    ],
    ids=["float dim", "fractional dim", "an int", "strings", "float offsets", "a float tensor"],
)
def test_grouped_shapes_and_offsets_of_other_numbers_are_refused(
    name: str, value: object, expected: str, installed_te: Installer
) -> None:
    """A shape or offset that is no whole number is refused, naming the attribute, what was
    expected and what was found (never truncated to a different size)."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 256, 96, mxfp8=True)
    setattr(g, name, value)
    with pytest.raises(StorageValueError, match=rf"attribute .*{name}.* is expected to be {expected}; found"):
        te_compat.grouped_storage(g)


def test_grouped_bf16(installed_te: Installer) -> None:
    installed_te("2.20.2")
    s = te_compat.grouped_storage(T.grouped_tensor("2.20.2", 2, 64, 32, mxfp8=False))
    assert not s.quantized and s.rowwise_data.dtype == torch.bfloat16 and s.members is None


def test_grouped_swizzled_flag(installed_te: Installer) -> None:
    installed_te("2.20.2")
    s = te_compat.grouped_storage(T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True, swizzled=True))
    assert s.scales_swizzled


def test_2_13_grouped_flag_comes_from_members(installed_te: Installer) -> None:
    installed_te("2.13.0")
    g = T.grouped_tensor("2.13.0", 2, 128, 128, mxfp8=True)
    for m in g.quantized_tensors:
        m._with_gemm_swizzled_scales = True
    assert te_compat.grouped_storage(g).scales_swizzled


def test_wrong_kind(installed_te: Installer) -> None:
    installed_te("2.20.2")
    with pytest.raises(UnsupportedTensorError, match="mxfp8_storage expects a TE mxfp8 tensor; found .*Float8Tensor"):
        te_compat.mxfp8_storage(T.float8_tensor("2.20.2", 32, 32))
    with pytest.raises(UnsupportedTensorError, match="grouped_storage expects"):
        te_compat.grouped_storage(torch.zeros(3))


# ---- one snapshot base: one need, one shape rule, flags and counts checked, never coerced ----

# The public fields of every snapshot, in order (te_compat's API: callers build on them).
SNAPSHOT_FIELDS = {
    te_compat.MXFP8Storage: "owner shape rowwise_data rowwise_scale_inv columnwise_data columnwise_scale_inv "
    "scales_swizzled quantized_2d",
    te_compat.Float8Storage: "owner shape data transpose scale_inv",
    te_compat.GroupedStorage: "owner num_tensors tensor_shapes rowwise_data columnwise_data rowwise_scale_inv "
    "columnwise_scale_inv rowwise_scale_inv_offsets columnwise_scale_inv_offsets members quantized "
    "scales_swizzled amax_rowwise amax_columnwise quantized_2d",
    te_compat.NVFP4Storage: "owner shape rowwise_data rowwise_scale_inv columnwise_data columnwise_scale_inv "
    "amax_rowwise amax_columnwise scales_swizzled row_scaled_nvfp4 nvfp4_e4m3_max nvfp4_use_4over6",
    te_compat.BlockwiseStorage: "owner shape rowwise_data rowwise_scale_inv columnwise_data columnwise_scale_inv "
    "is_2d_scaled data_format columnwise_transposed",
    te_compat.HybridStorage: "owner rowwise columnwise rowwise_kind columnwise_kind",
}


@pytest.mark.parametrize("cls", list(SNAPSHOT_FIELDS), ids=lambda c: c.__name__)
def test_snapshots_keep_their_fields_and_share_one_need(cls: type) -> None:
    assert [f.name for f in dataclasses.fields(cls)] == SNAPSHOT_FIELDS[cls].split()
    assert issubclass(cls, StorageSnapshot) and cls.need is StorageSnapshot.need  # type: ignore[attr-defined]


def test_need_of_a_field_no_snapshot_has_is_a_named_error(installed_te: Installer) -> None:
    installed_te("2.20.2")
    s = te_compat.mxfp8_storage(T.mxfp8_tensor("2.20.2", 64, 64))
    with pytest.raises(UnknownStorageNameError, match="MXFP8Storage has no field 'rowwise_dta'; expected one of owner"):
        s.need("rowwise_dta")
    assert s.need(te_compat.StorageName.ROWWISE_DATA) is s.rowwise_data  # the enum names the field too


def test_float8_shape_comes_from_the_transpose_when_data_is_gone(installed_te: Installer) -> None:
    # Float8's transpose is [K] + shape[:-1] (TE's _create_transpose); a storage-only object with
    # only the transpose has the logical shape back from it
    installed_te("2.20.2")
    st = make_standin(
        "2.20.2",
        T.storage_class_path("2.20.2", "Float8Tensor"),
        {"_data": None, "_transpose": torch.zeros(48, 2, 16, dtype=torch.uint8), "_scale_inv": torch.ones(1)},
    )
    assert te_compat.float8_storage(st).shape == (2, 16, 48)


FLAG_ATTRS = [
    ("MXFP8Tensor", "_with_gemm_swizzled_scales", "2.12.0"),
    ("NVFP4Tensor", "_with_gemm_swizzled_scales", "2.12.0"),
    ("NVFP4Tensor", "_row_scaled_nvfp4", "2.16.0"),
    ("NVFP4Tensor", "_nvfp4_use_4over6", "2.17.0"),
    ("Float8BlockwiseQTensor", "_is_2D_scaled", "2.3.0"),
    ("GroupedTensor", "_with_gemm_swizzled_scales", "2.14.0"),
]


def _make(name: str, release: str, **attrs: object) -> tuple[object, Callable[[object], object]]:
    if name == "MXFP8Tensor":
        return T.mxfp8_tensor(release, 64, 64, **attrs), te_compat.mxfp8_storage
    if name == "NVFP4Tensor":
        return T.nvfp4_tensor(release, 64, 64, **attrs), te_compat.nvfp4_storage
    if name == "Float8BlockwiseQTensor":
        return T.blockwise_tensor(release, 128, 128, **attrs), te_compat.blockwise_storage
    g = T.grouped_tensor(release, 2, 64, 64, mxfp8=True)
    for attr, value in attrs.items():
        setattr(g, attr, value)
    return g, te_compat.grouped_storage


@pytest.mark.parametrize(("name", "attr", "release"), FLAG_ATTRS)
@pytest.mark.parametrize("value", ["False", "True", "", 0, 1, None])
def test_a_flag_that_is_not_a_bool_is_a_named_error(
    name: str, attr: str, release: str, value: object, installed_te: Installer
) -> None:
    installed_te(release)
    obj, snapshot = _make(name, release, **{attr: value})
    if value is None and attr != "_is_2D_scaled":  # TE's "not set": the flag reads False or None
        snapshot(obj)
        return
    expected = StorageNotFoundError if value is None else StorageValueError
    with pytest.raises(expected) as info:
        snapshot(obj)
    if value is not None:
        message = str(info.value)
        assert name in message and repr(attr) in message and f"TE {release}" in message
        assert f"found {value!r} ({type(value).__name__})" in message and "expected to be a bool" in message
        assert isinstance(info.value, TypeError) and isinstance(info.value, UnsupportedTensorError)


@pytest.mark.parametrize("value", ["abc", "448", 448.0, True, None])
def test_the_nvfp4_e4m3_max_must_be_an_int(value: object, installed_te: Installer) -> None:
    installed_te("2.17.0")
    p = T.nvfp4_tensor("2.17.0", 64, 64, _nvfp4_e4m3_max=value)
    if value is None:
        assert te_compat.nvfp4_storage(p).nvfp4_e4m3_max is None
        return
    with pytest.raises(StorageValueError, match=r"NVFP4Tensor: attribute '_nvfp4_e4m3_max' .* expected to be an int"):
        te_compat.nvfp4_storage(p)
    assert te_compat.nvfp4_storage(T.nvfp4_tensor("2.17.0", 64, 64, _nvfp4_e4m3_max=256)).nvfp4_e4m3_max == 256


def test_a_tensor_slot_holding_something_else_is_a_named_error(installed_te: Installer) -> None:
    installed_te("2.20.2")
    for make, snapshot in [
        (lambda: T.mxfp8_tensor("2.20.2", 64, 64, _rowwise_scale_inv=[1, 2]), te_compat.mxfp8_storage),
        (lambda: T.nvfp4_tensor("2.20.2", 64, 64, _amax_rowwise=1.0), te_compat.nvfp4_storage),
    ]:
        with pytest.raises(StorageValueError, match="is expected to be a torch.Tensor or None; found"):
            snapshot(make())
