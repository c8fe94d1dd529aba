"""mok.weights as its callers use Megatron's module: written from that module's public behaviour
(megatron/core/transformer/moe/megakernel/mok/weights.py and its tests), not from this code.

Upstream reads storage off any object (public name, then private, then both on ``.data``),
composes its views from the module's own functions (a caller that replaces one sees every call),
converts each expert's scales with ``_swizzle_mxfp8_scale`` (out= the cached buffers on a
refresh), never stacks per-expert scales, and raises RuntimeError for every refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import mok
from mok import weights as W
from mok.plan import work as mok_work
from tests import te_objects as T
from tests.spec_oracle import spec_layout
from tests.upstream import refused

ROWS, COLUMNS = 256, 128


def _logical(rows: int, columns: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (rows, columns // 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


class SplitParam:
    """A per-expert MXFP8 weight as Megatron's tests build one: public payloads, private scales."""

    def __init__(self, seed: int, rows: int = ROWS, columns: int = COLUMNS) -> None:
        self.shape = (rows, columns)
        self.rowwise_data = torch.randint(0, 256, (rows, columns), dtype=torch.uint8).view(torch.float8_e4m3fn)
        self.columnwise_data = torch.randint(0, 256, (rows, columns), dtype=torch.uint8).view(torch.float8_e4m3fn)
        self._rowwise_scale_inv = _logical(rows, columns, seed)
        self._columnwise_scale_inv = _logical(columns, rows, seed + 100).t().contiguous()  # [rows/32, columns]


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Upstream's test: per-expert scales keep their own allocations, never torch.stack-ed."""

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("split MXFP8 scales must not be stacked")

    monkeypatch.setattr(torch, "stack", fail)
    yield


# ------------------------------------------------------------------ the storage probe


def test_parameter_storage_attr_public_private_and_data() -> None:
    public = SimpleNamespace(rowwise_data=torch.tensor([1]))
    private = SimpleNamespace(_rowwise_data=torch.tensor([2]))
    wrapped = SimpleNamespace(data=private)
    both = SimpleNamespace(rowwise_data=torch.tensor([3]), _rowwise_data=torch.tensor([4]))
    assert W._parameter_storage_attr(public, "rowwise_data") is public.rowwise_data
    assert W._parameter_storage_attr(private, "rowwise_data") is private._rowwise_data
    assert W._parameter_storage_attr(wrapped, "rowwise_data") is private._rowwise_data
    assert W._parameter_storage_attr(both, "rowwise_data") is both.rowwise_data  # the public name first


def test_parameter_storage_attr_underscore_names_only_as_given() -> None:
    public = SimpleNamespace(rowwise_scale_inv=torch.tensor([1]))
    assert W._parameter_storage_attr(public, "_rowwise_scale_inv") is None
    private = SimpleNamespace(_rowwise_scale_inv=torch.tensor([2]))
    assert W._parameter_storage_attr(private, "_rowwise_scale_inv") is private._rowwise_scale_inv


def test_parameter_storage_attr_any_object_and_value() -> None:
    marker = object()
    holder = SimpleNamespace(quantized_tensors=marker, _num_tensors=3)
    assert W._parameter_storage_attr(holder, "quantized_tensors") is marker  # not only tensors
    assert W._parameter_storage_attr(holder, "num_tensors") == 3
    assert W._parameter_storage_attr(holder, "no_such_storage") is None
    assert W._parameter_storage_attr(object(), "rowwise_data") is None
    none_public = SimpleNamespace(rowwise_data=None, _rowwise_data=torch.tensor([5]))
    assert W._parameter_storage_attr(none_public, "rowwise_data") is none_public._rowwise_data  # None: not there


# ------------------------------------------------------------------ the layout


def test_lane_layout_of_a_128x128_matrix() -> None:
    """Upstream's test: row group g, lane l and scale c of a 128 x 128 weight land at [0, 0, l, 4g + c]."""
    logical = torch.arange(128 * 4, dtype=torch.int32).to(torch.uint8).reshape(1, 128, 4)
    swizzled = W._swizzle_mxfp8_scale(logical, rows=128, columns=128)
    assert swizzled.shape == (1, 1, 32, 16)
    expected = torch.empty_like(swizzled)
    for lane in range(32):
        for group in range(4):
            for c in range(4):
                expected[0, 0, lane, 4 * group + c] = logical[0, 32 * group + lane, c]
    assert torch.equal(swizzled, expected)


