"""tests/fsdp_experts.py on GPUs (NCCL): one GPU, and two where the machine has them. With
TE_COMPAT_FSDP_RECORD=DIR set (matrix/gpu_live.sh sets its output folder), the two-GPU run's
record (ranks, steps, device, torch, the TE beside, commit) is written to DIR/fsdp-2gpu.json, to
go beside the live records in matrix/live/."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import te_compat
from tests.mok.test_fsdp import check_record, run_fsdp


def test_views_follow_fsdp2_on_one_gpu(tmp_path: Path) -> None:
    check_record(run_fsdp(tmp_path, 1, "cuda"), 1, 5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_views_follow_fsdp2_sharded_over_two_gpus(tmp_path: Path) -> None:
    record = run_fsdp(tmp_path, 2, "cuda")
    check_record(record, 2, 5)
    folder = os.environ.get("TE_COMPAT_FSDP_RECORD")
    if folder:
        root = Path(__file__).resolve().parent.parent.parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
        record["commit"] = os.environ.get("TE_COMPAT_COMMIT") or commit.stdout.strip() or None
        record["gpus"] = [torch.cuda.get_device_name(i) for i in range(2)]
        record["te"] = str(te_compat.te_version())  # the TE installed beside (the weights here are BF16)
        (Path(folder) / "fsdp-2gpu.json").write_text(json.dumps(record, indent=1) + "\n")
