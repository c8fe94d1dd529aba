"""The one way in: every view and refresh of expert weights, whoever asks for it
(mok.split_weight_view, mok.grouped_weight_view, mok.LayerRefresh, mok.export_mxfp8, the
mok.weights drop-in), is made by :func:`view`, and its reader chosen by :func:`reader_for`, here
alone.

The reader decides how the weights are read: BF16 weights viewed as they are or quantised by mok
(MXFP8 asked of BF16 weights), TE's MXFP8/NVFP4/hybrid storage one Parameter per expert or one
grouped Parameter, or, where a caller brings its own functions for the steps of a view
(mok.weights: Megatron's module's names, any of which a caller may replace), those functions
(mok.read.readers.SeamReader). Every reader produces the same snapshot, which goes through the one
pipeline (mok.plan.pipeline): its plan, its guard and its kernels serve them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from mok.backend import backend_argument, preference
from mok.formats import Format, format_named
from mok.plan.pipeline import Reader, rerun_unchanged, view_or_refresh
from mok.read.readers import BF16Reader, GroupedReader, SeamReader, Seams, SplitReader, is_bf16_group
from mok.views import ExpertWeights, GroupedExpertWeights, Shape, SplitExpertWeights, check_sizes, param_list
from te_compat import TensorKind, tensor_kind_or_none

__all__ = ["Shape", "quantized_on_the_fly", "reader_for", "rerun", "view"]


def view(
    weights: object,
    *,
    grouped: bool,
    format: object,
    rows: object,
    columns: object,
    experts: object = None,
    cached: ExpertWeights | None = None,
    backend: object = None,
    seams: Seams | None = None,
    outs: Sequence[Sequence[Any]] | None = None,
    both_directions: bool = False,
) -> Any:
    """A new view of ``weights``, or ``cached`` refreshed in place and returned.

    ``grouped``: one grouped weight of ``experts`` weights ``(rows, columns)``; else a sequence of
    one Parameter per expert (``experts`` is their count). ``format``: a :class:`Format` or its
    name; ``backend`` checked on every path, though a BF16 view converts nothing. ``seams``: a
    caller's functions for the steps of a view (mok.weights); ``outs``: the caller's own layout
    buffers to convert into (one sequence per direction), where the caller's view to refresh is
    not a mok view. ``both_directions``: weights TE keeps rowwise only are refused.
    """
    fmt = format_named(format)
    request = backend_argument(backend)
    if fmt is Format.BF16 and seams is None:
        preference(request)
    if (
        cached is not None
        and (seams is None or seams.own or cached.quantized_on_the_fly)
        and rerun(weights, grouped, fmt, rows, columns, experts, cached, request)
    ):
        return cached
    reader = reader_for(
        weights,
        grouped=grouped,
        format=fmt,
        rows=rows,
        columns=columns,
        experts=experts,
        seams=seams,
        mok_view=outs is None or cached is not None,
        into_outs=outs is not None,
        both_directions=both_directions,
    )
    if type(reader) is SeamReader:  # the caller's functions, called again: a new view, into the caller's buffers
        return view_or_refresh(reader, None, request, outs)
    return view_or_refresh(reader, cached, request)


def reader_for(
    weights: object,
    *,
    grouped: bool,
    format: Format,
    rows: object,
    columns: object,
    experts: object = None,
    seams: Seams | None = None,
    mok_view: bool = True,
    into_outs: bool = False,
    both_directions: bool = False,
) -> Reader[Any]:
    """The reader of ``weights`` as :func:`view` describes them, every argument checked: the
    same reader for a new view and a refresh. With ``seams``, mok's own readers read the weights
    only where what they read is the same: MXFP8 of BF16 weights (mok quantises them), or, while
    every function is mok's, TE's own MXFP8 weights; each into a new view or a mok view (``mok_view``);
    otherwise the caller's functions read them (``into_outs``: for a refresh into the caller's
    own buffers)."""
    if grouped:
        if format is Format.HYBRID:
            raise ValueError("format='hybrid': TE's hybrid weights are per-expert tensors; use split_weight_view")
        shape = Shape(*check_sizes(num_experts=experts, rows=rows, columns=columns))
        objects: tuple[object, ...] = (weights,)
    else:
        rows, columns = check_sizes(rows=rows, columns=columns)
        # a caller's functions take any objects (Megatron's checks passed them); mok's readers take tensors
        objects = tuple(cast(Sequence[object], weights)) if seams is not None else tuple(param_list(weights))
        shape = Shape(len(objects), rows, columns)
    view_type: type[ExpertWeights] = GroupedExpertWeights if grouped else SplitExpertWeights
    what = "grouped " if grouped else ""
    on_the_fly = format is Format.MXFP8 and quantized_on_the_fly(objects, grouped)
    mok_reads = on_the_fly or (
        format is Format.MXFP8 and seams is not None and seams.own and _te_mxfp8(objects, grouped)
    )
    if seams is not None and not (mok_view and mok_reads):
        return SeamReader(objects, format, shape, seams, into_outs, view_type, what)
    if format is Format.BF16 or on_the_fly:
        return BF16Reader(objects, format, shape, view_type, what, on_the_fly)
    if grouped:
        return GroupedReader((weights,), format, shape, both_directions)
    return SplitReader(objects, format, shape, both_directions)


def quantized_on_the_fly(weights: Sequence[object], grouped: bool) -> bool:
    """Whether MXFP8 asked of these weights means mok quantises BF16 weights itself: a plain
    tensor (or TE's BF16 GroupedTensor) where TE's MXFP8 is due. Decided from the weights as they
    are now, for a new view and a refresh alike, never from what a cached view was made of: a
    refresh of weights whose kind changed then reads them as a new view would, and the pipeline
    refuses the change if the view cannot hold it."""
    if not weights:
        return False
    first = weights[0]
    return is_bf16_group(first) if grouped else tensor_kind_or_none(first) is TensorKind.PLAIN


def _te_mxfp8(objects: Sequence[object], grouped: bool) -> bool:
    """TE's own MXFP8 weights: a TE GroupedTensor, or per-expert TE MXFP8 tensors (one kind check
    per class)."""
    if grouped:
        return tensor_kind_or_none(objects[0]) is TensorKind.GROUPED
    return {tensor_kind_or_none(p) for p in {type(p): p for p in objects}.values()} == {TensorKind.MXFP8}


def rerun(
    weights: object,
    grouped: bool,
    fmt: Format,
    rows: object,
    columns: object,
    experts: object,
    cached: object,
    request: str | None = None,
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
        experts = len(objects)
    return rerun_unchanged(cached, view_type, fmt, (experts, rows, columns), objects, request)
