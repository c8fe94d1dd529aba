"""NVFP4, Float8 blockwise and hybrid snapshots on the stand-ins of every release that has each class.

Expected shapes are literal values worked out from TE's own formulas (the comments in
tests/te_objects.py cite the source files); which flags a release has comes from its record.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

import te_compat
from matrix.check import check_record, check_release, lineage, uncovered_quantized
from matrix.extract import load_record
from matrix.releases import matrix_release
from te_compat import StorageNotFoundError, TensorKind, UnsupportedTensorError
from te_compat.storage import blockwise_storage, hybrid_storage, nvfp4_storage
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


# --- Float8 blockwise --------------------------------------------------------------------------

BLOCKWISE_RELEASES = T.releases_with("Float8BlockwiseQTensor")


def test_blockwise_releases_are_2_3_on() -> None:
    assert BLOCKWISE_RELEASES[0] == "2.3.0" and BLOCKWISE_RELEASES[-1] == "2.20.2"


@pytest.mark.parametrize("two_d", [True, False], ids=["2d", "1d"])
@pytest.mark.parametrize("release", BLOCKWISE_RELEASES)
def test_blockwise_storage_every_release(release: str, two_d: bool, installed_te: Installer) -> None:
    installed_te(release)
    p = T.blockwise_tensor(release, 256, 384, two_d=two_d, param=True)
    has_format = "_data_format" in _assigned(release, "Float8BlockwiseQTensor")
    for obj in _both(p):
        s = blockwise_storage(obj)
        assert s.owner is obj and s.shape == (256, 384) and s.is_2d_scaled is two_d
        assert s.rowwise_data is p._rowwise_data and s.rowwise_scale_inv is p._rowwise_scale_inv
        assert s.columnwise_data is p._columnwise_data and s.columnwise_scale_inv is p._columnwise_scale_inv
        assert s.data_format == ("GEMM_READY" if has_format else None)
        assert s.columnwise_transposed is True
        assert tuple(s.columnwise_data.shape) == (384, 256)
        assert s.rowwise_scale_inv.dtype == torch.float32


@pytest.mark.parametrize(
    ("m", "k", "two_d", "row_scales", "col_scales"),
    [
        (256, 384, True, (2, 4), (3, 4)),  # [c(M), r4(c(K))], [c(K), r4(c(M))]
        (256, 384, False, (3, 256), (2, 384)),  # [c(K), r4(M)], [c(M), r4(K)]
        (202, 130, True, (2, 4), (2, 4)),
        (202, 130, False, (2, 204), (2, 132)),  # padded: M 202 -> 204, K 130 -> 132
    ],
)
def test_blockwise_scale_shapes(
    m: int,
    k: int,
    two_d: bool,
    row_scales: tuple[int, int],
    col_scales: tuple[int, int],
    installed_te: Installer,
) -> None:
    installed_te("2.20.2")
    s = blockwise_storage(T.blockwise_tensor("2.20.2", m, k, two_d=two_d))
    assert tuple(s.rowwise_scale_inv.shape) == row_scales and tuple(s.columnwise_scale_inv.shape) == col_scales
    assert tuple(s.rowwise_data.shape) == (m, k) and tuple(s.columnwise_data.shape) == (k, m)


@pytest.mark.parametrize("release", ["2.5.0", "2.8.0", "2.11.0"])
def test_blockwise_compact_format(release: str, installed_te: Installer) -> None:
    # COMPACT (all-gather usage) with 1-D scaling keeps columnwise data [M, K], untransposed.
    installed_te(release)
    st = T.blockwise_tensor(release, 256, 384, two_d=False, compact=True, rowwise=False, storage=True)
    s = blockwise_storage(st)
    assert s.data_format == "COMPACT" and s.columnwise_transposed is False
    assert s.shape == (256, 384) and tuple(s.columnwise_data.shape) == (256, 384)
    assert tuple(s.columnwise_scale_inv.shape) == (2, 384)
    # with 2-D scaling COMPACT changes no shape: columnwise data stays transposed
    s2 = blockwise_storage(T.blockwise_tensor(release, 256, 384, two_d=True, compact=True, rowwise=False, storage=True))
    assert s2.data_format == "COMPACT" and s2.columnwise_transposed is True and s2.shape == (256, 384)


@pytest.mark.parametrize("release", ["2.3.0", "2.8.0", "2.12.0", "2.20.2"])
def test_blockwise_storage_object_shape_from_transposed_columnwise(release: str, installed_te: Installer) -> None:
    installed_te(release)
    s = blockwise_storage(T.blockwise_tensor(release, 128, 384, rowwise=False, storage=True))
    assert s.shape == (128, 384) and s.rowwise_data is None
    with pytest.raises(StorageNotFoundError, match=rf"holds no rowwise_scale_inv .*TE {release}"):
        s.need("rowwise_scale_inv")


def test_blockwise_errors(installed_te: Installer) -> None:
    installed_te("2.20.2")
    with pytest.raises(StorageNotFoundError, match="Float8BlockwiseQTensor holds no rowwise_data"):
        blockwise_storage(T.blockwise_tensor("2.20.2", 128, 128, rowwise=False, columnwise=False))
    with pytest.raises(StorageNotFoundError, match="holds no is_2d_scaled"):
        blockwise_storage(T.blockwise_tensor("2.20.2", 128, 128, _is_2D_scaled=None))
    with pytest.raises(UnsupportedTensorError, match="blockwise_storage expects a TE float8_blockwise tensor; found"):
        blockwise_storage(T.nvfp4_tensor("2.20.2", 64, 64))


# --- Hybrid (2.19+) ----------------------------------------------------------------------------

HYBRID_RELEASES = T.releases_with("HybridQuantizedTensor")
SUB_READERS = {
    TensorKind.MXFP8: te_compat.mxfp8_storage,
    TensorKind.NVFP4: nvfp4_storage,
    TensorKind.FLOAT8_BLOCKWISE: blockwise_storage,
}
FORMAT_KINDS = {
    "mxfp8": TensorKind.MXFP8,
    "nvfp4": TensorKind.NVFP4,
    "blockwise": TensorKind.FLOAT8_BLOCKWISE,
    "identity": TensorKind.IDENTITY,
}
COMBOS = [
    ("mxfp8", "nvfp4"),
    ("nvfp4", "mxfp8"),
    ("nvfp4", "nvfp4"),
    ("mxfp8", "identity"),
    ("blockwise", None),
    (None, "nvfp4"),
]


def test_hybrid_releases() -> None:
    assert HYBRID_RELEASES == ["2.19.0", "2.20.2"] == T.releases_with("IdentityTensor")


def _check_direction(sub: object, kind: TensorKind, rowwise: bool) -> None:
    """The sub-storage reads with its own kind's snapshot and holds only its direction."""
    if kind is TensorKind.IDENTITY:
        data = te_compat.storage_attr(sub, "data")
        assert data is sub._hp_data and tuple(data.shape) == (128, 256)
        return
    s = SUB_READERS[kind](sub)
    assert s.shape == (128, 256)
    if rowwise:
        assert s.rowwise_data is sub._rowwise_data and s.columnwise_data is None
    else:
        assert s.columnwise_data is sub._columnwise_data and s.rowwise_data is None


