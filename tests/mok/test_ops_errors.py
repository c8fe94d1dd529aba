"""Who checks what at mok's op boundary, as docs/kernels.md and mok/ops.py say: the public
functions raise mok's named errors for every argument; ``torch.ops.mok.*`` leaves argument types
to torch's schema and checks the rest itself; under torch.compile each failure reaches the caller as the
documented torch exception, mok's message in it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo

import mok
import mok.ops
from mok import LayoutError
from tests import ROOT

SCALES = torch.randint(0, 256, (100, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
LAYOUT = torch.zeros((1, 2, 32, 16), dtype=torch.uint8)  # the layout of [100, 7]
SCHEMA_TEXT = "Declaration: mok::"  # how torch's schema parser words its refusals
M: Any = mok  # the public functions, called with what their annotations forbid


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: M.swizzle_mxfp8_scales(1), LayoutError, r"^scales: expected a torch.Tensor; found 1 \(int\)"),
        (lambda: M.swizzle_mxfp8_scales(SCALES, out=3), LayoutError, r"^out: expected a torch.Tensor or None"),
        (lambda: M.swizzle_mxfp8_scales(SCALES, backend=3), ValueError, r"^backend: expected one of 'auto'"),
        (lambda: M.swizzle_mxfp8_scales_many([SCALES, 3]), TypeError, r"^scales\[1\]: expected logical scale"),
        (lambda: M.swizzle_mxfp8_scales_many(SCALES), TypeError, r"^scales: expected a sequence"),
        (lambda: M.swizzle_mxfp8_scales_many([SCALES], outs=[3]), TypeError, r"^outs\[0\]: expected layout"),
        (lambda: M.swizzle_mxfp8_scales_many([SCALES], backend=b"x"), ValueError, r"^backend: expected one of"),
        (lambda: M.unswizzle_mxfp8_scales(1, rows=100, columns=224), LayoutError, r"^layout: expected a uint8"),
        (lambda: M.unswizzle_mxfp8_scales(LAYOUT, rows="a", columns=224), TypeError, r"^rows: expected an int"),
        (
            lambda: M.unswizzle_mxfp8_scales(LAYOUT, rows=100, columns=224, out=3),
            LayoutError,
            r"^out: expected a torch.Tensor; found 3 \(int\)",
        ),
    ],
)
def test_the_public_functions_name_every_bad_argument(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as raised:
        call()
    assert SCHEMA_TEXT not in str(raised.value)


def test_called_directly_the_ops_leave_types_to_torch_and_check_the_rest() -> None:
    out = torch.empty((1, 2, 32, 16), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"Expected a value of type 'Tensor' for argument 'out'") as raised:
        torch.ops.mok.swizzle_mxfp8_scales(SCALES, 3)
    assert SCHEMA_TEXT in str(raised.value) and not isinstance(raised.value, mok.MokError)
    with pytest.raises(RuntimeError, match=r"Expected a value of type 'List\[Tensor\]' for argument 'scales'"):
        torch.ops.mok.swizzle_mxfp8_scales_many([SCALES, 3], [out])
    with pytest.raises(LayoutError, match=r"^out cannot hold the layout of scales \(1, 100, 7\)"):
        torch.ops.mok.swizzle_mxfp8_scales(SCALES, torch.empty(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^backend: expected one of 'auto', 'cuda', 'torch' or None; found 'x'"):
        torch.ops.mok.swizzle_mxfp8_scales(SCALES, out, "x")


NO_SCALES = r"^swizzle_mxfp8_scales_many: expected at least one scale matrix; found none$"


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.swizzle_mxfp8_scales_many([]),
        lambda: M.swizzle_mxfp8_scales_many([], outs=[]),
        lambda: torch.ops.mok.swizzle_mxfp8_scales_many([], []),  # no tensor: no device to dispatch on
        lambda: torch.ops.mok.swizzle_mxfp8_scales_many.default([], [], "torch"),
        lambda: torch.ops.mok.swizzle_mxfp8_scales_many([], [LAYOUT]),  # a CPU tensor: the CPU kernel
        lambda: torch.ops.mok.swizzle_mxfp8_scales_many([], [LAYOUT.to("meta")]),  # the fake implementation
    ],
    ids=["public", "public with outs", "op", "op with a backend", "op with an out", "op on meta"],
)
def test_no_scale_matrix_is_the_same_layout_error_everywhere(call: Callable[[], object]) -> None:
    with pytest.raises(LayoutError, match=NO_SCALES):
        call()


@pytest.mark.parametrize("fullgraph", [True, False])
def test_under_torch_compile_a_failed_check_keeps_mok_s_message(fullgraph: bool) -> None:
    message = "scales: expected uint8 (E8M0) scales; found dtype torch.float32"
    torch._dynamo.reset()
    compiled = torch.compile(lambda s: mok.swizzle_mxfp8_scales(s), fullgraph=fullgraph)
    expected = torch._dynamo.exc.Unsupported if fullgraph else LayoutError
    with pytest.raises(expected, match=re.escape(message)):
        compiled(SCALES.float())
    torch._dynamo.reset()
    op = torch.compile(lambda s, o: torch.ops.mok.swizzle_mxfp8_scales(s, o), fullgraph=fullgraph)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"out cannot hold the layout of scales"):
        op(SCALES, torch.empty(3, dtype=torch.uint8))


def test_the_boundary_is_documented() -> None:
    docs = {"docs/kernels.md": (ROOT / "docs" / "kernels.md").read_text(), "mok/ops.py": mok.ops.__doc__ or ""}
    for where, text in docs.items():
        flat = " ".join(text.split())
        for phrase in ("torch._dynamo.exc.Unsupported", "torch._dynamo.exc.TorchRuntimeError", "RuntimeError"):
            assert phrase in flat, f"{where} does not say {phrase}"
