"""TE-owned expert weights under torch FSDP2, on one GPU (world size 1).

TE's Float8Tensor and MXFP8Tensor take part in FSDP2's all-gather from TE 2.10
(``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``), and ``fully_shard`` asks each Parameter for
a dequantizing ``view(-1)``, which TE refuses for MXFP8 below compute capability 10.0: where TE can
shard each kind is te_compat's capability (``mxfp8_fsdp2``, ``float8_fsdp2``), and a test of a kind
TE cannot shard here skips with that reason. So on sm_90 (H100, H200) the FSDP2 coverage is TE's
Float8 Parameters, and BF16 weights mok quantises (tests/gpu/test_fsdp_gpu.py, and on any machine
tests/fsdp_experts.py).

The experts are built by TE under its recipe and sharded with ``fully_shard``; FSDP2's explicit
``unshard()`` gathers them and ``reshard()`` frees them again, as forward and backward would.
MXFP8: after each gather, TE's buffers are filled with random bytes (TE's MXFP8 quantizers write
nothing on sm_90) and the refreshed split view must equal a new view of the gathered weights;
between gathers a refresh must not hand out the freed memory. Float8: after each gather, what
te_compat reads of each Parameter (its payload and scale) must be what TE dequantizes it to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import mok
import te_compat
from tests.live.evidence import Evidence
from tests.live.test_live_te import mxfp8_init, seed_mxfp8, te

pytestmark = pytest.mark.live
E, M, K = 4, 256, 512


def _sharded_experts(kind: str = "mxfp8") -> tuple[torch.nn.Module, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    capabilities = te_compat.capabilities(verify=False)
    if not getattr(capabilities, f"{kind}_fsdp2"):
        pytest.skip(f"torch FSDP2 cannot shard TE's {kind.upper()} Parameters here: {capabilities.fsdp2_reasons[kind]}")
    block = torch.nn.Module()
    with mxfp8_init() if kind == "mxfp8" else float8_init():
        block.experts = torch.nn.ModuleList(
            te().Linear(K, M, bias=False, params_dtype=torch.bfloat16, device="cuda")
            for _ in range(E)  # type: ignore[attr-defined]
        )
    fully_shard(block, mesh=init_device_mesh("cuda", (1,)), reshard_after_forward=True)
    return block, block.experts


@contextlib.contextmanager
def float8_init() -> Iterator[None]:
    from transformer_engine.common.recipe import DelayedScaling

    init = getattr(te(), "quantized_model_init", None) or te().fp8_model_init  # type: ignore[attr-defined]
    with init(enabled=True, recipe=DelayedScaling()):
        yield


@contextlib.contextmanager
def _one_rank() -> Iterator[None]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_te_float8_weights_read_through_fsdp2(evidence: Evidence) -> None:
    """What te_compat reads of each gathered Float8 Parameter, payload times scale, is TE's own
    dequantization of it, at every gather: random bytes are seeded into the gathered payload
    first, so an empty or stale read cannot pass."""
    with _one_rank():
        block, experts = _sharded_experts("float8")
        for step in range(3):
            block.unshard()
            params = [linear.weight for linear in experts]
            assert all(te_compat.tensor_kind(p) is te_compat.TensorKind.FLOAT8 for p in params)
            for e, p in enumerate(params):
                s = te_compat.float8_storage(p)
                assert s.data is not None and s.scale_inv is not None and s.data.data_ptr() != 0
                source = evidence.fill_random_(s.data)
                ours = s.data.view(torch.float8_e4m3fn).float() * s.scale_inv.float()
                theirs = p.dequantize(dtype=torch.float32)  # type: ignore[attr-defined]
                evidence.compared(f"step {step} expert {e}", s.data, source)
                torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True, msg=f"step {step} expert {e}")
            block.reshard()


def test_views_of_te_mxfp8_weights_follow_fsdp2(evidence: Evidence) -> None:
    with _one_rank():
        block, experts = _sharded_experts()
        view = None
        for step in range(3):
            block.unshard()  # FSDP2's all-gather into the unsharded parameters
            params = [linear.weight for linear in experts]
            assert all(te_compat.tensor_kind(p) is te_compat.TensorKind.MXFP8 for p in params)
            for p in params:
                seed_mxfp8(evidence, p)
            view = mok.split_weight_view(params, rows=M, columns=K, format="mxfp8", cached=view)
            fresh = mok.split_weight_view(params, rows=M, columns=K, format="mxfp8")
            for mine, new in zip(view.directions, fresh.directions, strict=True):
                assert mine.data_ptrs is not None and new.data_ptrs is not None
                assert mine.data_ptrs.tolist() == new.data_ptrs.tolist(), f"step {step}: payload table"
                assert all(map(torch.equal, mine.scales or (), new.scales or ())), f"step {step}: scales"
            block.reshard()  # FSDP2 frees the gathered weights
            try:
                mok.split_weight_view(params, rows=M, columns=K, format="mxfp8", cached=view)
            except mok.StorageFreedError:
                pass  # freed: refused, naming the tensor
            else:  # TE kept the gathered buffers alive: the refresh reads live memory
                assert all(te_compat.mxfp8_storage(p).rowwise_data.untyped_storage().nbytes() for p in params)
