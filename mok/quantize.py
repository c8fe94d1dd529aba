"""BF16 weights to MXFP8, both directions, scales straight in the GEMM layout: the public entry
of mok's quantize kernel (one launch for every expert; the torch reference off CUDA), through its
torch library op (mok.ops: ``torch.ops.mok.quantize_mxfp8``)."""

from __future__ import annotations

import torch

from mok.backend import backend_argument
from mok.checks import describe
from mok.kernels.quantize import QuantizeOutputs, empty_outputs
from mok.ops import quantize_op
from mok.quantize_reference import check_input


def quantize_mxfp8(
    weights: torch.Tensor, *, out: QuantizeOutputs | None = None, backend: str | None = None
) -> QuantizeOutputs:
    """Quantise BF16 ``weights`` (``[E, R, C]``, or ``[R, C]`` for E = 1; R and C multiples of 32)
    as the installed TE release's ``MXFP8Quantizer(rowwise=True, columnwise=True)`` does
    (mok.quantize_reference has the rule; TE 2.13 changed its reciprocal, and without TE the
    newest rule is followed): FP8 E4M3 payloads ``[E, R, C]`` both ways (columnwise not transposed, as TE keeps
    it), and both scale matrices in the 128x4 layout: rowwise of ``[R, C/32]``
    (``layout_shape(R, C/32, E)``), columnwise of the ``[C, R/32]`` transpose the dgrad GEMM
    reads (``layout_shape(C, R/32, E)``). With ``out`` (an earlier result, or
    mok.kernels.quantize.empty_outputs) the results are written there in place (same
    addresses: CUDA-graph safe) and ``out`` is returned. ``weights`` is never written."""
    batch = check_input(weights, "weights")
    if out is None:
        experts, rows, cols = batch.shape
        out = empty_outputs(experts, rows, cols, batch.device)
    elif not isinstance(out, QuantizeOutputs):
        raise TypeError(f"out: expected a QuantizeOutputs (an earlier result); found {describe(out)}")
    quantize_op(batch, *out, backend_argument(backend))
    return out
