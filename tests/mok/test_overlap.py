"""mok.overlap's check is exact (its docstring): a buffer lying wholly in the gaps of a strided
view shares no byte with it and passes, whether the two are dense or strided, while one byte in
common is refused. Expected answers come from the byte addresses, listed here by hand."""

from __future__ import annotations

import pytest
import torch

import mok
from mok import LayoutError
from mok.overlap import check_no_overlap
from tests.spec_oracle import spec_layout


def _buffer(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("inside", "meets"),
    [
        (slice(1, 4), False),  # bytes 1..3: the gap between the view's bytes 0 and 4
        (slice(5, 8), False),  # bytes 5..7
        (slice(4, 6), True),  # byte 4 is the view's
        (slice(3, 5), True),  # byte 4 again, from the other side
    ],
)
@pytest.mark.parametrize("strided_is_out", [True, False])
def test_a_dense_buffer_in_the_gaps_of_a_strided_view(inside: slice, meets: bool, strided_is_out: bool) -> None:
    base = _buffer(64)
    strided, dense = base[0::4], base[inside]  # strided: bytes 0, 4, ..., 60; dense: contiguous
    outs, inputs = ([strided], [dense]) if strided_is_out else ([dense], [strided])
    if meets:
        with pytest.raises(LayoutError, match=r"overlaps .* in memory"):
            check_no_overlap(outs, inputs, "t")
    else:
        check_no_overlap(outs, inputs, "t")  # spans intersect, bytes do not


def test_two_dense_views_whose_spans_meet_overlap() -> None:
    base = _buffer(64)
    with pytest.raises(LayoutError, match=r"outs\[0\] overlaps inputs\[0\]"):
        check_no_overlap([base[8:16]], [base[15:20]], "t")
    check_no_overlap([base[8:16]], [base[16:20]], "t")  # adjacent, not sharing


def test_a_sparse_strided_view_and_a_dense_buffer_in_its_gaps() -> None:
    # a joint span far larger than both views' bytes: the address-by-address comparison
    base = _buffer(128 * 1024)
    rows = base.view(128, 1024)[:, :4]  # 4 bytes at the start of each 1024-byte row
    check_no_overlap([base[4:1024]], [rows], "t")
    with pytest.raises(LayoutError):
        check_no_overlap([base[1020:1030]], [rows], "t")  # bytes 1024..1027 are row 1's


def test_a_conversion_writes_into_the_gaps_of_its_own_input() -> None:
    """The public function takes an output lying in the gaps of its strided input, and writes the
    spec's layout there, leaving the input's bytes as they were."""
    base = _buffer(128 * 1024)
    scales = base.view(128, 1024)[:, :4]  # [128, 4] logical scales, row stride 1024
    scales.copy_(torch.randint(0, 256, (128, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)))
    before = scales.clone()
    out = base[4 : 4 + 512].view(1, 1, 32, 16)  # the layout of [128, 4]: 512 bytes, in row 0's gap
    assert mok.swizzle_mxfp8_scales(scales, out=out, backend="torch") is out
    assert torch.equal(out, spec_layout(before)) and torch.equal(scales, before)
