"""Views over one Parameter per expert, with device pointer tables for a kernel: the public
entry through the one door (mok.door) and the one pipeline (mok.plan.pipeline)."""

from __future__ import annotations

from collections.abc import Sequence

from mok.backend import backend_argument, preference
from mok.door import reader_for
from mok.formats import Format, format_named
from mok.plan.pipeline import view_or_refresh
from mok.views import SplitExpertWeights


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
    backend = backend_argument(backend)
    if fmt is Format.BF16:
        preference(backend)  # checked on every path, though a BF16 view converts nothing
    reader = reader_for(params, grouped=False, fmt=fmt, dims=(rows, columns), cached=cached)
    view: SplitExpertWeights = view_or_refresh(reader, cached, backend)  # a split reader's view
    return view