@pytest.mark.parametrize(("row_fmt", "col_fmt"), COMBOS, ids=[f"{r}-{c}" for r, c in COMBOS])
@pytest.mark.parametrize("sub_storage", [True, False], ids=["storages", "tensors"])
@pytest.mark.parametrize("release", ["2.19.0", "2.20.2"])
def test_hybrid_storage(
    release: str, sub_storage: bool, row_fmt: str | None, col_fmt: str | None, installed_te: Installer
) -> None:
    installed_te(release)
    p = T.hybrid_tensor(release, 128, 256, rowwise=row_fmt, columnwise=col_fmt, sub_storage=sub_storage, param=True)
    st = T.hybrid_tensor(release, 128, 256, rowwise=row_fmt, columnwise=col_fmt, sub_storage=sub_storage, storage=True)
    for obj in [p, p.data, st]:
        h = hybrid_storage(obj)
        assert h.owner is obj
        assert h.rowwise is obj._rowwise_storage and h.columnwise is obj._columnwise_storage
        assert h.rowwise_kind is (FORMAT_KINDS[row_fmt] if row_fmt else None)
        assert h.columnwise_kind is (FORMAT_KINDS[col_fmt] if col_fmt else None)
        if h.rowwise_kind is not None:
            _check_direction(h.rowwise, h.rowwise_kind, rowwise=True)
        if h.columnwise_kind is not None:
            _check_direction(h.columnwise, h.columnwise_kind, rowwise=False)


def test_hybrid_nvfp4_columnwise_is_transposed(installed_te: Installer) -> None:
    installed_te("2.20.2")
    h = hybrid_storage(T.hybrid_tensor("2.20.2", 128, 256, rowwise="mxfp8", columnwise="nvfp4"))
    col = nvfp4_storage(h.columnwise)
    assert tuple(col.columnwise_data.shape) == (256, 64) and tuple(col.columnwise_scale_inv.shape) == (256, 8)
    assert tuple(te_compat.mxfp8_storage(h.rowwise).rowwise_scale_inv.shape) == (128, 8)


