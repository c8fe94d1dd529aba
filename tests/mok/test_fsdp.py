"""mok's views under torch FSDP2 (tests/fsdp_experts.py), on the CPU with gloo: one rank (FSDP's
cycle of freeing and gathering the unsharded weights, unsharded) and two ranks (the weights
really sharded: each rank holds half). The same script runs on GPUs (tests/gpu/test_fsdp_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import TESTS

pytest.importorskip("torch.distributed.fsdp", reason="torch without FSDP2 (fully_shard)")
SCRIPT = TESTS / "fsdp_experts.py"


def run_fsdp(tmp_path: Path, ranks: int, device: str, steps: int = 5) -> dict[str, Any]:
    """Run the script under torchrun with ``ranks`` processes; its record (rank 0's)."""
    out = tmp_path / f"fsdp-{device}-{ranks}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(SCRIPT)]
    command += ["--device", device, "--steps", str(steps), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def check_record(record: dict[str, Any], ranks: int, steps: int, experts: int = 8) -> None:
    assert [r["rank"] for r in record["ranks"]] == list(range(ranks))
    for rank in record["ranks"]:
        assert rank["world_size"] == ranks and len(rank["steps"]) == steps
        assert rank["shards"]["grouped"][0] == experts // ranks  # dim 0 sharded over the ranks
        assert rank["distinct gathers"] > 1  # gathered into new memory, step after step
        for step in rank["steps"]:
            assert step["gathered"] and step["checked"] and step["freed"] and step["quantised tables live"]
            assert step["refresh while freed"] == "expert 0 weight"


@pytest.mark.parametrize("ranks", [1, 2])
def test_views_follow_fsdp2_step_after_step_on_the_cpu(tmp_path: Path, ranks: int) -> None:
    check_record(run_fsdp(tmp_path, ranks, "cpu"), ranks, 5)
