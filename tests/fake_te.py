"""A stand-in Transformer Engine package for the self-test's TE checks on a CPU (tests only).

It offers exactly what mok.selftest's TE checks call, built on te_compat.testing's fakes of the
release te_compat is told is installed: ``transformer_engine.pytorch`` (GroupedLinear, which
makes per-expert MXFP8 weights under ``quantized_model_init``/``fp8_model_init`` and BF16 ones
otherwise), the quantizers' ``make_empty`` (MXFP8, NVFP4, Float8 blockwise, hybrid), TE 2.13+'s
``GroupedTensor.make_grouped_tensor_with_shapes``, and ``transformer_engine_torch`` with TE 2.12+'s
in-place ``swizzle_scales_for_gemm_``, written from the layout spec (tests/spec_oracle.py) as TE's
swizzle: new scale buffers of the same shape, the flag set. Nothing of it quantizes or dequantizes.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from packaging.version import Version

import te_compat
from te_compat.testing import fake_blockwise, fake_grouped, fake_hybrid, fake_mxfp8, fake_nvfp4, installed_release
from tests.spec_oracle import spec_layout


class _Recipe:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


class _State:
    mxfp8_init = False


def _device(device: object) -> torch.device:
    return torch.device(device) if device is not None else torch.device("cpu")


class MXFP8Quantizer:
    def __init__(self, dtype: object, *, rowwise: bool = True, columnwise: bool = True, **flags: bool) -> None:
        self.with_2d_quantization = flags.get("with_2d_quantization", False)

    def make_empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: object = None) -> Any:
        return fake_mxfp8(shape, quantized_2d=self.with_2d_quantization, device=_device(device))


class NVFP4Quantizer:
    def make_empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: object = None) -> Any:
        return fake_nvfp4(shape, device=_device(device))


class Float8BlockQuantizer:
    def __init__(self, dtype: object, *, rowwise: bool, columnwise: bool) -> None:
        pass

    def make_empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: object = None) -> Any:
        return fake_blockwise(shape, device=_device(device))


class HybridQuantizer:
    def __init__(self, *, rowwise_quantizer: object, columnwise_quantizer: object) -> None:
        self.formats = [
            "mxfp8" if isinstance(q, MXFP8Quantizer) else "nvfp4" for q in (rowwise_quantizer, columnwise_quantizer)
        ]

    def make_empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: object = None) -> Any:
        return fake_hybrid(shape, rowwise=self.formats[0], columnwise=self.formats[1], device=_device(device))


class GroupedTensor:
    @staticmethod
    def make_grouped_tensor_with_shapes(
        num: int, shapes: list[tuple[int, int]], *, quantizer: object, device: object, dtype: torch.dtype
    ) -> Any:
        fmt = {MXFP8Quantizer: "mxfp8", NVFP4Quantizer: "nvfp4", type(None): "bf16"}[type(quantizer)]
        return fake_grouped((num, *shapes[0]), format=fmt, device=_device(device))


class GroupedLinear(torch.nn.Module):
    def __init__(self, experts: int, columns: int, rows: int, *, bias: bool, params_dtype: torch.dtype, device: object):
        super().__init__()
        for e in range(experts):
            if _State.mxfp8_init:
                weight = fake_mxfp8((rows, columns), param=True, seed=e, device=_device(device))
            else:
                weight = torch.nn.Parameter(torch.zeros(rows, columns, dtype=params_dtype, device=_device(device)))
            setattr(self, f"weight{e}", weight)


@contextlib.contextmanager
def _model_init(enabled: bool = True, recipe: object = None) -> Iterator[None]:
    _State.mxfp8_init = enabled
    try:
        yield
    finally:
        _State.mxfp8_init = False


def swizzle_scales_for_gemm_(t: Any) -> None:
    """TE's in-place swizzle as the spec lays it out: new buffers of TE's shapes, flag set."""
    kind = te_compat.tensor_kind(t)
    rows, columns = int(t.shape[0]), int(t.shape[-1])
    if kind is te_compat.TensorKind.MXFP8:
        s = te_compat.mxfp8_storage(t)
        row = s.rowwise_scale_inv[:rows, : columns // 32]
        col = s.columnwise_scale_inv[: rows // 32, :columns].t()
        buffers = (s.rowwise_scale_inv, s.columnwise_scale_inv)
    else:
        n = te_compat.nvfp4_storage(t)
        row = n.rowwise_scale_inv[:rows, : columns // 16]
        col = n.columnwise_scale_inv[:columns, : rows // 16]
        buffers = (n.rowwise_scale_inv, n.columnwise_scale_inv)
    new = [
        spec_layout(m.contiguous().view(torch.uint8)).view(b.dtype).view(b.shape)
        for m, b in zip((row, col), buffers, strict=True)
    ]
    t._rowwise_scale_inv, t._columnwise_scale_inv = (b.to(old.device) for b, old in zip(new, buffers, strict=True))
    t._with_gemm_swizzled_scales = True


def grouped_swizzle_for_gemm(t: Any, *, rowwise: bool, columnwise: bool) -> None:
    """TE 2.14+'s grouped swizzle as the spec lays it out: each member's layout, one after another,
    in new buffers of the group's; the group's flag set (the members are left as they were)."""
    gs = te_compat.grouped_storage(t)
    members = gs.members or ()
    rows, columns = gs.tensor_shapes[0]
    row = [te_compat.mxfp8_storage(m).rowwise_scale_inv[:rows, : columns // 32] for m in members]
    col = [te_compat.mxfp8_storage(m).columnwise_scale_inv[: rows // 32, :columns].t() for m in members]
    if rowwise:
        t.scale_inv = torch.cat([spec_layout(m.contiguous()).reshape(-1) for m in row]).to(gs.rowwise_scale_inv.device)
    if columnwise:
        t.columnwise_scale_inv = torch.cat([spec_layout(m.contiguous()).reshape(-1) for m in col]).to(
            gs.columnwise_scale_inv.device
        )
    t._with_gemm_swizzled_scales = True


def _module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


@contextlib.contextmanager
def fake_te(
    monkeypatch: pytest.MonkeyPatch, release: str, swizzle: Callable[[Any], None] | None = None
) -> Iterator[None]:
    """Within the block, TE ``release`` is installed and importable as this stand-in, on the CPU."""
    version = Version(release)
    tex = _module("transformer_engine_torch", DType=types.SimpleNamespace(kFloat8E4M3="kFloat8E4M3"))
    if version >= Version("2.12"):
        tex.swizzle_scales_for_gemm_ = swizzle or swizzle_scales_for_gemm_  # type: ignore[attr-defined]
    if version >= Version("2.14"):
        tex.grouped_swizzle_for_gemm = grouped_swizzle_for_gemm  # type: ignore[attr-defined]
    pytorch = _module(
        "transformer_engine.pytorch",
        GroupedLinear=GroupedLinear,
        fp8_model_init=_model_init,
        quantized_model_init=_model_init,
    )
    modules = {
        "transformer_engine": _module("transformer_engine", __version__=release, pytorch=pytorch),
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.common": _module("transformer_engine.common"),
        "transformer_engine.common.recipe": _module("transformer_engine.common.recipe", MXFP8BlockScaling=_Recipe),
        "transformer_engine.pytorch.tensor": _module("transformer_engine.pytorch.tensor"),
        "transformer_engine.pytorch.tensor.mxfp8_tensor": _module("mxfp8_tensor", MXFP8Quantizer=MXFP8Quantizer),
        "transformer_engine.pytorch.tensor.nvfp4_tensor": _module("nvfp4_tensor", NVFP4Quantizer=NVFP4Quantizer),
        "transformer_engine.pytorch.tensor.float8_blockwise_tensor": _module(
            "float8_blockwise_tensor", Float8BlockQuantizer=Float8BlockQuantizer
        ),
        "transformer_engine.pytorch.tensor.hybrid_tensor": _module("hybrid_tensor", HybridQuantizer=HybridQuantizer),
        "transformer_engine.pytorch.tensor.grouped_tensor": _module("grouped_tensor", GroupedTensor=GroupedTensor),
        "transformer_engine_torch": tex,
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    import mok.selftest as ms

    monkeypatch.setattr(ms, "_cuda_device", lambda: torch.device("cpu"))
    with installed_release(release):
        yield
