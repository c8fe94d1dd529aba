"""Public entry points of the MXFP8 scale conversion and its inverse.

Each checks what it needs before allocating what it returns and calls its torch library op
(mok.ops). The op checks its outputs (fake tensors too) and, on real tensors, memory overlap, then
runs the work: one kernel launch on CUDA, the torch reference on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mok.backend import backend_argument
from mok.checks import check_int, check_sequence, describe
from mok.errors import LayoutError
from mok.layout import as_batch, check_layout_of, empty_layout
from mok.ops import check_logical_out, check_some_scales, swizzle_many_op, swizzle_op, unswizzle_op
from te_compat.geometry import MXFP8


def swizzle_mxfp8_scales(
    scales: torch.Tensor, *, out: torch.Tensor | None = None, backend: str | None = None
) -> torch.Tensor:
    """Convert logical MXFP8 scales ``[R, C]`` or ``[E, R, C]`` (any strides) to the layout.

    Returns uint8 ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(R,128)``, ``Cp = roundup(C,4)``),
    each expert padded on its own with zero bytes. With ``out`` the result is written there
    (same address: CUDA-graph safe) and ``out`` is returned. ``backend``: "auto" (default),
    "cuda" or "torch" (see mok.kernel_backend).
    """
    batch = as_batch(scales)
    if out is None:
        experts, rows, cols = batch.shape
        out = empty_layout(rows, cols, experts, batch.device, "swizzle_mxfp8_scales")
    elif not isinstance(out, torch.Tensor):  # the op's schema would refuse it in torch's words
        raise LayoutError(f"out: expected a torch.Tensor or None; found {describe(out)}")
    swizzle_op(batch, out, backend_argument(backend))
    return out


def swizzle_mxfp8_scales_many(
    scales: Sequence[torch.Tensor],
    *,
    outs: Sequence[torch.Tensor] | None = None,
    backend: str | None = None,
) -> list[torch.Tensor]:
    """Convert separate per-expert logical scales ``[R_i, C_i]`` (one launch on CUDA, any number
    of experts). ``outs[i]`` must be the layout buffer of ``scales[i]``; without ``outs`` they
    are allocated."""
    scales = check_sequence("scales", scales, "logical scale matrices [R, C]", item_type=torch.Tensor)
    check_some_scales(scales)
    batches = []
    for i, s in enumerate(scales):
        batch = as_batch(s, f"scales[{i}]")
        if batch.shape[0] != 1:
            raise LayoutError(f"scales[{i}]: expected a 2-D [R, C] matrix; found {tuple(s.shape)}")
        batches.append(batch)
    device = batches[0].device
    for i, b in enumerate(batches):
        if b.device != device:
            raise LayoutError(f"scales[{i}] is on {b.device}; expected every matrix on {device}")
    if outs is None:
        outs = [empty_layout(b.shape[1], b.shape[2], 1, device, f"scales[{i}]") for i, b in enumerate(batches)]
    else:
        outs = check_sequence("outs", outs, "layout buffers", item_type=torch.Tensor)
    swizzle_many_op(batches, outs, backend_argument(backend))
    return list(outs)


def unswizzle_mxfp8_scales(
    layout: torch.Tensor,
    *,
    rows: int,
    columns: int,
    experts: int = 1,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """The exact inverse of :func:`swizzle_mxfp8_scales`: the layout of ``experts`` MXFP8 weights
    ``(rows, columns)`` back into their logical scales ``[experts, rows, columns/32]`` (uint8,
    the layout's padding dropped). With ``out`` (that shape, any strides: the transpose TE keeps
    columnwise scales in works) the scales are written there and ``out`` is returned."""
    rows, columns, experts = (
        check_int(n, v, minimum=1) for n, v in (("rows", rows), ("columns", columns), ("experts", experts))
    )
    if columns % MXFP8.block:
        raise LayoutError(f"columns: expected a multiple of {MXFP8.block} (one scale per block); found {columns}")
    logical = (experts, rows, columns // MXFP8.block)
    check_layout_of(layout, logical)
    if out is None:
        out = torch.empty(logical, dtype=torch.uint8, device=layout.device)
    unswizzle_op(layout, check_logical_out(out, logical, layout.device), backend_argument(backend))
    return out
