"""Realistic stand-in TE objects (see standins.py) filled with buffers shaped as TE shapes them.

Which attribute holds which buffer comes from ../shared/te-releases/facts.md ("Storage
attributes"), written here independently of te_compat's table so the table is checked, not
echoed. Which classes exist, where, and what they assign comes from matrix/records.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch
from packaging.version import Version

from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from tests.standins import make_standin

# facts.md: MXFP8 stores _rowwise_data/_columnwise_data (uint8, both [M, K]) and padded uint8
# scales _rowwise_scale_inv [roundup(M,128), roundup(K/32,4)], _columnwise_scale_inv
# [roundup(M/32,4), roundup(K,128)]; 2.12+ adds _with_gemm_swizzled_scales.
SWIZZLE_FLAG_SINCE = Version("2.12")
GROUPED_RENAME_SINCE = Version("2.14")  # facts.md: data -> rowwise_data, shape -> tensor_shapes


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
NVFP4_BLOCK = 16  # constants.NVFP4_BLOCK_SCALING_SIZE
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
BLOCKWISE_BLOCK = 128
BLOCKWISE_FORMAT_SINCE, BLOCKWISE_FORMAT_UNTIL = Version("2.5"), Version("2.12")


class Float8BlockScaleTensorFormat(enum.Enum):
    """Stands for tex.Float8BlockScaleTensorFormat (a pybind11 enum in TE's C++ extension)."""

    GEMM_READY = 0
    COMPACT = 1


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


def garbage_padded(rows: int, cols: int, pad_rows: int, pad_cols: int, g: torch.Generator) -> torch.Tensor:
    """A TE-padded scale buffer: random logical bytes, 0xFF garbage in the padding (TE >= 2.7
    leaves padding uninitialised)."""
    buf = torch.full((pad_rows, pad_cols), 0xFF, dtype=torch.uint8)
    buf[:rows, :cols] = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=g)
    return buf


