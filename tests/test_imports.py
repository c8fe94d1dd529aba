"""`import te_compat` stays cheap: no TE, no torch, nothing that initialises CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules_after(code: str) -> set[str]:
    script = f"import sys, json; {code}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(json.loads(out.stdout))


def test_import_te_compat_imports_neither_te_nor_torch() -> None:
    mods = _modules_after("import te_compat")
    assert not {m for m in mods if m.split(".")[0] in ("transformer_engine", "torch", "cuda")}


def test_version_queries_import_nothing_heavy() -> None:
    mods = _modules_after("import te_compat; te_compat.te_version(); te_compat.te_min_version('2.1')")
    assert not {m for m in mods if m.split(".")[0] in ("transformer_engine", "torch", "cuda")}


def test_tensor_kind_does_not_import_te() -> None:
    mods = _modules_after("import torch, te_compat; te_compat.tensor_kind(torch.zeros(1))")
    assert not {m for m in mods if m.split(".")[0] == "transformer_engine"}


def test_nothing_initialises_cuda() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, te_compat, mok; te_compat.tensor_kind(torch.zeros(1)); print(torch.cuda.is_initialized())",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert out.stdout.strip() == "False"
