"""Bad input to the public mok and te_compat API (issue 10).

Every call either returns a correct result or raises a te_compat/mok error (``TECompatError``),
``TypeError`` or ``ValueError`` that says something; no other exception, no silent wrong result,
and no input modified (checked byte for byte). Correct results come from the spec
(tests/spec_oracle.py: the layout formula, written out independently of mok), and whether an
input is valid is decided here, from the documented contract, not by asking mok.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

import mok
import mok.kernels.quantize
import te_compat
from mok import MokError, weights
from mok.checks import check_bool, check_index, check_int, check_sequence
from mok.overlap import check_no_overlap
from te_compat import TECompatError
from tests import te_objects as T
from tests.spec_oracle import roundup, spec_layout, spec_offset

Installer = Callable[..., None]
ALLOWED = (TECompatError, MokError, TypeError, ValueError)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
E8M0 = torch.float8_e8m0fnu


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """(True, result) or (False, the error); an error of any other type fails the test as it is."""
    try:
        return True, fn(*args, **kwargs)
    except ALLOWED as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return False, exc


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s whole storage (not only the view), to compare after a call."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).clone()


def assert_unchanged(tensors: Sequence[torch.Tensor], before: Sequence[torch.Tensor]) -> None:
    for i, (t, b) in enumerate(zip(tensors, before, strict=True)):
        assert torch.equal(snapshot(t), b), f"input {i} was modified"


def is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


# ---------------------------------------------------------------------------------------------
# Scalars: valid ints (plain and numpy) and everything a caller might pass by mistake.
BAD_SCALARS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([64.0, np.float64(128.0), "64", "128", b"4", None, [64], (64,), 1j]),
    st.text(max_size=3),
    st.builds(torch.tensor, st.integers(1, 300)),  # a 0-d tensor is not an int
    st.integers(-(2**70), 0),
)
DIMS = st.one_of(st.integers(1, 700), st.integers(1, 700).map(np.int64), st.integers(2**62, 2**70), BAD_SCALARS)
INDICES = st.one_of(st.integers(-3, 800), st.integers(0, 300).map(np.int32), BAD_SCALARS)


@PROPERTY
@given(r=INDICES, c=INDICES, rows=DIMS, cols=DIMS)
def test_layout_offset(r: object, c: object, rows: object, cols: object) -> None:
    ok, out = attempt(mok.layout_offset, r, c, rows, cols)
    valid = all(map(is_int, (r, c, rows, cols))) and 0 <= r < rows and 0 <= c < cols  # type: ignore[operator]
    assert ok == valid, f"layout_offset({r!r}, {c!r}, {rows!r}, {cols!r}): {out!r}"
    if ok:
        assert out == spec_offset(int(r), int(c), roundup(int(cols), 4))  # type: ignore[call-overload]


@PROPERTY
@given(rows=DIMS, cols=DIMS, experts=DIMS)
def test_layout_shape_and_padded_shape(rows: object, cols: object, experts: object) -> None:
    valid_dims = is_int(rows) and is_int(cols) and rows >= 1 and cols >= 1  # type: ignore[operator]
    ok, padded = attempt(mok.padded_shape, rows, cols)
    assert ok == valid_dims, f"padded_shape({rows!r}, {cols!r}): {padded!r}"
    ok, shape = attempt(mok.layout_shape, rows, cols, experts)
    assert ok == (valid_dims and is_int(experts) and experts >= 1), f"layout_shape: {shape!r}"  # type: ignore[operator]
    if ok:
        r, c, e = int(rows), int(cols), int(experts)  # type: ignore[call-overload]
        assert padded == (roundup(r, 128), roundup(c, 4))
        assert shape == (e * roundup(r, 128) // 128, roundup(c, 4) // 4, 32, 16)


@st.composite
def scale_buffers(draw: st.DrawFn) -> object:
    """A TE-like padded scale buffer, or something that is not one."""
    kind = draw(st.sampled_from(["uint8", "uint8", "e8m0", "float32", "1-D", "transposed", "list", "none"]))
    r, c = draw(st.integers(1, 260)), draw(st.integers(1, 300))
    buf = torch.randint(0, 256, (r, c), dtype=torch.uint8, generator=torch.Generator().manual_seed(r * 1000 + c))
    if kind == "e8m0":
        return buf.view(E8M0)
    if kind == "float32":
        return buf.float()
    if kind == "1-D":
        return buf.flatten()
    if kind == "transposed":
        return buf.t()
    if kind == "list":
        return buf.tolist()
    return None if kind == "none" else buf


def _scale_buffer_ok(buf: object, need_rows: int, need_cols: int) -> bool:
    return (
        isinstance(buf, torch.Tensor)
        and buf.dtype in (torch.uint8, E8M0)
        and buf.dim() == 2
        and buf.shape[0] >= need_rows
        and buf.shape[1] >= need_cols
    )


MX_DIMS = st.one_of(st.integers(1, 12).map(lambda n: 32 * n), st.integers(1, 400), DIMS)


@PROPERTY
@given(buf=scale_buffers(), rows=MX_DIMS, cols=MX_DIMS)
def test_rowwise_scales(buf: object, rows: object, cols: object) -> None:
    before = [snapshot(buf)] if isinstance(buf, torch.Tensor) else []
    ok, view = attempt(te_compat.scale_matrix, buf, rows, cols)
    dims_ok = is_int(rows) and is_int(cols) and rows >= 1 and cols >= 1 and cols % 32 == 0  # type: ignore[operator]
    assert ok == (dims_ok and _scale_buffer_ok(buf, int(rows), int(cols) // 32)), f"{view!r}"  # type: ignore[call-overload]
    if ok:
        assert isinstance(buf, torch.Tensor)
        r, k = int(rows), int(cols) // 32  # type: ignore[call-overload]
        assert view.dtype == torch.uint8 and view.shape == (r, k) and view.data_ptr() == buf.data_ptr()
        assert torch.equal(view, buf.view(torch.uint8)[:r, :k])
    if before:
        assert_unchanged([buf], before)  # type: ignore[list-item]


@PROPERTY
@given(buf=scale_buffers(), rows=MX_DIMS, cols=MX_DIMS)
def test_columnwise_scales(buf: object, rows: object, cols: object) -> None:
    before = [snapshot(buf)] if isinstance(buf, torch.Tensor) else []
    ok, view = attempt(te_compat.scale_matrix, buf, rows, cols, direction="columnwise")
    dims_ok = is_int(rows) and is_int(cols) and rows >= 1 and cols >= 1 and rows % 32 == 0  # type: ignore[operator]
    assert ok == (dims_ok and _scale_buffer_ok(buf, int(rows) // 32, int(cols))), f"{view!r}"  # type: ignore[call-overload]
    if ok:
        assert isinstance(buf, torch.Tensor)
        m, k = int(rows) // 32, int(cols)  # type: ignore[call-overload]
        assert view.shape == (k, m) and torch.equal(view, buf.view(torch.uint8)[:m, :k].t())
    if before:
        assert_unchanged([buf], before)  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------
# Swizzle: logical scales of any strides, or not; outputs that fit, or not; backends.
@st.composite
def logical_scales(draw: st.DrawFn) -> tuple[object, bool]:
    """(scales, valid): logical [R, C] / [E, R, C] uint8 or E8M0 of any strides, or bad input."""
    kind = draw(
        st.sampled_from(
            [
                "2-D",
                "3-D",
                "transposed",
                "padded slice",
                "e8m0",
                "float32",
                "int8",
                "1-D",
                "4-D",
                "empty",
                "list",
                "none",
            ]
        )
    )
    e, r, c = draw(st.integers(1, 3)), draw(st.integers(1, 200)), draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(e * 100000 + r * 100 + c)
    base = torch.randint(0, 256, (e, r, c), dtype=torch.uint8, generator=g)
    made: dict[str, tuple[object, bool]] = {
        "2-D": (base[0], True),
        "3-D": (base, True),
        "transposed": (base.transpose(1, 2).contiguous().transpose(1, 2), True),
        "padded slice": (torch.full((e, r + 5, c + 3), 0xFF, dtype=torch.uint8)[:, :r, :c].copy_(base), True),
        "e8m0": (base.view(E8M0), True),
        "float32": (base.float(), False),
        "int8": (base.view(torch.int8), False),
        "1-D": (base.flatten(), False),
        "4-D": (base.unsqueeze(0), False),
        "empty": (base[:, :0], False),
        "list": (base.tolist(), False),
        "none": (None, False),
    }
    return made[kind]


OUT_FITS = st.sampled_from(["none", "fresh", "shape", "dtype", "strided"])
BACKENDS = st.sampled_from([None, "torch", "auto", "garbage", "", 5, True, "cuda"])
VALID_ON_CPU = (None, "torch", "auto")


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


@PROPERTY
@given(
    case=logical_scales(), out_kind=st.sampled_from(["none", "fresh", "shape", "dtype", "strided"]), backend=BACKENDS
)
def test_swizzle_mxfp8_scales(case: tuple[object, bool], out_kind: str, backend: object) -> None:
    scales, scales_ok = case
    want = spec_layout(_u8(scales)) if scales_ok else None  # type: ignore[arg-type]
    out: torch.Tensor | None = None
    if out_kind != "none":
        shape = tuple(want.shape) if want is not None else (1, 1, 32, 16)
        out = torch.full(shape, 0xEE, dtype=torch.uint8)
        if out_kind == "shape":
            out = torch.full((shape[0] + 1, *shape[1:]), 0xEE, dtype=torch.uint8)
        elif out_kind == "dtype":
            out = out.view(torch.int8)
        elif out_kind == "strided":
            out = torch.full((shape[0], shape[1], 16, 32), 0xEE, dtype=torch.uint8).transpose(2, 3)
    inputs = [t for t in (scales, out) if isinstance(t, torch.Tensor)]
    before = [snapshot(t) for t in inputs]
    ok, result = attempt(mok.swizzle_mxfp8_scales, scales, out=out, backend=backend)
    valid = scales_ok and out_kind in ("none", "fresh") and backend in VALID_ON_CPU
    assert ok == valid, f"scales ok: {scales_ok}, out: {out_kind}, backend {backend!r}: {result!r}"
    if ok:
        assert torch.equal(result, want) and (out is None or result is out)
        assert_unchanged(inputs[:1], before[:1])
    else:
        assert_unchanged(inputs, before)  # a refused call writes nothing, not even into out
        if scales_ok and out_kind in ("none", "fresh") and backend not in (*VALID_ON_CPU, "cuda"):
            assert isinstance(result, ValueError) and "backend" in str(result)


@pytest.mark.parametrize("value", ["garbage", "cuda-please", "0"])
def test_invalid_backend_variable_is_named(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TE_COMPAT_KERNEL_BACKEND", value)
    with pytest.raises(ValueError, match="TE_COMPAT_KERNEL_BACKEND"):
        mok.swizzle_mxfp8_scales(torch.zeros(128, 4, dtype=torch.uint8))


# ---------------------------------------------------------------------------------------------
# swizzle_mxfp8_scales_many: the outputs may not overlap each other or any input.
def _matrices(shapes: Sequence[tuple[int, int]], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, s, dtype=torch.uint8, generator=g) for s in shapes]


def _layout_bytes(r: int, c: int) -> int:
    return roundup(r, 128) * roundup(c, 4)


def _outs_in_one_buffer(shapes: Sequence[tuple[int, int]], gap: int) -> list[torch.Tensor]:
    """Layout buffers for ``shapes`` cut from one allocation, each ``gap`` bytes after the last
    one ends (a negative gap overlaps them); 16-byte aligned offsets."""
    sizes = [_layout_bytes(r, c) for r, c in shapes]
    big = torch.full((sum(sizes) + 64 * len(sizes),), 0xEE, dtype=torch.uint8)
    outs, at = [], 0
    for (r, c), n in zip(shapes, sizes, strict=True):
        outs.append(big[at : at + n].view(mok.layout_shape(r, c)))
        at = max(0, at + n + gap)
    return outs


def _alias_input(scales: list[torch.Tensor], shapes: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """outs[0] written over input 1: input 1 is rebuilt as the start of a buffer big enough to
    also be read as outs[0] (the issue's ``outs=[c_as_layout, x]``)."""
    n = max(_layout_bytes(*shapes[0]), scales[1].numel())
    big = torch.zeros(n, dtype=torch.uint8)
    big[: scales[1].numel()] = scales[1].flatten()
    scales[1] = big[: scales[1].numel()].view(scales[1].shape)
    return [big[: _layout_bytes(*shapes[0])].view(mok.layout_shape(*shapes[0])), torch.empty(0)]


OUT_KINDS = ["none", "fresh", "disjoint in one buffer", "wrong count", "one wrong shape"]
# OVERLAP cases: must raise LayoutError naming both indices. They pass silently (a wrong result,
# or an overwritten input) until mok.layout.check_no_overlap is wired into
# swizzle_mxfp8_scales_many (issue 10 item 1, the lead's mok/swizzle.py).
OVERLAP_KINDS = ["same buffer twice", "overlapping in one buffer", "an input as an output"]


def _make_outs(kind: str, scales: list[torch.Tensor], shapes: list[tuple[int, int]]) -> list[torch.Tensor] | None:
    outs = _make_first_outs(kind, scales, shapes)
    if outs is not None and kind in OVERLAP_KINDS:  # fresh buffers for any further matrix
        outs += [torch.empty(mok.layout_shape(r, c), dtype=torch.uint8) for r, c in shapes[len(outs) :]]
    return outs


def _make_first_outs(kind: str, scales: list[torch.Tensor], shapes: list[tuple[int, int]]) -> list[torch.Tensor] | None:
    if kind == "none":
        return None
    if kind == "fresh":
        return [torch.full(mok.layout_shape(r, c), 0xEE, dtype=torch.uint8) for r, c in shapes]
    if kind == "disjoint in one buffer":
        return _outs_in_one_buffer(shapes, gap=16)
    if kind == "wrong count":
        return [torch.empty(mok.layout_shape(r, c), dtype=torch.uint8) for r, c in shapes[:-1]]
    if kind == "one wrong shape":
        outs = [torch.empty(mok.layout_shape(r, c), dtype=torch.uint8) for r, c in shapes]
        outs[-1] = torch.empty(outs[-1].shape[0] + 1, *outs[-1].shape[1:], dtype=torch.uint8)
        return outs
    if kind == "same buffer twice":  # the outs=[buf, buf]
        buf = torch.full(mok.layout_shape(*shapes[0]), 0xEE, dtype=torch.uint8)
        return [buf, buf.view(mok.layout_shape(*shapes[1]))]
    if kind == "overlapping in one buffer":
        return _outs_in_one_buffer(shapes, gap=-16)
    outs = _alias_input(scales, shapes)
    outs[1] = torch.empty(mok.layout_shape(*shapes[1]), dtype=torch.uint8)
    return outs


# Two matrices of one layout size (so one buffer can be read as either layout), then any.
MANY_SHAPES = st.one_of(
    st.tuples(st.integers(1, 128), st.integers(1, 4)).map(lambda s: [s, (128, 4)]),
    st.lists(st.tuples(st.integers(1, 260), st.integers(1, 9)), min_size=2, max_size=3),
)


def _run_many(kind: str, shapes: list[tuple[int, int]], seed: int) -> tuple[bool, Any, list[torch.Tensor]]:
    scales = _matrices(shapes, seed)
    if kind in ("same buffer twice", "an input as an output") and _layout_bytes(*shapes[0]) != _layout_bytes(
        *shapes[1]
    ):
        shapes[1] = shapes[0]
        scales[1] = _matrices([shapes[0]], seed + 1)[0]
    outs = _make_outs(kind, scales, shapes)
    want = [spec_layout(s.clone()) for s in scales]
    before = [snapshot(s) for s in scales]
    ok, result = attempt(mok.swizzle_mxfp8_scales_many, scales, outs=outs)
    if ok:
        assert len(result) == len(scales)
        for i, (got, w) in enumerate(zip(result, want, strict=True)):
            assert torch.equal(got, w), f"outs[{i}] does not hold the layout of scales[{i}]"
            assert outs is None or got is outs[i]
        assert_unchanged(scales, before)
    return ok, result, scales


@PROPERTY
@given(kind=st.sampled_from(OUT_KINDS + OVERLAP_KINDS), shapes=MANY_SHAPES, seed=st.integers(0, 1000))
def test_swizzle_many(kind: str, shapes: list[tuple[int, int]], seed: int) -> None:
    ok, result, _ = _run_many(kind, shapes, seed)
    assert ok == (kind in ("none", "fresh", "disjoint in one buffer")), f"{kind}: {result!r}"
    if kind in OVERLAP_KINDS:  # OVERLAP: fails until check_no_overlap is wired in (see above)
        assert isinstance(result, mok.LayoutError) and "overlap" in str(result)


# OVERLAP: each of these fails until check_no_overlap is wired into swizzle_mxfp8_scales_many.
@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("same buffer twice", ("outs[0]", "outs[1]")),
        ("overlapping in one buffer", ("outs[0]", "outs[1]")),
        ("an input as an output", ("outs[0]", "[1]")),
    ],
)
def test_swizzle_many_refuses_overlapping_outputs(kind: str, names: tuple[str, str]) -> None:
    ok, result, _ = _run_many(kind, [(128, 4), (128, 4)], seed=7)
    assert not ok, f"{kind}: returned without error"
    assert isinstance(result, mok.LayoutError)
    assert all(name in str(result) for name in names), str(result)