def test_swizzle_refreshes_out_in_place() -> None:
    logical = _logical(128, 128, 1).unsqueeze(0)
    expected = W._swizzle_mxfp8_scale(logical, rows=128, columns=128)
    out = torch.empty_like(expected)
    address = out.data_ptr()
    assert W._swizzle_mxfp8_scale(logical, rows=128, columns=128, out=out) is out
    assert out.data_ptr() == address and torch.equal(out, expected)


# ------------------------------------------------------------------ replaced module functions


class Calls:
    """Records what the view passed to the module's replaced functions."""

    def __init__(self) -> None:
        self.storage: list[tuple[Any, ...]] = []
        self.scales: list[tuple[Any, ...]] = []
        self.swizzle: list[tuple[Any, ...]] = []


@pytest.fixture
def grouped_fakes(monkeypatch: pytest.MonkeyPatch) -> Calls:
    calls = Calls()
    made: dict[tuple[int, str], torch.Tensor] = {}

    def storage_view(storage: Any, shape: Any, *, dtype: torch.dtype, name: str) -> Any:
        calls.storage.append((storage, shape, dtype, name))
        return storage

    def scale_view(param: Any, member_attr: str, shape: Any, *, name: str) -> torch.Tensor:
        calls.scales.append((param, member_attr, shape, name))
        return made.setdefault((id(param), member_attr), torch.empty(shape))

    def swizzle(scale: Any, *, rows: int, columns: int, out: Any = None) -> Any:
        result = object() if out is None else out
        calls.swizzle.append((scale, rows, columns, out, result))
        return result

    monkeypatch.setattr(W, "_storage_view", storage_view)
    monkeypatch.setattr(W, "_single_grouped_mxfp8_scale_view", scale_view)
    monkeypatch.setattr(W, "_swizzle_mxfp8_scale", swizzle)
    return calls


class GroupedWeight:
    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape
        self.rowwise_data = object()
        self.columnwise_data = object()


