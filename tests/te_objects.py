"""Realistic stand-in TE objects (see standins.py) filled with buffers shaped as TE shapes them.

Which attribute holds which buffer comes from ../shared/te-releases/facts.md ("Storage
attributes"), written here independently of te_compat's table so the table is checked, not
echoed. Which classes exist, where, and what they assign comes from matrix/records. The buffers
themselves (shapes, dtypes, TE's padding, keyed by te_compat's logical names) are
te_compat.testing's builders, whose shapes tests/te_compat/test_testing.py checks against the numbers below.
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.version import Version

from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from te_compat.testing import (
    Float8BlockScaleTensorFormat,
    blockwise_buffers,
    float8_buffers,
    grouped_buffers,
    mxfp8_buffers,
    nvfp4_buffers,
    padded_scales,
)
from tests.standins import make_standin

garbage_padded = padded_scales  # a TE-padded scale buffer: random logical bytes, 0xFF in the padding

# facts.md: MXFP8 stores _rowwise_data/_columnwise_data (uint8, both [M, K]) and padded uint8
# scales _rowwise_scale_inv [roundup(M,128), roundup(K/32,4)], _columnwise_scale_inv
# [roundup(M/32,4), roundup(K,128)]; 2.12+ adds _with_gemm_swizzled_scales.
SWIZZLE_FLAG_SINCE = Version("2.12")
GROUPED_RENAME_SINCE = Version("2.14")  # facts.md: data -> rowwise_data, shape -> tensor_shapes
# facts.md: GroupedTensor's PUBLIC buffers, by logical name (2.13 calls rowwise_data "data")
GROUPED_PUBLIC_NAMES = {
    "rowwise_data": "rowwise_data",
    "columnwise_data": "columnwise_data",
    "rowwise_scale_inv": "scale_inv",
    "columnwise_scale_inv": "columnwise_scale_inv",
    "rowwise_scale_inv_offsets": "scale_inv_offsets",
    "columnwise_scale_inv_offsets": "columnwise_scale_inv_offsets",
}


# NVFP4, read off TE's source (transformer_engine/pytorch/tensor/nvfp4_tensor.py, the same
# NVFP4Quantizer.get_scale_shape / get_columnwise_shape / convert_shape_for_fp4 in every release
# 2.8.0-2.20.2; make_empty in 2.8-2.15, inner_tensor_specs in 2.19+): with M = prod(shape[:-1])
# and K = shape[-1], _rowwise_data is uint8 [M, K/2] (two E2M1 values a byte), _rowwise_scale_inv
# uint8 E4M3 [roundup(M,128), roundup(ceil(K/16),4)], _columnwise_data uint8 [K, M/2] (TRANSPOSED),
# _columnwise_scale_inv uint8 [roundup(K,128), roundup(ceil(M/16),4)], _amax_rowwise and
# _amax_columnwise fp32 [1] (_amax_rowwise [M] when row-scaled: 2.19+'s inner_tensor_specs).
# Constructor defaults (NVFP4Tensor.__new__ 2.17+): row_scaled_nvfp4=False,
# nvfp4_use_4over6=False, nvfp4_e4m3_max=448. Flags: _row_scaled_nvfp4 2.16+, _nvfp4_use_4over6 and
# _nvfp4_e4m3_max 2.17+ (storage/nvfp4_tensor_storage.py).
NVFP4_ROW_SCALED_SINCE = Version("2.16")
NVFP4_4OVER6_SINCE = Version("2.17")
NVFP4_E4M3_MAX_DEFAULT = 448


# Float8 blockwise, read off TE's source (transformer_engine/pytorch/tensor/float8_blockwise_tensor.py,
# Float8BlockQuantizer: block_len = 128; get_scale_shape, get_columnwise_shape, make_empty (2.3-2.15)
# and inner_tensor_specs (2.19+)). With M = prod(shape[:-1]), K = shape[-1], c(x) = ceil(x/128):
# _rowwise_data uint8 shape; _columnwise_data uint8 [K, M] (transposed); scales fp32, 2-D (128x128):
# rowwise [c(M), roundup(c(K),4)], columnwise [c(K), roundup(c(M),4)]; 1-D (1x128): rowwise
# [c(K), roundup(M,4)], columnwise [c(M), roundup(K,4)]. 2.5-2.11 add _data_format
# (tex.Float8BlockScaleTensorFormat): COMPACT when the quantizer's all_gather_usage, and then,
# for 1-D scaling only, columnwise data is not transposed ([M, K]) and the scales are unpadded:
# rowwise [M, c(K)], columnwise [c(M), K]. _is_2D_scaled is block_scaling_dim == 2.
BLOCKWISE_FORMAT_SINCE, BLOCKWISE_FORMAT_UNTIL = Version("2.5"), Version("2.12")


# Hybrid (2.19+), read off pytorch/tensor/hybrid_tensor.py and storage/hybrid_tensor_storage.py:
# HybridQuantizedTensorStorage.__new__ assigns _rowwise_storage, _columnwise_storage, _quantizer
# (and _dtype); HybridQuantizer pins its rowwise sub-quantizer to rowwise usage only and its
# columnwise one to columnwise only, so each sub-storage holds one direction's buffers. The
# sub-storages are what sub_quantizer.quantize() returns: a tensor class or, for an internal
# quantizer, a storage class. IdentityTensorStorage (storage/identity_tensor_storage.py) holds
# the high-precision tensor in _hp_data.
HYBRID_SINCE = Version("2.19")


def rel(v: str) -> Version:
    return Version(v)


def class_path(release: str, name: str) -> str:
    """The module path of class ``name`` in ``release``, read off the record (not the table)."""
    classes = load_record(matrix_release(release).source_from)["classes"]
    hits = [p for p, c in classes.items() if c["name"] == name]
    if not hits:
        raise LookupError(f"TE {release} defines no class {name}")
    # Prefer the user-facing tensor class over a same-named storage class.
    return sorted(hits, key=lambda p: ".storage." in p)[0]


def storage_class_path(release: str, name: str) -> str:
    """The module path of TE's storage-only class ``name`` (2.9+ ``...Storage``, 2.0-2.8
    ``..._internal...Base``) in ``release``, read off the record."""
    classes = load_record(matrix_release(release).source_from)["classes"]
    hits = [p for p, c in classes.items() if c["name"] in (f"{name}Storage", f"{name}Base")]
    if len(hits) != 1:
        raise LookupError(f"TE {release}: expected one storage class for {name}, found {hits}")
    return hits[0]


def releases_with(name: str) -> list[str]:
    out = []
    for v in release_versions():
        classes = load_record(matrix_release(v).source_from)["classes"]
        if any(c["name"] == name for c in classes.values()):
            out.append(v)
    return out


def roundup(x: int, m: int) -> int:
    return -(-x // m) * m


def te_names(buffers: dict[str, Any]) -> dict[str, Any]:
    """Buffers by logical name -> by TE's attribute: facts.md's single-tensor attributes are the
    logical names with a leading underscore (``_rowwise_data``, ``_amax_rowwise``, ``_data``...)."""
    return {f"_{name}": value for name, value in buffers.items()}


def _to(attrs: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in attrs.items()}


def mxfp8_tensor(
    release: str,
    m: int,
    k: int,
    *,
    seed: int = 0,
    columnwise: bool = True,
    param: bool = False,
    device: str = "cpu",
    **extra: Any,
) -> Any:
    g = torch.Generator().manual_seed(seed)
    attrs = _to(te_names(mxfp8_buffers((m, k), g, columnwise=columnwise)), device)
    if rel(release) >= SWIZZLE_FLAG_SINCE:
        attrs.setdefault("_with_gemm_swizzled_scales", False)
    attrs.update(extra)
    t = make_standin(release, class_path(release, "MXFP8Tensor"), attrs, shape=(m, k), device=device)
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def float8_tensor(release: str, m: int, k: int, *, seed: int = 0, param: bool = False) -> Any:
    attrs = te_names(float8_buffers((m, k), torch.Generator().manual_seed(seed)))
    t = make_standin(release, class_path(release, "Float8Tensor"), attrs, shape=(m, k))
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def grouped_tensor(
    release: str,
    experts: int,
    rows: int,
    cols: int,
    *,
    mxfp8: bool,
    seed: int = 0,
    members: bool = True,
    param: bool = True,
    swizzled: bool = False,
    columnwise: bool = True,
    device: str = "cpu",
) -> Any:
    """A GroupedTensor as facts.md records it on 2.20.2: flat 1-D buffers, scales expert-major,
    per-expert MXFP8 members whose scale views sit in the grouped buffer."""
    new_names = rel(release) >= GROUPED_RENAME_SINCE
    data_name, shapes_name = ("rowwise_data", "tensor_shapes") if new_names else ("data", "shape")
    g = torch.Generator().manual_seed(seed)
    fmt = "mxfp8" if mxfp8 else "bf16"
    buffers = grouped_buffers((experts, rows, cols), g, format=fmt, columnwise=columnwise, device=device)
    names = {**GROUPED_PUBLIC_NAMES, "rowwise_data": data_name}
    attrs: dict[str, Any] = {names[k]: v for k, v in buffers.flat.items()}
    attrs.update({"num_tensors": experts, shapes_name: [(rows, cols)] * experts})
    if mxfp8:
        attrs["quantizer"] = object()  # stands for an MXFP8Quantizer: only its presence is read
        if swizzled:
            attrs["_with_gemm_swizzled_scales"] = True
        if members:
            flag = {"_with_gemm_swizzled_scales": swizzled} if rel(release) >= SWIZZLE_FLAG_SINCE else {}
            path = class_path(release, "MXFP8Tensor")
            attrs["quantized_tensors"] = [
                make_standin(release, path, {**te_names(piece), **flag}, shape=(rows, cols), device=device)
                for piece in buffers.experts
            ]
    obj = make_standin(release, class_path(release, "GroupedTensor"), attrs, shape=(experts, rows, cols), device=device)
    if param and isinstance(obj, torch.Tensor):
        return torch.nn.Parameter(obj, requires_grad=False)
    return obj


def _nvfp4_flags(release: str, swizzled: bool, row_scaled: bool) -> dict[str, Any]:
    """The flags the release's NVFP4 constructor sets, at TE's defaults."""
    v = rel(release)
    flags: dict[str, Any] = {}
    if v >= SWIZZLE_FLAG_SINCE:
        flags["_with_gemm_swizzled_scales"] = swizzled
    elif swizzled:
        raise ValueError(f"TE {release} has no swizzled-scales flag (2.12+)")
    if v >= NVFP4_ROW_SCALED_SINCE:
        flags["_row_scaled_nvfp4"] = row_scaled
    elif row_scaled:
        raise ValueError(f"TE {release} has no row-scaled NVFP4 (2.16+)")
    if v >= NVFP4_4OVER6_SINCE:
        flags["_nvfp4_use_4over6"] = False
        flags["_nvfp4_e4m3_max"] = NVFP4_E4M3_MAX_DEFAULT
    return flags


def nvfp4_tensor(
    release: str,
    m: int,
    k: int,
    *,
    seed: int = 0,
    columnwise: bool = True,
    rowwise: bool = True,
    swizzled: bool = False,
    row_scaled: bool = False,
    param: bool = False,
    storage: bool = False,
    device: str = "cpu",
    **extra: Any,
) -> Any:
    """One NVFP4 weight of logical shape [m, k] (TE 2.8+): an NVFP4Tensor (a Parameter with
    ``param``), or the storage-only class with ``storage`` (what a hybrid holds per direction).
    ``swizzled`` sets the 2.12+ flag; ``extra`` overrides any attribute by TE's name."""
    g = torch.Generator().manual_seed(seed)
    buffers = nvfp4_buffers((m, k), g, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled)
    attrs = _to(te_names(buffers), device)
    attrs.update(_nvfp4_flags(release, swizzled, row_scaled))
    attrs.update(extra)
    if storage:
        return make_standin(release, storage_class_path(release, "NVFP4Tensor"), attrs)
    t = make_standin(release, class_path(release, "NVFP4Tensor"), attrs, shape=(m, k), device=device)
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def blockwise_tensor(
    release: str,
    m: int,
    k: int,
    *,
    seed: int = 0,
    two_d: bool = True,
    rowwise: bool = True,
    columnwise: bool = True,
    compact: bool = False,
    param: bool = False,
    storage: bool = False,
    device: str = "cpu",
    **extra: Any,
) -> Any:
    """One Float8 blockwise weight of logical shape [m, k] (TE 2.3+); ``compact`` is the 2.5-2.11
    COMPACT data format; ``storage`` gives the storage-only class."""
    v = rel(release)
    has_format = BLOCKWISE_FORMAT_SINCE <= v < BLOCKWISE_FORMAT_UNTIL
    if compact and not has_format:
        raise ValueError(f"TE {release} has no COMPACT blockwise format (2.5-2.11)")
    g = torch.Generator().manual_seed(seed)
    buffers = blockwise_buffers((m, k), g, two_d=two_d, rowwise=rowwise, columnwise=columnwise, compact=compact)
    attrs = _to(te_names(buffers), device)
    attrs["_is_2D_scaled"] = two_d
    if has_format:
        fmt = Float8BlockScaleTensorFormat.COMPACT if compact else Float8BlockScaleTensorFormat.GEMM_READY
        attrs["_data_format"] = fmt
    attrs.update(extra)
    if storage:
        return make_standin(release, storage_class_path(release, "Float8BlockwiseQTensor"), attrs)
    t = make_standin(release, class_path(release, "Float8BlockwiseQTensor"), attrs, shape=(m, k), device=device)
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def _mxfp8_one_direction(release: str, m: int, k: int, *, rowwise: bool, seed: int, storage: bool) -> Any:
    g = torch.Generator().manual_seed(seed)
    attrs = te_names(mxfp8_buffers((m, k), g, rowwise=rowwise, columnwise=not rowwise))
    attrs["_with_gemm_swizzled_scales"] = False
    if storage:
        return make_standin(release, storage_class_path(release, "MXFP8Tensor"), attrs)
    return make_standin(release, class_path(release, "MXFP8Tensor"), attrs, shape=(m, k))


