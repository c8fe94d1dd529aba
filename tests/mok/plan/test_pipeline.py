"""The one refresh pipeline: a refresh guards exactly what was read, so a race with TE heals at the
next refresh that nothing races; one path for split, grouped, layer and mok.weights; and the
architecture it stands on (views hold data only, a shallow import graph, no callbacks upward)."""

from __future__ import annotations

import functools
import itertools
import random
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mok
from mok import weights as W
from mok.plan import pipeline
from mok.read import reading as snapshot
from te_compat.testing import fake_mxfp8, fake_nvfp4, installed_release
from tests import te_objects as T
from tests.spec_oracle import spec_layout
from tests.test_imports import _import_graph

Installer = Callable[..., None]
R, C = 128, 256


def _rows(buf: torch.Tensor, rows: int = R, blocks: int = C // 32) -> torch.Tensor:
    return buf[:rows, :blocks]


def _fresh(t: torch.Tensor, seed: int) -> torch.Tensor:
    """A new buffer like ``t`` (what TE's re-quantisation into new storage leaves), random bytes."""
    return torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)).view(
        t.dtype
    )


@pytest.fixture
def between_read_and_plan(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Run an action once, after the weights were read and before the launch is planned: where a
    thread of TE's could reassign a buffer."""
    actions: list[Callable[[], None]] = []
    real = pipeline.plan_directions

    def racing(*args: Any) -> Any:
        while actions:
            actions.pop()()
        return real(*args)

    monkeypatch.setattr(pipeline, "plan_directions", racing)
    return actions.append


# ------------------------------------------------------------------ a race heals at the next refresh


@pytest.mark.parametrize("refreshing", [False, True], ids=["first view", "refresh"])
def test_a_buffer_reassigned_while_planning_is_converted_next_time(
    installed_te: Installer, between_read_and_plan: Callable[[Callable[[], None]], None], refreshing: bool
) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    view = split_weight_view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8") if refreshing else None

    def te_moves_a_buffer() -> None:
        ps[1]._rowwise_scale_inv = _fresh(ps[1]._rowwise_scale_inv, 7)

    between_read_and_plan(te_moves_a_buffer)
    if refreshing:
        ps[2]._columnwise_scale_inv = _fresh(ps[2]._columnwise_scale_inv, 8)  # makes this refresh plan
    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=split_weight_view)
    plans = view.refresh_plan.plans
    # the racing call read the old buffer; the next refresh must see the new one and convert it
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    assert view.refresh_plan.plans == plans + 1
    assert torch.equal(view.rowwise.scales[1], spec_layout(_rows(ps[1]._rowwise_scale_inv)))
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    assert view.refresh_plan.plans == plans + 1  # and then nothing changed: the launch reruns


