"""mok's readers of TE's storage (mok.read.readers): what they refuse, as a new view and a
refresh see it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import mok
from te_compat.testing import fake_grouped, installed_release

E, R, C = 2, 128, 64
_E8M0 = getattr(torch, "float8_e8m0fnu", None)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("attr", ["scale_inv", "columnwise_scale_inv"])
@pytest.mark.parametrize(
    "dtype",
    [torch.float8_e4m3fn, torch.int8, torch.bool, torch.float32],
    ids=["float8_e4m3fn", "int8", "bool", "float32"],
)
def test_a_grouped_scale_buffer_of_no_scale_dtype_is_refused(fmt: str, attr: str, dtype: torch.dtype) -> None:
    """A group's flat scale buffer is uint8 (or E8M0): one of another dtype, of one byte or not,
    is refused naming both (mok refused it so before te_compat viewed the buffer)."""
    direction = "rowwise" if attr == "scale_inv" else "columnwise"
    with installed_release("2.20.2"):
        weight = fake_grouped((E, R, C), format=fmt, param=True)
        flat = getattr(weight, attr)
        setattr(weight, attr, flat.view(dtype) if dtype.itemsize == 1 else flat.to(dtype))
        with pytest.raises(
            mok.LayoutError, match=rf"grouped {direction} scales: expected uint8 \(E8M0\) scales; found dtype {dtype}"
        ):
            mok.grouped_weight_view(weight, num_experts=E, rows=R, columns=C, format=fmt, backend="torch")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_grouped_scale_buffer_of_a_scale_dtype_is_read(fmt: str) -> None:
    dtypes: list[Callable[[torch.Tensor], torch.Tensor]] = [lambda t: t]
    if _E8M0 is not None:
        dtypes.append(lambda t: t.view(_E8M0))
    for as_dtype in dtypes:
        with installed_release("2.20.2"):
            weight = fake_grouped((E, R, C), format=fmt, param=True, seed=1)
            want = mok.grouped_weight_view(weight, num_experts=E, rows=R, columns=C, format=fmt, backend="torch")
            weight.scale_inv = as_dtype(weight.scale_inv)
            got = mok.grouped_weight_view(weight, num_experts=E, rows=R, columns=C, format=fmt, backend="torch")
        assert want.rowwise.scales is not None and got.rowwise.scales is not None
        assert torch.equal(got.rowwise.scales[0], want.rowwise.scales[0])