def mxfp8_buffers(m: int, k: int, g: torch.Generator, columnwise: bool = True) -> dict[str, Any]:
    out = {
        "_rowwise_data": torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g),
        "_rowwise_scale_inv": garbage_padded(m, k // 32, roundup(m, 128), roundup(k // 32, 4), g),
    }
    if columnwise:
        out["_columnwise_data"] = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
        out["_columnwise_scale_inv"] = garbage_padded(m // 32, k, roundup(m // 32, 4), roundup(k, 128), g)
    return out


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
    attrs = _to(mxfp8_buffers(m, k, g, columnwise), device)
    if rel(release) >= SWIZZLE_FLAG_SINCE:
        attrs.setdefault("_with_gemm_swizzled_scales", False)
    attrs.update(extra)
    t = make_standin(release, class_path(release, "MXFP8Tensor"), attrs, shape=(m, k), device=device)
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def float8_tensor(release: str, m: int, k: int, *, seed: int = 0, param: bool = False) -> Any:
    g = torch.Generator().manual_seed(seed)
    attrs = {
        "_data": torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g),
        "_scale_inv": torch.rand(1, generator=g),
        "_transpose": torch.randint(0, 256, (k, m), dtype=torch.uint8, generator=g),
    }
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
    g = torch.Generator().manual_seed(seed)
    new_names = rel(release) >= GROUPED_RENAME_SINCE
    data_name, shapes_name = ("rowwise_data", "tensor_shapes") if new_names else ("data", "shape")
    n = experts * rows * cols
    attrs: dict[str, Any] = {"num_tensors": experts, shapes_name: [(rows, cols)] * experts}
    if not mxfp8:
        attrs[data_name] = torch.randn(n, generator=g).to(torch.bfloat16).to(device)
    else:
        rp, rc = roundup(rows, 128), roundup(cols // 32, 4)
        cp, cc = roundup(rows // 32, 4), roundup(cols, 128)
        row_scales = torch.cat([garbage_padded(rows, cols // 32, rp, rc, g).flatten() for _ in range(experts)]).to(
            device
        )
        attrs.update(
            {
                data_name: torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(device),
                "scale_inv": row_scales,
                "scale_inv_offsets": [e * rp * rc for e in range(experts + 1)],
                "quantizer": object(),  # stands for an MXFP8Quantizer: only its presence is read
            }
        )
        if columnwise:
            attrs.update(
                {
                    "columnwise_data": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(device),
                    "columnwise_scale_inv": torch.cat(
                        [garbage_padded(rows // 32, cols, cp, cc, g).flatten() for _ in range(experts)]
                    ).to(device),
                    "columnwise_scale_inv_offsets": [e * cp * cc for e in range(experts + 1)],
                }
            )
        if swizzled:
            attrs["_with_gemm_swizzled_scales"] = True
        if members:
            mem = []
            for e in range(experts):
                pieces = {
                    "_rowwise_data": attrs[data_name][e * rows * cols : (e + 1) * rows * cols].view(rows, cols),
                    "_rowwise_scale_inv": row_scales[e * rp * rc : (e + 1) * rp * rc].view(rp, rc),
                }
                if columnwise:
                    pieces["_columnwise_data"] = attrs["columnwise_data"][e * rows * cols : (e + 1) * rows * cols].view(
                        rows, cols
                    )
                    pieces["_columnwise_scale_inv"] = attrs["columnwise_scale_inv"][
                        e * cp * cc : (e + 1) * cp * cc
                    ].view(cp, cc)
                if rel(release) >= SWIZZLE_FLAG_SINCE:
                    pieces["_with_gemm_swizzled_scales"] = swizzled
                mem.append(
                    make_standin(release, class_path(release, "MXFP8Tensor"), pieces, shape=(rows, cols), device=device)
                )
            attrs["quantized_tensors"] = mem
    path = class_path(release, "GroupedTensor")
    obj = make_standin(release, path, attrs, shape=(experts, rows, cols), device=device)
    if param and isinstance(obj, torch.Tensor):
        return torch.nn.Parameter(obj, requires_grad=False)
    return obj


def nvfp4_buffers(
    m: int,
    k: int,
    g: torch.Generator,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    row_scaled: bool = False,
) -> dict[str, Any]:
    """NVFP4 buffers of a logical [m, k] tensor, shaped as TE's source shapes them (see above)."""
    out: dict[str, Any] = {}
    if rowwise:
        kb = math.ceil(k / NVFP4_BLOCK)
        out["_rowwise_data"] = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=g)
        out["_rowwise_scale_inv"] = garbage_padded(m, kb, roundup(m, 128), roundup(kb, 4), g)
        out["_amax_rowwise"] = torch.rand(m if row_scaled else 1, generator=g)
    if columnwise:
        mb = math.ceil(m / NVFP4_BLOCK)
        out["_columnwise_data"] = torch.randint(0, 256, (k, m // 2), dtype=torch.uint8, generator=g)
        out["_columnwise_scale_inv"] = garbage_padded(k, mb, roundup(k, 128), roundup(mb, 4), g)
        out["_amax_columnwise"] = torch.rand(1, generator=g)
    return out


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
    attrs = _to(nvfp4_buffers(m, k, g, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled), device)
    attrs.update(_nvfp4_flags(release, swizzled, row_scaled))
    attrs.update(extra)
    if storage:
        return make_standin(release, storage_class_path(release, "NVFP4Tensor"), attrs)
    t = make_standin(release, class_path(release, "NVFP4Tensor"), attrs, shape=(m, k), device=device)
    return torch.nn.Parameter(t, requires_grad=False) if param else t


def _padded_f32(rows: int, cols: int, pad_rows: int, pad_cols: int, g: torch.Generator) -> torch.Tensor:
    """An fp32 scale buffer: random logical values, 0xFF bytes (NaN) in TE's uninitialised padding."""
    buf = torch.full((pad_rows, pad_cols * 4), 0xFF, dtype=torch.uint8).view(torch.float32)
    buf[:rows, :cols] = torch.rand(rows, cols, generator=g) + 0.5
    return buf


def blockwise_buffers(
    m: int,
    k: int,
    g: torch.Generator,
    *,
    two_d: bool = True,
    rowwise: bool = True,
    columnwise: bool = True,
    compact: bool = False,
) -> dict[str, Any]:
    """Float8 blockwise buffers of a logical [m, k] tensor, shaped as TE's source shapes them."""

    def c(x: int) -> int:
        return math.ceil(x / BLOCKWISE_BLOCK)

    flat = compact and not two_d  # COMPACT changes nothing for 2-D scaling
    out: dict[str, Any] = {}
    if rowwise:
        out["_rowwise_data"] = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
        if two_d:
            out["_rowwise_scale_inv"] = _padded_f32(c(m), c(k), c(m), roundup(c(k), 4), g)
        elif flat:
            out["_rowwise_scale_inv"] = _padded_f32(m, c(k), m, c(k), g)
        else:
            out["_rowwise_scale_inv"] = _padded_f32(c(k), m, c(k), roundup(m, 4), g)
    if columnwise:
        shape = (m, k) if flat else (k, m)
        out["_columnwise_data"] = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        if two_d:
            out["_columnwise_scale_inv"] = _padded_f32(c(k), c(m), c(k), roundup(c(m), 4), g)
        elif flat:
            out["_columnwise_scale_inv"] = _padded_f32(c(m), k, c(m), k, g)
        else:
            out["_columnwise_scale_inv"] = _padded_f32(c(m), k, c(m), roundup(k, 4), g)
    return out


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
    attrs = _to(
        blockwise_buffers(m, k, g, two_d=two_d, rowwise=rowwise, columnwise=columnwise, compact=compact), device
    )
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
    if rowwise:
        attrs = mxfp8_buffers(m, k, g, columnwise=False)
    else:
        attrs = {
            "_columnwise_data": torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g),
            "_columnwise_scale_inv": garbage_padded(m // 32, k, roundup(m // 32, 4), roundup(k, 128), g),
        }
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
