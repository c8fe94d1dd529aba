"""The torch reference against the spec: hand-checkable vectors, the formula, padding, strides."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mok
import te_compat
import te_compat.geometry
from mok import LayoutError, layout_offset, swizzle_mxfp8_scales
from tests.spec_oracle import spec_layout, spec_offset

# ../shared/spec/mxfp8-scale-layout.md, "Hand-checkable vectors": (R, C, r, c, byte)
SPEC_VECTORS = [
    (128, 4, 0, 3, 3),
    (128, 4, 1, 0, 16),
    (128, 4, 31, 3, 499),
    (128, 4, 32, 0, 4),
    (128, 4, 33, 1, 21),
    (128, 4, 64, 2, 10),
    (128, 4, 96, 3, 15),
    (128, 4, 100, 1, 77),
    (128, 4, 127, 3, 511),
    (256, 8, 0, 4, 512),
    (256, 8, 127, 4, 1020),
    (256, 8, 128, 0, 1024),
    (256, 8, 130, 5, 1569),
    (256, 8, 255, 7, 2047),
    (200, 6, 199, 5, 1657),
]


@pytest.mark.parametrize(("rows", "cols", "r", "c", "byte"), SPEC_VECTORS)
def test_spec_vectors_formula(rows: int, cols: int, r: int, c: int, byte: int) -> None:
    assert layout_offset(r, c, rows, cols) == byte


@pytest.mark.parametrize(("rows", "cols", "r", "c", "byte"), SPEC_VECTORS)
def test_spec_vectors_through_the_reference(rows: int, cols: int, r: int, c: int, byte: int) -> None:
    # a single marked byte must land exactly at the spec's offset and nowhere else
    s = torch.zeros(rows, cols, dtype=torch.uint8)
    s[r, c] = 0xA5
    flat = swizzle_mxfp8_scales(s).flatten()
    assert flat[byte] == 0xA5
    assert int((flat != 0).sum()) == 1


def test_padded_vector_zero_padding() -> None:
    # R=200, C=6 pads to 256x8 = 2048 bytes; every byte no entry maps to is 0
    s = torch.randint(1, 256, (200, 6), dtype=torch.uint8)
    out = swizzle_mxfp8_scales(s).flatten()
    assert out.numel() == 2048
    hit = torch.zeros(2048, dtype=torch.bool)
    for r in range(200):
        for c in range(6):
            hit[layout_offset(r, c, 200, 6)] = True
            assert out[layout_offset(r, c, 200, 6)] == s[r, c]
    assert int(hit.sum()) == 1200
    assert bool((out[~hit] == 0).all())


def test_columnwise_spec_vector() -> None:
    # data M=256, K=256: Scol[5,130] lands at 1569 (it is S'[130,5])
    scol = torch.zeros(8, 256, dtype=torch.uint8)
    scol[5, 130] = 7
    flat = swizzle_mxfp8_scales(te_compat.scale_matrix(scol, 256, 256, direction="columnwise")).flatten()
    assert flat[1569] == 7 and int((flat != 0).sum()) == 1


@settings(max_examples=60, deadline=None)
@given(
    experts=st.integers(1, 4),
    rows=st.integers(1, 300),
    cols=st.integers(1, 20),
    transposed=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_reference_matches_spec_scatter(experts: int, rows: int, cols: int, transposed: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(
        0, 256, (experts, cols, rows) if transposed else (experts, rows, cols), dtype=torch.uint8, generator=g
    )
    logical = base.transpose(1, 2) if transposed else base  # any strides must work
    assert torch.equal(swizzle_mxfp8_scales(logical), spec_layout(logical))


def test_sliced_view_of_padded_buffer_never_copies_padding() -> None:
    m, k = 96, 160  # not multiples of 128: TE pads rows to 128, k/32=5 columns to 8
    buf = torch.full((128, 8), 0xFF, dtype=torch.uint8)
    buf[:m, : k // 32] = torch.randint(0, 0xFF, (m, k // 32), dtype=torch.uint8)
    logical = te_compat.scale_matrix(buf, m, k)
    assert logical.data_ptr() == buf.data_ptr() and logical.shape == (96, 5)
    out = swizzle_mxfp8_scales(logical)
    assert torch.equal(out, spec_layout(buf[:m, : k // 32].clone()))
    assert 0xFF not in set(out.flatten().tolist()) - set(logical.flatten().tolist())


def test_out_is_written_in_place() -> None:
    s = torch.randint(0, 256, (3, 128, 8), dtype=torch.uint8)
    out = torch.full(mok.layout_shape(128, 8, 3), 0xEE, dtype=torch.uint8)
    ptr = out.data_ptr()
    res = swizzle_mxfp8_scales(s, out=out)
    assert res is out and out.data_ptr() == ptr
    assert torch.equal(out, spec_layout(s))


def test_e8m0_dtype_is_accepted() -> None:
    s = torch.randint(0, 256, (128, 4), dtype=torch.uint8)
    assert torch.equal(swizzle_mxfp8_scales(s.view(torch.float8_e8m0fnu)), swizzle_mxfp8_scales(s))


@pytest.mark.parametrize(
    ("scales", "message"),
    [
        (torch.zeros(4, 4, dtype=torch.float32), "expected uint8"),
        (torch.zeros(4, dtype=torch.uint8), "expected a non-empty logical scale matrix"),
        (torch.zeros(0, 4, dtype=torch.uint8), "expected a non-empty"),
        (torch.zeros(2, 2, 2, 2, dtype=torch.uint8), "found shape (2, 2, 2, 2)"),
    ],
)
def test_bad_scales(scales: torch.Tensor, message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        swizzle_mxfp8_scales(scales)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (torch.zeros(1, 1, 32, 16, dtype=torch.uint8), r"shape \(2, 1, 32, 16\)"),
        (torch.zeros(2, 1, 32, 16, dtype=torch.int8), "dtype torch.uint8"),
        (torch.zeros(2, 1, 16, 32, dtype=torch.uint8).transpose(2, 3), "contiguous"),
    ],
)
def test_bad_out(out: torch.Tensor, message: str) -> None:
    s = torch.zeros(256, 4, dtype=torch.uint8)
    before = out.clone()
    with pytest.raises(LayoutError, match=message):
        swizzle_mxfp8_scales(s, out=out)
    assert torch.equal(out, before)  # nothing written on a rejected call


OVERLAP = "swizzle_mxfp8_scales: out\\[0\\] overlaps scales\\[0\\] in memory"


def test_out_aliasing_input_is_refused() -> None:
    buf = torch.zeros(512, dtype=torch.uint8)
    with pytest.raises(LayoutError, match=OVERLAP):
        swizzle_mxfp8_scales(buf.view(128, 4), out=buf.view(1, 1, 32, 16))


def _numpy_pair(offset: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Scales and an output over one numpy buffer, each through its own torch storage."""
    b = np.arange(1024, dtype=np.uint8)
    return torch.from_numpy(b[:512]).view(128, 4), torch.from_numpy(b[offset : offset + 512]).view(1, 1, 32, 16), b


