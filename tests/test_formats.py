"""NVFP4, Float8 blockwise and hybrid snapshots on the stand-ins of every release that has each class.

Expected shapes are literal values worked out from TE's own formulas (the comments in
tests/te_objects.py cite the source files); which flags a release has comes from its record.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import te_compat
from matrix.check import lineage
from matrix.extract import load_record
from matrix.releases import matrix_release
from te_compat import StorageNotFoundError, UnsupportedTensorError
from te_compat.snapshots import nvfp4_storage
from tests import te_objects as T

Installer = Callable[..., None]

NVFP4_RELEASES = T.releases_with("NVFP4Tensor")


def _assigned(release: str, name: str) -> set[str]:
    """What the release's tensor class ``name`` (and its TE bases) assigns, per its record."""
    classes = load_record(matrix_release(release).source_from)["classes"]
    return {a for c in lineage(classes, T.class_path(release, name)) for a in classes[c]["assigns"]}


def _both(p: torch.Tensor) -> list[object]:
    """The Parameter and its ``.data`` (a new wrapper sharing the buffers)."""
    return [p, p.data]


def test_nvfp4_releases_are_2_8_on() -> None:
    assert NVFP4_RELEASES[0] == "2.8.0" and NVFP4_RELEASES[-1] == "2.20.2"


@pytest.mark.parametrize("release", NVFP4_RELEASES)
def test_nvfp4_storage_every_release(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.nvfp4_tensor(release, 256, 192, param=True)
    assigns = _assigned(release, "NVFP4Tensor")
    for obj in _both(p):
        s = nvfp4_storage(obj)
        assert s.owner is obj and s.shape == (256, 192)
        assert s.rowwise_data is p._rowwise_data and s.rowwise_scale_inv is p._rowwise_scale_inv
        assert s.columnwise_data is p._columnwise_data and s.columnwise_scale_inv is p._columnwise_scale_inv
        assert s.amax_rowwise is p._amax_rowwise and s.amax_columnwise is p._amax_columnwise
        assert s.scales_swizzled is False
        # a flag the release's constructor never assigns reads as None; one it does, as its value
        assert s.row_scaled_nvfp4 is (False if "_row_scaled_nvfp4" in assigns else None)
        assert s.nvfp4_use_4over6 is (False if "_nvfp4_use_4over6" in assigns else None)
        assert s.nvfp4_e4m3_max == (448 if "_nvfp4_e4m3_max" in assigns else None)


@pytest.mark.parametrize(
    ("m", "k", "row", "row_scales", "col", "col_scales"),
    [
        (256, 192, (256, 96), (256, 12), (192, 128), (256, 16)),  # aligned
        (96, 80, (96, 40), (128, 8), (80, 48), (128, 8)),  # padded: M 96 -> 128, K/16 = 5 -> 8
        (32, 32, (32, 16), (128, 4), (32, 16), (128, 4)),
    ],
)
def test_nvfp4_buffer_shapes(
    m: int,
    k: int,
    row: tuple[int, int],
    row_scales: tuple[int, int],
    col: tuple[int, int],
    col_scales: tuple[int, int],
    installed_te: Installer,
) -> None:
    installed_te("2.20.2")
    s = nvfp4_storage(T.nvfp4_tensor("2.20.2", m, k))
    assert s.shape == (m, k)
    assert tuple(s.rowwise_data.shape) == row and tuple(s.rowwise_scale_inv.shape) == row_scales
    assert tuple(s.columnwise_data.shape) == col and tuple(s.columnwise_scale_inv.shape) == col_scales
    assert s.rowwise_data.dtype == torch.uint8 and s.rowwise_scale_inv.dtype == torch.uint8
    assert s.amax_rowwise.dtype == torch.float32 and tuple(s.amax_rowwise.shape) == (1,)


@pytest.mark.parametrize("release", ["2.8.0", "2.11.0", "2.20.2"])
def test_nvfp4_storage_object_shape_from_columnwise_bytes(release: str, installed_te: Installer) -> None:
    # A storage-only object has no .shape: [K, M/2] columnwise bytes give back [M, K].
    installed_te(release)
    st = T.nvfp4_tensor(release, 96, 64, storage=True, rowwise=False)
    assert not isinstance(st, torch.Tensor)
    s = nvfp4_storage(st)
    assert s.shape == (96, 64) and s.rowwise_data is None and s.amax_rowwise is None
    with pytest.raises(StorageNotFoundError, match=rf"holds no rowwise_data \(attribute '_rowwise_data'.*TE {release}"):
        s.need("rowwise_data")


def test_nvfp4_storage_object_shape_from_rowwise_bytes(installed_te: Installer) -> None:
    installed_te("2.20.2")
    assert nvfp4_storage(T.nvfp4_tensor("2.20.2", 96, 64, storage=True, columnwise=False)).shape == (96, 64)


@pytest.mark.parametrize("release", ["2.12.0", "2.16.0", "2.20.2"])
def test_nvfp4_swizzled_flag(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.nvfp4_tensor(release, 128, 128, swizzled=True, param=True)
    assert nvfp4_storage(p).scales_swizzled is True and nvfp4_storage(p.data).scales_swizzled is True


def test_nvfp4_row_scaled(installed_te: Installer) -> None:
    installed_te("2.16.0")
    s = nvfp4_storage(T.nvfp4_tensor("2.16.0", 64, 64, row_scaled=True, columnwise=False))
    assert s.row_scaled_nvfp4 is True and tuple(s.amax_rowwise.shape) == (64,)
    assert s.nvfp4_e4m3_max is None  # 2.17+
    with pytest.raises(StorageNotFoundError, match=r"holds no nvfp4_e4m3_max \(attribute \(none in this release\)"):
        s.need("nvfp4_e4m3_max")


def test_nvfp4_4over6_flags(installed_te: Installer) -> None:
    installed_te("2.17.0")
    p = T.nvfp4_tensor("2.17.0", 64, 64, _nvfp4_use_4over6=True, _nvfp4_e4m3_max=256)
    s = nvfp4_storage(p)
    assert s.nvfp4_use_4over6 is True and s.nvfp4_e4m3_max == 256


def test_nvfp4_with_no_data_at_all(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.nvfp4_tensor("2.20.2", 64, 64, rowwise=False, columnwise=False)
    with pytest.raises(StorageNotFoundError, match="NVFP4Tensor holds no rowwise_data"):
        nvfp4_storage(p)


def test_nvfp4_wrong_kind(installed_te: Installer) -> None:
    installed_te("2.20.2")
    with pytest.raises(UnsupportedTensorError, match="nvfp4_storage expects a TE nvfp4 tensor; found .*MXFP8Tensor"):
        nvfp4_storage(T.mxfp8_tensor("2.20.2", 64, 64))
    with pytest.raises(UnsupportedTensorError, match="nvfp4_storage expects"):
        nvfp4_storage(torch.zeros(2))


def test_nvfp4_kind(installed_te: Installer) -> None:
    installed_te("2.20.2")
    assert te_compat.tensor_kind(T.nvfp4_tensor("2.20.2", 64, 64, param=True)) is te_compat.TensorKind.NVFP4
