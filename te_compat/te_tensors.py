"""The self-test's check of te_compat against the installed TE's own tensors (needs TE and a GPU).

Each tensor comes from a TE quantizer's ``make_empty`` (no cast kernel runs: TE's MXFP8 and
NVFP4 cast kernels do nothing, or raise, below compute capability 10.0); te_compat's snapshot of
it must hold the very tensors TE's own ``get_data_tensors`` returns, with the scale buffers TE
allocates as te_compat.geometry says. Imported only by that check: it imports torch and TE.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from packaging.version import Version

from te_compat import mxfp8_storage, nvfp4_storage, tensor_kind  # imported by the check, after te_compat
from te_compat.geometry import block_geometry
from te_compat.table import TensorKind, kinds_in

ROWS, COLUMNS = 224, 320  # padded both ways: rows to 256, MXFP8 K/32 = 10 to 12, NVFP4 M/16 = 14 to 16


def _quantizer(module: str, name: str, *args: Any) -> Any | None:
    try:
        cls = getattr(importlib.import_module(f"transformer_engine.pytorch.tensor.{module}"), name)
    except (ImportError, AttributeError):
        return None
    return cls(*args)


def _same(what: str, ours: object, theirs: object) -> None:
    if ours is not theirs:
        raise AssertionError(f"{what}: te_compat's snapshot holds another object than TE's get_data_tensors()")


def _scales(kind: TensorKind, direction: str, buffer: torch.Tensor | None) -> None:
    expected = block_geometry(kind).direction(direction).scale_buffer(ROWS, COLUMNS)
    if buffer is None or tuple(buffer.shape) != expected:
        found = None if buffer is None else tuple(buffer.shape)
        raise AssertionError(f"{kind.value} {direction} scales: expected TE's padded {expected}; found {found}")


def _made(kind: TensorKind, quantizer: Any) -> None:
    t = quantizer.make_empty((ROWS, COLUMNS), dtype=torch.bfloat16, device=torch.device("cuda"))
    if tensor_kind(t) is not kind:
        raise AssertionError(f"TE's {type(t).__name__} read as {tensor_kind(t)}; expected {kind.value}")
    s = mxfp8_storage(torch.nn.Parameter(t, requires_grad=False)) if kind is TensorKind.MXFP8 else nvfp4_storage(t)
    row, col = t.get_data_tensors()
    _same(f"{kind.value} rowwise data", s.rowwise_data, row)
    _same(f"{kind.value} columnwise data", s.columnwise_data, col)
    _scales(kind, "rowwise", s.rowwise_scale_inv)
    _scales(kind, "columnwise", s.columnwise_scale_inv)


def check_te_tensors(release: Version) -> str:
    """Make a tensor of each block-scaled kind ``release`` has and compare (module doc)."""
    e4m3 = importlib.import_module("transformer_engine_torch").DType.kFloat8E4M3
    quantizers = {
        TensorKind.MXFP8: ("mxfp8_tensor", "MXFP8Quantizer", e4m3),
        TensorKind.NVFP4: ("nvfp4_tensor", "NVFP4Quantizer"),
    }
    made = []
    for kind, (module, name, *args) in quantizers.items():
        if kind not in kinds_in(release):
            continue
        quantizer = _quantizer(module, name, *args)
        if quantizer is None:
            raise AssertionError(
                f"TE {release} has {kind.value} tensors, but no transformer_engine.pytorch.tensor.{module}.{name}"
            )
        _made(kind, quantizer)
        made.append(kind.value)
    return f"read TE {release}'s own {' and '.join(made)} tensors as TE does"
