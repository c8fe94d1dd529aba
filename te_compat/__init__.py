"""te_compat: the one place that knows where Transformer Engine keeps quantized storage.

Importing this package imports neither Transformer Engine nor torch; both are looked at only
when a function is called. See README.md for a tour.
"""

from te_compat.caches import on_refresh, refresh
from te_compat.capabilities import Capabilities, capabilities, cuda_device, has_cuda_core
from te_compat.errors import (
    MissingFeatureError,
    StorageNotFoundError,
    TECompatError,
    TENotFoundError,
    TEVersionError,
    UnsupportedTensorError,
)
from te_compat.probe import StorageReader, storage_attr, storage_field, storage_fingerprint, storage_reader, tensor_kind
from te_compat.snapshots import (
    Float8Storage,
    GroupedStorage,
    MXFP8Storage,
    float8_storage,
    grouped_storage,
    mxfp8_storage,
)
from te_compat.table import StorageName, TensorKind
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
    "Capabilities",
    "Float8Storage",
    "GroupedStorage",
    "MXFP8Storage",
    "MissingFeatureError",
    "StorageName",
    "StorageNotFoundError",
    "StorageReader",
    "TECompatError",
    "TENotFoundError",
    "TEStatus",
    "TEVersionError",
    "TensorKind",
    "UnsupportedTensorError",
    "capabilities",
    "cuda_device",
    "float8_storage",
    "grouped_storage",
    "has_cuda_core",
    "mxfp8_storage",
    "on_refresh",
    "parse_te_version",
    "refresh",
    "require_te",
    "storage_attr",
    "storage_field",
    "storage_fingerprint",
    "storage_reader",
    "te_min_version",
    "te_status",
    "te_version",
    "tensor_kind",
]
