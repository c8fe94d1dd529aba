"""mok: zero-copy views over routed-expert weights and the MXFP8 scale layout for tcgen05.

mok reads Transformer Engine objects only through te_compat.
"""

from mok.backend import BackendChoice, kernel_backend
from mok.deprecation import renamed_keywords
from mok.errors import ExpertWeightError, LayoutError, MokError, RefreshError, StorageFreedError
from mok.export import MXFP8Export, export_mxfp8
from mok.formats import Format
from mok.grouped import grouped_weight_view
from mok.kernels.quantize import QuantizeOutputs
from mok.layer import LayerRefresh, refresh_layer
from mok.layout import layout_offset, layout_shape, padded_shape
from mok.quantize import quantize_mxfp8
from mok.readback import logical_scales
from mok.shared_expert import prepare_shared_expert_config
from mok.split import split_weight_view
from mok.swizzle import swizzle_mxfp8_scales, swizzle_mxfp8_scales_many, unswizzle_mxfp8_scales
from mok.views import ExpertWeights, GroupedExpertWeights, RefreshPlan, SplitExpertWeights, ViewDirection, storage_view

# their ``cols=`` keyword is ``columns=``, as everywhere in mok's API; ``cols=`` warns for a release
layout_offset = renamed_keywords(cols="columns")(layout_offset)
layout_shape = renamed_keywords(cols="columns")(layout_shape)
padded_shape = renamed_keywords(cols="columns")(padded_shape)

__all__ = [
    "BackendChoice",
    "ExpertWeightError",
    "ExpertWeights",
    "Format",
    "GroupedExpertWeights",
    "LayerRefresh",
    "LayoutError",
    "MXFP8Export",
    "MokError",
    "QuantizeOutputs",
    "RefreshError",
    "RefreshPlan",
    "SplitExpertWeights",
    "StorageFreedError",
    "ViewDirection",
    "export_mxfp8",
    "grouped_weight_view",
    "kernel_backend",
    "layout_offset",
    "layout_shape",
    "logical_scales",
    "padded_shape",
    "prepare_shared_expert_config",
    "quantize_mxfp8",
    "refresh_layer",
    "split_weight_view",
    "storage_view",
    "swizzle_mxfp8_scales",
    "swizzle_mxfp8_scales_many",
    "unswizzle_mxfp8_scales",
]
