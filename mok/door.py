"""The one way in: every view and refresh of expert weights, whoever asks for it
(mok.split_weight_view, mok.grouped_weight_view, mok.LayerRefresh, the mok.weights drop-in), is
decided and checked here, once.

:func:`reader_for` decides how the weights are read: BF16 weights viewed as they are or
quantised by mok (on the fly, when MXFP8 is asked of BF16 weights), TE's MXFP8/NVFP4/hybrid
storage one Parameter per expert or one grouped Parameter; and checks every argument (sizes,
format, the list of experts) before anything is read. The reader then goes through the one
pipeline (mok.plan.pipeline), whose refresh guard compares what the reader read.

A caller that brings its own functions for the steps of a view (the mok.weights drop-in, as
Megatron's module composes them) passes them in as mok.seams.Seams: where they are mok's own and
the weights are TE's, that caller comes through here too; otherwise mok.seams composes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mok.backend import backend_argument, preference
from mok.formats import Format, format_named
from mok.plan.pipeline import Reader, rerun_unchanged, view_or_refresh
from mok.read.readers import BF16Reader, GroupedReader, SplitReader, is_bf16_group
from mok.views import ExpertWeights, GroupedExpertWeights, SplitExpertWeights, check_sizes, param_list
from te_compat import TensorKind, tensor_kind_or_none

# ------------------------------------------------------------------------------ the door


def on_the_fly(weights: Sequence[object], grouped: bool) -> bool:
    """Whether MXFP8 asked of these weights means mok quantises BF16 weights itself: a plain
    tensor (or TE's BF16 GroupedTensor) where TE's MXFP8 is due. Decided from the weights as they
    are now, for a new view and a refresh alike, never from what a cached view was made of: a
    refresh of weights whose kind changed then reads them as a new view would, and the pipeline
    refuses the change if the view cannot hold it."""
    if not weights:
        return False
    first = weights[0]
    return is_bf16_group(first) if grouped else tensor_kind_or_none(first) is TensorKind.PLAIN


def reader_for(weights: object, *, grouped: bool, fmt: Format, dims: tuple[object, ...]) -> Reader[Any]:
    """The reader of ``weights`` (one grouped weight, or a sequence of one Parameter per expert)
    as ``fmt`` of ``dims`` (``(experts, rows, columns)`` grouped, ``(rows, columns)`` split),
    every argument checked. The same reader for a new view and a refresh."""
    if grouped:
        if fmt is Format.HYBRID:
            raise ValueError("format='hybrid': TE's hybrid weights are per-expert tensors; use split_weight_view")
        experts, rows, columns = check_sizes(num_experts=dims[0], rows=dims[1], columns=dims[2])
        shape = (experts, rows, columns)
        if fmt is Format.BF16 or (fmt is Format.MXFP8 and on_the_fly((weights,), True)):
            return BF16Reader((weights,), True, shape, fmt is Format.MXFP8)
        return GroupedReader(weights, fmt, shape)
    rows, columns = check_sizes(rows=dims[0], columns=dims[1])
    params = tuple(param_list(weights))
    shape = (len(params), rows, columns)
    if fmt is Format.BF16 or (fmt is Format.MXFP8 and on_the_fly(params, False)):
        return BF16Reader(params, False, shape, fmt is Format.MXFP8)
    return SplitReader(params, fmt, rows, columns)


def open_view(
    weights: object,
    *,
    grouped: bool,
    format: object,
    use_mxfp8: object,
    dims: tuple[object, ...],
    cached: ExpertWeights | None,
    backend: object = None,
) -> Any:
    """A new view of ``weights``, or ``cached`` refreshed, as mok.split_weight_view and
    mok.grouped_weight_view ask for it: the format named, the backend checked (on every path, though
    a BF16 view converts nothing), then the reader through the pipeline."""
    fmt = format_named(format, use_mxfp8)
    request = backend_argument(backend)
    if fmt is Format.BF16:
        preference(request)
    if cached is not None and rerun(weights, grouped, fmt, dims, cached, request):
        return cached
    return view_or_refresh(reader_for(weights, grouped=grouped, fmt=fmt, dims=dims), cached, request)


def rerun(
    weights: object, grouped: bool, fmt: Format, dims: tuple[object, ...], cached: object, request: str | None = None
) -> bool:
    """A refresh whose guard finds everything its last plan read unchanged: the prepared launch
    ran again, with no reader made. The reader a new view would choose is then the one the view
    was planned with (it depends on the weights' classes and TE's quantizer attribute, which the
    guard read). Anything unusual (arguments not as the view was made, weights not a list or
    tuple) goes the full way, whose checks name it."""
    if grouped:
        view_type: type[ExpertWeights] = GroupedExpertWeights
        objects: tuple[object, ...] = (weights,)
    else:
        if type(weights) not in (list, tuple):
            return False
        view_type, objects = SplitExpertWeights, tuple(weights)  # type: ignore[arg-type]
        dims = (len(objects), *dims)
    return rerun_unchanged(cached, view_type, fmt, dims, objects, request)