def _identity(release: str, m: int, k: int, *, seed: int, storage: bool) -> Any:
    g = torch.Generator().manual_seed(seed)
    attrs = {"_hp_data": torch.randn(m, k, generator=g).to(torch.bfloat16), "_dtype": torch.bfloat16}
    if storage:
        return make_standin(release, storage_class_path(release, "IdentityTensor"), attrs)
    return make_standin(release, class_path(release, "IdentityTensor"), attrs, shape=(m, k))


HYBRID_FORMATS = ("mxfp8", "nvfp4", "blockwise", "identity")


def hybrid_direction(
    release: str, fmt: str, m: int, k: int, *, rowwise: bool, seed: int = 0, storage: bool = True
) -> Any:
    """One sub-storage of a hybrid: ``fmt`` pinned to one direction, as HybridQuantizer pins it."""
    if fmt == "mxfp8":
        return _mxfp8_one_direction(release, m, k, rowwise=rowwise, seed=seed, storage=storage)
    if fmt == "nvfp4":
        return nvfp4_tensor(release, m, k, seed=seed, rowwise=rowwise, columnwise=not rowwise, storage=storage)
    if fmt == "blockwise":
        return blockwise_tensor(release, m, k, seed=seed, rowwise=rowwise, columnwise=not rowwise, storage=storage)
    if fmt == "identity":
        return _identity(release, m, k, seed=seed, storage=storage)
    raise ValueError(f"hybrid direction format must be one of {HYBRID_FORMATS}; got {fmt!r}")