@pytest.mark.parametrize("offset", [256, 511, 100])
def test_out_overlapping_input_through_another_storage_is_refused(offset: int) -> None:
    s, out, b = _numpy_pair(offset)
    assert s.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()  # two storages, one memory
    before = b.copy()
    with pytest.raises(LayoutError, match=OVERLAP):
        swizzle_mxfp8_scales(s, out=out)
    assert (b == before).all()
    framed = torch.frombuffer(bytearray(1024), dtype=torch.uint8)
    with pytest.raises(LayoutError, match=OVERLAP):
        swizzle_mxfp8_scales(
            framed[:512].view(128, 4),
            out=torch.frombuffer(framed.numpy(), dtype=torch.uint8, offset=100, count=512).view(1, 1, 32, 16),
        )


def test_out_beside_input_in_one_storage_is_accepted() -> None:
    s, out, _ = _numpy_pair(512)  # the next 512 bytes: disjoint
    assert torch.equal(swizzle_mxfp8_scales(s, out=out), spec_layout(s))
    buf = torch.randint(0, 256, (1024,), dtype=torch.uint8)
    scales, dst = buf[:512].view(128, 4), buf[512:].view(1, 1, 32, 16)
    want = spec_layout(scales.clone())
    assert torch.equal(swizzle_mxfp8_scales(scales, out=dst), want)