def test_swizzle_many_scales_not_a_sequence() -> None:
    for bad in (None, 5, "scales"):
        ok, result = attempt(mok.swizzle_mxfp8_scales_many, bad)
        assert not ok
    ok, result = attempt(mok.swizzle_mxfp8_scales_many, [torch.zeros(128, 4, dtype=torch.uint8), None])
    assert not ok and "[1]" in str(result)


# ---------------------------------------------------------------------------------------------
# Views: bad scalar arguments and parameter lists, on stand-ins of TE 2.20.2.
RELEASE = "2.20.2"
ROWS, COLUMNS = 64, 128


def _params() -> list[Any]:
    return [T.mxfp8_tensor(RELEASE, ROWS, COLUMNS, seed=e, param=True) for e in range(2)]


def _te_buffers(objs: Sequence[Any]) -> list[torch.Tensor]:
    names = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
    return [getattr(o, n) for o in objs for n in names if getattr(o, n, None) is not None]


BAD_VIEW_ARGS = [
    ("rows", "64"),
    ("rows", 64.0),
    ("rows", True),
    ("rows", -64),
    ("rows", 0),
    ("rows", None),
    ("rows", [64]),
    ("columns", "128"),
    ("columns", 128.0),
    ("columns", False),
    ("columns", -128),
    ("columns", np.float32(128)),
]