def test_a_flag_set_while_planning_is_seen_next_time(
    installed_te: Installer, between_read_and_plan: Callable[[Callable[[], None]], None]
) -> None:
    """TE swizzles the scales in place and sets its flag after the read: the next refresh copies
    them as they are instead of converting them a second time."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    logical = _rows(ps[0]._rowwise_scale_inv).clone()

    def te_swizzles() -> None:
        ps[0]._rowwise_scale_inv.view(-1)[: spec_layout(logical).numel()] = spec_layout(logical).view(-1)
        ps[0]._with_gemm_swizzled_scales = True

    between_read_and_plan(te_swizzles)
    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    assert torch.equal(view.rowwise.scales[0], spec_layout(logical))  # copied, not swizzled twice


def test_a_group_swizzled_while_planning_is_copied_next_time(
    installed_te: Installer, between_read_and_plan: Callable[[Callable[[], None]], None]
) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, R, C, mxfp8=True)
    logical = torch.stack([_rows(m._rowwise_scale_inv) for m in g.quantized_tensors]).clone()

    def te_swizzles_the_group() -> None:
        g.scale_inv[: spec_layout(logical).numel()] = spec_layout(logical).view(-1)
        g._with_gemm_swizzled_scales = True

    between_read_and_plan(te_swizzles_the_group)
    view = mok.grouped_weight_view(g, num_experts=2, rows=R, columns=C, format="mxfp8")
    mok.grouped_weight_view(g, num_experts=2, rows=R, columns=C, format="mxfp8", cached=view)
    assert view.refresh_plan.plans == 2 and torch.equal(view.rowwise.scales[0], spec_layout(logical))


def test_a_layer_and_the_drop_in_heal_the_same_way(
    installed_te: Installer, between_read_and_plan: Callable[[Callable[[], None]], None]
) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    layer = mok.LayerRefresh([(ps, view)])
    between_read_and_plan(lambda: setattr(ps[0], "_rowwise_scale_inv", _fresh(ps[0]._rowwise_scale_inv, 5)))
    layer()  # the layer's first call plans (and races)
    layer()
    assert torch.equal(view.rowwise.scales[0], spec_layout(_rows(ps[0]._rowwise_scale_inv)))

    drop_in = W._native_split_weight_view(ps, rows=R, columns=C, use_mxfp8=True)
    between_read_and_plan(lambda: setattr(ps[1], "_columnwise_scale_inv", _fresh(ps[1]._columnwise_scale_inv, 6)))
    ps[0]._rowwise_scale_inv = _fresh(ps[0]._rowwise_scale_inv, 9)  # so this refresh plans (and races)
    W._native_split_weight_view(ps, rows=R, columns=C, use_mxfp8=True, cached_view=drop_in)
    W._native_split_weight_view(ps, rows=R, columns=C, use_mxfp8=True, cached_view=drop_in)
    col = ps[1]._columnwise_scale_inv[: R // 32, :C].t()
    assert torch.equal(drop_in.transposed_scale_tensors[1], spec_layout(col))


def _layer_run_twice(fc1: list[Any], fc2: list[Any]) -> tuple[Any, Any, mok.LayerRefresh, int, Any]:
    """Views of ``fc1`` ``[R, C]`` and ``fc2`` ``[C, R]``, and their layer refreshed twice, the
    second time by rerunning what the first prepared: ``(v1, v2, layer, plans, prepared)``."""
    v1 = mok.split_weight_view(fc1, rows=R, columns=C, format="mxfp8")
    v2 = mok.split_weight_view(fc2, rows=C, columns=R, format="mxfp8")
    layer = mok.LayerRefresh([(fc1, v1), (fc2, v2)])
    layer()
    plans = layer.plan.plans
    layer()
    assert layer.plan.plans == plans  # unchanged: the prepared launch ran again
    prepared = layer.plan.prepared
    assert isinstance(prepared, pipeline.PreparedRefresh) and prepared.guard._checks is not None
    return v1, v2, layer, plans, prepared


@pytest.mark.parametrize(("entry", "expert"), [(0, 0), (0, 2), (1, 0), (1, 2)])
def test_a_layer_checks_its_entries_in_one_bulk_read_and_sees_a_change_in_any(
    installed_te: Installer, entry: int, expert: int
) -> None:
    """fc1's and fc2's experts (one class, the same names) are checked by one bulk read: the
    joined check still finds a buffer TE moved in either entry, at either end."""
    installed_te("2.20.2")
    fc1 = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    fc2 = [T.mxfp8_tensor("2.20.2", C, R, seed=10 + e, param=True) for e in range(3)]
    v1, v2, layer, plans, prepared = _layer_run_twice(fc1, fc2)
    assert len(prepared.guard.readings) == 2 and len(prepared.guard._checks) == 1
    ps, view, rows, cols = [(fc1, v1, R, C), (fc2, v2, C, R)][entry]
    ps[expert]._rowwise_scale_inv = _fresh(ps[expert]._rowwise_scale_inv, 3)
    layer()
    assert layer.plan.plans == plans + 1
    assert torch.equal(view.rowwise.scales[expert], spec_layout(_rows(ps[expert]._rowwise_scale_inv, rows, cols // 32)))


def test_neighbouring_readings_of_other_names_are_checked_apart(installed_te: Installer) -> None:
    """A rowwise-only entry beside one of both directions (one class, other names) is not joined
    with it: two checks, an unchanged layer reruns, and a change in either is still seen."""
    installed_te("2.20.2")
    fc1 = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(2)]
    fc2 = [T.mxfp8_tensor("2.20.2", C, R, seed=10 + e, param=True) for e in range(2)]
    v1, _, layer, plans, prepared = _layer_run_twice(fc1, fc2)
    assert len(prepared.guard._checks) == 2
    fc1[1]._rowwise_scale_inv = _fresh(fc1[1]._rowwise_scale_inv, 4)
    layer()
    assert layer.plan.plans == plans + 1
    assert torch.equal(v1.rowwise.scales[1], spec_layout(_rows(fc1[1]._rowwise_scale_inv)))


def test_a_reading_joins_only_one_of_its_kind(installed_te: Installer) -> None:
    installed_te("2.20.2")
    tensors = [torch.zeros(4), torch.zeros(4)]
    plain = snapshot.read_itself(tensors[:1])
    other = snapshot.read_storage([T.mxfp8_tensor("2.20.2", R, C, seed=0)])
    with pytest.raises(ValueError, match=r"^Reading.joined: expected a bulk reading of .*; found"):
        plain.joined(other)
    both = plain.joined(snapshot.read_itself(tensors[1:]))
    assert both.objects == tuple(tensors) and both.addresses == tuple(t.data_ptr() for t in tensors)


def test_a_reading_answers_with_what_it_read_whenever_asked(installed_te: Installer) -> None:
    """Which names hold tensors, and each name's values, are worked out when first asked (a guard
    asks at the first refresh): from the values read, never from what TE holds by then."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    names = ("scales_swizzled", "rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")
    reading = snapshot.read_storage(ps, names)
    old_scales = [p._rowwise_scale_inv for p in ps]
    for p in ps:  # after the read, before anything asked: TE drops a direction, moves a buffer
        p._columnwise_data = None
        p._rowwise_scale_inv = _fresh(p._rowwise_scale_inv, 3)
    assert reading.names == names and reading.tensor_columns == (1, 2, 3, 4)
    assert all(a is b for a, b in zip(reading.column("rowwise_scale_inv"), old_scales, strict=True))
    assert not mok.plan.guard.StorageGuard(ps, [reading]).unchanged(ps)


