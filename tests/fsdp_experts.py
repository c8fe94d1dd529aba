"""mok's views over expert weights that torch FSDP2 shards, frees and gathers again at every step.

Run under torchrun (one process per rank; ``--device cpu`` uses gloo, ``cuda`` NCCL)::

    python -m torch.distributed.run --nproc-per-node 2 tests/fsdp_experts.py --device cuda --out run.json

An expert block holds BF16 expert weights twice, as one grouped Parameter ``[E, rows, columns]``
and as one Parameter per expert, under ``fully_shard(reshard_after_forward=True)``: each forward
all-gathers the unsharded weights into storage FSDP frees again (``resize_(0)``) after it. In
forward, right after the all-gather, the block refreshes its views (``cached=``): grouped and
split, quantised to MXFP8 on the fly and plain BF16. Each step checks, on every rank:

- FSDP freed the unsharded weights after the previous step and gathered them again;
- every refreshed view equals a new view of the gathered weights: the quantised payloads and
  scale layouts byte for byte, the BF16 views at the gathered memory, every pointer table
  listing exactly the view's tensors;
- the views' own buffers never moved (kernels and graphs keep their addresses);
- after the step, with the weights freed, no pointer table of a quantised view lists freed
  memory (they list the view's own buffers), and a refresh refuses with a StorageFreedError
  naming the freed weight instead of handing out stale addresses.

The ranks write one JSON record (``--out``, rank 0) of what was checked; any failed check raises
on its rank, so torchrun exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mok


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def same_view(mine: mok.ExpertWeights, fresh: mok.ExpertWeights, what: str) -> None:
    """``mine`` (refreshed) equals ``fresh`` (new): bytes of mok's own buffers, addresses of the
    weights' memory, and pointer tables listing the view's tensors."""
    assert len(mine.directions) == len(fresh.directions), what
    for a, b in zip(mine.directions, fresh.directions, strict=True):
        assert a.format is b.format, what
        if mine.quantized_on_the_fly:
            assert all(torch.equal(_bytes(x), _bytes(y)) for x, y in zip(a.data, b.data, strict=True)), what
        else:
            assert [t.data_ptr() for t in a.data] == [t.data_ptr() for t in b.data], what
        for tensors, table in ((a.data, a.data_ptrs), (a.scales, a.scale_ptrs)):
            if table is not None and tensors is not None:
                assert table.tolist() == [t.data_ptr() for t in tensors], f"{what}: a stale pointer table"
        if a.scales is not None and b.scales is not None:
            assert all(torch.equal(x, y) for x, y in zip(a.scales, b.scales, strict=True)), f"{what}: scales"


def own_addresses(view: mok.ExpertWeights) -> list[int]:
    return [t.data_ptr() for d in view.directions for t in (*d.data, *(d.scales or ()))]


def tables_live(view: mok.ExpertWeights) -> bool:
    """Every address a pointer table of ``view`` lists lies in a storage that still holds it."""
    for d in view.directions:
        for tensors, table in ((d.data, d.data_ptrs), (d.scales, d.scale_ptrs)):
            if table is None or tensors is None:
                continue
            for address, t in zip(table.tolist(), tensors, strict=True):
                storage = t.untyped_storage()
                if (
                    not storage.data_ptr() <= address < storage.data_ptr() + max(storage.nbytes(), 1)
                    or not storage.nbytes()
                ):
                    return False
    return True


class ExpertBlock(torch.nn.Module):
    """BF16 expert weights, grouped and per expert, and mok's views of them, refreshed in forward."""

    def __init__(self, experts: int, rows: int, columns: int, device: torch.device) -> None:
        super().__init__()
        g = torch.Generator(device="cpu").manual_seed(0)
        self.shape = (experts, rows, columns)
        self.grouped = torch.nn.Parameter(torch.randn(self.shape, generator=g).to(device, torch.bfloat16))
        self.split = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(rows, columns, generator=g).to(device, torch.bfloat16))
            for _ in range(experts)
        )
        self.views: dict[str, Any] = {}
        self.log: list[dict[str, Any]] = []

    def _view(self, name: str, cached: Any) -> Any:
        experts, rows, columns = self.shape
        fmt = "bf16" if name.endswith("bf16") else "mxfp8"
        if name.startswith("grouped"):
            return mok.grouped_weight_view(
                self.grouped, num_experts=experts, rows=rows, columns=columns, format=fmt, cached=cached
            )
        return mok.split_weight_view(list(self.split), rows=rows, columns=columns, format=fmt, cached=cached)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gathered = [self.grouped, *self.split]  # the unsharded Parameters FSDP gathered for this forward
        record: dict[str, Any] = {
            "gathered": all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in gathered),
            "addresses": [p.data_ptr() for p in gathered],
        }
        for name in ("grouped mxfp8", "split mxfp8", "grouped bf16", "split bf16"):
            cached = self.views.get(name)
            before = None if cached is None else own_addresses(cached) if "mxfp8" in name else None
            view = self.views[name] = self._view(name, cached)
            assert cached is None or view is cached, f"{name}: the refresh returned another view"
            same_view(view, self._view(name, None), name)
            if before is not None:
                assert own_addresses(view) == before, f"{name}: the view's own buffers moved"
        record["checked"] = True
        self.log.append(record)
        self.gathered = gathered
        y = torch.einsum("bk,enk->ben", x, self.grouped)
        return y + torch.stack([torch.einsum("bk,nk->bn", x, w) for w in self.split], dim=1)