@pytest.mark.parametrize(("name", "value"), BAD_VIEW_ARGS)
def test_split_weight_view_bad_scalar(name: str, value: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    params = _params()
    buffers = _te_buffers(params)
    before = [snapshot(b) for b in buffers]
    kwargs: dict[str, Any] = {"rows": ROWS, "columns": COLUMNS, "format": "mxfp8", name: value}
    with pytest.raises(ALLOWED, match=name) as err:
        mok.split_weight_view(params, **kwargs)
    assert repr(value)[:20] in str(err.value) or str(value) in str(err.value), str(err.value)
    assert_unchanged(buffers, before)


@pytest.mark.parametrize(
    ("name", "value"), [*BAD_VIEW_ARGS, ("num_experts", "2"), ("num_experts", 2.0), ("num_experts", True)]
)
def test_grouped_weight_view_bad_scalar(name: str, value: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    buffers = [g.rowwise_data, g.scale_inv, g.columnwise_data, g.columnwise_scale_inv]
    before = [snapshot(b) for b in buffers]
    kwargs: dict[str, Any] = {"num_experts": 2, "rows": ROWS, "columns": COLUMNS, "format": "mxfp8", name: value}
    with pytest.raises(ALLOWED, match=name):
        mok.grouped_weight_view(g, **kwargs)
    assert_unchanged(buffers, before)


def test_views_accept_the_good_arguments(installed_te: Installer) -> None:
    # the baseline the bad cases differ from: these calls work, and give the spec's layout
    installed_te(RELEASE)
    params = _params()
    v = mok.split_weight_view(params, rows=np.int64(ROWS), columns=COLUMNS, format="mxfp8")
    for e, p in enumerate(params):
        assert torch.equal(v.rowwise.scales[e], spec_layout(p._rowwise_scale_inv[:ROWS, : COLUMNS // 32]))
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    assert mok.grouped_weight_view(g, num_experts=2, rows=ROWS, columns=COLUMNS, format="mxfp8").num_experts == 2


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda ps: None, "params"),
        (lambda ps: 5, "params"),
        (lambda ps: "weights", "params"),
        (lambda ps: ps[0], "params"),  # one tensor, not a list of them
        (lambda ps: [ps[0], None], r"(params\[1\]|expert 1)"),
        (lambda ps: [ps[0], "weight1"], r"(params\[1\]|expert 1)"),
        (lambda ps: [], "params|expert"),
    ],
    ids=["None", "int", "str", "a tensor", "[p, None]", "[p, str]", "empty"],
)
def test_split_weight_view_bad_params(make: Callable[[list[Any]], object], match: str, installed_te: Installer) -> None:
    installed_te(RELEASE)
    params = _params()
    buffers = _te_buffers(params)
    before = [snapshot(b) for b in buffers]
    with pytest.raises(ALLOWED, match=match):
        mok.split_weight_view(make(params), rows=ROWS, columns=COLUMNS, format="mxfp8")  # type: ignore[arg-type]
    assert_unchanged(buffers, before)


@PROPERTY
@given(rows=DIMS, columns=DIMS)
def test_split_weight_view_dims_property(rows: object, columns: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    params = _params()
    buffers = _te_buffers(params)
    before = [snapshot(b) for b in buffers]
    ok, view = attempt(mok.split_weight_view, params, rows=rows, columns=columns, format="mxfp8")
    assert ok == (is_int(rows) and is_int(columns) and rows == ROWS and columns == COLUMNS), f"{view!r}"
    if ok:
        assert torch.equal(view.row_scales[1], spec_layout(params[1]._rowwise_scale_inv[:ROWS, : COLUMNS // 32]))
    assert_unchanged(buffers, before)


@pytest.mark.parametrize(
    "entries",
    [None, 42, "ab", b"ab", [1, 2], [None], "pairs"],
    ids=["None", "int", "str", "bytes", "list of ints", "[None]", "a string"],
)
def test_refresh_layer_rejects_non_pairs(entries: object) -> None:
    with pytest.raises(TypeError):
        mok.refresh_layer(entries)  # type: ignore[arg-type]


def test_refresh_layer_rejects_wrong_sized_entries(installed_te: Installer) -> None:
    installed_te(RELEASE)
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    v = mok.grouped_weight_view(g, num_experts=2, rows=ROWS, columns=COLUMNS, format="mxfp8")
    before = [snapshot(v.rowwise.scales[0])]  # type: ignore[arg-type]
    for bad in ([(g,)], [(g, v, 3)], [g, v]):
        with pytest.raises(TypeError, match=r"entry 0|\[0\]"):
            mok.refresh_layer(bad)  # type: ignore[arg-type]
    with pytest.raises(ALLOWED):
        mok.refresh_layer([(g, object())])  # type: ignore[list-item]
    with pytest.raises(ALLOWED):
        mok.refresh_layer([])
    assert_unchanged([v.rowwise.scales[0]], before)  # type: ignore[list-item]


NO_PAIRS = r"^refresh_layer: expected at least one \(weights, cached view\) pair; found none$"


@pytest.mark.parametrize("entries", [[], ()], ids=["list", "tuple"])
def test_a_layer_of_no_views_is_refused_as_refresh_layer_refuses_it(entries: Sequence[Any]) -> None:
    with pytest.raises(ValueError, match=NO_PAIRS):
        mok.refresh_layer(entries)
    with pytest.raises(ValueError, match=NO_PAIRS):
        mok.LayerRefresh(entries)


def test_a_layer_keeps_its_views_when_given_none(installed_te: Installer) -> None:
    installed_te(RELEASE)
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    v = mok.grouped_weight_view(g, num_experts=2, rows=ROWS, columns=COLUMNS, format="mxfp8")
    layer = mok.LayerRefresh([(g, v)])
    with pytest.raises(ValueError, match=NO_PAIRS):
        layer.entries = []
    assert layer.entries == ((g, v),)
    layer()


# ---------------------------------------------------------------------------------------------
# te_compat
VERSIONS = st.one_of(
    st.from_regex(r"\A[0-9]{1,2}(\.[0-9]{1,2}){0,3}(\.dev[0-9]|rc[0-9]|\.post[0-9])?\Z"),
    st.text(max_size=8),
    st.sampled_from(["banana", "", " ", "2.14.x", "v2.14", "2..14", "2.14-1"]),
    st.floats(allow_nan=False),
    st.integers(),
    st.booleans(),
    st.none(),
    st.binary(max_size=4),
)


def _release(v: str) -> tuple[int, ...]:
    release = Version(v).release
    return release + (0,) * (4 - len(release))


def _parses(v: object) -> bool:
    if not isinstance(v, str):
        return False
    try:
        Version(v)
    except InvalidVersion:
        return False
    return True


@PROPERTY
@given(asked=VERSIONS, installed=st.sampled_from(["2.14.1", "2.9.0", "2.10.0.dev0+abc", None]))
def test_te_min_version(asked: object, installed: str | None, installed_te: Installer) -> None:
    # A bad version string is refused even when no TE is installed (a typo must not read as "no").
    installed_te(installed)
    ok, answer = attempt(te_compat.te_min_version, asked)
    assert ok == _parses(asked), f"te_min_version({asked!r}) with TE {installed}: {answer!r}"
    if ok:
        expected = installed is not None and _release(installed) >= _release(asked)  # type: ignore[arg-type]
        assert answer is expected


@pytest.mark.parametrize(
    "obj",
    [None, "weight", 42, [1, 2], object(), types.SimpleNamespace(_rowwise_data=torch.zeros(2))],
    ids=["None", "str", "int", "list", "object", "namespace with TE's attribute"],
)
def test_storage_attr_of_a_non_tensor(obj: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    with pytest.raises(te_compat.UnsupportedTensorError, match="expected a torch.Tensor"):
        te_compat.storage_attr(obj, "rowwise_data")
    with pytest.raises(te_compat.UnsupportedTensorError):
        te_compat.tensor_kind(obj)


@pytest.mark.parametrize("name", [None, 5, "", "rowwise_dta", b"rowwise_data"])
def test_storage_attr_bad_name(name: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    p = T.mxfp8_tensor(RELEASE, ROWS, COLUMNS)
    before = [snapshot(b) for b in _te_buffers([p])]
    ok, result = attempt(te_compat.storage_attr, p, name)
    assert not ok, f"storage_attr(p, {name!r}) returned {result!r}"
    assert_unchanged(_te_buffers([p]), before)


# ---------------------------------------------------------------------------------------------
# mok.checks and mok.layout.check_no_overlap: the validators the entry points use.
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, r"rows: expected an int >= 1; found True \(bool\)"),
        (64.0, TypeError, r"rows: expected an int >= 1; found 64.0 \(float\)"),
        ("64", TypeError, r"rows: expected an int >= 1; found '64' \(str\)"),
        (None, TypeError, r"rows: expected an int >= 1; found None \(NoneType\)"),
        (0, ValueError, r"rows: expected an int >= 1; found 0"),
        (-32, ValueError, r"rows: expected an int >= 1; found -32"),
    ],
)
def test_check_int(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        check_int("rows", value, minimum=1)


def test_check_int_accepts_ints() -> None:
    assert check_int("rows", 64, minimum=1) == 64
    assert type(check_int("rows", np.int32(64), minimum=1)) is int
    assert check_int("e", 3, minimum=0, maximum=3) == 3
    with pytest.raises(ValueError, match=r"e: expected an int in \[0, 3\]; found 4"):
        check_int("e", 4, maximum=3)


def test_messages_never_print_a_te_tensor(installed_te: Installer) -> None:
    # repr() of a TE tensor dequantizes it; the stand-in raises if anything touches its values
    installed_te(RELEASE)
    p = T.mxfp8_tensor(RELEASE, ROWS, COLUMNS, param=True)
    with pytest.raises(TypeError, match=r"rows: expected an int >= 1; found a MXFP8Tensor of shape \(64, 128\)"):
        check_int("rows", p, minimum=1)
    with pytest.raises(TypeError, match=r"entries\[0\]: expected \(weights, view\) pairs; found a MXFP8Tensor"):
        check_sequence("entries", [p], "(weights, view) pairs", item_type=tuple)


def test_check_bool_and_index() -> None:
    assert check_bool("fp8_param", False) is False
    for bad in ("False", 0, None, np.float64(1)):
        with pytest.raises(TypeError, match="fp8_param: expected a bool"):
            check_bool("fp8_param", bad)
    assert check_index("expert", 3, 4) == 3
    with pytest.raises(ValueError, match=r"r: expected an index in \[0, 128\); found 500"):
        check_index("r", 500, 128)
    with pytest.raises(ValueError, match="found -1"):
        check_index("r", -1, 128)
    with pytest.raises(TypeError, match=r"found True \(bool\)"):
        check_index("r", True, 128)


def test_check_sequence() -> None:
    assert check_sequence("params", [1, 2], "ints", item_type=int) == (1, 2)
    for bad in (None, "ab", b"ab", 5, torch.zeros(3), {1, 2}):
        with pytest.raises(TypeError, match="params: expected a sequence"):
            check_sequence("params", bad, "expert parameters")
    with pytest.raises(TypeError, match=r"params\[1\]: expected expert parameters; found None"):
        check_sequence("params", [torch.zeros(1), None], "expert parameters", item_type=torch.Tensor)


def test_no_overlap_is_exact() -> None:
    buf = torch.zeros(4096, dtype=torch.uint8)
    check_no_overlap([buf[:512], buf[512:1024]], [buf[1024:2048]], "t")  # disjoint views of one buffer
    check_no_overlap([buf[0:512:2]], [buf[1:512:2]], "t")  # interleaved, no shared byte
    check_no_overlap([torch.zeros(2, 2)], [torch.zeros(2, 2)], "t")  # separate allocations
    check_no_overlap([], [buf, buf[:10]], "t")  # inputs may share bytes with each other
    check_no_overlap([buf[:0], buf[:0]], [buf], "t")  # empty views hold no byte
    with pytest.raises(mok.LayoutError, match=r"t: outs\[0\] overlaps outs\[1\]"):
        check_no_overlap([buf[:512], buf[511:1023]], [], "t")  # one shared byte
    with pytest.raises(mok.LayoutError, match=r"t: outs\[1\] overlaps inputs\[0\]"):
        check_no_overlap([buf[:512], buf[2048:2560]], [buf[2000:2100].view(10, 10).t()], "t")
    with pytest.raises(mok.LayoutError, match=r"t: outs\[0\] overlaps inputs\[1\]"):
        check_no_overlap([buf[0:512:2]], [buf[1000:1001], buf[6:7]], "t")  # byte 6 is in the strided out
    words = torch.zeros(16, dtype=torch.int32)
    check_no_overlap([words.view(torch.uint8)[:4]], [words[1:]], "t")  # bytes 0-3 against 4-63
    with pytest.raises(mok.LayoutError, match=r"outs\[0\] overlaps inputs\[0\]"):
        check_no_overlap([words.view(torch.uint8)[5:6]], [words[1:]], "t")  # a byte inside word 1
    with pytest.raises(mok.LayoutError, match=r"scales\[2\] overlaps|overlaps scales\[2\]"):
        check_no_overlap([buf[:16]], [buf[100:200], buf[300:400], buf[8:9]], "t", input_label="scales")


# ---------------------------------------------------------------------------------------------
# Round 3: memory shared through other storages, dtype mixes, string flags, huge requests.


def _byte_set(t: torch.Tensor) -> set[int]:
    """Every byte address ``t`` covers, by plain iteration (an independent expectation)."""
    k, found = t.element_size(), set()
    for index in np.ndindex(*t.shape):
        start = t.data_ptr() + k * sum(i * s for i, s in zip(index, t.stride(), strict=True))
        found.update(range(start, start + k))
    return found


@st.composite
def shared_memory_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Logical scales (any strides) and a layout buffer over one numpy buffer, each through a
    torch storage of its own (numpy, frombuffer or DLPack), at any offsets."""
    buf = np.random.default_rng(draw(st.integers(0, 99))).integers(0, 256, 4096, dtype=np.uint8)
    r, c = draw(st.integers(1, 40)), draw(st.integers(1, 6))
    rs, cs = draw(st.sampled_from([(c, 1), (1, r), (c + 3, 1), (2 * c, 2)]))
    off = draw(st.integers(0, 900))
    wrap = draw(st.sampled_from(["numpy", "frombuffer", "dlpack"]))
    base = {
        "numpy": lambda: torch.from_numpy(buf),
        "frombuffer": lambda: torch.frombuffer(buf, dtype=torch.uint8),
        "dlpack": lambda: torch.from_dlpack(buf),
    }[wrap]()
    scales = base.as_strided((r, c), (rs, cs), off)
    layout = int(np.prod(mok.layout_shape(r, c)))
    out_at = draw(st.integers(0, 4096 - layout))
    out = torch.from_numpy(buf[out_at : out_at + layout]).view(mok.layout_shape(r, c))
    return scales, out, buf


@PROPERTY
@given(pair=shared_memory_pairs())
def test_out_sharing_memory_through_another_storage(pair: tuple[torch.Tensor, torch.Tensor, np.ndarray]) -> None:
    scales, out, buf = pair
    overlapping = bool(_byte_set(scales) & _byte_set(out))
    want = spec_layout(scales.clone())
    before = buf.copy()
    ok, result = attempt(mok.swizzle_mxfp8_scales, scales, out=out)
    assert ok != overlapping, f"overlapping={overlapping}: {result!r}"
    if ok:
        assert torch.equal(result, want) and torch.equal(scales, spec_unlayout(want, scales.shape))
    else:
        assert isinstance(result, mok.LayoutError) and (buf == before).all()


def spec_unlayout(layout: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Logical scales back from a layout, by the spec's offset formula (tests/spec_oracle.py)."""
    r, c = shape
    flat = layout.flatten()
    return torch.tensor(
        [[int(flat[spec_offset(i, j, roundup(c, 4))]) for j in range(c)] for i in range(r)], dtype=torch.uint8
    )


def test_meta_outputs_never_overlap() -> None:
    scales = [torch.empty(128, 4, dtype=torch.uint8, device="meta") for _ in range(2)]
    outs = [torch.empty(1, 1, 32, 16, dtype=torch.uint8, device="meta") for _ in range(2)]
    got = mok.swizzle_mxfp8_scales_many(scales, outs=outs)
    assert [g is o for g, o in zip(got, outs, strict=True)] == [True, True]


def test_interleaved_views_are_told_apart_without_a_byte_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two interleaved 16 MiB views (every other byte of one buffer): decided from their strides
    alone, without building a byte mask or an address list."""
    buf = torch.zeros(32 * 2**20, dtype=torch.uint8)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: pytest.fail("built a byte mask"))
    monkeypatch.setattr(mok.overlap, "_addresses", lambda t: pytest.fail("listed addresses"))
    check_no_overlap([buf[0::2]], [buf[1::2]], "interleaved")
    monkeypatch.undo()
    with pytest.raises(mok.LayoutError, match=r"interleaved: outs\[0\] overlaps inputs\[0\]"):
        check_no_overlap([buf[0::2]], [buf[2::4]], "interleaved")


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (lambda: [torch.zeros(256, 128)], "torch.float32"),
        (lambda: [torch.zeros(256, 128, dtype=torch.int8)], "torch.int8"),
        (
            lambda: [torch.zeros(256, 128, dtype=torch.bfloat16), torch.zeros(256, 128, dtype=torch.float16)],
            "torch.float16",
        ),
    ],
    ids=["float32", "int8", "bf16 beside fp16"],
)
def test_bf16_split_views_refuse_other_dtypes(make: Callable[[], list[torch.Tensor]], found: str) -> None:
    with pytest.raises(mok.ExpertWeightError, match=f"expected dtype torch.bfloat16; found {found}"):
        mok.split_weight_view(make(), rows=256, columns=128, format="bf16")


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8", "nvfp4", "hybrid"])
@pytest.mark.parametrize("bad", [None, "weight", 3])
def test_every_sequence_error_names_the_index(fmt: str, bad: object, installed_te: Installer) -> None:
    installed_te(RELEASE)
    first = torch.zeros(ROWS, COLUMNS, dtype=torch.bfloat16) if fmt == "bf16" else _params()[0]
    with pytest.raises(ALLOWED, match=r"params\[1\]|expert 1"):
        mok.split_weight_view([first, bad], rows=ROWS, columns=COLUMNS, format=fmt)


def test_refresh_layer_names_the_entry_of_every_refusal(installed_te: Installer) -> None:
    installed_te(RELEASE)
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    v = mok.grouped_weight_view(g, num_experts=2, rows=ROWS, columns=COLUMNS, format="mxfp8")
    with pytest.raises(ALLOWED, match="^refresh_layer entry 0: "):
        mok.LayerRefresh([(_params(), v)])()  # a list of experts beside a grouped view


def test_a_layer_entry_says_which_of_view_and_weights_is_grouped(installed_te: Installer) -> None:
    """Per-expert weights beside a grouped view, or a grouped weight beside a per-expert view:
    refused when the layer is made, in words that say which side is grouped, nothing written."""
    installed_te(RELEASE)
    g = T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True)
    gv = mok.grouped_weight_view(g, num_experts=2, rows=ROWS, columns=COLUMNS, format="mxfp8")
    ps = _params()
    sv = mok.split_weight_view(ps, rows=ROWS, columns=COLUMNS, format="mxfp8")
    layouts = [*(gv.rowwise.scales or ()), *(sv.rowwise.scales or ())]
    before = [snapshot(t) for t in layouts]
    grouped_beside_list = (
        r"^refresh_layer entry 0: the view is grouped \(a GroupedExpertWeights of 2 experts, over one "
        r"\[E, rows, columns\] weight\) and the weights are not: found a list of 2 items \(\[0\] a MXFP8Tensor "
        r"of shape \(64, 128\), dtype torch.bfloat16; .*pair per-expert parameters with a SplitExpertWeights view"
    )
    with pytest.raises(mok.RefreshError, match=grouped_beside_list):
        mok.LayerRefresh([(ps, gv)])
    with pytest.raises(mok.RefreshError, match=grouped_beside_list.replace("list of 2", "tuple of 2")):
        mok.refresh_layer([(tuple(ps), gv)])
    per_expert_beside_group = (
        r"^refresh_layer entry 1: the view is per expert \(a SplitExpertWeights of 2 experts, over a list of "
        r"expert parameters\) and the weights are one grouped weight: found a GroupedTensor of shape "
        r"\(2, 64, 128\), dtype torch.bfloat16; pair a grouped weight with a GroupedExpertWeights view"
    )
    with pytest.raises(mok.RefreshError, match=per_expert_beside_group):
        mok.refresh_layer([(g, gv), (g, sv)])
    layer = mok.LayerRefresh([(g, gv)])
    with pytest.raises(mok.RefreshError, match=per_expert_beside_group.replace("entry 1", "entry 0")):
        layer.entries = [(g, sv)]
    assert layer.entries == ((g, gv),)  # the refused entries left the layer as it was
    assert_unchanged(layouts, before)


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (lambda ps, g: (ps, (1, 2)), r"\(1, 2\) \(tuple\)"),
        (lambda ps, g: (ps, object()), "an object of class object"),
        (
            lambda ps, g: (ps, weights._native_split_weight_view(ps, rows=ROWS, columns=COLUMNS, use_mxfp8=True)),
            r"an object of class mok.seams.SplitRoutedWeight \(its .expert_view is one: pass SplitExpertWeights\)",
        ),
        (
            lambda ps, g: (
                g,
                weights._native_single_grouped_weight_view(
                    g, num_experts=2, rows=ROWS, columns=COLUMNS, use_mxfp8=True
                ),
            ),
            r"a mok.seams.GroupedWeightTuple of 5 items \(\[0\] a Tensor of shape \(2, 64, 128\), dtype "
            r"torch.float8_e4m3fn; .*\(its .expert_view is one: pass GroupedExpertWeights\)",
        ),
    ],
    ids=["tuple", "object", "SplitRoutedWeight", "GroupedWeightTuple"],
)
def test_a_layer_entry_whose_view_is_no_mok_view_is_named(
    make: Callable[[list[Any], Any], tuple[object, object]], found: str, installed_te: Installer
) -> None:
    installed_te(RELEASE)
    entry = make(_params(), T.grouped_tensor(RELEASE, 2, ROWS, COLUMNS, mxfp8=True))
    expected = (
        r"^refresh_layer entry 0: expected a GroupedExpertWeights or SplitExpertWeights view \(what "
        r"mok.grouped_weight_view or mok.split_weight_view returns\) as the pair's second item; found "
    )
    with pytest.raises(mok.RefreshError, match=expected + found + "$"):
        mok.LayerRefresh([entry])  # type: ignore[list-item]
    with pytest.raises(mok.RefreshError, match=expected + found + "$"):
        mok.refresh_layer([entry])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("shape", "dtype", "match"),
    [
        ((-1, -12), torch.float32, r"shape\[0\]: expected an int >= 0; found -1"),
        (("3", 4), torch.float32, r"shape\[0\]: expected an int >= 0; found '3'"),
        ((3, 4), "uint8", "dtype: expected a torch.dtype; found 'uint8'"),
        (12, torch.float32, "shape: expected a sequence"),
    ],
)
def test_storage_view_arguments(shape: object, dtype: object, match: str) -> None:
    with pytest.raises(TypeError if "'" in match or "sequence" in match else ValueError, match=match):
        mok.storage_view(torch.zeros(12), shape, dtype=dtype, name="w")  # type: ignore[arg-type]


def test_huge_requests_fail_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    huge = torch.zeros(1, 4, dtype=torch.uint8).expand(2**33, 4)  # a 32 GiB layout from 4 bytes
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(mok.LayoutError, match=r"needs 34359738368 bytes; expected at most the \d+ bytes cpu has"):
        mok.swizzle_mxfp8_scales(huge)


def _into_an_inference_tensor(entry: str) -> tuple[Callable[[], object], str, list[torch.Tensor]]:
    """A public in-place entry writing into an inference tensor (made under torch.inference_mode()):
    the call, the name of that buffer, and every tensor the call is given."""
    scales = torch.randint(0, 256, (100, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    weights = torch.randn(64, 96, generator=torch.Generator().manual_seed(5)).bfloat16()
    layout = mok.swizzle_mxfp8_scales(scales)
    normal = torch.full(mok.layout_shape(100, 7), 0xEE, dtype=torch.uint8)
    with torch.inference_mode():
        out = torch.full(mok.layout_shape(100, 7), 0xEE, dtype=torch.uint8)
        logical = torch.full((1, 100, 7), 0xEE, dtype=torch.uint8)
        q = mok.kernels.quantize.empty_outputs(1, 64, 96, "cpu")
        for t in q:
            t.view(torch.uint8).fill_(0xEE)
    calls: dict[str, tuple[Callable[[], object], str, list[torch.Tensor]]] = {
        "swizzle": (lambda: mok.swizzle_mxfp8_scales(scales, out=out), "out", [scales, out]),
        "many": (
            lambda: mok.swizzle_mxfp8_scales_many([scales] * 2, outs=[normal, out]),
            "outs[1]",
            [scales, normal, out],
        ),
        "unswizzle": (
            lambda: mok.unswizzle_mxfp8_scales(layout, rows=100, columns=224, out=logical),
            "out",
            [layout, logical],
        ),
        "quantize": (lambda: mok.quantize_mxfp8(weights, out=q), "out.row_data", [weights, *q]),
    }
    return calls[entry]


@pytest.mark.parametrize("entry", ["swizzle", "many", "unswizzle", "quantize"])
def test_an_inference_tensor_out_is_refused_before_anything_is_written(entry: str) -> None:
    call, name, tensors = _into_an_inference_tensor(entry)
    before = [snapshot(t) for t in tensors]
    with pytest.raises(
        mok.LayoutError, match=rf"^{re.escape(name)} is an inference tensor .*; expected a tensor made outside"
    ):
        call()
    assert_unchanged(tensors, before)  # outs[0] of many too: nothing is written
    with torch.inference_mode():  # where torch lets it be written, it is
        call()


def test_a_quantisation_larger_than_memory_fails_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    experts, rows, cols = 2**16, 4096, 4096
    huge = torch.zeros(1, rows, cols, dtype=torch.bfloat16).expand(experts, rows, cols)  # 2 TiB from 32 MiB
    before = snapshot(huge)
    need = experts * 2 * (rows * cols + 512 * (rows // 128) * (cols // 128))  # both payloads, both layouts
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(
        mok.LayoutError, match=rf"{cols}\] BF16 weights .*needs {need} bytes; expected at most the \d+ bytes cpu"
    ):
        mok.quantize_mxfp8(huge)
    monkeypatch.undo()
    assert_unchanged([huge], [before])


def test_the_reference_allocates_nothing_beyond_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = torch.randint(0, 256, (3, 300, 7), dtype=torch.uint8)
    out = torch.full(mok.layout_shape(300, 7, 3), 0xEE, dtype=torch.uint8)
    want = spec_layout(scales)
    for name in ("empty", "zeros", "full", "empty_like", "zeros_like", "empty_strided"):
        monkeypatch.setattr(torch, name, lambda *a, **k: pytest.fail("allocated a temporary"))
    monkeypatch.setattr(torch.Tensor, "clone", lambda *a, **k: pytest.fail("cloned"))
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda *a, **k: pytest.fail("made contiguous"))
    mok.layout.swizzle_reference(scales, out)
    monkeypatch.undo()
    assert torch.equal(out, want)


def test_a_refresh_names_the_index_of_a_bad_expert_too(installed_te: Installer) -> None:
    """A refresh checks the experts only when they are not the objects its view was built from."""
    installed_te(RELEASE)
    params = _params()
    view = mok.split_weight_view(params, rows=ROWS, columns=COLUMNS, format="mxfp8")
    with pytest.raises(TypeError, match=r"params\[1\]: expected expert parameters \(tensors\); found None"):
        mok.split_weight_view([params[0], None], rows=ROWS, columns=COLUMNS, format="mxfp8", cached=view)


def test_small_arguments_are_checked_on_every_path(installed_te: Installer) -> None:
    installed_te(RELEASE)
    bf16 = [torch.zeros(ROWS, COLUMNS, dtype=torch.bfloat16)]
    with pytest.raises(ValueError, match="backend: expected one of 'auto', 'cuda', 'torch' or None; found 'bogus'"):
        mok.split_weight_view(bf16, rows=ROWS, columns=COLUMNS, format="bf16", backend="bogus")
    with pytest.raises(ValueError, match="backend: expected one of"):
        mok.LayerRefresh([], backend="bogus")
    with pytest.raises(ValueError, match="use_mxfp8=False contradicts format='mxfp8'"), pytest.deprecated_call():
        mok.split_weight_view(_params(), rows=ROWS, columns=COLUMNS, format="mxfp8", use_mxfp8=False)
    from te_compat.testing import fake_mxfp8

    with pytest.raises(TypeError, match=r"fake_mxfp8: param: expected a bool; found 'False' \(str\)"):
        fake_mxfp8((128, 64), param="False")  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("bad", "found"),
    [("e8m0", "'e8m0'"), ([1, 2], r"\[1, 2\]"), (3, "3")],
    ids=["a string", "a list", "an int"],
)
def test_a_scale_buffer_that_is_no_tensor_is_named(bad: object, found: str, installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(3)]
    ps[1]._rowwise_scale_inv = bad
    with pytest.raises(MokError, match=rf"expert 1 rowwise scales: expected a tensor of 1-byte scales; found {found}"):
        mok.split_weight_view(ps, rows=128, columns=256, format="mxfp8")


@pytest.mark.parametrize("which", ["rowwise scales", "columnwise data", "columnwise scales"])
def test_a_view_names_a_scale_or_payload_off_the_experts_device(which: str, installed_te: Installer) -> None:
    """One launch reads every buffer: one on another device is named, not left to the launch."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(3)]
    attr = {"rowwise scales": "_rowwise_scale_inv", "columnwise data": "_columnwise_data"}.get(
        which, "_columnwise_scale_inv"
    )
    setattr(ps[2], attr, getattr(ps[2], attr).to("meta"))
    with pytest.raises(MokError, match=rf"expert 2 {which} is on meta; expected it on cpu, with expert 0's data"):
        mok.split_weight_view(ps, rows=128, columns=256, format="mxfp8")


@pytest.mark.parametrize("shapes", [[(128, 256)] * 2, [], [(128, 256)] * 4], ids=["too few", "none", "too many"])
def test_a_group_with_a_shape_short_of_its_experts_is_refused(shapes: object, installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 3, 128, 256, mxfp8=True)
    g.tensor_shapes = shapes
    with pytest.raises(MokError, match=rf"expected a shape for each of its 3 experts; found {len(shapes)}"):
        mok.grouped_weight_view(g, num_experts=3, rows=128, columns=256, format="mxfp8")


def test_records_needs_a_column_for_every_field() -> None:
    """snapshot.records makes named tuples through tuple.__new__, which checks no arity."""
    from mok.read.reading import ScaleSource, records

    with pytest.raises(TypeError, match=r"expected a column for each field of ScaleSource .*; found 2"):
        records(ScaleSource, ["a"], ["b"])
    assert records(ScaleSource, ["n"], ["t"], ["g"], [True]) == [ScaleSource("n", "t", "g", True)]  # type: ignore[arg-type]
