"""Public entry points of the MXFP8 scale conversion, with backend selection.

CUDA tensors go to the NVRTC kernel (``mok.kernels``) when te_compat's backend choice says
``cuda``; everything else, and every CPU tensor, goes to the torch reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mok.errors import LayoutError
from mok.layout import as_batch, check_out, layout_shape, swizzle_reference
from te_compat import kernel_backend


def backend_for(device: torch.device, backend: str | None) -> str:
    """ "cuda" or "torch" for tensors on ``device`` under the requested backend."""
    if device.type != "cuda":
        if backend == "cuda":
            raise LayoutError(f"backend 'cuda' needs CUDA tensors; found scales on {device}")
        return "torch"
    return kernel_backend(backend).name


def swizzle_mxfp8_scales(
    scales: torch.Tensor, *, out: torch.Tensor | None = None, backend: str | None = None
) -> torch.Tensor:
    """Convert logical MXFP8 scales ``[R, C]`` or ``[E, R, C]`` (any strides) to the layout.

    Returns uint8 ``[E*Rp/128, Cp/4, 32, 16]`` (``Rp = roundup(R,128)``, ``Cp = roundup(C,4)``),
    each expert padded on its own with zero bytes. With ``out`` the result is written there
    (same address: CUDA-graph safe) and ``out`` is returned.
    """
    batch = as_batch(scales)
    if out is None:
        experts, rows, cols = batch.shape
        out = torch.empty(layout_shape(rows, cols, experts), dtype=torch.uint8, device=batch.device)
    else:
        check_out(out, batch)
    if backend_for(batch.device, backend) == "cuda":
        from mok.kernels import launcher

        launcher.swizzle_batch(batch, out)
    else:
        swizzle_reference(batch, out)
    return out


def swizzle_mxfp8_scales_many(
    scales: Sequence[torch.Tensor],
    *,
    outs: Sequence[torch.Tensor] | None = None,
    backend: str | None = None,
) -> list[torch.Tensor]:
    """Convert separate per-expert logical scales ``[R_i, C_i]`` (one launch on CUDA).

    ``outs[i]`` must be the layout buffer of ``scales[i]``; without ``outs`` they are allocated.
    """
    if len(scales) == 0:
        raise LayoutError("swizzle_mxfp8_scales_many: expected at least one scale matrix; found none")
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
        outs = [torch.empty(layout_shape(b.shape[1], b.shape[2]), dtype=torch.uint8, device=device) for b in batches]
    elif len(outs) != len(batches):
        raise LayoutError(f"expected {len(batches)} output buffers, one per scale matrix; found {len(outs)}")
    for i, (b, o) in enumerate(zip(batches, outs, strict=True)):
        check_out(o, b, f"outs[{i}]")
    if backend_for(device, backend) == "cuda":
        from mok.kernels import launcher

        launcher.swizzle_many(batches, list(outs))
    else:
        for b, o in zip(batches, outs, strict=True):
            swizzle_reference(b, o)
    return list(outs)
