"""te_compat.geometry's answers are cached per shape: a question asked with other number types
(floats, numpy integers) equal to ints must never change what an int question gets."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import te_compat
from te_compat.geometry import MXFP8, NVFP4, DirectionGeometry

# sizes no other test asks about: what is cached first is what this test asks
ROWS, COLUMNS = 2464, 2336


@pytest.mark.parametrize(
    "d",
    [*MXFP8.directions(), *NVFP4.directions()],
    ids=["mxfp8-rowwise", "mxfp8-columnwise", "nvfp4-rowwise", "nvfp4-columnwise"],
)
@pytest.mark.parametrize("other", [float, np.int64], ids=["float", "numpy"])
def test_an_answer_to_other_number_types_is_not_an_answer_to_ints(d: DirectionGeometry, other: type) -> None:
    rows, columns = ROWS + (d.block if other is float else 0), COLUMNS + (0 if d.rowwise else d.block)
    for method in (d.payload_shape, d.scale_matrix, d.buffer_matrix, d.scale_buffer):
        method(other(rows), other(columns))  # a caller's question in its own number type
        found = method(rows, columns)
        assert all(type(n) is int for n in found), (method.__name__, found)
    with contextlib.suppress(TypeError):  # range() refuses floats: nothing cached
        d.grouped_offsets(other(3), other(rows), other(columns))
    assert all(type(n) is int for n in d.grouped_offsets(3, rows, columns))


def test_a_float_question_leaves_te_compat_s_own_readers_working() -> None:
    rows, columns = ROWS + 2 * MXFP8.block, COLUMNS
    MXFP8.rowwise.scale_buffer(float(rows), float(columns))
    r, c = MXFP8.rowwise.scale_buffer(rows, columns)
    flat = torch.zeros(2 * r * c, dtype=torch.uint8)
    assert te_compat.grouped_scale_buffers(flat, 2, rows, columns).shape == (2, r, c)
    MXFP8.rowwise.buffer_matrix(float(rows), float(columns))
    matrix = te_compat.scale_matrix(torch.zeros(r, c, dtype=torch.uint8), rows, columns)
    assert matrix.shape == (rows, columns // MXFP8.block)
