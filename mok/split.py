"""Views over one Parameter per expert, with device pointer tables for a kernel: the public
entry through the one door (mok.door) and the one pipeline (mok.plan.pipeline)."""

from __future__ import annotations

from collections.abc import Sequence

from mok.door import open_view
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
    view: SplitExpertWeights = open_view(
        params, grouped=False, format=format, use_mxfp8=use_mxfp8, dims=(rows, columns), cached=cached, backend=backend
    )
    return view