def test_grouped_view_is_composed_of_the_module_functions(grouped_fakes: Calls) -> None:
    experts, rows, columns = 2, 256, 128
    weight = GroupedWeight((experts, rows, columns))
    first = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True
    )
    assert first[0] is weight.rowwise_data and first[2] is weight.columnwise_data and first[4] is True
    assert [(s[1], s[2]) for s in grouped_fakes.storage] == [((experts, rows, columns), torch.float8_e4m3fn)] * 2
    assert [(s[1], s[2]) for s in grouped_fakes.scales] == [
        ("_rowwise_scale_inv", (experts, rows, columns // 32)),
        ("_columnwise_scale_inv", (experts, rows // 32, columns)),
    ]
    # once per direction: the columnwise scales as their [E, columns, rows/32] transpose
    row_call, col_call = grouped_fakes.swizzle
    assert (row_call[1:4], col_call[1:4]) == ((rows, columns, None), (columns, rows, None))
    assert col_call[0].shape == (experts, columns, rows // 32)
    assert [first[1], first[3]] == [row_call[4], col_call[4]]

    grouped_fakes.swizzle.clear()
    again = W._native_single_grouped_weight_view(
        weight, num_experts=experts, rows=rows, columns=columns, use_mxfp8=True, cached_view=first
    )
    assert [call[3] for call in grouped_fakes.swizzle] == [first[1], first[3]]
    assert again[1] is first[1] and again[3] is first[3]


def test_replaced_functions_see_te_tensors_too(grouped_fakes: Calls, installed_te: Callable[..., None]) -> None:
    """A replaced function is called for TE's own GroupedTensor as well: no fast path around it."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    got = W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True)
    assert got[0] is g.rowwise_data and got[2] is g.columnwise_data  # _parameter_storage_attr's objects
    assert len(grouped_fakes.swizzle) == 2 and len(grouped_fakes.scales) == 2


def test_bf16_grouped_views_use_rowwise_data(monkeypatch: pytest.MonkeyPatch) -> None:
    experts, rows, columns = 2, 8, 8
    plain = torch.nn.Parameter(torch.randn(experts, rows, columns, dtype=torch.bfloat16))
    assert W._native_single_grouped_weight_view(plain, num_experts=2, rows=8, columns=8, use_mxfp8=False) is plain
    fc1 = torch.nn.Parameter(torch.randn(experts, rows, columns, dtype=torch.bfloat16))
    fc1.rowwise_data = torch.randn(experts, rows, columns, dtype=torch.bfloat16)
    seen: list[tuple[Any, ...]] = []

    def storage_view(storage: torch.Tensor, shape: Any, *, dtype: torch.dtype, name: str) -> torch.Tensor:
        seen.append((storage, shape, dtype))
        return storage.view(shape)

    monkeypatch.setattr(W, "_storage_view", storage_view)
    view = W._native_single_grouped_weight_view(fc1, num_experts=2, rows=8, columns=8, use_mxfp8=False)
    assert view.data_ptr() == fc1.rowwise_data.data_ptr()
    assert seen == [(fc1.rowwise_data, (experts, rows, columns), torch.bfloat16)]


# ------------------------------------------------------------------ split views over plain objects


def test_split_view_over_plain_objects(no_stack: None) -> None:
    params = [SplitParam(seed) for seed in range(2)]
    view = W._native_split_weight_view(tuple(params), rows=ROWS, columns=COLUMNS, use_mxfp8=True)
    assert view.native_columnwise is True
    assert view.data.data_ptr() == params[0].rowwise_data.data_ptr()
    assert view.storage_table.tolist() == [p.rowwise_data.data_ptr() for p in params]
    assert view.transposed_storage_table.tolist() == [p.columnwise_data.data_ptr() for p in params]
    assert view.scale is view.scale_tensors[0] and view.transposed_scale is view.transposed_scale_tensors[0]
    assert tuple(view.scale.shape) == (ROWS // 128, COLUMNS // 128, 32, 16)
    assert tuple(view.transposed_scale.shape) == (COLUMNS // 128, ROWS // 128, 32, 16)
    assert view.scale_tensors[0].data_ptr() != view.scale_tensors[1].data_ptr()
    for e, p in enumerate(params):
        assert torch.equal(view.scale_tensors[e], spec_layout(p._rowwise_scale_inv))
        assert torch.equal(view.transposed_scale_tensors[e], spec_layout(p._columnwise_scale_inv.t()))

    addresses = [t.data_ptr() for t in (*view.scale_tensors, *view.transposed_scale_tensors)]
    params[0]._rowwise_scale_inv.fill_(9)  # re-quantised in place
    params[1]._columnwise_scale_inv.fill_(11)
    again = W._native_split_weight_view(tuple(params), rows=ROWS, columns=COLUMNS, use_mxfp8=True, cached_view=view)
    assert again is view
    assert [t.data_ptr() for t in (*view.scale_tensors, *view.transposed_scale_tensors)] == addresses
    for e, p in enumerate(params):
        expected_row = W._swizzle_mxfp8_scale(p._rowwise_scale_inv.unsqueeze(0), rows=ROWS, columns=COLUMNS)
        expected_col = W._swizzle_mxfp8_scale(
            p._columnwise_scale_inv.transpose(-2, -1).unsqueeze(0), rows=COLUMNS, columns=ROWS
        )
        assert torch.equal(view.scale_tensors[e], expected_row)
        assert torch.equal(view.transposed_scale_tensors[e], expected_col)


def test_split_refresh_of_any_object_with_the_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's contract: any cached_view with scale_tensors and transposed_scale_tensors; with
    the module's own _swizzle_mxfp8_scale every expert and direction converts in one launch."""
    params = [SplitParam(seed) for seed in range(3)]
    shape = mok.layout_shape(ROWS, COLUMNS // 32)
    cache = SimpleNamespace(
        scale_tensors=tuple(torch.full(shape, 0xEE, dtype=torch.uint8) for _ in params),
        transposed_scale_tensors=tuple(
            torch.full(mok.layout_shape(COLUMNS, ROWS // 32), 0xEE, dtype=torch.uint8) for _ in params
        ),
    )
    runs: list[int] = []
    real_run = mok_work.PreparedWork.run

    def counted(self: mok_work.PreparedWork) -> None:
        runs.append(len(self.work))
        real_run(self)

    monkeypatch.setattr(mok_work.PreparedWork, "run", counted)
    assert W._native_split_weight_view(params, rows=ROWS, columns=COLUMNS, use_mxfp8=True, cached_view=cache) is cache
    assert runs == [2 * len(params)]  # one launch: 3 experts x 2 directions
    for e, p in enumerate(params):
        assert torch.equal(cache.scale_tensors[e], spec_layout(p._rowwise_scale_inv))
        assert torch.equal(cache.transposed_scale_tensors[e], spec_layout(p._columnwise_scale_inv.t()))


def test_replaced_swizzle_sees_each_expert_and_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    params = [SplitParam(seed) for seed in range(2)]
    calls: list[tuple[Any, ...]] = []
    real = W._swizzle_mxfp8_scale

    def swizzle(scale: torch.Tensor, *, rows: int, columns: int, out: Any = None) -> torch.Tensor:
        calls.append((tuple(scale.shape), rows, columns, out))
        return real(scale, rows=rows, columns=columns, out=out)

    monkeypatch.setattr(W, "_swizzle_mxfp8_scale", swizzle)
    view = W._native_split_weight_view(params, rows=ROWS, columns=COLUMNS, use_mxfp8=True)
    row, col = (1, ROWS, COLUMNS // 32), (1, COLUMNS, ROWS // 32)
    assert calls == [(row, ROWS, COLUMNS, None)] * 2 + [(col, COLUMNS, ROWS, None)] * 2
    calls.clear()
    W._native_split_weight_view(params, rows=ROWS, columns=COLUMNS, use_mxfp8=True, cached_view=view)
    outs = [o for pair in zip(view.scale_tensors, view.transposed_scale_tensors, strict=True) for o in pair]
    assert [c[3] for c in calls] == outs  # expert by expert, each into its cached buffer


def test_replaced_storage_view_sees_each_payload(monkeypatch: pytest.MonkeyPatch, no_stack: None) -> None:
    params = [SplitParam(seed) for seed in range(2)]
    seen: list[tuple[Any, ...]] = []

    def storage_view(storage: torch.Tensor, shape: Any, **kwargs: Any) -> torch.Tensor:
        seen.append((storage, tuple(shape), kwargs["dtype"]))
        return storage.view(shape)

    monkeypatch.setattr(W, "_storage_view", storage_view)
    W._native_split_weight_view(params, rows=ROWS, columns=COLUMNS, use_mxfp8=True)
    fp8 = torch.float8_e4m3fn
    assert [(s[0], s[1], s[2]) for s in seen] == [
        (p.rowwise_data if i == 0 else p.columnwise_data, (ROWS, COLUMNS), fp8) for p in params for i in (0, 1)
    ]


def test_te_tensors_take_the_fast_path_unless_a_function_is_replaced(
    monkeypatch: pytest.MonkeyPatch, installed_te: Callable[..., None]
) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    fast = W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=True)
    assert isinstance(fast.expert_view, mok.SplitExpertWeights)  # mok.split_weight_view's checked refresh
    seen: list[str] = []
    real = W._storage_view

    def storage_view(storage: torch.Tensor, shape: Any, *, dtype: torch.dtype, name: str) -> torch.Tensor:
        seen.append(name)
        return real(storage, shape, dtype=dtype, name=name)

    monkeypatch.setattr(W, "_storage_view", storage_view)
    composed = W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=True)
    assert composed.expert_view is None and len(seen) == 4
    for e in range(2):
        assert torch.equal(composed.scale_tensors[e], fast.scale_tensors[e])
        assert torch.equal(composed.transposed_scale_tensors[e], fast.transposed_scale_tensors[e])


def test_bf16_split_views_use_rowwise_data() -> None:
    plain = [torch.nn.Parameter(torch.randn(8, 4, dtype=torch.bfloat16)) for _ in range(2)]
    view = W._native_split_weight_view(plain, rows=8, columns=4, use_mxfp8=False)
    assert view.data.data_ptr() == plain[0].data_ptr() and view.storage_table.tolist() == [p.data_ptr() for p in plain]
    held = [SimpleNamespace(rowwise_data=torch.randn(8, 4, dtype=torch.bfloat16)) for _ in range(2)]
    view = W._native_split_weight_view(held, rows=8, columns=4, use_mxfp8=False)
    assert view.storage_table.tolist() == [h.rowwise_data.data_ptr() for h in held]


# ------------------------------------------------------------------ refusals are RuntimeErrors


def _packed_members(experts: int, spread: bool) -> SimpleNamespace:
    backing = torch.zeros(experts * 2, 4, 2, dtype=torch.uint8)
    members = [SimpleNamespace(_rowwise_scale_inv=backing[(2 if spread else 1) * i]) for i in range(experts)]
    return SimpleNamespace(quantized_tensors=members)


def test_grouped_scale_view_of_packed_members() -> None:
    packed = _packed_members(3, spread=False)
    view = W._single_grouped_mxfp8_scale_view(packed, "_rowwise_scale_inv", (3, 4, 2), name="fc1")
    assert view.shape == (3, 4, 2) and view.data_ptr() == packed.quantized_tensors[0]._rowwise_scale_inv.data_ptr()


REFUSALS: list[tuple[str, Callable[[], object]]] = [
    ("storage of the wrong dtype", lambda: W._storage_view(torch.zeros(4), (4,), dtype=torch.bfloat16, name="x")),
    ("storage of the wrong size", lambda: W._storage_view(torch.zeros(4), (5,), dtype=torch.float32, name="x")),
    ("a negative view size", lambda: W._storage_view(torch.zeros(4), (-1, 4), dtype=torch.float32, name="x")),
    ("storage not contiguous", lambda: W._storage_view(torch.zeros(4, 4).t(), (16,), dtype=torch.float32, name="x")),
    (
        "members not packed expert-major",
        lambda: W._single_grouped_mxfp8_scale_view(_packed_members(2, True), "_rowwise_scale_inv", (2, 4, 2), name="x"),
    ),
    ("a group without members", lambda: W._single_grouped_mxfp8_scale_view(object(), "_s", (2, 4, 2), name="x")),
    (
        "scales of the wrong shape",
        lambda: W._swizzle_mxfp8_scale(torch.zeros(1, 128, 3, dtype=torch.uint8), rows=128, columns=128),
    ),
    (
        "a string size",
        lambda: W._swizzle_mxfp8_scale(torch.zeros(1, 128, 4, dtype=torch.uint8), rows=128, columns="128"),
    ),
    (
        "a grouped weight of the wrong shape",
        lambda: W._native_single_grouped_weight_view(
            torch.zeros(2, 8, 8, dtype=torch.bfloat16), num_experts=2, rows=8, columns=4, use_mxfp8=False
        ),
    ),
    (
        "a string use_mxfp8",
        lambda: W._native_single_grouped_weight_view(
            GroupedWeight((1, 256, 128)), num_experts=1, rows=256, columns=128, use_mxfp8="False"
        ),
    ),
    (
        "a BF16 grouped weight in float32",
        lambda: W._native_single_grouped_weight_view(
            torch.zeros(2, 8, 8), num_experts=2, rows=8, columns=8, use_mxfp8=False
        ),
    ),
    ("no experts", lambda: W._native_split_weight_view((), rows=256, columns=128, use_mxfp8=True)),
    (
        "an expert without scales",
        lambda: W._native_split_weight_view([SimpleNamespace(rowwise_data=1)], rows=256, columns=128, use_mxfp8=True),
    ),
    (
        "a BF16 refresh",
        lambda: W._native_split_weight_view(
            [SplitParam(0)], rows=ROWS, columns=COLUMNS, use_mxfp8=False, cached_view=1
        ),
    ),
    (
        "a cache without buffers",
        lambda: W._native_split_weight_view([SplitParam(0)], rows=ROWS, columns=COLUMNS, use_mxfp8=True, cached_view=1),
    ),
    ("a non-string name", lambda: W._parameter_storage_attr(SimpleNamespace(), 5)),
]


@pytest.mark.parametrize(("what", "call"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_refusal_is_a_runtime_error(what: str, call: Callable[[], object]) -> None:
    with pytest.raises(RuntimeError) as caught:
        call()
    own = caught.value if type(caught.value) is not RuntimeError else caught.value.__cause__
    assert isinstance(own, (mok.MokError, TypeError, ValueError)), repr(own)  # the project's own error behind it
    assert "expected" in str(caught.value) and caught.value.args == own.args


def test_missing_member_names_member_expert_and_type() -> None:
    half = SplitParam(0)
    del half._columnwise_scale_inv
    with pytest.raises(
        RuntimeError, match=r"expert 1: expected MXFP8 storage .* on the SplitParam .*missing _columnwise_scale_inv"
    ):
        W._native_split_weight_view([SplitParam(1), half], rows=ROWS, columns=COLUMNS, use_mxfp8=True)
    with refused(mok.ExpertWeightError, match="expert 1"):  # the project's own class behind it
        W._native_split_weight_view([SplitParam(1), half], rows=ROWS, columns=COLUMNS, use_mxfp8=True)


def test_refusals_pickle_and_name_their_cause() -> None:
    """A refusal crosses a process boundary (a pool's worker) as upstream's: a RuntimeError."""
    import pickle

    with pytest.raises(RuntimeError) as caught:
        W._swizzle_mxfp8_scale(torch.zeros(1, 128, 3, dtype=torch.uint8), rows=128, columns=128)
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is RuntimeError and again.args == caught.value.args
    assert type(caught.value.__cause__) is mok.LayoutError
    with pytest.raises(RuntimeError, match="cached_view: expected an earlier grouped view, the 5-tuple"):
        W._native_single_grouped_weight_view(
            GroupedWeight((1, 256, 128)), num_experts=1, rows=256, columns=128, use_mxfp8=True, cached_view=(1,)
        )
    shaped = SimpleNamespace(shape=(1, 256, 128))  # no storage, no dtype
    with pytest.raises(RuntimeError, match="grouped weight: expected a torch.bfloat16 tensor, or storage rowwise_data"):
        W._native_single_grouped_weight_view(shaped, num_experts=1, rows=256, columns=128, use_mxfp8=False)