def test_hybrid_missing_direction(installed_te: Installer) -> None:
    installed_te("2.20.2")
    h = hybrid_storage(T.hybrid_tensor("2.20.2", 128, 256, rowwise="mxfp8", columnwise=None))
    with pytest.raises(StorageNotFoundError, match=r"holds no columnwise_storage \(attribute '_columnwise_storage'"):
        h.need("columnwise")
    assert h.need("rowwise") is h.rowwise
    with pytest.raises(StorageNotFoundError, match="HybridQuantizedTensor holds no rowwise_storage"):
        hybrid_storage(T.hybrid_tensor("2.20.2", 128, 256, rowwise=None, columnwise=None))
    with pytest.raises(UnsupportedTensorError, match="hybrid_storage expects a TE hybrid tensor; found .*MXFP8Tensor"):
        hybrid_storage(T.mxfp8_tensor("2.20.2", 64, 64))


@pytest.mark.parametrize("release", ["2.19.0", "2.20.2"])
def test_tensor_kind_of_hybrid_and_identity(release: str, installed_te: Installer) -> None:
    installed_te(release)
    for obj in [
        T.hybrid_tensor(release, 64, 64, param=True),
        T.hybrid_tensor(release, 64, 64, param=True).data,
        T.hybrid_tensor(release, 64, 64, storage=True),
    ]:
        assert te_compat.tensor_kind(obj) is TensorKind.HYBRID, type(obj)
    for storage in (True, False):
        ident = T.hybrid_direction(release, "identity", 64, 64, rowwise=True, storage=storage)
        assert te_compat.tensor_kind(ident) is TensorKind.IDENTITY


def test_hybrid_and_identity_classes_are_covered() -> None:
    # Before the hybrid rows, 2.19's check listed these as "not covered".
    for release in HYBRID_RELEASES:
        assert uncovered_quantized(load_record(release)) == []
        assert check_release(release) == []


def _renamed(release: str, cls: str, old: str, new: str) -> dict[str, object]:
    record = json.loads(json.dumps(load_record(release)))
    facts = record["classes"][cls]
    assert old in facts["assigns"], (cls, old)
    facts["assigns"] = sorted(new if a == old else a for a in facts["assigns"])
    return {**record, "release": "2.21.0"}


HYBRID_STORAGE_CLS = "transformer_engine.pytorch.tensor.storage.hybrid_tensor_storage.HybridQuantizedTensorStorage"
IDENTITY_STORAGE_CLS = "transformer_engine.pytorch.tensor.storage.identity_tensor_storage.IdentityTensorStorage"


@pytest.mark.parametrize("release", ["2.19.0", "2.20.2"])
@pytest.mark.parametrize(
    ("cls", "old", "new", "kind"),
    [
        (HYBRID_STORAGE_CLS, "_rowwise_storage", "_rowwise_sub_storage", "hybrid"),
        (HYBRID_STORAGE_CLS, "_columnwise_storage", "_colwise_storage", "hybrid"),
        (IDENTITY_STORAGE_CLS, "_hp_data", "_data", "identity"),
    ],
)
def test_a_hybrid_rename_fails_the_check(release: str, cls: str, old: str, new: str, kind: str) -> None:
    problems = check_record(_renamed(release, cls, old, new))
    assert any(f"'{old}'" in p and "never assign" in p for p in problems), problems
    assert any(f"assigns '{new}', unknown to the {kind} row" in p for p in problems), problems


def test_a_moved_hybrid_module_fails_the_check() -> None:
    record = json.loads(json.dumps(load_record("2.20.2")))
    record["classes"]["transformer_engine.pytorch.tensor.hybrid.HybridQuantizedTensorStorage"] = record["classes"].pop(
        HYBRID_STORAGE_CLS
    )
    problems = check_record({**record, "release": "2.21.0"})
    assert any(f"looks for class {HYBRID_STORAGE_CLS}, which this release does not define" in p for p in problems)


# --- grouped NVFP4 amax ------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["2.13.0", "2.14.0", "2.20.2"])
def test_grouped_amax(release: str, installed_te: Installer) -> None:
    # grouped_tensor*.py (2.13+): an NVFP4 group keeps per-expert fp32 amax in "amax" and
    # "columnwise_amax" ([num_tensors]); other formats leave them None.
    installed_te(release)
    g = T.grouped_tensor(release, 2, 128, 64, mxfp8=True)
    assert te_compat.grouped_storage(g).amax_rowwise is None
    g.amax, g.columnwise_amax = torch.rand(2), torch.rand(2)
    s = te_compat.grouped_storage(g)
    assert s.amax_rowwise is g.amax and s.amax_columnwise is g.columnwise_amax
