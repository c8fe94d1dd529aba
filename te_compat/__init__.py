"""te_compat: the one place that knows where Transformer Engine keeps quantized storage.

Importing this package imports neither Transformer Engine nor torch; both are looked at only
when a function is called. docs/te_compat.md describes the API.
"""

from te_compat.behaviour import mxfp8_reciprocal_rule
from te_compat.caches import on_refresh, refresh
from te_compat.capabilities import Capabilities, capabilities
from te_compat.device import cuda_device, has_cuda_core  # has_cuda_core: deprecated (mok.backend's)
from te_compat.errors import (
    AmbiguousStorageNameError,
    MissingFeatureError,
    StorageNotFoundError,
    StorageValueError,
    TECompatError,
    TENotFoundError,
    TEVersionError,
    UnknownStorageNameError,
    UnsupportedTensorError,
)
from te_compat.gemm_layout import GemmLayoutEntry, GemmLayoutReport, GemmLayoutStatus, request_gemm_layout_scales
from te_compat.names import known_storage_name, logical_storage_name
from te_compat.probe import (
    StorageReader,
    storage_attr,
    storage_field,
    storage_fingerprint,
    storage_reader,
    tensor_kind,
    tensor_kind_or_none,
)
from te_compat.quantize import mxfp8_quantize_into
from te_compat.selfcheck import CheckResult, SelftestResult, SkipCheck, selftest
from te_compat.storage import (
    BlockwiseStorage,
    Float8Storage,
    GroupedStorage,
    HybridStorage,
    MXFP8Storage,
    NVFP4Storage,
    blockwise_storage,
    float8_storage,
    grouped_scale_buffers,
    grouped_storage,
    hybrid_storage,
    mxfp8_storage,
    nvfp4_storage,
    scale_matrix,
    storage_values,
)
from te_compat.table import StorageName, TensorKind
from te_compat.verify import Verification, find_te_source, verify_installed
from te_compat.version import (
    TEStatus,
    parse_te_version,
    require_te,
    te_min_version,
    te_status,
    te_version,
)

__version__ = "0.1.0"

__all__ = [
    "AmbiguousStorageNameError",
    "BlockwiseStorage",
    "Capabilities",
    "CheckResult",
    "Float8Storage",
    "GemmLayoutEntry",
    "GemmLayoutReport",
    "GemmLayoutStatus",
    "GroupedStorage",
    "HybridStorage",
    "MXFP8Storage",
    "MissingFeatureError",
    "NVFP4Storage",
    "SelftestResult",
    "SkipCheck",
    "StorageName",
    "StorageNotFoundError",
    "StorageReader",
    "StorageValueError",
    "TECompatError",
    "TENotFoundError",
    "TEStatus",
    "TEVersionError",
    "TensorKind",
    "UnknownStorageNameError",
    "UnsupportedTensorError",
    "Verification",
    "blockwise_storage",
    "capabilities",
    "cuda_device",
    "find_te_source",
    "float8_storage",
    "grouped_scale_buffers",
    "grouped_storage",
    "has_cuda_core",
    "hybrid_storage",
    "known_storage_name",
    "logical_storage_name",
    "mxfp8_quantize_into",
    "mxfp8_reciprocal_rule",
    "mxfp8_storage",
    "nvfp4_storage",
    "on_refresh",
    "parse_te_version",
    "refresh",
    "request_gemm_layout_scales",
    "require_te",
    "scale_matrix",
    "selftest",
    "storage_attr",
    "storage_field",
    "storage_fingerprint",
    "storage_reader",
    "storage_values",
    "te_min_version",
    "te_status",
    "te_version",
    "tensor_kind",
    "tensor_kind_or_none",
    "verify_installed",
]