def after_step(block: ExpertBlock) -> dict[str, Any]:
    """What a step left: the unsharded weights freed (FSDP resharded them), the quantised views'
    tables still over live memory, and a refresh now refused, naming the freed weight."""
    found: dict[str, Any] = {"freed": all(p.untyped_storage().nbytes() == 0 for p in block.gathered)}
    found["quantised tables live"] = all(tables_live(block.views[n]) for n in ("grouped mxfp8", "split mxfp8"))
    try:
        _, rows, columns = block.shape
        mok.split_weight_view(
            block.gathered[1:], rows=rows, columns=columns, format="mxfp8", cached=block.views["split mxfp8"]
        )
    except mok.StorageFreedError as exc:
        found["refresh while freed"] = str(exc).split(":")[0]
    else:
        found["refresh while freed"] = "returned"
    return found


def run(device_kind: str, steps: int, experts: int, rows: int, columns: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device(device_kind, rank % torch.cuda.device_count()) if device_kind == "cuda" else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device_kind, (world,))
    block = ExpertBlock(experts, rows, columns, device)
    fully_shard(block, mesh=mesh, reshard_after_forward=True)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.5)
    g = torch.Generator(device="cpu").manual_seed(1 + rank)
    steps_done = []
    for _ in range(steps):
        x = torch.randn(4, columns, generator=g).to(device, torch.bfloat16)
        block(x).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        found = after_step(block)
        assert found["freed"], f"rank {rank}: FSDP did not free the unsharded weights after the step"
        assert found["quantised tables live"], f"rank {rank}: a quantised view's table lists freed memory"
        assert found["refresh while freed"] == "expert 0 weight", f"rank {rank}: {found['refresh while freed']}"
        steps_done.append({**block.log[-1], **found})
    moved = len({tuple(s["addresses"]) for s in steps_done})
    shards = {name: list(p.to_local().shape) for name, p in block.named_parameters()}  # DTensors between steps
    return {
        "rank": rank,
        "world_size": world,
        "device": str(device),
        "shards": {k: shards[k] for k in ("grouped", "split.0")},
        "steps": steps_done,
        "distinct gathers": moved,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--columns", type=int, default=512)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    try:
        record = run(args.device, args.steps, args.experts, args.rows, args.columns)
        records: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(records, record)
        if dist.get_rank() == 0 and args.out is not None:
            args.out.write_text(json.dumps({"ranks": records, "torch": torch.__version__}, indent=1) + "\n")
        dist.barrier()  # every rank done with the group before any tears it down
    finally:
        dist.destroy_process_group()
    return 0


def exit_now(code: int) -> NoReturn:
    """End this rank's process without Python's finalization. destroy_process_group does not stop
    gloo's worker threads (the group lives on, held through the mesh by DTensor's sharding
    caches), and a worker thread frees a finished collective's tensors only after the caller has
    moved on: ending its run loop's turn, the thread that ran the last barrier releases the
    tensors of all_gather_object, whose Python objects need the GIL. Once the interpreter is
    finalizing, a thread that asks for the GIL is ended there (pthread_exit) inside a noexcept
    destructor, and the rank dies of std::terminate: SIGABRT, "terminate called without an active
    exception". By now the record is written and the group destroyed; only stdio is left."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        status = main()
    except Exception:
        traceback.print_exc()  # a failed check: said here, and the rank still exits as exit_now says
        status = 1
    exit_now(status)
