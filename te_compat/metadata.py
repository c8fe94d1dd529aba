"""The keys ``get_metadata()`` of TE's storage classes returns, per release: refit code
(Megatron-Bridge ``fp8_export.py``, NeMo-RL) reads TE's buffers through it, so te_compat's fakes
answer it with exactly the keys of the release they fake (te_compat.testing).

Read from every release's wheel (``get_metadata`` of ``Float8TensorBase``/``Float8TensorStorage``,
``MXFP8TensorBase``/``MXFP8TensorStorage``, ``NVFP4Tensor*``, ``Float8BlockwiseQTensor*``,
``HybridQuantizedTensorStorage``, ``IdentityTensorStorage``): one row per key, in TE's order,
with the attribute its value is read from and the releases that return it (``since <= release
< until``). A key whose value is computed names no attribute (Float8's ``device``).
``te-compat verify`` checks the table against a TE source tree (:func:`check_metadata`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from te_compat.table import TensorKind, in_range, row_for


@dataclass(frozen=True)
class MetadataKey:
    """One key of ``get_metadata()``'s dict for ``kind``'s storage class, in ``since``..``until``."""

    kind: TensorKind
    key: str
    attribute: str | None  # the attribute TE returns under ``key``; None: computed (see module doc)
    since: str
    until: str | None = None


def _keys(kind: TensorKind, since: str, *pairs: tuple[str, str | None]) -> tuple[MetadataKey, ...]:
    return tuple(MetadataKey(kind, key, attr, since) for key, attr in pairs)


_F8, _MX, _NV, _BW = TensorKind.FLOAT8, TensorKind.MXFP8, TensorKind.NVFP4, TensorKind.FLOAT8_BLOCKWISE
_BLOCK_BUFFERS = (
    ("rowwise_data", "_rowwise_data"),
    ("rowwise_scale_inv", "_rowwise_scale_inv"),
    ("columnwise_data", "_columnwise_data"),
    ("columnwise_scale_inv", "_columnwise_scale_inv"),
)
_SWIZZLED = ("with_gemm_swizzled_scales", "_with_gemm_swizzled_scales")
_FAKE_DTYPE = ("fake_dtype", "_dtype")

METADATA_KEYS: tuple[MetadataKey, ...] = (
    *_keys(_F8, "2.0", ("data", "_data"), ("fp8_scale_inv", "_scale_inv"), ("fp8_dtype", "_fp8_dtype")),
    *_keys(_F8, "2.0", ("data_transpose", "_transpose"), ("quantizer", "_quantizer")),
    MetadataKey(_F8, "device", None, "2.14", "2.16"),
    MetadataKey(_F8, *_FAKE_DTYPE, "2.14"),
    *_keys(_MX, "2.0", *_BLOCK_BUFFERS, ("fp8_dtype", "_fp8_dtype"), ("quantizer", "_quantizer")),
    MetadataKey(_MX, *_SWIZZLED, "2.12"),
    MetadataKey(_MX, *_FAKE_DTYPE, "2.14"),
    *_keys(_NV, "2.8", *_BLOCK_BUFFERS, ("amax_rowwise", "_amax_rowwise"), ("amax_columnwise", "_amax_columnwise")),
    *_keys(_NV, "2.8", ("fp4_dtype", "_fp4_dtype"), ("quantizer", "_quantizer")),
    MetadataKey(_NV, *_SWIZZLED, "2.12"),
    MetadataKey(_NV, "row_scaled_nvfp4", "_row_scaled_nvfp4", "2.16"),
    MetadataKey(_NV, "nvfp4_use_4over6", "_nvfp4_use_4over6", "2.17"),
    MetadataKey(_NV, "nvfp4_e4m3_max", "_nvfp4_e4m3_max", "2.17"),
    MetadataKey(_NV, *_FAKE_DTYPE, "2.14"),
    *_keys(_BW, "2.3", *_BLOCK_BUFFERS, ("fp8_dtype", "_fp8_dtype"), ("quantizer", "_quantizer")),
    MetadataKey(_BW, "is_2D_scaled", "_is_2D_scaled", "2.3"),
    MetadataKey(_BW, "data_format", "_data_format", "2.5", "2.12"),
    MetadataKey(_BW, *_FAKE_DTYPE, "2.14"),
    *_keys(
        TensorKind.HYBRID,
        "2.19",
        ("rowwise_storage", "_rowwise_storage"),
        ("columnwise_storage", "_columnwise_storage"),
    ),
    *_keys(TensorKind.HYBRID, "2.19", ("quantizer", "_quantizer"), _FAKE_DTYPE),
    *_keys(TensorKind.IDENTITY, "2.19", ("hp_data", "_hp_data"), ("quantizer", "_quantizer"), _FAKE_DTYPE),
)


def metadata_keys(kind: TensorKind, release: Version) -> tuple[MetadataKey, ...]:
    """The keys ``get_metadata()`` returns for ``kind`` in ``release``, in TE's order (empty for
    a kind whose storage class has none there)."""
    return tuple(k for k in METADATA_KEYS if k.kind is kind and in_range(release, k.since, k.until))


def source_metadata_keys(source: bytes | str, class_name: str) -> list[str] | None:
    """The keys of the dict ``class_name.get_metadata`` builds in ``source`` (a module's Python
    source), in order; None where that class defines no get_metadata."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "get_metadata":
                    dicts = [d for d in ast.walk(fn) if isinstance(d, ast.Dict)]
                    return [str(k.value) for d in dicts for k in d.keys if isinstance(k, ast.Constant)]
    return None


def check_metadata(release: Version, package: Path) -> tuple[int, tuple[str, ...]]:
    """(keys checked, problems): each kind's storage class in the TE source tree ``package``
    (the ``transformer_engine`` folder) against :data:`METADATA_KEYS` for ``release``. A problem
    names the class, its file, the keys found and the keys expected."""
    checked, problems = 0, []
    for kind in dict.fromkeys(k.kind for k in METADATA_KEYS):
        expected = [k.key for k in metadata_keys(kind, release)]
        row = row_for(kind, release)
        if not expected or row is None or len(row.classes) < 2:
            continue
        module, _, name = row.classes[1].rpartition(".")
        path = package.parent / (module.replace(".", "/") + ".py")
        try:
            found = source_metadata_keys(path.read_bytes(), name)
        except (OSError, SyntaxError, ValueError) as exc:
            problems.append(f"{row.classes[1]}: cannot read {path}: {type(exc).__name__}: {exc}")
            continue
        checked += len(expected)
        if found != expected:
            problems.append(
                f"{row.classes[1]}.get_metadata ({path}): te_compat.metadata expects keys {expected} for TE {release}; "
                f"found {found if found is not None else 'no get_metadata'}"
            )
    return checked, tuple(problems)
