"""A refresh is a fresh view made fast: the invariant, stated as a property.

After any sequence of changes to the weights between a view and its checked refresh, the
refresh leaves the view equal to a new view of the same weights (payloads and amax at the same
memory, pointer tables listing it, scale layouts byte for byte), or raises what the new view
raises (same class, the new view's message in the refresh's). The changes: a buffer reassigned
(a copy, None); re-viewed at the same address with another dtype, shape, strides or offset,
reassigned or through ``.data =``; shrunk in place; its storage freed with ``resize_(0)`` and
regrown at any address; bytes written; TE's own ``clear()``; TE's swizzled flag set or unset;
experts swapped, or one replaced in the list in place; ``requires_grad`` switched. Routes: split,
grouped, a layer of both, and the mok.weights drop-in; formats MXFP8, NVFP4, hybrid and BF16 as
TE keeps them, and BF16 weights mok quantises to MXFP8 on the fly.

Where the cached view cannot become the new view in place, the refresh raises a RefreshError
instead, and only there: a direction the cached view has that the weights no longer store
(docs/views-and-refresh.md says so); the other two such cases (a buffer of the view's own freed, other rows or
columns) are tested by name below.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mok
import te_compat
from mok import weights as W
from te_compat.testing import fake_grouped, fake_hybrid, fake_mxfp8, fake_nvfp4, installed_release

RELEASE = "2.20.2"
E, R, C = 3, 64, 96  # padded both ways: 64 rows of 128, 96 / 32 = 3 scale columns of 4 (NVFP4: 6 of 8)
PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
Outcome = tuple[bool, Any]  # (True, view) or (False, the exception)


# ------------------------------------------------------------------------------ TE's own clear()


def te_clear(obj: object) -> None:
    """What TE 2.20.2's ``clear()`` does to a tensor's storage (read from its source):
    ``MXFP8TensorStorage.clear`` (pytorch/tensor/storage/mxfp8_tensor_storage.py:116) and
    ``NVFP4TensorStorage.clear`` (storage/nvfp4_tensor_storage.py:146) set ``t.data =
    _empty_tensor()`` on each buffer, in place; ``GroupedTensorStorage.clear``
    (storage/grouped_tensor_storage.py:406) sets the buffers (and the members) to None."""
    kind = te_compat.tensor_kind(obj)
    if kind is te_compat.TensorKind.GROUPED:
        for name in ("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax"):
            setattr(obj, name, None)
        obj.columnwise_amax = None  # type: ignore[attr-defined]
        obj.quantized_tensors = None  # type: ignore[attr-defined]
        obj.num_tensors = 0  # type: ignore[attr-defined]
        obj.tensor_shapes = []  # type: ignore[attr-defined]
        return
    names = ["_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"]
    if kind is te_compat.TensorKind.NVFP4:
        names += ["_amax_rowwise", "_amax_columnwise"]
    for name in names:
        t = getattr(obj, name, None)
        if t is not None:
            t.data = torch.empty(0)


# ------------------------------------------------------------------------------ the weights and their views


@dataclass
class Entry:
    """One ``(weights, view)`` pair: ``weights`` a list of experts (split) or a one-item list
    holding the grouped weight, changed in place by the steps."""

    grouped: bool
    weights: list[Any]
    view: Any = None

    @property
    def arg(self) -> Any:
        return self.weights[0] if self.grouped else self.weights


@dataclass
class World:
    route: str  # "split", "grouped", "layer", "weights split", "weights grouped"
    fmt: str  # "mxfp8", "nvfp4", "hybrid", "bf16", "bf16 to mxfp8"
    requires_grad: bool
    entries: list[Entry] = field(default_factory=list)
    freed: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)
    seeds: Iterator[int] = field(default_factory=lambda: itertools.count(100))

    # --- making weights

    def expert(self) -> Any:
        seed = next(self.seeds)
        if self.fmt == "mxfp8":
            return fake_mxfp8((R, C), param=True, seed=seed)
        if self.fmt == "nvfp4":
            return fake_nvfp4((R, C), param=True, seed=seed)
        if self.fmt == "hybrid":
            return fake_hybrid((R, C), param=True, seed=seed)
        return self._bf16((R, C), seed)

    def group(self) -> Any:
        seed = next(self.seeds)
        if self.fmt in ("mxfp8", "nvfp4"):
            return fake_grouped((E, R, C), format=self.fmt, param=True, seed=seed)
        return self._bf16((E, R, C), seed)

    def _bf16(self, shape: tuple[int, ...], seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        values = torch.randn(shape, generator=g).to(torch.bfloat16)
        return torch.nn.Parameter(values, requires_grad=self.requires_grad)

    # --- views as the route makes them

    @property
    def mok_format(self) -> str:
        return "mxfp8" if self.fmt == "bf16 to mxfp8" else self.fmt

    def new_view(self, entry: Entry, cached: Any = None) -> Any:
        if self.route.startswith("weights"):
            if entry.grouped:
                return W._native_single_grouped_weight_view(
                    entry.arg, num_experts=E, rows=R, columns=C, use_mxfp8=True, cached_view=cached
                )
            return W._native_split_weight_view(entry.arg, rows=R, columns=C, use_mxfp8=True, cached_view=cached)
        if entry.grouped:
            return mok.grouped_weight_view(
                entry.arg, num_experts=E, rows=R, columns=C, format=self.mok_format, cached=cached
            )
        return mok.split_weight_view(entry.arg, rows=R, columns=C, format=self.mok_format, cached=cached)

    def build(self) -> None:
        kinds = {"split": [False], "grouped": [True], "weights split": [False], "weights grouped": [True]}
        layer = [False, True] if self.fmt != "hybrid" else [False, False]  # TE keeps no hybrid groups
        for grouped in kinds.get(self.route, layer):
            entry = Entry(grouped, [self.group()] if grouped else [self.expert() for _ in range(E)])
            entry.view = self.new_view(entry)
            self.entries.append(entry)
        if self.route == "layer":
            self.layer = mok.LayerRefresh([(e.arg, e.view) for e in self.entries])

    def refresh(self) -> Outcome:
        """The checked refresh of the cached views, as the route makes it."""
        if self.route == "layer":
            return attempt(lambda: (self.layer(), [e.view for e in self.entries])[1])
        return attempt(lambda: [self.new_view(e, e.view) for e in self.entries])

    # --- what a step may change

    def owners(self) -> list[Any]:
        """The objects holding TE's buffers: the experts (their sub-storages for hybrid weights) or groups."""
        found: list[Any] = []
        for entry in self.entries:
            for w in entry.weights:
                if self.fmt == "hybrid":
                    found += [s for s in (w._rowwise_storage, w._columnwise_storage) if s is not None]
                elif te_compat.tensor_kind(w) is not te_compat.TensorKind.PLAIN:
                    found.append(w)
        return found

    def buffers(self) -> list[tuple[Any, str | None]]:
        """(owner, attribute) of every tensor the views read; (tensor, None) for BF16 weights."""
        found: list[tuple[Any, str | None]] = []
        for owner in self.owners():
            found += [
                (owner, n)
                for n, v in vars(owner).items()
                if isinstance(v, torch.Tensor) and not hasattr(type(owner), n)
            ]
        for entry in self.entries:
            found += [(w, None) for w in entry.weights if te_compat.tensor_kind(w) is te_compat.TensorKind.PLAIN]
        return found