def hybrid_tensor(
    release: str,
    m: int,
    k: int,
    *,
    rowwise: str | None = "mxfp8",
    columnwise: str | None = "nvfp4",
    seed: int = 0,
    sub_storage: bool = True,
    param: bool = False,
    storage: bool = False,
) -> Any:
    """A HybridQuantizedTensor (TE 2.19+) of logical shape [m, k]: ``rowwise`` and ``columnwise``
    name each direction's format (None: that direction absent). ``sub_storage`` makes the
    sub-storages storage-only objects (an internal sub-quantizer) rather than tensors."""
    if rel(release) < HYBRID_SINCE:
        raise ValueError(f"TE {release} has no HybridQuantizedTensor (2.19+)")
    attrs: dict[str, Any] = {
        "_rowwise_storage": (
            hybrid_direction(release, rowwise, m, k, rowwise=True, seed=seed, storage=sub_storage) if rowwise else None
        ),
        "_columnwise_storage": (
            hybrid_direction(release, columnwise, m, k, rowwise=False, seed=seed + 1, storage=sub_storage)
            if columnwise
            else None
        ),
        "_quantizer": object(),  # stands for the HybridQuantizer copy TE keeps
        "_dtype": torch.bfloat16,
    }
    if storage:
        return make_standin(release, storage_class_path(release, "HybridQuantizedTensor"), attrs)
    t = make_standin(release, class_path(release, "HybridQuantizedTensor"), attrs, shape=(m, k))
    return torch.nn.Parameter(t, requires_grad=False) if param else t
