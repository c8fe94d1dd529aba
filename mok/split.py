"""Views over one Parameter per expert, with device pointer tables for a kernel: the public
entry through the one door (mok.door) and the one pipeline (mok.plan.pipeline)."""

from __future__ import annotations

from collections.abc import Sequence

from mok import door
from mok.formats import format_asked
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
    in its own format (``rowwise.format``/``columnwise.format``). (``use_mxfp8``, Megatron's
    flag, True/False for "mxfp8"/"bf16", is deprecated: it warns; mok.weights keeps it.) BF16
    Parameters asked for as MXFP8 are quantised by mok, into buffers the view owns
    (``quantized_on_the_fly``), again at every refresh.

    With ``cached`` (a previous result), refresh it in place and return it, equal to a new view
    of the same weights: its own buffers (scale layouts, pointer tables) keep their addresses,
    and where TE moved a payload (a buffer reassigned, FSDP's next all-gather) the view's
    payload tensors and pointer tables follow it. When TE reassigned no storage since, the
    prepared launch simply runs again. A refresh raises what a new view would, and
    :class:`mok.RefreshError` where the view cannot become the new one in place (other shape,
    count or format; a direction gone; a buffer of its own freed).
    All experts convert in one kernel launch (cuda backend). ``backend`` ("auto", "cuda",
    "torch"; default the environment's TE_COMPAT_KERNEL_BACKEND) is resolved when the view is
    built; its refreshes keep it unless they name another.

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers may convert the old buffers; the
    next refresh that nothing races sees the change and converts the new ones.
    """
    if use_mxfp8 is not None:
        format = format_asked(format, use_mxfp8)  # type: ignore[assignment]  # a Format is a str
    view: SplitExpertWeights = door.view(
        params, grouped=False, format=format, rows=rows, columns=columns, cached=cached, backend=backend
    )
    return view