def test_cuda_backend_refuses_cpu_tensors() -> None:
    with pytest.raises(LayoutError, match=r"backend 'cuda' needs CUDA tensors; found \w+ on cpu"):
        swizzle_mxfp8_scales(torch.zeros(128, 4, dtype=torch.uint8), backend="cuda")


def test_many_matches_one_by_one() -> None:
    mats = [torch.randint(0, 256, (r, c), dtype=torch.uint8) for r, c in [(128, 4), (200, 6), (33, 1)]]
    outs = mok.swizzle_mxfp8_scales_many(mats)
    for m, o in zip(mats, outs, strict=False):
        assert torch.equal(o, spec_layout(m))


def test_many_errors() -> None:
    with pytest.raises(LayoutError, match="at least one"):
        mok.swizzle_mxfp8_scales_many([])
    with pytest.raises(LayoutError, match=r"scales\[1\]: expected a 2-D"):
        mok.swizzle_mxfp8_scales_many([torch.zeros(4, 4, dtype=torch.uint8), torch.zeros(2, 4, 4, dtype=torch.uint8)])
    with pytest.raises(LayoutError, match="expected 2 output buffers"):
        mok.swizzle_mxfp8_scales_many(
            [torch.zeros(4, 4, dtype=torch.uint8)] * 2, outs=[torch.zeros(1, 1, 32, 16, dtype=torch.uint8)]
        )