def attempt(fn: Callable[[], Any]) -> Outcome:
    try:
        return True, fn()
    except Exception as exc:  # the property compares whatever is raised
        return False, exc


# ------------------------------------------------------------------------------ the steps


def _get(owner: Any, name: str | None) -> torch.Tensor:
    return owner if name is None else getattr(owner, name)


def _put(owner: Any, name: str | None, new: torch.Tensor | None) -> None:
    if name is None:  # a BF16 weight: it changes under the same Parameter
        assert new is not None
        owner.data = new
    else:
        setattr(owner, name, new)


def _reviews(t: torch.Tensor) -> list[torch.Tensor]:
    """The same memory seen another way: at the same address (another shape, strides or dtype),
    or one element on (another storage offset)."""
    ways: list[Callable[[torch.Tensor], torch.Tensor]] = [
        lambda x: x.view(-1),
        lambda x: x.transpose(-1, -2),
        lambda x: x.view(-1, x.shape[-1] * x.shape[-2]),
        lambda x: x[: x.shape[0] // 2],
        lambda x: x.view(
            torch.int8 if x.element_size() == 1 else torch.float16 if x.element_size() == 2 else torch.int32
        ),
        lambda x: x.view(-1)[1:],
    ]
    found = []
    for way in ways:
        try:
            found.append(way(t))
        except (RuntimeError, IndexError):  # not a view this tensor has
            pass
    return found


def _alive(t: torch.Tensor | None) -> bool:
    """``t``'s storage holds every byte it spans (torch itself reads freed memory otherwise)."""
    if t is None or t.numel() == 0:
        return False
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (t.storage_offset() + span) * t.element_size() <= t.untyped_storage().nbytes()


def _random_bytes(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def step(world: World, data: st.DataObject) -> str:
    """Make one change the steps know (drawn), and say which."""
    kinds = ["reassign a copy", "reassign a re-view", "re-view through .data", "shrink in place", "write bytes", "free"]
    kinds += ["regrow"] if world.freed else []
    kinds += ["set None", "clear", "flip the swizzled flag"] if world.owners() else []
    kinds += ["requires_grad"] if world.fmt.startswith("bf16") else []
    if any(not e.grouped for e in world.entries):
        kinds += ["swap experts", "replace an expert in place"]
    kind = data.draw(st.sampled_from(kinds), label="change")
    buffers = world.buffers()
    owner, name = data.draw(st.sampled_from(buffers), label="buffer") if buffers else (None, None)
    t = _get(owner, name) if owner is not None else None
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    with torch.no_grad():
        if kind == "reassign a copy" and _alive(t):
            _put(owner, name, t.clone())
        elif kind in ("reassign a re-view", "re-view through .data") and t is not None:
            new = data.draw(st.sampled_from(_reviews(t)), label="re-view")
            if kind == "reassign a re-view" and name is not None:
                setattr(owner, name, new)
            else:
                _get(owner, name).data = new
        elif kind == "shrink in place" and t is not None and t.numel() > 1 and name is not None:
            t.resize_(t.numel() // 2)
        elif kind == "write bytes" and _alive(t) and t.is_contiguous():
            t.view(-1).view(torch.uint8).copy_(_random_bytes(t.numel() * t.element_size(), g))
        elif kind == "free" and t is not None and t.untyped_storage().nbytes():
            world.freed.append((t.untyped_storage(), t.untyped_storage().nbytes()))
            t.untyped_storage().resize_(0)
        elif kind == "regrow":
            storage, nbytes = world.freed.pop(data.draw(st.integers(0, len(world.freed) - 1), label="freed"))
            storage.resize_(nbytes)  # new memory, at whatever address the allocator gives
            torch.empty(0, dtype=torch.uint8).set_(storage).copy_(_random_bytes(nbytes, g))
        elif kind == "set None" and name is not None:
            setattr(owner, name, None)
        elif kind == "clear":
            te_clear(data.draw(st.sampled_from(world.owners()), label="owner"))
        elif kind == "flip the swizzled flag":
            target = data.draw(st.sampled_from(world.owners()), label="owner")
            if hasattr(target, "_with_gemm_swizzled_scales"):
                target._with_gemm_swizzled_scales = not target._with_gemm_swizzled_scales
        elif kind == "requires_grad":
            for entry in world.entries:
                for w in entry.weights:
                    if isinstance(w, torch.nn.Parameter):
                        w.requires_grad_(not w.requires_grad)
        elif kind == "swap experts":
            entry = next(e for e in world.entries if not e.grouped)
            i, j = data.draw(st.permutations(range(E)), label="order")[:2]
            entry.weights[i], entry.weights[j] = entry.weights[j], entry.weights[i]
        elif kind == "replace an expert in place":
            entry = next(e for e in world.entries if not e.grouped)
            entry.weights[data.draw(st.integers(0, E - 1), label="expert")] = world.expert()
    return kind


# ------------------------------------------------------------------------------ the comparison


def _directions(view: Any) -> list[Any]:
    """mok.ViewDirection-like records of a view as the route returns it: (data, data table,
    scales, scale table, amax, amax table) per direction."""
    if isinstance(view, mok.ExpertWeights):
        return [(d.data, d.data_ptrs, d.scales, d.scale_ptrs, d.amax, d.amax_ptrs) for d in view.directions]
    if isinstance(view, W.SplitRoutedWeight):
        assert view.expert_view is not None
        return [
            *_directions(view.expert_view),
            (None, view.storage_table, view.scale_tensors, view.scale_storage_table, None, None),
            (
                None,
                view.transposed_storage_table,
                view.transposed_scale_tensors,
                view.transposed_scale_storage_table,
                None,
                None,
            ),
        ]
    row_data, row_scales, col_data, col_scales, _ = view  # mok.weights' grouped 5-tuple
    return [((row_data,), None, (row_scales,), None, None, None), ((col_data,), None, (col_scales,), None, None, None)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def assert_same_view(cached: Any, fresh: Any, on_the_fly: bool) -> None:
    mine, new = _directions(cached), _directions(fresh)
    assert len(mine) == len(new), "a direction more or less than a new view"
    for (data, table, scales, scale_table, amax, amax_table), (n_data, n_table, n_scales, _, n_amax, _) in zip(
        mine, new, strict=True
    ):
        if data is not None:
            assert [t.shape for t in data] == [t.shape for t in n_data] and [t.dtype for t in data] == [
                t.dtype for t in n_data
            ]
            if on_the_fly:  # mok's own buffers: the bytes a new quantisation writes
                assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(data, n_data, strict=True))
            else:  # TE's memory: the very addresses a new view reads
                assert [t.data_ptr() for t in data] == [t.data_ptr() for t in n_data]
        if table is not None:
            listed = [t.data_ptr() for t in data] if data is not None else n_table.tolist() if not on_the_fly else None
            assert listed is None or table.tolist() == listed, "a pointer table not listing the view's memory"
            if not on_the_fly:
                assert table.tolist() == n_table.tolist()
        assert (scales is None) == (n_scales is None)
        if scales is not None:
            assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(scales, n_scales, strict=True)), "scales"
            if scale_table is not None:
                assert scale_table.tolist() == [t.data_ptr() for t in scales]
        assert (amax is None) == (n_amax is None)
        if amax is not None:
            assert [t.data_ptr() for t in amax] == [t.data_ptr() for t in n_amax]
            assert amax_table is None or amax_table.tolist() == [t.data_ptr() for t in amax]


def _own_error(exc: BaseException) -> BaseException:
    """mok.weights raises upstream's RuntimeError, its own error the cause."""
    return exc.__cause__ if type(exc) is RuntimeError and exc.__cause__ is not None else exc


def _lost_direction(world: World, entry: Entry) -> bool:
    """The entry's cached view has a direction its weights no longer store (a new mok view of
    them has fewer): the one change a refresh cannot follow in place."""
    cached = entry.view.expert_view if isinstance(entry.view, W.SplitRoutedWeight) else entry.view
    directions = 2 if isinstance(entry.view, tuple) else len(cached.directions)
    make = mok.grouped_weight_view if entry.grouped else mok.split_weight_view
    sizes = {"num_experts": E} if entry.grouped else {}
    ok, fresh = attempt(functools.partial(make, entry.arg, rows=R, columns=C, format=world.mok_format, **sizes))
    return ok and len(fresh.directions) < directions


def expected(world: World) -> tuple[str, Any]:
    """What the refresh must do, entry by entry as it reads them: ("lost", None) at the first
    entry whose cached view has a direction the weights lost, ("raise", the error a new view
    raises) at the first whose new view raises; else ("equal", the new views)."""
    fresh = []
    for entry in world.entries:
        if _lost_direction(world, entry):  # mok reads the weights fine, but has less to show than the view
            return "lost", None
        ok, new = attempt(functools.partial(world.new_view, entry))
        if not ok:
            return "raise", new
        fresh.append(new)
    return "equal", fresh


def check_invariant(world: World, what: str) -> None:
    verdict, fresh = expected(world)
    ok, refreshed = world.refresh()
    if verdict == "lost":
        assert not ok and isinstance(_own_error(refreshed), mok.RefreshError), f"after {what}: {refreshed!r}"
    elif verdict == "raise":
        assert not ok, f"after {what}: the refresh returned; a new view raises {fresh!r}"
        mine, theirs = _own_error(refreshed), _own_error(fresh)
        assert type(mine) is type(theirs), f"after {what}: {mine!r}; a new view raises {theirs!r}"
        assert str(theirs) in str(mine), f"after {what}: {mine}; a new view raises {theirs}"
    else:
        assert ok, f"after {what}: the refresh raised {refreshed!r}; a new view is fine"
        for entry, new in zip(world.entries, fresh, strict=True):
            assert_same_view(entry.view, new, world.fmt == "bf16 to mxfp8")


ROUTES = [
    ("split", "mxfp8"),
    ("split", "nvfp4"),
    ("split", "hybrid"),
    ("split", "bf16"),
    ("split", "bf16 to mxfp8"),
    ("grouped", "mxfp8"),
    ("grouped", "nvfp4"),
    ("grouped", "bf16"),
    ("grouped", "bf16 to mxfp8"),
    ("layer", "mxfp8"),
    ("layer", "nvfp4"),
    ("layer", "hybrid"),
    ("layer", "bf16"),
    ("layer", "bf16 to mxfp8"),
    ("weights split", "mxfp8"),
    ("weights split", "bf16 to mxfp8"),
    ("weights grouped", "mxfp8"),
    ("weights grouped", "bf16 to mxfp8"),
]


@contextlib.contextmanager
def _release() -> Iterator[None]:
    with installed_release(RELEASE):
        yield


@pytest.mark.parametrize(("route", "fmt"), ROUTES)
@pytest.mark.parametrize("requires_grad", [True, False])
@PROPERTY
@given(data=st.data(), steps=st.integers(1, 5))
def test_a_refresh_is_a_fresh_view(route: str, fmt: str, requires_grad: bool, data: st.DataObject, steps: int) -> None:
    if not requires_grad and not fmt.startswith("bf16"):
        return  # TE's Parameters: requires_grad is TE's to set, and changes nothing read
    with _release():
        world = World(route, fmt, requires_grad)
        world.build()
        check_invariant(world, "nothing")
        done: list[str] = []
        for _ in range(steps):
            done.append(step(world, data))
            check_invariant(world, ", then ".join(done))


# ------------------------------------------------------------------------------ the refusals, by name


def _views_of(route: str, fmt: str) -> World:
    world = World(route, fmt, requires_grad=True)
    world.build()
    return world


def _scale_bytes(world: World) -> list[torch.Tensor]:
    return [_bytes(t).clone() for e in world.entries for d in _directions(e.view) for t in d[2] or ()]


@pytest.mark.parametrize(("route", "fmt"), [r for r in ROUTES if r[0] != "layer"])
@pytest.mark.parametrize(("rows", "columns"), [(2 * R, C), (R, 2 * C), (2 * R, C // 2)])
def test_a_refresh_with_other_rows_or_columns_is_refused(route: str, fmt: str, rows: int, columns: int) -> None:
    """The same weights and expert count, other ``rows``/``columns``: not the view's shape, so the
    refresh refuses (a new view of that shape may be fine) and writes nothing."""
    with _release():
        world = _views_of(route, fmt)
        entry = world.entries[0]
        before, plans = _scale_bytes(world), _plans(entry.view)
        if route.startswith("weights"):
            call: Callable[[], Any] = (
                functools.partial(W._native_single_grouped_weight_view, entry.arg, num_experts=E)
                if entry.grouped
                else functools.partial(W._native_split_weight_view, entry.arg)
            )
            with pytest.raises(RuntimeError, match=r"\(experts, rows, columns\)") as caught:
                call(rows=rows, columns=columns, use_mxfp8=True, cached_view=entry.view)
            assert isinstance(_own_error(caught.value), mok.RefreshError)
        else:
            make = mok.grouped_weight_view if entry.grouped else mok.split_weight_view
            sizes = {"num_experts": E} if entry.grouped else {}
            with pytest.raises(mok.RefreshError, match=r"\(experts, rows, columns\)"):
                make(entry.arg, rows=rows, columns=columns, format=world.mok_format, cached=entry.view, **sizes)
        assert all(map(torch.equal, _scale_bytes(world), before)) and _plans(entry.view) == plans


def _plans(view: Any) -> int:
    found = view.expert_view if isinstance(view, (W.SplitRoutedWeight, W.GroupedWeightTuple)) else view
    return int(found.refresh_plan.plans) if isinstance(found, mok.ExpertWeights) else -1


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4", "bf16", "bf16 to mxfp8"])
def test_a_layer_reads_a_parameter_put_into_its_list_in_place(fmt: str) -> None:
    """``fc1[2] = other`` after the layer was refreshed: the next call reads ``other``, as a new
    view of the list would."""
    with _release():
        world = _views_of("layer", fmt)
        world.layer()
        entry = next(e for e in world.entries if not e.grouped)
        other = world.expert()
        entry.weights[2] = other
        world.layer()
        fresh = mok.split_weight_view(entry.weights, rows=R, columns=C, format=world.mok_format)
        assert_same_view(entry.view, fresh, fmt == "bf16 to mxfp8")
        if fmt != "bf16 to mxfp8":  # TE's memory (or the BF16 weight's) is what the view lists
            assert entry.view.rowwise.data[2].data_ptr() == fresh.rowwise.data[2].data_ptr() != 0


@pytest.mark.parametrize(("route", "fmt"), [r for r in ROUTES if r[1] not in ("bf16",)])
def test_a_buffer_of_the_views_own_freed_is_refused(route: str, fmt: str) -> None:
    """A layout buffer (or, for weights mok quantises, an output) the view owns, freed: the refresh
    would write into memory that is gone, so it refuses, naming it, however unchanged TE is."""
    with _release():
        world = _views_of(route, fmt)
        entry = world.entries[0]
        own = _directions(entry.view)[0][0 if fmt == "bf16 to mxfp8" else 2][0]
        own.untyped_storage().resize_(0)
        ok, refreshed = world.refresh()
        assert not ok and isinstance(_own_error(refreshed), mok.StorageFreedError), refreshed
        assert "the cached view's" in str(refreshed)


def test_installed_release_clears_every_cache_it_filled_on_exit() -> None:
    """What te_compat and mok learnt inside an ``installed_release`` block (mok's layer plans, the
    memory classes, the CUDA device, the verified rows of the table) is forgotten when it ends."""
    from packaging.version import Version

    from mok import layer
    from mok.read import memory
    from te_compat import probe

    capabilities = importlib.import_module("te_compat.capabilities")

    with _release():
        world = _views_of("split", "mxfp8")
        mok.refresh_layer([(world.entries[0].arg, world.entries[0].view)])
        capabilities.cuda_device()
        probe.verified_rows(Version(RELEASE))
        filled = (len(layer._LAYERS), len(memory._HOLDS_MEMORY), probe.verified_rows.cache_info().currsize)
        assert all(filled), filled
    assert not layer._LAYERS and not memory._HOLDS_MEMORY
    assert probe.verified_rows.cache_info().currsize == 0 and capabilities.cuda_device.cache_info().currsize == 0
