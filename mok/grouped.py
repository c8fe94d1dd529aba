"""Views over one grouped expert Parameter ``(E, rows, columns)``: the public entry through the
one door (mok.door) and the one pipeline (mok.plan.pipeline)."""

from __future__ import annotations

from mok import door
from mok.formats import format_asked
from mok.views import GroupedExpertWeights


def grouped_weight_view(
    weight: object,
    *,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool | None = None,
    format: str | None = None,
    cached: GroupedExpertWeights | None = None,
    backend: str | None = None,
) -> GroupedExpertWeights:
    """Views over one grouped Parameter ``(E, rows, columns)`` (TE 2.13 ``data`` and 2.14+
    ``rowwise_data`` naming, via te_compat).

    ``format``: "bf16", "mxfp8" or "nvfp4". (``use_mxfp8``, Megatron's flag, True/False for
    "mxfp8"/"bf16", is deprecated: it warns; mok.weights keeps it.) A BF16 weight (a plain tensor, or
    TE's high-precision GroupedTensor) asked for as MXFP8 is quantised by mok, into buffers the
    view owns (``quantized_on_the_fly``), again at every refresh. With ``cached`` (a previous
    result), refresh it in place and return it, as :func:`mok.split_weight_view` does. One
    kernel launch on the cuda backend; ``backend`` as for :func:`mok.split_weight_view`.

    Threads: as :func:`mok.split_weight_view`.
    """
    if use_mxfp8 is not None:
        format = format_asked(format, use_mxfp8)  # type: ignore[assignment]  # a Format is a str
    view: GroupedExpertWeights = door.view(
        weight,
        grouped=True,
        format=format,
        rows=rows,
        columns=columns,
        experts=num_experts,
        cached=cached,
        backend=backend,
    )
    return view