def test_a_direction_without_data_but_with_a_scale_buffer_is_watched(installed_te: Installer) -> None:
    """TE dropped the columnwise data and left its scale buffer: the view reads the rowwise
    direction, and its refresh still watches the buffer left (a tensor, never tested for truth)."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(2)]
    for p in ps:
        p._columnwise_data = None
    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    assert view.columnwise is None and view.refresh_plan.plans == 1
    ps[1]._columnwise_scale_inv = _fresh(ps[1]._columnwise_scale_inv, 4)  # the buffer left, alone
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    assert view.refresh_plan.plans == 2
    assert torch.equal(view.rowwise.scales[1], spec_layout(_rows(ps[1]._rowwise_scale_inv)))


@pytest.mark.parametrize("how", ["refresh_layer", "entries assigned"])
def test_a_layer_given_other_weights_for_its_views_reads_those(installed_te: Installer, how: str) -> None:
    """The same views with new weights: the layer reads the new ones, and its views become what
    new views of them would be (payloads and pointer tables at the new memory, their scales),
    their own buffers staying where they are."""
    installed_te("2.20.2")
    fc1 = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    v1 = mok.split_weight_view(fc1, rows=R, columns=C, format="mxfp8")
    other = [T.mxfp8_tensor("2.20.2", R, C, seed=100 + e, param=True) for e in range(3)]
    layer = mok.LayerRefresh([(fc1, v1)])
    for _ in range(2):
        mok.refresh_layer([(fc1, v1)]) if how == "refresh_layer" else layer()
    scales, tables = [t.data_ptr() for t in v1.rowwise.scales or ()], v1.rowwise.data_ptrs
    if how == "refresh_layer":
        mok.refresh_layer([(other, v1)])
    else:
        layer.entries = ((other, v1),)
        layer()
    fresh = mok.split_weight_view(other, rows=R, columns=C, format="mxfp8")
    for mine, new in ((v1.rowwise, fresh.rowwise), (v1.columnwise, fresh.columnwise)):
        assert mine is not None and new is not None
        assert [t.data_ptr() for t in mine.data] == [t.data_ptr() for t in new.data]
        assert torch.equal(mine.data_ptrs, new.data_ptrs)
        assert all(map(torch.equal, mine.scales or (), new.scales or ()))
    assert [t.data_ptr() for t in v1.rowwise.scales or ()] == scales and v1.rowwise.data_ptrs is tables


def test_refreshes_racing_a_thread_that_moves_buffers_heal_afterwards(installed_te: Installer) -> None:
    """Real threads: while a refresh plans, another thread moves a buffer as TE would, at a random
    moment; once it is done, one refresh makes the view byte-correct, in every trial."""
    installed_te("2.20.2")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race windows are microseconds wide
    try:
        for trial in range(100):
            _race_and_heal(trial)
    finally:
        sys.setswitchinterval(interval)


def _race_and_heal(trial: int) -> None:
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True, columnwise=False) for e in range(4)]
    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    wait = random.Random(trial).randrange(12000)

    def te() -> None:
        for _ in range(wait):  # spin: a sleep would give the planning thread all the time it needs
            pass
        ps[2]._rowwise_scale_inv = _fresh(ps[2]._rowwise_scale_inv, trial)

    ps[0]._rowwise_scale_inv = _fresh(ps[0]._rowwise_scale_inv, 1000 + trial)  # so the next refresh plans
    mover = threading.Thread(target=te)
    mover.start()
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    mover.join()
    mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8", cached=view)
    for e, p in enumerate(ps):
        assert torch.equal(view.rowwise.scales[e], spec_layout(_rows(p._rowwise_scale_inv))), (trial, e)


# ------------------------------------------------------------------ memory moved into one flat buffer


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(["bf16", "mxfp8", "nvfp4"]),
    order=st.integers(1, 4).flatmap(lambda n: st.permutations(range(n))),
    lead=st.sampled_from([0, 16, 4096]),
    route=st.sampled_from(["split", "layer"]),
)
@example(fmt="bf16", order=[0, 1, 2], lead=0, route="split")
@example(fmt="mxfp8", order=[2, 0, 1], lead=16, route="layer")
def test_payloads_moved_into_one_flat_buffer_are_followed_to_their_own_offsets(
    fmt: str, order: list[int], lead: int, route: str
) -> None:
    """TE (or an all-gather) moves every expert's payload into one new flat buffer, expert ``e``
    at slot ``order.index(e)`` after ``lead`` bytes: the checked refresh points each expert's
    payload view at its own slice, as a new view of the weights does (addresses, pointer table,
    bytes)."""
    with installed_release("2.20.2"):
        experts = len(order)
        if fmt == "bf16":
            params: list[Any] = [
                torch.nn.Parameter(torch.randn(R, C).bfloat16(), requires_grad=False) for _ in range(experts)
            ]
        else:
            make = fake_mxfp8 if fmt == "mxfp8" else fake_nvfp4
            params = [make((R, C), param=True, seed=e, columnwise=False) for e in range(experts)]
        view = mok.split_weight_view(params, rows=R, columns=C, format=fmt)
        layer = mok.LayerRefresh([(params, view)]) if route == "layer" else None
        payloads = [p if fmt == "bf16" else p._rowwise_data for p in params]
        size = payloads[0].numel() * payloads[0].element_size()
        flat = torch.randint(0, 256, (lead + experts * size,), dtype=torch.uint8)
        for slot, e in enumerate(order):
            old = payloads[e]
            new = flat[lead + slot * size : lead + (slot + 1) * size].view(old.dtype).view(old.shape)
            if fmt == "bf16":
                params[e].data = new
            else:
                params[e]._rowwise_data = new
        if layer is not None:
            layer()
        else:
            assert mok.split_weight_view(params, rows=R, columns=C, format=fmt, cached=view) is view
        fresh = mok.split_weight_view(params, rows=R, columns=C, format=fmt)
        got, want = view.rowwise, fresh.rowwise
        assert [t.data_ptr() for t in got.data] == [t.data_ptr() for t in want.data]
        assert got.data_ptrs is not None and want.data_ptrs is not None
        assert got.data_ptrs.tolist() == want.data_ptrs.tolist()
        pairs = zip(got.data, want.data, strict=True)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)


# ------------------------------------------------------------------ the architecture


def _floors(package: str) -> dict[str, int]:
    graph = _import_graph(package)
    floors: dict[str, int] = {}

    def floor(module: str) -> int:
        if module not in floors:
            floors[module] = 1 + max((floor(d) for d in graph[module]), default=0)
        return floors[module]

    for module in graph:
        floor(module)
    return floors


def test_mok_imports_are_at_most_nine_floors_deep() -> None:
    floors = _floors("mok")
    assert max(floors.values()) <= 9, sorted(floors.items(), key=lambda kv: kv[1])


def test_views_hold_data_only() -> None:
    """The view types import none of the reading, planning, guarding or launching modules."""
    graph = _import_graph("mok")

    def below(module: str) -> set[str]:
        return set().union(*({d} | below(d) for d in graph[module])) if graph[module] else set()

    stack = {
        "mok.plan.pipeline",
        "mok.read.readers",
        "mok.plan.guard",
        "mok.read.reading",
        "mok.plan.work",
        "mok.kernels.launch",
    }
    assert not below("mok.views") & stack, below("mok.views")


def _mok_stacks(call: Callable[[], object]) -> Iterator[tuple[str, list[str]]]:
    """(callee module, modules of the mok frames below it) at every call ``call`` makes."""
    seen: list[tuple[str, list[str]]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            mods, f = [], frame.f_back
            while f is not None:
                mods.append(str(f.f_globals.get("__name__", "")))
                f = f.f_back
            seen.append((str(frame.f_globals.get("__name__", "")), [m for m in reversed(mods) if m.startswith("mok")]))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return iter(seen)


@pytest.mark.parametrize("entry", ["split", "grouped"])
def test_a_first_view_enters_each_module_once(installed_te: Installer, entry: str) -> None:
    """The public entry calls each module in one stretch (its arguments, the reader, the pipeline;
    no going back and forth), and no module is called back by one it called."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)]
    g = T.grouped_tensor("2.20.2", 2, R, C, mxfp8=True)

    def first_view() -> object:
        if entry == "split":
            return mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
        return mok.grouped_weight_view(g, num_experts=2, rows=R, columns=C, format="mxfp8")

    first_view()  # compiled regexes, cached readers: the steady state
    stacks = list(_mok_stacks(first_view))
    module = "mok.split" if entry == "split" else "mok.grouped"

    def callees(caller: str) -> list[str]:
        called = [callee for callee, below in stacks if below and below[-1] == caller and callee != caller]
        return [m for m, _ in itertools.groupby(called) if m.startswith("mok")]

    assert callees(module) == ["mok.door"]  # the public entry goes through the one door
    in_order = callees("mok.door")
    assert len(in_order) == len(set(in_order)), in_order
    assert in_order[-1] == "mok.plan.pipeline"  # which reads through the reader, plans and launches
    for callee, below in stacks:
        chain = [m for m, _ in itertools.groupby([*below, callee]) if m.startswith("mok")]
        assert len(chain) == len(set(chain)), chain  # a module re-entered from below it


