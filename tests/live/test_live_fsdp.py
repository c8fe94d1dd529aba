"""mok's views of TE-owned MXFP8 expert weights under torch FSDP2, on one GPU (world size 1).

TE's MXFP8Tensor takes part in FSDP2's all-gather from TE 2.10 (``fsdp_pre_all_gather`` /
``fsdp_post_all_gather``). The experts are built by TE under its MXFP8 recipe and sharded with
``fully_shard``; FSDP2's explicit ``unshard()`` gathers them and ``reshard()`` frees them again,
as forward and backward would (TE's MXFP8 GEMMs need compute capability 10.x, so no forward runs
here). After each gather, TE's buffers are filled with random bytes (TE's MXFP8 quantizers write
nothing on sm_90) and the refreshed split view must equal a new view of the gathered weights;
between gathers a refresh must not hand out the freed memory. The BF16 counterpart, which runs on
any machine, is tests/fsdp_experts.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mok
import te_compat
from tests.live.evidence import Evidence
from tests.live.test_live_te import mxfp8_init, seed_mxfp8, te

pytestmark = pytest.mark.live
E, M, K = 4, 256, 512


def _sharded_experts() -> tuple[torch.nn.Module, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor

    if not hasattr(MXFP8Tensor, "fsdp_pre_all_gather"):
        pytest.skip(f"TE {te_compat.te_version()}: MXFP8Tensor has no FSDP2 all-gather hooks (TE 2.10+)")
    block = torch.nn.Module()
    with mxfp8_init():
        block.experts = torch.nn.ModuleList(
            te().Linear(K, M, bias=False, params_dtype=torch.bfloat16, device="cuda")
            for _ in range(E)  # type: ignore[attr-defined]
        )
    fully_shard(block, mesh=init_device_mesh("cuda", (1,)), reshard_after_forward=True)
    return block, block.experts


def test_views_of_te_mxfp8_weights_follow_fsdp2(evidence: Evidence) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        block, experts = _sharded_experts()
        view = None
        for step in range(3):
            block.unshard()  # FSDP2's all-gather into the unsharded parameters
            params = [linear.weight for linear in experts]
            assert all(te_compat.tensor_kind(p) is te_compat.TensorKind.MXFP8 for p in params)
            for p in params:
                seed_mxfp8(evidence, p)
            view = mok.split_weight_view(params, rows=M, columns=K, use_mxfp8=True, cached=view)
            fresh = mok.split_weight_view(params, rows=M, columns=K, use_mxfp8=True)
            for mine, new in zip(view.directions, fresh.directions, strict=True):
                assert mine.data_ptrs is not None and new.data_ptrs is not None
                assert mine.data_ptrs.tolist() == new.data_ptrs.tolist(), f"step {step}: payload table"
                assert all(map(torch.equal, mine.scales or (), new.scales or ())), f"step {step}: scales"
            block.reshard()  # FSDP2 frees the gathered weights
            try:
                mok.split_weight_view(params, rows=M, columns=K, use_mxfp8=True, cached=view)
            except mok.StorageFreedError:
                pass  # freed: refused, naming the tensor
            else:  # TE kept the gathered buffers alive: the refresh reads live memory
                assert all(te_compat.mxfp8_storage(p).rowwise_data.untyped_storage().nbytes() for p in params)
    finally:
        dist.destroy_process_group()
