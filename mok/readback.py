"""Logical block scales read back from where they are in the GEMM layout: a view's layout
buffers, or a TE tensor whose scales TE keeps swizzled (TE 2.12+, after
``te_compat.request_gemm_layout_scales``). For a checkpoint, a comparison of two runs, or a
look at one value; scales are returned in TE's own orientation, as TE's logical buffers hold
them (MXFP8: rowwise ``[rows, columns/32]``, columnwise ``[rows/32, columns]``; NVFP4: rowwise
``[rows, columns/16]``, columnwise ``[columns, rows/16]``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mok.checks import describe
from mok.errors import ExpertWeightError
from mok.layout import layout_shape, te_swizzled_layout
from mok.plan.work import ScaleWork, run_work
from mok.read.blocks import BLOCK_OF_KIND, BlockFormat, Direction, block_format
from mok.views import ExpertWeights, GroupedExpertWeights, ViewDirection
from te_compat import tensor_kind

DIRECTIONS = ("rowwise", "columnwise")


def _unswizzle(
    block: BlockFormat, d: Direction, layouts: Sequence[torch.Tensor], experts: int, rows: int, columns: int
) -> list[torch.Tensor]:
    """Each layout back into logical scales in TE's orientation (te_compat's ``orient``), all in
    one launch."""
    shape = (experts, *d.buffer_matrix(rows, columns))
    outs = [torch.empty(shape, dtype=torch.uint8, device=lay.device) for lay in layouts]
    matrices = [d.orient(o) for o in outs]
    run_work([ScaleWork(lay, m, inverse=True) for lay, m in zip(layouts, matrices, strict=True)])
    return outs


def _from_view(view: ExpertWeights, name: str) -> torch.Tensor | tuple[torch.Tensor, ...]:
    part: ViewDirection | None = view.rowwise if name == "rowwise" else view.columnwise
    if part is None or part.scales is None:
        raise ExpertWeightError(f"{name} scales: expected a view with {name} block scales; found none")
    block = block_format(part.format)
    d = block.geometry.direction(name)
    if isinstance(view, GroupedExpertWeights):
        return _unswizzle(block, d, part.scales, view.num_experts, view.rows, view.columns)[0]
    return tuple(o[0] for o in _unswizzle(block, d, part.scales, 1, view.rows, view.columns))


def _from_tensor(param: object, name: str) -> torch.Tensor:
    block = BLOCK_OF_KIND.get(tensor_kind(param))
    if block is None:
        raise ExpertWeightError(
            f"expected a view, or a TE MXFP8 or NVFP4 tensor; found {describe(param)} (kind {tensor_kind(param)})"
        )
    d = block.geometry.direction(name)
    snapshot = block.snapshot(param)
    buffer = snapshot.need(d.scales.value)
    rows, columns = snapshot.shape[0], snapshot.shape[-1]
    if len(snapshot.shape) != 2:
        raise ExpertWeightError(f"expected a 2-D weight; found shape {tuple(snapshot.shape)}")
    if not snapshot.scales_swizzled:  # TE keeps them logical: a copy, never a view of TE's buffer
        logical = block.gemm_scales(d, buffer, rows, columns, f"{name} scales")[0]
        return d.orient(logical).clone()
    shape = layout_shape(*d.scale_matrix(rows, columns))
    layout = te_swizzled_layout(buffer.view(torch.uint8), shape, f"{name} scales")
    return _unswizzle(block, d, [layout], 1, rows, columns)[0][0]


def logical_scales(source: object, *, direction: str = "rowwise") -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The logical scales of ``direction`` ("rowwise" or "columnwise") in TE's orientation.

    ``source`` is a view (grouped: one ``[E, ...]`` tensor; per expert: a tuple of one tensor
    per expert, converted in one launch) or a TE MXFP8/NVFP4 tensor (read back from the layout
    when TE keeps its scales swizzled, copied out of TE's padded buffer when it keeps them
    logical). Always new tensors: writing one never writes TE's storage, and saving one saves
    the scales alone.
    """
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {', '.join(map(repr, DIRECTIONS))}; found {describe(direction)}")
    if isinstance(source, ExpertWeights):
        return _from_view(source, direction)
    return _from_tensor(source, direction)
