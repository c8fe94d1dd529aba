"""Views over one Parameter per expert, with device pointer tables for a kernel: the public entry
of mok.readers.SplitReader through the one pipeline (mok.pipeline), and plain BF16 views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from mok.backend import backend_argument, preference
from mok.formats import Format, format_named
from mok.pipeline import view_or_refresh
from mok.readers import BF16Reader, SplitReader
from mok.views import SplitExpertWeights, check_sizes, param_list
from te_compat import TensorKind, tensor_kind


def split_weight_view(
    params: Sequence[object],
    *,
    rows: int,
    columns: int,
    use_mxfp8: bool | None = None,
    format: str | None = None,
    cached: SplitExpertWeights | None = None,
    backend: str | None = None,
) -> SplitExpertWeights:
    """Views over one Parameter per expert, each ``(rows, columns)``, with pointer tables.

    ``format``: "bf16", "mxfp8", "nvfp4", or "hybrid" for TE 2.19+ hybrid weights, each direction
    in its own format (``rowwise.format``/``columnwise.format``); default from the seed's
    ``use_mxfp8``. BF16 Parameters asked for as MXFP8 are quantised by mok, into buffers the view
    owns (``quantized_on_the_fly``), again at every refresh. With ``cached`` (a previous
    result), refresh its scale buffers in place (same addresses) after checking that no payload
    moved, and return it: when TE reassigned no storage since, the prepared launch simply runs
    again. All experts convert in one kernel
    launch (cuda backend). ``backend`` ("auto", "cuda", "torch"; default the environment's
    TE_COMPAT_KERNEL_BACKEND) is resolved when the view is built; its refreshes keep it unless
    they name another.

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers may convert the old buffers; the
    next refresh that nothing races sees the change and converts the new ones.
    """
    fmt = format_named(format, use_mxfp8)
    rows, columns = check_sizes(rows=rows, columns=columns)
    # a refresh of the same objects needs no item check; a new view checks them once, here
    experts = param_list(params, tensors=fmt is Format.BF16 or cached is None)
    backend = backend_argument(backend)
    if fmt is Format.BF16:
        preference(backend)  # checked on every path, though a BF16 view converts nothing
    on_the_fly = cached.quantized_on_the_fly if isinstance(cached, SplitExpertWeights) else _plain(experts[0])
    if fmt is Format.BF16 or (fmt is Format.MXFP8 and on_the_fly):
        reader = BF16Reader(tuple(experts), False, (len(experts), rows, columns), fmt is Format.MXFP8)
        return cast(SplitExpertWeights, view_or_refresh(reader, cached, backend))  # the reader's split view
    return view_or_refresh(SplitReader(tuple(experts), fmt, rows, columns, cached is None), cached, backend)


def _plain(param: object) -> bool:
    """A plain (BF16) tensor, which an MXFP8 view quantises on the fly."""
    return tensor_kind(param) is TensorKind.PLAIN
