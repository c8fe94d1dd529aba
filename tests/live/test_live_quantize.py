"""te_compat.mxfp8_quantize_into and the mxfp8_quantization capability against a real TE.

The capability says TE's MXFP8 quantisation writes on this device; the first test asks TE itself:
its buffers are filled with random bytes, TE re-quantises into them, and whether any byte changed
must equal the capability (on an H200 nothing changes and the capability is False). Where TE
writes, mxfp8_quantize_into must give the bytes TE's own quantizer gives.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import te_compat
from te_compat.quantize import padded_scale_shape
from tests.live.evidence import WRITTEN_BY_TE, Evidence

NAMES = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")
SHAPE = (2, 256, 128)  # aligned: no padding, so whole scale buffers compare


def _quantizer(optimize_for_gemm: bool = False) -> Any:
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    q = MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=True)
    if optimize_for_gemm:
        q.optimize_for_gemm = True
    return q


def _te_buffers(tensor: object) -> list[torch.Tensor]:
    return [te_compat.storage_field(tensor, name) for name in NAMES]


def test_the_capability_is_whether_te_writes(evidence: Evidence) -> None:
    caps = te_compat.capabilities(verify=False)
    x = torch.randn(256, 128, dtype=torch.bfloat16, device="cuda")
    q = _quantizer()
    t = q.make_empty((256, 128), dtype=torch.bfloat16, device=torch.device("cuda"))
    buffers = _te_buffers(t)
    evidence.fill_random_(*buffers)
    before = [b.clone() for b in buffers]
    try:
        q.update_quantized(x, t)
        torch.cuda.synchronize()
        raised = ""
    except RuntimeError as exc:  # TE before the cast-kernel split refuses compute capability < 10.0
        raised = str(exc)
    changed = any(not torch.equal(b, a) for b, a in zip(buffers, before, strict=True))
    evidence.note(f"cc {caps.compute_capability}: TE changed bytes: {changed}; raised: {raised or 'no'}")
    assert changed == caps.mxfp8_quantization, (caps.compute_capability, raised)


def _own(evidence: Evidence, x: torch.Tensor, gemm_layout: bool) -> dict[str, torch.Tensor]:
    rows, columns = x.numel() // x.shape[-1], x.shape[-1]
    shapes = {
        "rowwise_data": tuple(x.shape),
        "rowwise_scale_inv": padded_scale_shape(rows, columns, columnwise=False),
        "columnwise_data": tuple(x.shape),
        "columnwise_scale_inv": padded_scale_shape(rows, columns, columnwise=True),
    }
    given = {name: torch.empty(shape, dtype=torch.uint8, device=x.device) for name, shape in shapes.items()}
    evidence.fill_random_(*given.values())
    te_compat.mxfp8_quantize_into(x, **given, gemm_layout=gemm_layout)
    return given


@pytest.mark.parametrize("gemm_layout", [False, True])
def test_quantize_into_gives_te_own_bytes(gemm_layout: bool, evidence: Evidence) -> None:
    caps = te_compat.capabilities(verify=False)
    if not caps.mxfp8_quantization:
        pytest.skip(f"TE does not quantise MXFP8 here: {caps.missing('mxfp8_quantization')}")
    if gemm_layout and "optimize_for_gemm" not in str(caps.mxfp8_quantize_api):
        pytest.skip(f"TE {caps.te_version} writes compact scales only")
    # one magnitude per row, so the scales differ between rows and blocks
    x = torch.randn(SHAPE, device="cuda") * torch.exp2(torch.randint(-8, 9, (*SHAPE[:-1], 1), device="cuda"))
    x = x.to(torch.bfloat16)
    ours = _own(evidence, x, gemm_layout)
    reference = _quantizer(gemm_layout)(x)
    for name, theirs in zip(NAMES, _te_buffers(reference), strict=True):
        mine = ours[name].view(theirs.shape)
        if name.endswith("_data"):  # E8M0 scales hold few distinct values; random bytes left there still differ
            evidence.compared(name, mine, WRITTEN_BY_TE)
        assert torch.equal(mine, theirs.view(torch.uint8)), name
