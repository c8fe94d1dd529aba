"""The release table: where each TE release keeps each storage tensor.

This module is data. Every row covers one tensor kind over a range of TE releases
(``since`` inclusive, ``until`` exclusive) and says which classes (module path and name)
carry that kind's storage, which attribute holds each *logical* piece of storage, and which
other attributes those classes assign (known and deliberately not probed). Each row cites the
TE release, and the PR where known, that forced it; a row can go when te_compat stops
supporting the releases it covers.

``python -m matrix.check`` checks every row against the classes each real release defines
(``matrix/records/``): every probed attribute must be assigned under that name, every class
must exist at that module path, and every attribute a covered class assigns must be known here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Literal

from packaging.version import Version

from te_compat.errors import describe
from te_compat.version import release_of

TE = "transformer_engine.pytorch"
# The newest release matrix/ checked this table against; a newer TE gets the newest rows, every
# name any row knows, and a warning. `python -m matrix.refresh` moves it.
CHECKED_THROUGH = "2.20.2"


class TensorKind(str, Enum):
    """What a tensor is, as far as its storage layout goes."""

    PLAIN = "plain"
    FLOAT8 = "float8"
    MXFP8 = "mxfp8"
    FLOAT8_BLOCKWISE = "float8_blockwise"
    NVFP4 = "nvfp4"
    GROUPED = "grouped"
    HYBRID = "hybrid"  # TE 2.19+: one sub-storage per direction, each of its own kind
    IDENTITY = "identity"  # TE 2.19+: a high-precision tensor behind the quantized interface
    OTHER_QUANTIZED = "other_quantized"  # a TE quantized class this table does not cover

    def __str__(self) -> str:
        return self.value


@cache  # asked per tensor read (quantizer flags) with a handful of distinct arguments
def in_range(release: Version, since: str, until: str | None) -> bool:
    """``since <= release < until`` on release segments (a dev build of X counts as X; 2.14 is 2.14.0)."""
    plain = release_of(release)
    return Version(since) <= plain and (until is None or plain < Version(until))


class ReleaseRange:
    """What every row of the table shares: the releases it holds for, ``since <= release < until``
    (``until`` None: every later release). A row is a frozen dataclass with ``since`` and ``until``
    fields of its own; this gives it :meth:`covers` and :attr:`span`."""

    __slots__ = ()
    since: str
    until: str | None

    def covers(self, release: Version) -> bool:
        return in_range(release, self.since, self.until)

    @property
    def span(self) -> str:
        return f"{self.since} .. {self.until}" if self.until else f"{self.since} +"


class StorageName(str, Enum):
    """The logical storage names te_compat resolves per release (plain strings work too)."""

    DATA = "data"
    TRANSPOSE = "transpose"
    SCALE_INV = "scale_inv"
    ROWWISE_DATA = "rowwise_data"
    COLUMNWISE_DATA = "columnwise_data"
    ROWWISE_SCALE_INV = "rowwise_scale_inv"
    COLUMNWISE_SCALE_INV = "columnwise_scale_inv"
    ROWWISE_SCALE_INV_OFFSETS = "rowwise_scale_inv_offsets"
    COLUMNWISE_SCALE_INV_OFFSETS = "columnwise_scale_inv_offsets"
    SCALES_SWIZZLED = "scales_swizzled"
    QUANTIZER = "quantizer"
    QUANTIZED_TENSORS = "quantized_tensors"
    NUM_TENSORS = "num_tensors"
    TENSOR_SHAPES = "tensor_shapes"
    IS_2D_SCALED = "is_2d_scaled"
    AMAX_ROWWISE = "amax_rowwise"
    AMAX_COLUMNWISE = "amax_columnwise"
    DATA_FORMAT = "data_format"  # blockwise 2.5-2.11: GEMM_READY or COMPACT
    ROW_SCALED_NVFP4 = "row_scaled_nvfp4"  # NVFP4 2.16+
    NVFP4_E4M3_MAX = "nvfp4_e4m3_max"  # NVFP4 2.17+
    NVFP4_USE_4OVER6 = "nvfp4_use_4over6"  # NVFP4 2.17+
    ROWWISE_STORAGE = "rowwise_storage"  # hybrid 2.19+: the rowwise sub-storage
    COLUMNWISE_STORAGE = "columnwise_storage"  # hybrid 2.19+: the columnwise sub-storage

    def __str__(self) -> str:
        return self.value


def name_text(name: object, what: str) -> str:
    """``name`` (a str or a :class:`StorageName`) as a plain string. Anything else is a TypeError
    naming ``what``: turning it into a string could print a tensor (and dequantize TE's)."""
    if type(name) is str:
        return name
    if isinstance(name, StorageName):
        return name.value
    if isinstance(name, str):
        return str.__str__(name)
    raise TypeError(f"{what}: expected a storage name (a str or te_compat.StorageName); found {describe(name)}")


def names_text(names: object, what: str) -> tuple[str, ...]:
    """``names``, a tuple or list of storage names, as plain strings (:func:`name_text`)."""
    if type(names) is tuple and set(map(type, names)) <= {str}:
        return names
    if not isinstance(names, (tuple, list)):
        raise TypeError(f"{what}: expected a tuple of storage names or None; found {describe(names)}")
    return tuple(name_text(name, f"{what}[{i}]") for i, name in enumerate(names))


@dataclass(frozen=True)
class StorageRow(ReleaseRange):
    """Where one TE release range keeps one tensor kind's storage."""

    kind: TensorKind
    since: str  # first TE release the row describes
    until: str | None  # first release it no longer describes (None: still current)
    classes: tuple[str, ...]  # "module.Class" of every class that carries the storage
    storage: dict[str, str]  # logical name -> attribute name (public if it has no "_")
    known: frozenset[str]  # other attributes the classes assign, known and not probed
    introduced_by: str  # the TE release (and PR) that forced this row
    field_notes: dict[str, str] = field(default_factory=dict)


# Float8 (delayed and current scaling). Before 2.0, _scale_inv and _transpose are properties
# over the dict _fp8_attrs shared between a tensor and its detached copies.
_F8_1X_KNOWN = frozenset(
    {"_fp8_attrs", "_fp8_dtype", "_fp8_meta", "_fp8_meta_forward", "_fp8_meta_index", "_transpose_invalid"}
)
_F8_1X_STORAGE = {"data": "_data", "scale_inv": "_scale_inv", "transpose": "_transpose"}
_F8_2X_STORAGE = {**_F8_1X_STORAGE, "quantizer": "_quantizer"}
# QuantizedTensor (2.14+) keeps the fake dtype and requires_grad on every quantized tensor.
_QT_KNOWN = frozenset({"_dtype", "_requires_grad"})
_F8_2X_KNOWN = frozenset({"_fp8_dtype", "_transpose_invalid"}) | _QT_KNOWN

_MX_STORAGE = {
    "rowwise_data": "_rowwise_data",
    "columnwise_data": "_columnwise_data",
    "rowwise_scale_inv": "_rowwise_scale_inv",
    "columnwise_scale_inv": "_columnwise_scale_inv",
    "quantizer": "_quantizer",
}
_MX_KNOWN = frozenset({"_fp8_dtype"}) | _QT_KNOWN
_SWIZZLED = {"scales_swizzled": "_with_gemm_swizzled_scales"}

_BW_STORAGE = {**_MX_STORAGE, "is_2d_scaled": "_is_2D_scaled"}
_BW_FORMAT = {"data_format": "_data_format"}  # a tex.Float8BlockScaleTensorFormat
_BW_KNOWN = frozenset({"_fp8_dtype"}) | _QT_KNOWN

_FP4_STORAGE = {**_MX_STORAGE, "amax_rowwise": "_amax_rowwise", "amax_columnwise": "_amax_columnwise"}
_FP4_ROW_SCALED = {"row_scaled_nvfp4": "_row_scaled_nvfp4"}
_FP4_4OVER6 = {"nvfp4_e4m3_max": "_nvfp4_e4m3_max", "nvfp4_use_4over6": "_nvfp4_use_4over6"}
_FP4_KNOWN = frozenset({"_fp4_dtype"}) | _QT_KNOWN

_HYBRID_STORAGE = {
    "rowwise_storage": "_rowwise_storage",
    "columnwise_storage": "_columnwise_storage",
    "quantizer": "_quantizer",
}
_HYBRID_PR = "PR 2817, experimental"

_GROUPED_KNOWN = frozenset({"scale", "first_dims", "last_dims", "offsets", "tensor_offsets", "logical_shape"})
_GROUPED_STORAGE_COMMON = {
    # NVFP4 groups: fp32 [num_tensors] per-expert amax (rowwise [total rows] when row-scaled, 2.16+)
    "amax_rowwise": "amax",
    "amax_columnwise": "columnwise_amax",
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

ROWS: tuple[StorageRow, ...] = (
    StorageRow(
        TensorKind.FLOAT8,
        "1.0",
        "1.11",
        classes=(f"{TE}.float8_tensor.Float8Tensor",),
        storage=_F8_1X_STORAGE,
        known=_F8_1X_KNOWN,
        introduced_by="TE 1.0: Float8Tensor in pytorch/float8_tensor.py (on PyPI from 1.9.0.post1)",
    ),
    StorageRow(
        TensorKind.FLOAT8,
        "1.11",
        "2.0",
        classes=(f"{TE}.tensor.float8_tensor.Float8Tensor",),
        storage=_F8_1X_STORAGE,
        known=_F8_1X_KNOWN,
        introduced_by="TE 1.11: Float8Tensor moved to pytorch/tensor/ under QuantizedTensor",
    ),
    StorageRow(
        TensorKind.FLOAT8,
        "2.0",
        "2.9",
        classes=(
            f"{TE}.tensor.float8_tensor.Float8Tensor",
            f"{TE}.tensor._internal.float8_tensor_base.Float8TensorBase",
        ),
        storage=_F8_2X_STORAGE,
        known=_F8_2X_KNOWN,
        introduced_by="TE 2.0: quantizer API; storage in the Float8TensorBase mixin, _fp8_attrs gone",
    ),
    StorageRow(
        TensorKind.FLOAT8,
        "2.9",
        None,
        classes=(
            f"{TE}.tensor.float8_tensor.Float8Tensor",
            f"{TE}.tensor.storage.float8_tensor_storage.Float8TensorStorage",
        ),
        storage=_F8_2X_STORAGE,
        known=_F8_2X_KNOWN,
        introduced_by="TE 2.9 (PR 2039/2226): *Base mixins renamed *Storage under tensor/storage/",
    ),
    StorageRow(
        TensorKind.MXFP8,
        "2.0",
        "2.9",
        classes=(f"{TE}.tensor.mxfp8_tensor.MXFP8Tensor", f"{TE}.tensor._internal.mxfp8_tensor_base.MXFP8TensorBase"),
        storage=_MX_STORAGE,
        known=_MX_KNOWN,
        introduced_by="TE 2.0: MXFP8Tensor (on PyPI from 2.1.0)",
    ),
    StorageRow(
        TensorKind.MXFP8,
        "2.9",
        "2.12",
        classes=(
            f"{TE}.tensor.mxfp8_tensor.MXFP8Tensor",
            f"{TE}.tensor.storage.mxfp8_tensor_storage.MXFP8TensorStorage",
        ),
        storage=_MX_STORAGE,
        known=_MX_KNOWN,
        introduced_by="TE 2.9 (PR 2039/2226): MXFP8TensorBase renamed MXFP8TensorStorage",
    ),
    StorageRow(
        TensorKind.MXFP8,
        "2.12",
        None,
        classes=(
            f"{TE}.tensor.mxfp8_tensor.MXFP8Tensor",
            f"{TE}.tensor.storage.mxfp8_tensor_storage.MXFP8TensorStorage",
        ),
        storage={**_MX_STORAGE, **_SWIZZLED},
        known=_MX_KNOWN,
        introduced_by="TE 2.12: _with_gemm_swizzled_scales marks scales already in GEMM layout",
    ),
    StorageRow(
        TensorKind.FLOAT8_BLOCKWISE,
        "2.3",
        "2.5",
        classes=(
            f"{TE}.tensor.float8_blockwise_tensor.Float8BlockwiseQTensor",
            f"{TE}.tensor._internal.float8_blockwise_tensor_base.Float8BlockwiseQTensorBase",
        ),
        storage=_BW_STORAGE,
        known=_BW_KNOWN,
        introduced_by="TE 2.3: Float8BlockwiseQTensor (fp32 scales, columnwise data transposed)",
    ),
    StorageRow(
        TensorKind.FLOAT8_BLOCKWISE,
        "2.5",
        "2.9",
        classes=(
            f"{TE}.tensor.float8_blockwise_tensor.Float8BlockwiseQTensor",
            f"{TE}.tensor._internal.float8_blockwise_tensor_base.Float8BlockwiseQTensorBase",
        ),
        storage={**_BW_STORAGE, **_BW_FORMAT},
        known=_BW_KNOWN,
        introduced_by="TE 2.5: _data_format (COMPACT: 1-D scaled columnwise data not transposed)",
    ),
    StorageRow(
        TensorKind.FLOAT8_BLOCKWISE,
        "2.9",
        "2.12",
        classes=(
            f"{TE}.tensor.float8_blockwise_tensor.Float8BlockwiseQTensor",
            f"{TE}.tensor.storage.float8_blockwise_tensor_storage.Float8BlockwiseQTensorStorage",
        ),
        storage={**_BW_STORAGE, **_BW_FORMAT},
        known=_BW_KNOWN,
        introduced_by="TE 2.9 (PR 2039/2226): renamed Float8BlockwiseQTensorStorage",
    ),
    StorageRow(
        TensorKind.FLOAT8_BLOCKWISE,
        "2.12",
        None,
        classes=(
            f"{TE}.tensor.float8_blockwise_tensor.Float8BlockwiseQTensor",
            f"{TE}.tensor.storage.float8_blockwise_tensor_storage.Float8BlockwiseQTensorStorage",
        ),
        storage=_BW_STORAGE,
        known=_BW_KNOWN,
        introduced_by="TE 2.12: _data_format gone (columnwise data always transposed)",
    ),
    StorageRow(
        TensorKind.NVFP4,
        "2.8",
        "2.9",
        classes=(f"{TE}.tensor.nvfp4_tensor.NVFP4Tensor", f"{TE}.tensor._internal.nvfp4_tensor_base.NVFP4TensorBase"),
        storage=_FP4_STORAGE,
        known=_FP4_KNOWN,
        introduced_by="TE 2.8: NVFP4Tensor (packed payload, last dim K/2)",
    ),
    StorageRow(
        TensorKind.NVFP4,
        "2.9",
        "2.12",
        classes=(
            f"{TE}.tensor.nvfp4_tensor.NVFP4Tensor",
            f"{TE}.tensor.storage.nvfp4_tensor_storage.NVFP4TensorStorage",
        ),
        storage=_FP4_STORAGE,
        known=_FP4_KNOWN,
        introduced_by="TE 2.9 (PR 2039/2226): renamed NVFP4TensorStorage",
    ),
    StorageRow(
        TensorKind.NVFP4,
        "2.12",
        "2.16",
        classes=(
            f"{TE}.tensor.nvfp4_tensor.NVFP4Tensor",
            f"{TE}.tensor.storage.nvfp4_tensor_storage.NVFP4TensorStorage",
        ),
        storage={**_FP4_STORAGE, **_SWIZZLED},
        known=_FP4_KNOWN,
        introduced_by="TE 2.12: _with_gemm_swizzled_scales on NVFP4 too",
    ),
    StorageRow(
        TensorKind.NVFP4,
        "2.16",
        "2.17",
        classes=(
            f"{TE}.tensor.nvfp4_tensor.NVFP4Tensor",
            f"{TE}.tensor.storage.nvfp4_tensor_storage.NVFP4TensorStorage",
        ),
        storage={**_FP4_STORAGE, **_SWIZZLED, **_FP4_ROW_SCALED},
        known=_FP4_KNOWN,
        introduced_by="TE 2.16 (PR 2931): _row_scaled_nvfp4 (then one fp32 rowwise amax per row)",
    ),
    StorageRow(
        TensorKind.NVFP4,
        "2.17",
        None,
        classes=(
            f"{TE}.tensor.nvfp4_tensor.NVFP4Tensor",
            f"{TE}.tensor.storage.nvfp4_tensor_storage.NVFP4TensorStorage",
        ),
        storage={**_FP4_STORAGE, **_SWIZZLED, **_FP4_ROW_SCALED, **_FP4_4OVER6},
        known=_FP4_KNOWN,
        introduced_by="TE 2.17 (PR 2972): 4over6 NVFP4, _nvfp4_use_4over6 and _nvfp4_e4m3_max",
    ),
    StorageRow(
        TensorKind.GROUPED,
        "2.13",
        "2.14",
        classes=(f"{TE}.tensor.storage.grouped_tensor.GroupedTensor",),
        storage={"rowwise_data": "data", "data": "data", "tensor_shapes": "shape", **_GROUPED_STORAGE_COMMON},
        known=_GROUPED_KNOWN | {"dtype"},
        introduced_by="TE 2.13: GroupedTensor, a plain opt-in class with public buffers",
    ),
    StorageRow(
        TensorKind.GROUPED,
        "2.14",
        None,
        classes=(
            f"{TE}.tensor.grouped_tensor.GroupedTensor",
            f"{TE}.tensor.storage.grouped_tensor_storage.GroupedTensorStorage",
        ),
        storage={
            "rowwise_data": "rowwise_data",
            "data": "rowwise_data",
            "tensor_shapes": "tensor_shapes",
            **_GROUPED_STORAGE_COMMON,
            **_SWIZZLED,
        },
        known=_GROUPED_KNOWN | {"fake_dtype", "row_scaled_nvfp4", "nvfp4_e4m3_max", "nvfp4_use_4over6"},
        introduced_by="TE 2.14: GroupedTensor is a torch.Tensor; data renamed rowwise_data",
        field_notes={"row_scaled_nvfp4": "2.16+", "nvfp4_*": "2.17+"},
    ),
    StorageRow(
        TensorKind.HYBRID,
        "2.19",
        None,
        classes=(
            f"{TE}.tensor.hybrid_tensor.HybridQuantizedTensor",
            f"{TE}.tensor.storage.hybrid_tensor_storage.HybridQuantizedTensorStorage",
        ),
        storage=_HYBRID_STORAGE,
        known=_QT_KNOWN,
        introduced_by=f"TE 2.19 ({_HYBRID_PR}): HybridQuantizedTensor, a sub-storage per direction",
    ),
    StorageRow(
        TensorKind.IDENTITY,
        "2.19",
        None,
        classes=(
            f"{TE}.tensor.identity_tensor.IdentityTensor",
            f"{TE}.tensor.storage.identity_tensor_storage.IdentityTensorStorage",
        ),
        storage={"data": "_hp_data", "quantizer": "_quantizer"},
        known=_QT_KNOWN,
        introduced_by=f"TE 2.19 ({_HYBRID_PR}): IdentityTensor, high-precision data as a hybrid direction",
    ),
)

# Base classes of every TE quantized tensor: an object under one of these that matches no
# row above is a quantized kind this table does not cover (e.g. a custom recipe's tensor).
QUANTIZED_BASES: tuple[tuple[str, str, str | None], ...] = (
    (f"{TE}.tensor.quantized_tensor.QuantizedTensor", "1.11", "2.10"),
    (f"{TE}.quantized_tensor.QuantizedTensor", "2.10", None),
    (f"{TE}.tensor.quantized_tensor.QuantizedTensorBase", "2.4", "2.9"),
    (f"{TE}.tensor.quantized_tensor.QuantizedTensorStorage", "2.9", "2.10"),
    (f"{TE}.quantized_tensor.QuantizedTensorStorage", "2.10", None),
)


def rows_for(kind: TensorKind) -> tuple[StorageRow, ...]:
    return tuple(r for r in ROWS if r.kind is kind)


@cache  # a constant of this table, asked at every quantised view (the rule of the installed release)
def checked_through() -> Version:
    """The newest TE release the table was checked against (matrix/releases.toml's last)."""
    return Version(CHECKED_THROUGH)


def row_for(kind: TensorKind, release: Version) -> StorageRow | None:
    for row in rows_for(kind):
        if row.covers(release):
            return row
    return None


@cache
def class_index() -> dict[str, TensorKind]:
    """``module.Class`` -> kind, over every row of every release."""
    return {path: row.kind for row in ROWS for path in row.classes}


def kinds_in(release: Version) -> tuple[TensorKind, ...]:
    return tuple(k for k in TensorKind if any(r.covers(release) for r in rows_for(k)))


def all_names(kind: TensorKind, logical: str) -> tuple[str, ...]:
    """Every attribute name any release used for ``logical``, newest row first."""
    names: list[str] = []
    for row in reversed(rows_for(kind)):
        attr = row.storage.get(logical)
        if attr and attr not in names:
            names.append(attr)
    return tuple(names)


@cache
def logical_names(kind: TensorKind) -> tuple[str, ...]:
    return tuple(sorted({n for r in rows_for(kind) for n in r.storage}))


# --- TE's behaviour per release ----------------------------------------------------------------
#
# Facts of how a release behaves, beside where it stores things. Each row names the TE release
# range, the source it was read from (file and line in that release, the PR where known), and is
# checked against every release of the matrix: the Python facts against the wheels' records
# (matrix/check.py), the C++ facts against the torch extension's source archive of each release
# (matrix/native.py).

Rule = Literal["shift", "exact"]
RULES: tuple[Rule, ...] = ("shift", "exact")
NEWEST_RULE: Rule = "exact"


@dataclass(frozen=True)
class ReciprocalRow(ReleaseRange):
    """How TE's MXFP8 kernels take the reciprocal of an E8M0 scale code (``exp2f_rcp``), the factor
    every value of a block is multiplied by before its cast to FP8, over one release range."""

    since: str
    until: str | None
    rule: Rule  # mok.quantize_reference.ReciprocalRule's name for it
    form: str  # the expression in TE's source (matrix/native.py's classification of exp2f_rcp)
    where: str  # the file, as in TE's repository
    introduced_by: str
    note: str = ""


_PTX = "transformer_engine/common/util/ptx.cuh"

RECIPROCAL_ROWS: tuple[ReciprocalRow, ...] = (
    ReciprocalRow(
        "2.0",
        "2.6",
        "shift",
        form="exp2f",
        where="transformer_engine/common/utils.cuh",
        introduced_by="TE 2.0 (on PyPI from 2.1.0): exp2f_rcp(code) = code == 0 ? 1 : exp2f(127 - code) "
        "(2.1.0-2.4.0 common/utils.cuh:967, 2.5.0 :971)",
        note="the shift rule's reciprocal for codes 0 to 253; code 254 (a block holding an infinity) gives "
        "2^-127 and code 255 gives 2^-128, where the shift rule gives 0 and -inf, so a block holding an "
        "infinity quantises here as under the exact rule",
    ),
    ReciprocalRow(
        "2.6",
        "2.13",
        "shift",
        form="shift",
        where=_PTX,
        introduced_by="TE 2.6: exp2f_rcp(code) = code == 0 ? 1 : __int_as_float((254 - code) << 23), moved to "
        "util/ptx.cuh (2.6.0 ptx.cuh:110, 2.9.0 :249, 2.12.0 :330)",
        note="code 254 gives 0 and code 255 gives -inf",
    ),
    ReciprocalRow(
        "2.13",
        None,
        "exact",
        form="exact",
        where=_PTX,
        introduced_by="TE 2.13 (PR 2647, issue 2408): exp2f_rcp gives NaN for code 255, 2^-127 (0x00400000) for "
        "254 and __int_as_float((254 - code) << 23) = 2^(127 - code) otherwise, code 0 included "
        "(2.13.0 ptx.cuh:330; exp2f_rcp<float> from 2.14.0, :338)",
    ),
)

POST_ALL_GATHER_FUNCTION = f"{TE}.tensor.utils.post_all_gather_processing"
MXFP8_TENSOR = f"{TE}.tensor.mxfp8_tensor.MXFP8Tensor"

PostAllGather = Literal["absent", "raises", "no-op"]


@dataclass(frozen=True)
class PostAllGatherRow(ReleaseRange):
    """What ``transformer_engine.pytorch.tensor.utils.post_all_gather_processing`` (Megatron's
    distributed optimizer calls it on its parameters after their all-gather) does with an MXFP8
    weight, over one release range: absent, raises, or nothing (a no-op branch)."""

    since: str
    until: str | None
    mxfp8: PostAllGather
    introduced_by: str


POST_ALL_GATHER_ROWS: tuple[PostAllGatherRow, ...] = (
    PostAllGatherRow(
        "1.0",
        "2.10",
        "absent",
        introduced_by="before TE 2.10: no post_all_gather_processing in pytorch/tensor/utils.py",
    ),
    PostAllGatherRow(
        "2.10",
        "2.11",
        "raises",
        introduced_by="TE 2.10 (PR 2266): post_all_gather_processing has no MXFP8Tensor branch, so an MXFP8 weight "
        'falls to the QuantizedTensor one: ValueError(f"post_processing for {type(model_weight)} is not '
        'supported") (2.10.0 pytorch/tensor/utils.py:488-489)',
    ),
    PostAllGatherRow(
        "2.11",
        None,
        "no-op",
        introduced_by="TE 2.11: an MXFP8Tensor branch that does nothing, 'MXFP8 scaling: no need to do anything' "
        "(2.11.0 pytorch/tensor/utils.py:620-622; 2.20.2 :1434-1436)",
    ),
)


@dataclass(frozen=True)
class QuantizerFlagRow(ReleaseRange):
    """A flag of one quantizer class that changes how TE quantizes, and so what a tensor holds,
    over one release range. The tensor itself keeps no such flag: its quantizer (TE's copy of the
    one it was made with) does, and te_compat reads it there (``storage`` names the field it
    fills in a snapshot)."""

    storage: str  # the snapshot field te_compat fills from it
    quantizer: str  # "module.Class"
    attribute: str  # assigned by the quantizer's constructor, and accepted by it as a keyword
    since: str
    until: str | None
    kinds: frozenset[TensorKind]
    introduced_by: str
    note: str = ""


QUANTIZER_FLAG_ROWS: tuple[QuantizerFlagRow, ...] = (
    QuantizerFlagRow(
        "quantized_2d",
        f"{TE}.tensor.mxfp8_tensor.MXFP8Quantizer",
        "with_2d_quantization",
        "2.19",
        None,
        kinds=frozenset({TensorKind.MXFP8, TensorKind.GROUPED}),
        introduced_by="TE 2.19 (PR 2634): MXFP8Quantizer(..., with_2d_quantization=False) (2.19.0 "
        "pytorch/tensor/mxfp8_tensor.py:45-49; copy() keeps it, :58); csrc/quantizer.cpp "
        "MXFP8Quantizer::quantize passes it to the kernel (2.19.0 :1844), and so does grouped quantisation "
        "(csrc/extensions/cast.cpp:396)",
        note="one E8M0 scale per 32x32 block, written at every position of the 1x32 layout the block covers "
        "(common/cast/mxfp8/quantize_mxfp8.cuh: the same scale_idx as 1-D); the scaling mode stays "
        "NVTE_MXFP8_1D_SCALING and get_scale_shape has no 2-D branch, so scale shapes are unchanged",
    ),
)


def reciprocal_row(release: Version) -> ReciprocalRow | None:
    """The reciprocal row covering ``release`` (None: a release without MXFP8, 1.x)."""
    return next((r for r in RECIPROCAL_ROWS if r.covers(release)), None)


def post_all_gather_row(release: Version) -> PostAllGatherRow | None:
    return next((r for r in POST_ALL_GATHER_ROWS if r.covers(release)), None)


@cache  # asked per tensor read; a kind and a release give the same rows for good
def quantizer_flag_rows(kind: TensorKind, release: Version) -> tuple[QuantizerFlagRow, ...]:
    """The quantizer flag rows that hold for a ``kind`` tensor of ``release``."""
    return tuple(r for r in QUANTIZER_FLAG_ROWS if kind in r.kinds and r.covers(release))