def test_formula_agrees_with_oracle_offsets() -> None:
    for rows, cols in [(128, 4), (200, 6), (300, 13)]:
        cp = -(-cols // 4) * 4
        for r in range(0, rows, 7):
            for c in range(cols):
                assert layout_offset(r, c, rows, cols) == spec_offset(r, c, cp)


# Issue 10: out-of-range and mistyped scalars raise, naming the parameter and the value.
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: layout_offset(500, 0, 128, 4), ValueError, r"r: expected an index in \[0, 128\); found 500"),
        (lambda: layout_offset(0, 4, 128, 4), ValueError, r"c: expected an index in \[0, 4\); found 4"),
        (lambda: layout_offset(-1, 0, 128, 4), ValueError, r"r: .*found -1"),
        (lambda: layout_offset(0, 0, 0, 4), ValueError, r"rows: expected an int >= 1; found 0"),
        (lambda: layout_offset(1.0, 0, 128, 4), TypeError, r"r: .*found 1.0 \(float\)"),
        (lambda: mok.layout_shape(128, 4, experts=-2), ValueError, r"experts: expected an int >= 1; found -2"),
        (lambda: mok.layout_shape(128, 4, experts=0), ValueError, r"experts: .*found 0"),
        (lambda: mok.layout_shape(128, 4, experts=2.0), TypeError, r"experts: .*found 2.0 \(float\)"),
        (lambda: mok.layout_shape(True, 4), TypeError, r"rows: .*found True \(bool\)"),
        (lambda: mok.padded_shape("128", 4), TypeError, r"rows: .*found '128' \(str\)"),
        (lambda: mok.padded_shape(128, None), TypeError, r"columns: .*found None"),
        (lambda: mok.padded_shape(-128, 4), ValueError, r"rows: .*found -128"),
        (lambda: te_compat.scale_matrix(torch.zeros(128, 4, dtype=torch.uint8), -32, 128), ValueError, r"rows: .*-32"),
        (lambda: te_compat.scale_matrix(torch.zeros(128, 4, dtype=torch.uint8), 128, 128.0), TypeError, r"columns: "),
        (lambda: te_compat.scale_matrix([[0] * 4] * 128, 128, 128), TypeError, r"expected a torch.Tensor scale buffer"),
        (
            lambda: te_compat.scale_matrix(torch.zeros(4, 128, dtype=torch.uint8), 128, -128, direction="columnwise"),
            ValueError,
            r"columns: .*-128",
        ),
        (
            lambda: te_compat.scale_matrix(torch.zeros(4, 128, dtype=torch.uint8), False, 128, direction="columnwise"),
            TypeError,
            r"rows: .*bool",
        ),
        (
            lambda: te_compat.grouped_scale_buffers(torch.zeros(1024, dtype=torch.uint8), -2, 128, 128),
            ValueError,
            r"experts: .*-2",
        ),
    ],
)
def test_bad_scalars_are_named(call: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_good_scalars_still_work() -> None:
    # spec values: R=200, C=6 pads to 256 x 8; numpy ints count as ints
    assert mok.padded_shape(200, 6) == (256, 8)
    assert mok.layout_shape(np.int64(200), 6, experts=np.int32(3)) == (6, 2, 32, 16)
    assert layout_offset(np.int64(199), 5, 200, 6) == 1657
    mxfp8 = te_compat.geometry.MXFP8
    assert mxfp8.rowwise.scale_buffer(96, 160) == (128, 8) and mxfp8.columnwise.scale_buffer(96, 160) == (4, 256)


@pytest.mark.parametrize("kind", [te_compat.TensorKind.MXFP8, te_compat.TensorKind.NVFP4])
@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_logical_matrices_over_te_buffers_are_scale_matrix(kind: te_compat.TensorKind, direction: str) -> None:
    """te_compat's strided geometry over TE's padded buffers (one, and a grouped [E, ...] of them)
    reads exactly te_compat.scale_matrix of each expert, and orient() turns it back into TE's."""
    d = te_compat.geometry.block_geometry(kind).direction(direction)
    rows, columns, experts = 96, 160, 3
    padded = torch.randint(0, 256, (experts, *d.scale_buffer(rows, columns)), dtype=torch.uint8)
    sizes, strides = d.logical_matrices(rows, columns, padded.shape, padded.stride())
    logical = padded.as_strided(sizes, strides)
    assert sizes == (experts, *d.scale_matrix(rows, columns))
    for e in range(experts):
        matrix = te_compat.scale_matrix(padded[e], rows, columns, kind=kind, direction=direction)
        assert torch.equal(logical[e], matrix)
        assert torch.equal(d.orient(matrix), padded[e][tuple(slice(0, n) for n in d.buffer_matrix(rows, columns))])
    one = d.logical_matrices(rows, columns, padded[0].shape, padded[0].stride())
    assert one[0] == (1, *sizes[1:])
    with pytest.raises(ValueError, match=r"expected a buffer of at least \[\d+, \d+\] \(TE pads it\); found \(2, 3\)"):
        d.logical_matrices(rows, columns, (2, 3), (3, 1))


def test_grouped_scale_buffers_are_te_s_padded_buffers_at_its_offsets() -> None:
    d = te_compat.geometry.MXFP8.columnwise
    rows, columns, experts = 96, 160, 3
    r, c = d.scale_buffer(rows, columns)
    flat = torch.arange(experts * r * c, dtype=torch.int32).to(torch.uint8)
    view = te_compat.grouped_scale_buffers(flat, experts, rows, columns, direction="columnwise")
    offsets = d.grouped_offsets(experts, rows, columns)
    assert view.shape == (experts, r, c) and view.data_ptr() == flat.data_ptr()
    assert [view[e].data_ptr() - flat.data_ptr() for e in range(experts)] == list(offsets[:experts])
    with pytest.raises(ValueError, match=rf"g: expected 3 experts x \[{r}, {c}\] = {offsets[-1]} bytes; found 10"):
        te_compat.grouped_scale_buffers(flat[:10], experts, rows, columns, direction="columnwise", name="g")
    with pytest.raises(TypeError, match="expected a torch.Tensor scale buffer; found"):
        te_compat.grouped_scale_buffers([0] * 10, experts, rows, columns)
