"""Views over one grouped expert Parameter ``(E, rows, columns)``: the public entry of
mok.readers.GroupedReader through the one pipeline (mok.pipeline), and plain BF16 views."""

from __future__ import annotations

from typing import cast

from mok.backend import backend_argument, preference
from mok.formats import Format, format_named
from mok.pipeline import view_or_refresh
from mok.readers import BF16Reader, GroupedReader, is_bf16_group
from mok.views import GroupedExpertWeights, check_sizes


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
    ``rowwise_data`` naming, via te_compat). ``format``: "bf16", "mxfp8" or "nvfp4" (default
    from the seed's ``use_mxfp8``). A BF16 weight (a plain tensor, or TE's high-precision
    GroupedTensor) asked for as MXFP8 is quantised by mok, into buffers the view owns
    (``quantized_on_the_fly``), again at every refresh. With ``cached`` (a previous result),
    refresh its buffers in place and return it. One kernel launch on the cuda backend; ``backend`` as for
    :func:`mok.split_weight_view`.

    Threads: as :func:`mok.split_weight_view`.
    """
    fmt = format_named(format, use_mxfp8)
    if fmt is Format.HYBRID:
        raise ValueError("format='hybrid': TE's hybrid weights are per-expert tensors; use split_weight_view")
    dims = check_sizes(num_experts=num_experts, rows=rows, columns=columns)
    backend = backend_argument(backend)
    if fmt is Format.BF16:
        preference(backend)  # checked on every path, though a BF16 view converts nothing
    shape = (dims[0], dims[1], dims[2])
    on_the_fly = cached.quantized_on_the_fly if isinstance(cached, GroupedExpertWeights) else is_bf16_group(weight)
    if fmt is Format.BF16 or (fmt is Format.MXFP8 and on_the_fly):
        view = view_or_refresh(BF16Reader((weight,), True, shape, fmt is Format.MXFP8), cached, backend)
        return cast(GroupedExpertWeights, view)  # the reader's grouped view
    return view_or_refresh(GroupedReader(weight, fmt, shape), cached, backend)