def _faked_launch_view(ps: list[Any]) -> mok.SplitExpertWeights:
    """A split view of ``ps`` whose prepared launch is made of C builtins: cuda.core's launch
    (``zip`` takes any iterables and runs nothing) and torch's getter of the raw stream handle
    (``abs``), so the Python frames a refresh passes on a GPU can be counted on the CPU."""
    from mok.kernels import launch as launch_module
    from mok.kernels import streams

    view = mok.split_weight_view(ps, rows=R, columns=C, format="mxfp8")
    prepared = view.refresh_plan.prepared
    assert isinstance(prepared, pipeline.PreparedRefresh)
    launch = object.__new__(launch_module.Launch)  # a launch as Launch makes it, minus the device
    launch._launch = zip
    launch._launch_config, launch.kernel, launch._args = "config", "kernel", ("args",)
    stream = streams.CurrentStream(0)
    stream._handle = abs
    stream._last = (0, "stream")
    launch._stream = stream.current
    prepared.work._launch = launch
    return view


def _python_calls(fn: Callable[[], object]) -> list[str]:
    """The Python functions ``fn`` calls (C functions make no frame), in order."""
    called: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return called


def test_an_unchecked_rerun_passes_four_python_frames(installed_te: Installer) -> None:
    """``run_unchecked`` is the hot path of an eager refresh (a few microseconds a call): from the
    view's plan to the launch it passes as many Python frames as the code before the pipeline did
    (plan, work, launch, stream)."""
    installed_te("2.20.2")
    view = _faked_launch_view([T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(3)])
    called = _python_calls(view.refresh_plan.run_unchecked)
    assert called == ["run_unchecked", "run", "__call__", "current"], called


@pytest.mark.parametrize("experts", [3, 64])
def test_a_checked_refresh_makes_as_many_python_calls_as_the_code_before(installed_te: Installer, experts: int) -> None:
    """A checked refresh of an unchanged view (argument checks, guard, rerun) makes at most the
    24 Python calls of the code before the pipeline (commit 2d2365f), whatever the experts: the
    per-expert work stays in C-level passes."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", R, C, seed=e, param=True) for e in range(experts)]
    view = _faked_launch_view(ps)
    # a partial is C: the calls counted are the refresh's own
    refresh = functools.partial(mok.split_weight_view, ps, rows=R, columns=C, format="mxfp8", cached=view)
    refresh()  # the guard's checks are made at the first refresh
    called = _python_calls(refresh)
    assert "check" in called and called[-3:] == ["run", "__call__", "current"], called  # guarded, then rerun
    assert len(called) <= 24, called
