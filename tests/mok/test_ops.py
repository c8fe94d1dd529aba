"""mok's conversions as torch library ops: torch.compile without graph breaks, fake tensors and
meta tensors without a launch, torch.library.opcheck, and the exact inverse.

The expected layouts come from the spec (tests/spec_oracle.py), not from mok; GPU variants of
these checks are in tests/gpu/test_ops_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
import te_compat
from mok.plan import work
from tests import te_objects as T
from tests.spec_oracle import spec_layout

Installer = Callable[..., None]

SHAPES = [(1, 128, 4), (2, 300, 7), (3, 33, 1)]  # aligned; padded rows and columns; one column


def _scales(e: int, r: int, c: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (e, r, c), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any work actually run fails the test: fake and meta tensors must only be shaped."""
    monkeypatch.setattr(work.PreparedWork, "run", lambda self: pytest.fail("ran a conversion"))
    yield


@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_conversions_equal_eager(shape: tuple[int, int, int]) -> None:
    e, r, c = shape
    s = _scales(e, r, c)

    def convert(scales: torch.Tensor) -> torch.Tensor:
        return mok.swizzle_mxfp8_scales(scales)

    def round_trip(scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        mok.swizzle_mxfp8_scales(scales, out=out)
        return mok.unswizzle_mxfp8_scales(out, rows=r, columns=32 * c, experts=e)

    def many(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return mok.swizzle_mxfp8_scales_many([a, b])

    torch._dynamo.reset()
    assert torch.equal(torch.compile(convert, fullgraph=True)(s), spec_layout(s))
    out = torch.full(mok.layout_shape(r, c, e), 0xEE, dtype=torch.uint8)
    back = torch.compile(round_trip, fullgraph=True)(s, out)
    assert torch.equal(back, s) and torch.equal(out, spec_layout(s))
    got = torch.compile(many, fullgraph=True)(s[0], s[-1].t().contiguous().t())
    assert [torch.equal(g, spec_layout(x)) for g, x in zip(got, (s[0], s[-1]), strict=True)] == [True, True]


def test_fake_cuda_tensors_are_shaped_not_converted(no_launch: None) -> None:
    with FakeTensorMode():
        s = torch.empty(2, 300, 7, dtype=torch.uint8, device="cuda")
        layout = mok.swizzle_mxfp8_scales(s)
        assert (layout.shape, layout.dtype, layout.device.type) == (mok.layout_shape(300, 7, 2), torch.uint8, "cuda")
        separate = [torch.empty(r, c, dtype=torch.uint8, device="cuda") for r, c in ((130, 5), (64, 4))]
        outs = mok.swizzle_mxfp8_scales_many(separate)
        assert [tuple(o.shape) for o in outs] == [mok.layout_shape(130, 5), mok.layout_shape(64, 4)]
        back = mok.unswizzle_mxfp8_scales(layout, rows=300, columns=224, experts=2)
        assert (back.shape, back.dtype, back.device.type) == ((2, 300, 7), torch.uint8, "cuda")


def test_meta_tensors_are_shaped_not_converted(no_launch: None) -> None:
    s = torch.empty(2, 300, 7, dtype=torch.uint8, device="meta")
    layout = mok.swizzle_mxfp8_scales(s)
    assert layout.shape == mok.layout_shape(300, 7, 2) and layout.device.type == "meta"
    assert mok.unswizzle_mxfp8_scales(layout, rows=300, columns=224, experts=2).shape == (2, 300, 7)


def test_fake_tensors_still_get_shape_errors() -> None:
    with FakeTensorMode():
        s = torch.empty(300, 7, dtype=torch.uint8, device="cuda")
        with pytest.raises(mok.LayoutError, match="out cannot hold the layout"):
            mok.swizzle_mxfp8_scales(s, out=torch.empty(1, 1, 32, 16, dtype=torch.uint8, device="cuda"))


def test_fake_tensors_get_the_ops_own_checks(no_launch: None) -> None:
    """Called directly (as a traced graph calls them), the ops' fake implementations refuse what
    the real ones refuse."""
    with FakeTensorMode():
        s = torch.empty(300, 7, dtype=torch.uint8, device="cuda")
        small = torch.empty(1, 1, 32, 16, dtype=torch.uint8, device="cuda")
        with pytest.raises(mok.LayoutError, match="out cannot hold the layout"):
            torch.ops.mok.swizzle_mxfp8_scales(s, small)
        with pytest.raises(mok.LayoutError, match=r"outs\[0\] cannot hold the layout"):
            torch.ops.mok.swizzle_mxfp8_scales_many([s], [small])
        with pytest.raises(mok.LayoutError, match="expected 1 output buffers, one per scale matrix; found 2"):
            torch.ops.mok.swizzle_mxfp8_scales_many([s], [small, small])
        layout = torch.empty(mok.layout_shape(300, 7), dtype=torch.uint8, device="cuda")
        with pytest.raises(mok.LayoutError, match="each have a byte of their own"):
            torch.ops.mok.unswizzle_mxfp8_scales(
                layout, torch.empty(1, 1, 1, dtype=torch.uint8, device="cuda").expand(1, 300, 7)
            )


@pytest.mark.parametrize("shape", SHAPES)
def test_opcheck(shape: tuple[int, int, int]) -> None:
    e, r, c = shape
    s = _scales(e, r, c, seed=1)
    layout = torch.empty(mok.layout_shape(r, c, e), dtype=torch.uint8)
    checks = [
        (torch.ops.mok.swizzle_mxfp8_scales.default, (s, layout)),
        (torch.ops.mok.swizzle_mxfp8_scales.default, (s.transpose(1, 2).contiguous().transpose(1, 2), layout)),
        (torch.ops.mok.unswizzle_mxfp8_scales.default, (spec_layout(s), torch.empty(e, r, c, dtype=torch.uint8))),
        (
            torch.ops.mok.swizzle_mxfp8_scales_many.default,
            ([s[0], s[-1]], [torch.empty(mok.layout_shape(r, c), dtype=torch.uint8) for _ in range(2)]),
        ),
    ]
    for op, args in checks:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


# ------------------------------------------------------------------ the inverse


@pytest.mark.parametrize("shape", [*SHAPES, (2, 256, 8), (1, 1, 1), (2, 129, 5)])
def test_unswizzle_is_the_exact_inverse(shape: tuple[int, int, int]) -> None:
    e, r, c = shape
    s = _scales(e, r, c, seed=2)
    layout = spec_layout(s)  # the spec's layout, not mok's
    assert torch.equal(mok.unswizzle_mxfp8_scales(layout, rows=r, columns=32 * c, experts=e), s)
    into = torch.full((e, c, r), 0xEE, dtype=torch.uint8).transpose(1, 2)  # TE's columnwise orientation
    assert mok.unswizzle_mxfp8_scales(layout, rows=r, columns=32 * c, experts=e, out=into) is into
    assert torch.equal(into, s)
    assert torch.equal(
        mok.swizzle_mxfp8_scales(mok.unswizzle_mxfp8_scales(layout, rows=r, columns=32 * c, experts=e)), layout
    )


def test_unswizzle_writes_nothing_outside_out() -> None:
    s = _scales(2, 130, 5, seed=3)
    room = torch.full((2, 130, 9), 0xEE, dtype=torch.uint8)  # each row followed by other data
    mok.unswizzle_mxfp8_scales(spec_layout(s), rows=130, columns=160, experts=2, out=room[:, :, 2:7])
    assert torch.equal(room[:, :, 2:7], s)
    assert (room[:, :, :2] == 0xEE).all() and (room[:, :, 7:] == 0xEE).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rows": 128, "columns": 100}, mok.LayoutError, r"columns: expected a multiple of 32 .* found 100"),
        ({"rows": 128, "columns": 256}, mok.LayoutError, r"layout: expected a uint8 layout of shape \(1, 2, 32, 16\)"),
        ({"rows": 0, "columns": 128}, ValueError, r"rows: expected an int >= 1; found 0"),
        ({"rows": 128, "columns": "128"}, TypeError, r"columns: expected an int >= 1; found '128'"),
        (
            {"rows": 128, "columns": 128, "experts": 2},
            mok.LayoutError,
            r"expected a uint8 layout of shape \(2, 1, 32, 16\)",
        ),
        (
            {"rows": 128, "columns": 128, "out": torch.empty(1, 128, 4, dtype=torch.int8)},
            mok.LayoutError,
            "out cannot hold the logical scales: expected shape \\(1, 128, 4\\), dtype torch.uint8",
        ),
    ],
)
def test_unswizzle_errors(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    layout = torch.zeros(1, 1, 32, 16, dtype=torch.uint8)
    with pytest.raises(error, match=match):
        mok.unswizzle_mxfp8_scales(layout, **kwargs)  # type: ignore[arg-type]


def test_unswizzle_refuses_out_over_its_layout() -> None:
    buf = torch.zeros(1024, dtype=torch.uint8)
    layout = buf[:512].view(1, 1, 32, 16)
    before = buf.clone()
    with pytest.raises(mok.LayoutError, match=r"unswizzle_mxfp8_scales: out\[0\] overlaps layout\[0\]"):
        mok.unswizzle_mxfp8_scales(layout, rows=128, columns=128, out=buf[256:768].view(1, 128, 4))
    assert torch.equal(buf, before)


# ------------------------------------------------------------------ logical scales read back


@pytest.mark.parametrize(("rows", "cols"), [(256, 128), (160, 96)])
def test_logical_scales_of_views_in_te_orientation(rows: int, cols: int, installed_te: Installer) -> None:
    """facts.md: MXFP8 keeps rowwise [rows, cols/32] and columnwise [rows/32, cols] scales,
    NVFP4 rowwise [rows, cols/16] and columnwise (transposed) [cols, rows/16], each TE-padded."""
    installed_te("2.20.2")
    mx = [T.mxfp8_tensor("2.20.2", rows, cols, seed=e, param=True) for e in range(2)]
    v = mok.split_weight_view(mx, rows=rows, columns=cols, format="mxfp8")
    for e, p in enumerate(mx):
        assert torch.equal(mok.logical_scales(v)[e], p._rowwise_scale_inv[:rows, : cols // 32])
        assert torch.equal(
            mok.logical_scales(v, direction="columnwise")[e], p._columnwise_scale_inv[: rows // 32, :cols]
        )
    fp4 = [T.nvfp4_tensor("2.20.2", rows, cols, seed=e, param=True) for e in range(2)]
    v4 = mok.split_weight_view(fp4, rows=rows, columns=cols, format="nvfp4")
    for e, p in enumerate(fp4):
        assert torch.equal(mok.logical_scales(v4)[e], p._rowwise_scale_inv[:rows, : cols // 16])
        assert torch.equal(
            mok.logical_scales(v4, direction="columnwise")[e], p._columnwise_scale_inv[:cols, : rows // 16]
        )
    g = T.grouped_tensor("2.20.2", 3, rows, cols, mxfp8=True)
    gv = mok.grouped_weight_view(g, num_experts=3, rows=rows, columns=cols, format="mxfp8")
    members = g.quantized_tensors
    assert torch.equal(
        mok.logical_scales(gv), torch.stack([m._rowwise_scale_inv[:rows, : cols // 32] for m in members])
    )
    want_col = torch.stack([m._columnwise_scale_inv[: rows // 32, :cols] for m in members])
    assert torch.equal(mok.logical_scales(gv, direction="columnwise"), want_col)


def test_logical_scales_of_te_tensors(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor("2.20.2", 160, 96, seed=5, param=True)
    kept = mok.logical_scales(p)  # TE keeps them logical: copied out, never a view of TE's buffer
    assert torch.equal(kept, p._rowwise_scale_inv[:160, :3])
    before = p._rowwise_scale_inv.clone()
    kept.fill_(7)
    assert torch.equal(p._rowwise_scale_inv, before) and kept.untyped_storage().nbytes() == 160 * 3
    logical = p._rowwise_scale_inv[:160, :3].clone()
    swizzled = spec_layout(logical).view(p._rowwise_scale_inv.shape)  # TE's GEMM layout, as the spec writes it
    q = T.mxfp8_tensor(
        "2.20.2", 160, 96, seed=5, param=True, _rowwise_scale_inv=swizzled, _with_gemm_swizzled_scales=True
    )
    assert torch.equal(mok.logical_scales(q), logical)
    with pytest.raises(ValueError, match="direction: expected one of 'rowwise', 'columnwise'; found 'up'"):
        mok.logical_scales(q, direction="up")
    with pytest.raises(mok.ExpertWeightError, match="expected a view, or a TE MXFP8 or NVFP4 tensor"):
        mok.logical_scales(torch.zeros(4, 4))


# ------------------------------------------------------------------ reprs


class Unprintable(torch.Tensor):
    """A tensor whose own repr and str fail, as printing TE's MXFP8Tensor dequantizes it."""

    def __repr__(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("the tensor's own repr was called")

    __str__ = __repr__  # type: ignore[assignment]


def _unprintable(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(Unprintable)


def test_snapshot_repr_names_shapes_and_flags_only(installed_te: Installer) -> None:
    installed_te("2.20.2")
    p = T.mxfp8_tensor(
        "2.20.2", 160, 96, param=True, _rowwise_scale_inv=_unprintable(torch.zeros(256, 4, dtype=torch.uint8))
    )
    text = repr(te_compat.mxfp8_storage(p))  # the owner is a stand-in whose dispatch fails too
    assert text.startswith("MXFP8Storage(owner=MXFP8Tensor torch.bfloat16[160, 96] cpu, shape=(160, 96)")
    assert "rowwise_scale_inv=Unprintable torch.uint8[256, 4] cpu" in text and "scales_swizzled=False" in text
    g = T.grouped_tensor("2.20.2", 3, 128, 64, mxfp8=True)
    assert "members=3 x MXFP8Tensor" in repr(te_compat.grouped_storage(g))


def test_view_repr_names_shapes_and_formats_only(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 160, 96, seed=e, param=True) for e in range(3)]
    v = mok.split_weight_view(ps, rows=160, columns=96, format="mxfp8")
    hidden = replace(v, rowwise=replace(v.rowwise, data=tuple(_unprintable(d) for d in v.rowwise.data)))
    text = repr(hidden)
    assert text.startswith(
        "SplitExpertWeights(num_experts=3, rows=160, columns=96, format=mxfp8, rowwise=ViewDirection("
    )
    assert "data=3 x torch.float8_e4m3fn[160, 96] cpu" in text and "scales=3 x torch.uint8[2, 1, 32, 16] cpu" in text
    assert str(hidden) == text


def test_the_ops_check_their_outputs_themselves() -> None:
    """The ops are public (torch.ops.mok.*): a wrong out is refused there too, before any write."""
    s = _scales(1, 256, 8)
    with pytest.raises(mok.LayoutError, match="out cannot hold the layout of scales"):
        torch.ops.mok.swizzle_mxfp8_scales(s, torch.zeros(4096, dtype=torch.uint8))
    with pytest.raises(mok.LayoutError, match=r"outs\[0\] cannot hold the layout"):
        torch.ops.mok.swizzle_mxfp8_scales_many([s[0]], [torch.zeros(16, dtype=torch.uint8)])
    with pytest.raises(mok.LayoutError, match="expected 1 output buffers, one per scale matrix; found 2"):
        torch.ops.mok.swizzle_mxfp8_scales_many([s[0]], [torch.zeros(16, dtype=torch.uint8)] * 2)
    layout = spec_layout(s)
    with pytest.raises(
        mok.LayoutError, match=r"layout: expected a uint8 layout of shape \(1, 2, 32, 16\); found \(\(2, 2"
    ):
        torch.ops.mok.unswizzle_mxfp8_scales(layout, torch.empty(1, 128, 8, dtype=torch.uint8))


def test_an_output_that_overlaps_itself_is_refused() -> None:
    layout = spec_layout(_scales(1, 128, 4))
    folded = torch.zeros(1, 1, 1, dtype=torch.uint8).expand(1, 128, 4)
    with pytest.raises(mok.LayoutError, match="out: expected a view whose elements each have a byte of their own"):
        mok.unswizzle_mxfp8_scales(layout, rows=128, columns=128, out=folded)
    with pytest.raises(mok.LayoutError, match="each have a byte of their own"):
        torch.ops.mok.unswizzle_mxfp8_scales(
            layout, torch.zeros(132, dtype=torch.uint8).as_strided((1, 128, 4), (0, 1, 1))
        )
