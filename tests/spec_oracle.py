"""The layout spec (../shared/spec/mxfp8-scale-layout.md) as a slow, obvious oracle."""

from __future__ import annotations

import torch


def roundup(x: int, m: int) -> int:
    return -(-x // m) * m


def spec_offset(r: int, c: int, cp: int) -> int:
    # the spec's formula, verbatim
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def spec_layout(logical: torch.Tensor) -> torch.Tensor:
    """Layout bytes of a logical [R, C] or [E, R, C] uint8 matrix, by scattering each byte to its
    spec offset into a zeroed buffer, each expert padded on its own."""
    batch = logical if logical.dim() == 3 else logical.unsqueeze(0)
    e, r, c = batch.shape
    rp, cp = roundup(r, 128), roundup(c, 4)
    out = torch.zeros(e * rp * cp, dtype=torch.uint8)
    rr = torch.arange(r).view(r, 1).expand(r, c)
    cc = torch.arange(c).view(1, c).expand(r, c)
    idx = ((rr // 128) * (cp // 4) + cc // 4) * 512 + (rr % 32) * 16 + ((rr % 128) // 32) * 4 + cc % 4
    for x in range(e):
        out[x * rp * cp + idx.flatten()] = batch[x].cpu().flatten()
    return out.view(e * rp // 128, cp // 4, 32, 16)
