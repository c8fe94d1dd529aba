"""A refresh is a fresh view made fast: the invariant, stated as a property over ordered pairs of states.

"A refresh refuses what a fresh view refuses and holds what a fresh view holds, from any state
to any other." Each example draws a :class:`Plan`: the weights' shape, a state A, a state B, how
TE re-quantises A into B, and a few small changes on top of B. The view is made in state A; the
SAME weight objects are then put into state B where TE would keep them (TE re-quantises into the
same Parameter: it writes into the buffers it has where they fit, or reassigns buffers, flags
and member lists), new Parameter objects where the kind changes (TE MXFP8 <-> BF16 Parameter,
MXFP8 <-> NVFP4); then the view is refreshed and :func:`judge_refresh` compares it with a fresh
view of the weights as they now are, by the same route. It is judged in state A unchanged, in
state B, and after each change on top of B.

States (:class:`State`): the kind (MXFP8, NVFP4, hybrid with each direction's block format
drawn, BF16 as TE keeps it, BF16 weights mok quantises on the fly when MXFP8 is asked of them,
and each of these where another was); per expert, the directions TE stores (both, rowwise only,
columnwise only, so only some experts may have one); per expert, scales already in the GEMM
layout (TE's ``_with_gemm_swizzled_scales``) or not; and the memory under the buffers: own
allocations, experts sharing one flat buffer (views into one allocation at different offsets),
each buffer deep into a larger storage, re-strided at the same address, or deep into a storage
that then shrank. Shapes are padded (64 x 96) or aligned (128 x 128: TE's swizzled scales are
then viewed zero-copy). Routes: split, grouped, a layer of both, and the mok.weights drop-in.

Changes on top of B (:data:`STEP_KINDS`): a buffer reassigned (a copy, None), re-viewed at the
same address with another dtype, shape, strides or offset (reassigned or through ``.data =``),
re-strided at the same address, shrunk in place, moved deep into a larger storage (which may
then shrink), its experts' buffers moved into one shared allocation; bytes written; a storage
freed with ``resize_(0)`` and regrown at any address; TE's own ``clear()``; the swizzled flag
flipped; experts swapped or one replaced in the list in place; a grouped weight's member put
into its list in place; ``requires_grad`` switched.

How the draws stay deterministic: hypothesis needs every example's draws to depend only on
earlier draws, and replays a failing example to print what it drew. The whole plan is drawn
first, in one draw, from strategies that depend on the test's parameters alone (route and
format), never on the weights, the allocator, what torch accepts as a view or what mok raises;
and what is drawn is plain values (strings, ints, bools), never a tensor or a TE object (printing
one iterates it, which TE's tensors and te_compat's fakes refuse, so a replay that prints would
end where the run it replays went on). A change names what it touches by drawn integers, taken
modulo the number of candidates when it is applied; a change that does not apply (no such
buffer, a view torch refuses, nothing freed to regrow) changes nothing. Applying the plan draws
nothing.

Tested by name below: a refresh with other rows or columns, and one whose own buffer was freed,
refuse; a layer reads a Parameter put into its list in place.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mok
import te_compat
from mok import weights as W
from te_compat import TensorKind
from te_compat.testing import fake_grouped, fake_hybrid, fake_mxfp8, fake_nvfp4, installed_release

RELEASE = "2.20.2"
E = 3
PADDED, ALIGNED = (64, 96), (128, 128)  # padded: rows to 128, scale columns to 4; aligned: neither
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
Outcome = tuple[bool, Any]  # (True, what was returned) or (False, the exception)

# ------------------------------------------------------------------------------ the plan: every draw


USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}  # TE's update_usage
BLOCK_FORMATS = ("mxfp8", "nvfp4")
A_MEMORY = ("own", "shared", "deep")
B_MEMORY = (*A_MEMORY, "strided", "shrunk")  # a fresh view refuses these: not for the state a view is made in
MEMBER_WAYS = ("replaced", "edited in place", "re-pointed", "kept")
# the view's format asked for (the route's) -> kinds of weights in state A (viewable) and in state B
A_KINDS = {"mxfp8": ("mxfp8", "bf16"), "nvfp4": ("nvfp4",), "hybrid": ("hybrid",), "bf16": ("bf16",)}
B_KINDS = {
    "mxfp8": ("mxfp8", "bf16", "nvfp4"),
    "nvfp4": ("nvfp4", "mxfp8"),
    "hybrid": ("hybrid", "mxfp8"),
    "bf16": ("bf16", "mxfp8"),
}
STEP_KINDS = (
    "reassign a copy",
    "reassign a re-view",
    "re-view through .data",
    "restride at the same address",
    "shrink in place",
    "move deep into a storage",
    "deep into a shrunk storage",
    "share one flat buffer",
    "write bytes",
    "free",
    "regrow",
    "set None",
    "clear",
    "flip the swizzled flag",
    "requires_grad",
    "swap experts",
    "replace an expert in place",
    "put a member into the list in place",
)


@dataclass(frozen=True)
class State:
    """What the weights of every entry hold. ``usage``, ``swizzled``: per expert (a grouped
    weight takes the first); ``formats``: each direction's block format (hybrid; else the kind's);
    ``te_group``: a BF16 grouped weight is TE's high-precision GroupedTensor, not a Parameter."""

    kind: str  # "mxfp8", "nvfp4", "hybrid", "bf16"
    formats: tuple[str, str]
    usage: tuple[str, ...]
    swizzled: tuple[bool, ...]
    memory: str
    te_group: bool = False
    requires_grad: bool = True


@dataclass(frozen=True)
class Requantise:
    """How TE puts its weights into the next state: ``in_place``, into the buffers it has where
    one fits (same shape, dtype and strides), else into new buffers it assigns; ``members``, what
    becomes of a grouped weight's list of per-expert members (re-pointed: the same member objects
    over the group's buffers now)."""

    in_place: bool
    members: str


@dataclass(frozen=True)
class Step:
    """A change on top of state B: ``which`` and ``other`` pick, modulo the candidates' count
    when it is applied, what it changes (a buffer, an owner, an expert, a way to re-view)."""

    kind: str
    which: int
    other: int


@dataclass(frozen=True)
class Plan:
    """One example: the shape (``aligned``: 128 x 128, else padded), the view made in state ``a``,
    the weights put into state ``b`` as ``how`` says, then ``steps``; ``seed`` seeds the bytes."""

    aligned: bool
    a: State
    b: State
    how: Requantise
    steps: tuple[Step, ...]
    seed: int


def _per_expert(values: Sequence[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    """One value for every expert, or one each."""
    return st.one_of(st.sampled_from(values).map(lambda v: (v,) * E), st.tuples(*[st.sampled_from(values)] * E))


@st.composite
def states(draw: st.DrawFn, kinds: Sequence[str], *, viewable: bool, columnwise: bool = False) -> State:
    """A state of one of ``kinds``. ``viewable``: one a view can be made in (rowwise data on every
    expert, columnwise on all or none, on all with ``columnwise``; memory a view reads); else any,
    a direction on some experts only."""
    kind = draw(st.sampled_from(kinds))
    formats = (kind, kind)
    if kind == "hybrid":
        formats = (draw(st.sampled_from(BLOCK_FORMATS)), draw(st.sampled_from(BLOCK_FORMATS)))
    usage: tuple[str, ...] = ("both",) * E
    swizzled: tuple[bool, ...] = (False,) * E
    if kind != "bf16":
        if not viewable:
            usage = draw(_per_expert(tuple(USAGES)))
        elif not columnwise:
            usage = (draw(st.sampled_from(("both", "rowwise"))),) * E
        swizzled = draw(_per_expert((False, True)))
    memory = draw(st.sampled_from(A_MEMORY if viewable else B_MEMORY))
    te_group, requires_grad = (draw(st.booleans()), draw(st.booleans())) if kind == "bf16" else (False, True)
    return State(kind, formats, usage, swizzled, memory, te_group, requires_grad)


def plans(route: str, fmt: str) -> st.SearchStrategy[Plan]:
    """Every draw of an example, from the route and the view's format alone."""
    return st.builds(
        Plan,
        aligned=st.booleans(),
        a=states(A_KINDS[fmt], viewable=True, columnwise=route.startswith("weights")),  # Megatron's need both
        b=states(B_KINDS[fmt], viewable=False),
        how=st.builds(Requantise, in_place=st.booleans(), members=st.sampled_from(MEMBER_WAYS)),
        steps=st.lists(
            st.builds(Step, st.sampled_from(STEP_KINDS), st.integers(0, 255), st.integers(0, 255)), max_size=3
        ).map(tuple),
        seed=st.integers(0, 2**16),
    )


# ------------------------------------------------------------------------------ memory


def _alive(t: torch.Tensor | None) -> bool:
    """``t``'s storage holds every byte it spans (torch itself reads freed memory otherwise)."""
    if t is None or t.numel() == 0:
        return False
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (t.storage_offset() + span) * t.element_size() <= t.untyped_storage().nbytes()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _at(
    storage: torch.UntypedStorage, byte: int, like: torch.Tensor, stride: Sequence[int] | None = None
) -> torch.Tensor:
    """A tensor of ``like``'s dtype and shape (contiguous, or ``stride``) at ``byte`` of ``storage``."""
    strides = tuple(stride) if stride is not None else torch.empty(like.shape, device="meta").stride()
    return torch.empty(0, dtype=like.dtype).set_(storage, byte // like.element_size(), like.shape, strides)


def _deep(t: torch.Tensor, shrink: bool) -> torch.Tensor | None:
    """``t``'s values 512 bytes deep into a storage of their own; ``shrink``: that storage then
    shrinks to end halfway through them. None where ``t`` cannot be read."""
    if not _alive(t):
        return None
    storage = torch.UntypedStorage(512 + _nbytes(t))
    out = _at(storage, 512, t).copy_(t)
    if shrink:
        storage.resize_(512 + _nbytes(t) // 2)
    return out


def _shared(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The values of ``tensors`` (each readable) at different offsets of one allocation."""
    starts, end = [], 64
    for t in tensors:
        starts.append(end)
        end += -(-_nbytes(t) // 64) * 64 + 64
    storage = torch.UntypedStorage(end)
    return [_at(storage, s, t).copy_(t) for s, t in zip(starts, tensors, strict=True)]


def _restrided(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` at the same address with other strides: a matrix read column-major, a vector as
    the transpose of its two halves. None where it has no such view (or its storage no longer
    holds it: torch refuses such a view)."""
    try:
        if t.dim() == 2 and min(t.shape) > 1:
            return t.as_strided(t.shape, (1, t.shape[0]), t.storage_offset())
        if t.dim() == 1 and t.numel() >= 4 and t.numel() % 2 == 0:
            half = t.numel() // 2
            return t.as_strided((half, 2), (1, half), t.storage_offset())
    except RuntimeError:
        pass
    return None


def _random_bytes(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def _write(t: torch.Tensor, g: torch.Generator) -> None:
    """Random bytes into every element of ``t`` (readable), whatever its strides."""
    t.copy_(_random_bytes(_nbytes(t), g).view(t.dtype).view(t.shape))


def _realias_members(group: Any, moves: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Point the group's members' tensors that lie in a moved buffer (``(old, new)``) at the
    same place in the new one: TE's members are views of the group's buffers."""
    for member in getattr(group, "quantized_tensors", None) or ():
        for name, value in list(vars(member).items()):
            if not isinstance(value, torch.Tensor):
                continue
            for old, new in moves:
                where = value.data_ptr() - old.data_ptr()
                same = value.untyped_storage().data_ptr() == old.untyped_storage().data_ptr()
                if old is not new and same and 0 <= where < max(_nbytes(old), 1):
                    byte = new.storage_offset() * new.element_size() + where
                    setattr(member, name, _at(new.untyped_storage(), byte, value, value.stride()))
                    break


def _get(owner: Any, name: str | None) -> torch.Tensor:
    return owner if name is None else getattr(owner, name)


def _put(owner: Any, name: str | None, new: torch.Tensor | None) -> None:
    if name is None:  # a BF16 weight: it changes under the same Parameter
        assert new is not None
        owner.data = new
    else:
        setattr(owner, name, new)


def _move(pairs: Sequence[tuple[Any, str | None]], news: Sequence[torch.Tensor | None]) -> bool:
    """Each buffer to its new memory (a None stays); a group's members follow theirs."""
    moved = False
    for (owner, name), new in zip(pairs, news, strict=True):
        if new is None:
            continue
        old = _get(owner, name)
        _put(owner, name, new)
        if name is not None and te_compat.tensor_kind(owner) is TensorKind.GROUPED:
            _realias_members(owner, [(old, new)])
        moved = True
    return moved


# ------------------------------------------------------------------------------ TE's own clear()


def te_clear(obj: object) -> None:
    """What TE 2.20.2's ``clear()`` does to a tensor's storage (read from its source):
    ``MXFP8TensorStorage.clear`` (pytorch/tensor/storage/mxfp8_tensor_storage.py:116) and
    ``NVFP4TensorStorage.clear`` (storage/nvfp4_tensor_storage.py:146) set ``t.data =
    _empty_tensor()`` on each buffer, in place; ``GroupedTensorStorage.clear``
    (storage/grouped_tensor_storage.py:406) sets the buffers (and the members) to None."""
    kind = te_compat.tensor_kind(obj)
    if kind is TensorKind.GROUPED:
        for name in ("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax"):
            setattr(obj, name, None)
        obj.columnwise_amax = None  # type: ignore[attr-defined]
        obj.quantized_tensors = None  # type: ignore[attr-defined]
        obj.num_tensors = 0  # type: ignore[attr-defined]
        obj.tensor_shapes = []  # type: ignore[attr-defined]
        return
    names = ["_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"]
    if kind is TensorKind.NVFP4:
        names += ["_amax_rowwise", "_amax_columnwise"]
    for name in names:
        t = getattr(obj, name, None)
        if t is not None:
            t.data = torch.empty(0)


# ------------------------------------------------------------------------------ weights in a state

# TE's names of one direction's buffers, on a group and on a tensor (update_usage drops them)
_GROUP_ROWWISE = ("rowwise_data", "scale_inv", "amax")
_MEMBER_ROWWISE = ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise")
_SWIZZLED = "_with_gemm_swizzled_scales"


def _owned_tensors(obj: Any) -> list[str]:
    """Names of the buffers a TE object holds itself (not its class's properties)."""
    return [n for n, v in vars(obj).items() if isinstance(v, torch.Tensor) and not hasattr(type(obj), n)]


def _holders(weight: Any) -> list[Any]:
    """The TE objects holding a weight's buffers: itself, or a hybrid's sub-storages; none for a
    plain tensor."""
    kind = te_compat.tensor_kind(weight)
    if kind is TensorKind.HYBRID:
        return [s for s in (weight._rowwise_storage, weight._columnwise_storage) if s is not None]
    return [] if kind is TensorKind.PLAIN else [weight]


def _refs(weight: Any) -> list[tuple[Any, str | None]]:
    """(owner, attribute) of each buffer of a weight; (the weight, None) for a plain tensor."""
    holders = _holders(weight)
    return [(h, n) for h in holders for n in _owned_tensors(h)] if holders else [(weight, None)]


def _place(weights: list[Any], memory: str) -> None:
    """Put the buffers of ``weights`` (one entry's) into ``memory``; a group's members follow."""
    if memory == "own":
        return
    refs = [ref for w in weights for ref in _refs(w)]
    olds = [_get(*ref) for ref in refs]
    if memory == "shared":
        news: list[torch.Tensor | None] = list(_shared(olds))
    elif memory in ("deep", "shrunk"):
        news = [_deep(t, memory == "shrunk") for t in olds]
    else:
        news = [_restrided(t) for t in olds]
    _move(refs, news)


def _bf16(shape: tuple[int, ...], seed: int, requires_grad: bool) -> torch.nn.Parameter:
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return torch.nn.Parameter(values, requires_grad=requires_grad)


def make_expert(state: State, e: int, dims: tuple[int, int], seed: int) -> Any:
    """Expert ``e`` of a split entry in ``state`` (its memory as made: see :func:`_place`)."""
    if state.kind == "bf16":
        return _bf16(dims, seed, state.requires_grad)
    rowwise, columnwise = USAGES[state.usage[e]]
    if state.kind == "hybrid":
        weight = fake_hybrid(
            dims,
            rowwise=state.formats[0] if rowwise else None,
            columnwise=state.formats[1] if columnwise else None,
            param=True,
            seed=seed,
        )
        for sub in _holders(weight):
            setattr(sub, _SWIZZLED, state.swizzled[e])
        return weight
    factory = fake_mxfp8 if state.kind == "mxfp8" else fake_nvfp4
    return factory(dims, rowwise=rowwise, columnwise=columnwise, swizzled=state.swizzled[e], param=True, seed=seed)


def make_group(state: State, dims: tuple[int, int], seed: int) -> Any:
    """The grouped weight of an entry in ``state``: TE's GroupedTensor, or a BF16 Parameter."""
    shape = (E, *dims)
    if state.kind == "bf16":
        if state.te_group:
            return fake_grouped(shape, format="bf16", param=True, seed=seed)
        return _bf16(shape, seed, state.requires_grad)
    rowwise, columnwise = USAGES[state.usage[0]]
    kind = "mxfp8" if state.kind == "hybrid" else state.kind  # TE keeps no hybrid groups
    group = fake_grouped(shape, format=kind, columnwise=columnwise, swizzled=state.swizzled[0], param=True, seed=seed)
    if not rowwise:  # TE's update_usage(rowwise_usage=False), on the group and its members
        for name in _GROUP_ROWWISE:
            setattr(group, name, None)
        for member in group.quantized_tensors:
            for name in _MEMBER_ROWWISE:
                setattr(member, name, None)
    return group


def _fits(old: Any, new: Any) -> bool:
    """TE can write ``new``'s values into ``old`` in place: both readable, same shape, dtype, strides."""
    return (
        isinstance(old, torch.Tensor)
        and isinstance(new, torch.Tensor)
        and _alive(old)
        and _alive(new)
        and (old.shape, old.dtype, old.stride()) == (new.shape, new.dtype, new.stride())
    )


def _transplant(old: Any, new: Any, in_place: bool) -> None:
    """``old`` (a TE object) takes ``new``'s state: its values written into ``old``'s buffers
    where they fit and ``in_place``, else ``new``'s buffers, flags and quantizer assigned."""
    for name, value in vars(new).items():
        if name == "quantized_tensors":
            continue
        current = vars(old).get(name)
        if in_place and _fits(current, value):
            current.copy_(value)
        else:
            setattr(old, name, value)


def _members_into(old: Any, new: Any, ways: str) -> None:
    """A group's members after :func:`_transplant`: ``new``'s members, made views of ``old``'s
    buffers as they now are, then put into ``old`` as ``ways`` says."""
    members = getattr(new, "quantized_tensors", None)
    moves = [
        (getattr(new, n), getattr(old, n)) for n in _owned_tensors(new) if isinstance(getattr(old, n), torch.Tensor)
    ]
    _realias_members(new, moves)
    current = getattr(old, "quantized_tensors", None)
    if ways == "kept":
        return
    if ways == "edited in place" and isinstance(current, list) and isinstance(members, list):
        current[:] = members
    elif (
        ways == "re-pointed"
        and isinstance(current, list)
        and isinstance(members, list)
        and list(map(type, current)) == list(map(type, members))
    ):
        for mine, theirs in zip(current, members, strict=True):
            _transplant(mine, theirs, in_place=False)
    else:
        old.quantized_tensors = members


def into_state(old: Any, new: Any, how: Requantise) -> Any:
    """The weight TE holds in the next state, ``new`` being that state made afresh: ``old``
    itself, re-quantised into (TE keeps its Parameter), or ``new`` where the kind changed."""
    if type(old) is not type(new):
        return new
    kind = te_compat.tensor_kind(old)
    if kind is TensorKind.PLAIN:
        if how.in_place and _fits(old.data, new.data):
            old.data.copy_(new.data)
        else:
            old.data = new.data
        old.requires_grad_(new.requires_grad)
        return old
    if kind is TensorKind.HYBRID:  # a direction's sub-storage is kept where its format is
        for name in ("_rowwise_storage", "_columnwise_storage"):
            mine, theirs = getattr(old, name), getattr(new, name)
            if mine is not None and theirs is not None and type(mine) is type(theirs):
                _transplant(mine, theirs, how.in_place)
            else:
                setattr(old, name, theirs)
        return old
    _transplant(old, new, how.in_place)
    if kind is TensorKind.GROUPED:
        _members_into(old, new, how.members)
    return old


# ------------------------------------------------------------------------------ the weights and their views


@dataclass
class Entry:
    """One ``(weights, view)`` pair: ``weights`` a list of experts (split) or a one-item list
    holding the grouped weight, changed in place."""

    grouped: bool
    weights: list[Any]
    view: Any = None

    @property
    def arg(self) -> Any:
        return self.weights[0] if self.grouped else self.weights


@dataclass
class World:
    route: str  # "split", "grouped", "layer", "weights split", "weights grouped"
    fmt: str  # the view's format: "mxfp8", "nvfp4", "hybrid", "bf16"
    dims: tuple[int, int]
    state: State
    seeds: Iterator[int]
    entries: list[Entry] = field(default_factory=list)
    freed: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)
    layer: mok.LayerRefresh | None = None
    layer_args: list[Any] = field(default_factory=list)

    @classmethod
    def build(cls, route: str, fmt: str, state: State, dims: tuple[int, int] = PADDED, seed: int = 0) -> World:
        """The route's entries in ``state``, and their views."""
        world = cls(route, fmt, dims, state, itertools.count(100 + 1000 * seed))
        kinds = {"split": [False], "grouped": [True], "weights split": [False], "weights grouped": [True]}
        layer = [False, True] if fmt != "hybrid" else [False, False]  # TE keeps no hybrid groups
        for grouped in kinds.get(route, layer):
            entry = Entry(grouped, world.make(grouped, state))
            entry.view = world.new_view(entry)
            world.entries.append(entry)
        if route == "layer":
            world.layer_args = [e.arg for e in world.entries]
            world.layer = mok.LayerRefresh(list(zip(world.layer_args, [e.view for e in world.entries], strict=True)))
        return world

    def make(self, grouped: bool, state: State) -> list[Any]:
        """An entry's weights in ``state``, made afresh."""
        if grouped:
            weights = [make_group(state, self.dims, next(self.seeds))]
        else:
            weights = [make_expert(state, e, self.dims, next(self.seeds)) for e in range(E)]
        _place(weights, state.memory)
        return weights

    def requantise(self, state: State, how: Requantise) -> None:
        """Put every entry's weights into ``state`` as TE would (:func:`into_state`)."""
        with torch.no_grad():
            for entry in self.entries:
                for i, new in enumerate(self.make(entry.grouped, state)):
                    entry.weights[i] = into_state(entry.weights[i], new, how)
        self.state = state

    def new_view(self, entry: Entry, cached: Any = None) -> Any:
        """A view of the entry's weights as the route makes it (a refresh of ``cached``)."""
        if self.route.startswith("weights"):
            if entry.grouped:
                return W._native_single_grouped_weight_view(
                    entry.arg,
                    num_experts=E,
                    rows=self.dims[0],
                    columns=self.dims[1],
                    use_mxfp8=True,
                    cached_view=cached,
                )
            return W._native_split_weight_view(
                entry.arg, rows=self.dims[0], columns=self.dims[1], use_mxfp8=True, cached_view=cached
            )
        rows, columns = self.dims
        if entry.grouped:
            return mok.grouped_weight_view(
                entry.arg, num_experts=E, rows=rows, columns=columns, format=self.fmt, cached=cached
            )
        return mok.split_weight_view(entry.arg, rows=rows, columns=columns, format=self.fmt, cached=cached)

    def refresh(self) -> Outcome:
        """The checked refresh of the cached views, as the route makes it: what each call
        returned (the layer: None), or the exception."""
        if self.layer is not None:
            layer = self.layer
            args = [e.arg for e in self.entries]
            if any(a is not b for a, b in zip(args, self.layer_args, strict=True)):  # a grouped weight replaced
                layer.entries = list(zip(args, [e.view for e in self.entries], strict=True))
                self.layer_args = args
            return attempt(lambda: [layer()] * len(self.entries))
        return attempt(lambda: [self.new_view(e, e.view) for e in self.entries])

    # --- what a change may touch

    def owners(self) -> list[Any]:
        """The TE objects holding buffers: experts, a hybrid's sub-storages, groups."""
        return [h for entry in self.entries for w in entry.weights for h in _holders(w)]

    def buffers(self) -> list[tuple[Any, str | None]]:
        """(owner, attribute) of every tensor the views read; (tensor, None) for BF16 weights."""
        return [ref for e in self.entries for w in e.weights for ref in _refs(w)]

    def buffer_sets(self) -> list[list[tuple[Any, str | None]]]:
        """Buffers one allocation may hold together: a split entry's experts' buffers of one
        attribute (or its BF16 weights), a grouped weight's buffers."""
        found: list[list[tuple[Any, str | None]]] = []
        for entry in self.entries:
            by_name: dict[str | None, list[tuple[Any, str | None]]] = {}
            for owner, name in (ref for w in entry.weights for ref in _refs(w)):
                by_name.setdefault(None if entry.grouped else name, []).append((owner, name))
            found += by_name.values()
        return found


def attempt(fn: Callable[[], Any]) -> Outcome:
    try:
        return True, fn()
    except Exception as exc:  # the property compares whatever is raised
        return False, exc


# ------------------------------------------------------------------------------ the changes on top of B


def _dtype_of_size(t: torch.Tensor) -> torch.dtype:
    return {1: torch.int8, 2: torch.float16}.get(t.element_size(), torch.int32)


REVIEWS: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (  # the same memory seen another way
    lambda x: x.view(-1),
    lambda x: x.transpose(-1, -2),
    lambda x: x.view(-1, x.shape[-1] * x.shape[-2]),
    lambda x: x[: x.shape[0] // 2],
    lambda x: x.view(_dtype_of_size(x)),
    lambda x: x.view(-1)[1:],  # one element on: another storage offset
)


def _pick(candidates: Sequence[Any], index: int) -> Any:
    return candidates[index % len(candidates)] if candidates else None


def apply_step(world: World, step: Step, g: torch.Generator) -> str:
    """Make the change ``step`` names, where it applies; say what it changed."""
    with torch.no_grad():
        done = _apply(world, step, g)
    return f"{step.kind} ({done})" if done else f"{step.kind} (nothing to change)"


def _apply(world: World, step: Step, g: torch.Generator) -> str:
    kind, which, other = step.kind, step.which, step.other
    picked = _pick(world.buffers(), which)
    owner, name = picked if picked is not None else (None, None)
    t = _get(owner, name) if owner is not None else None
    label = f"{type(owner).__name__}.{name or 'data'}"
    if kind == "reassign a copy" and _alive(t):
        _put(owner, name, t.clone())
        return label
    if kind in ("reassign a re-view", "re-view through .data") and t is not None:
        try:
            new = REVIEWS[other % len(REVIEWS)](t)
        except (RuntimeError, IndexError):  # not a view this tensor has
            return ""
        if kind == "reassign a re-view" and name is not None:
            setattr(owner, name, new)
        else:
            t.data = new
        return f"{label}, way {other % len(REVIEWS)}"
    if kind == "restride at the same address" and t is not None:
        return label if _move([(owner, name)], [_restrided(t)]) else ""
    if kind == "shrink in place" and t is not None and t.numel() > 1 and name is not None:
        t.resize_(t.numel() // 2)
        return label
    if kind in ("move deep into a storage", "deep into a shrunk storage") and t is not None:
        return label if _move([(owner, name)], [_deep(t, kind.startswith("deep"))]) else ""
    if kind == "share one flat buffer":
        pairs = [p for p in _pick(world.buffer_sets(), which) or () if _alive(_get(*p))]
        return f"{len(pairs)} buffers" if len(pairs) > 1 and _move(pairs, _shared([_get(*p) for p in pairs])) else ""
    if kind == "write bytes" and _alive(t):
        _write(t, g)
        return label
    if kind == "free" and t is not None and t.untyped_storage().nbytes():
        world.freed.append((t.untyped_storage(), t.untyped_storage().nbytes()))
        t.untyped_storage().resize_(0)
        return label
    if kind == "regrow" and world.freed:
        storage, nbytes = world.freed.pop(which % len(world.freed))
        storage.resize_(nbytes)  # new memory, at whatever address the allocator gives
        torch.empty(0, dtype=torch.uint8).set_(storage).copy_(_random_bytes(nbytes, g))
        return f"{nbytes} bytes"
    if kind == "set None" and name is not None:
        setattr(owner, name, None)
        return label
    if kind == "clear" and world.owners():
        target = _pick(world.owners(), which)
        te_clear(target)
        return type(target).__name__
    if kind == "flip the swizzled flag":
        flagged = [o for o in world.owners() if isinstance(getattr(o, _SWIZZLED, None), bool)]
        target = _pick(flagged, which)
        if target is not None:
            setattr(target, _SWIZZLED, not getattr(target, _SWIZZLED))
            return type(target).__name__
        return ""
    if kind == "requires_grad":
        params = [w for e in world.entries for w in e.weights if isinstance(w, torch.nn.Parameter) and not _holders(w)]
        for w in params:
            w.requires_grad_(not w.requires_grad)
        return f"{len(params)} weights" if params else ""
    split = [e for e in world.entries if not e.grouped]
    if kind == "swap experts" and split:
        entry, i = _pick(split, which), other % E
        entry.weights[i], entry.weights[(i + 1) % E] = entry.weights[(i + 1) % E], entry.weights[i]
        return f"experts {i} and {(i + 1) % E}"
    if kind == "replace an expert in place" and split:
        entry, i = _pick(split, which), other % E
        entry.weights[i] = make_expert(world.state, i, world.dims, next(world.seeds))
        return f"expert {i}"
    lists = [m for e in world.entries if e.grouped for m in [getattr(e.arg, "quantized_tensors", None)] if m]
    if kind == "put a member into the list in place" and lists:
        members = _pick(lists, which)
        nvfp4 = te_compat.tensor_kind(members[0]) is TensorKind.NVFP4
        i = other % len(members)
        foreign = (fake_nvfp4 if nvfp4 else fake_mxfp8)(world.dims, seed=next(world.seeds))
        members[i] = foreign  # its buffers are its own, not views of the group's
        return f"member {i}"
    return ""


# ------------------------------------------------------------------------------ the oracle


def mok_view(view: Any) -> mok.ExpertWeights | None:
    """The mok view behind what a route returns (mok.weights wraps one); None if there is none."""
    found = getattr(view, "expert_view", view)
    return found if isinstance(found, mok.ExpertWeights) else None


def _directions(view: mok.ExpertWeights) -> list[tuple[str, mok.ViewDirection | None]]:
    return [("rowwise", view.rowwise), ("columnwise", view.columnwise)]


def structure(view: Any) -> tuple[Any, ...]:
    """What a refresh cannot change in place: the view's type, dims, format, whether mok
    quantises it, and each direction's presence and format."""
    v = mok_view(view)
    if v is None:
        return ("no mok view", type(view).__name__)
    directions = tuple((name, None if d is None else d.format) for name, d in _directions(v))
    return (type(v).__name__, (v.num_experts, v.rows, v.columns), v.format, v.quantized_on_the_fly, directions)


def cannot_become(cached: Any, fresh: Any) -> str | None:
    """Why the cached view cannot become ``fresh`` in place (None: it can): another structure,
    or scales that were TE's own (zero-copy) where the new view's are not."""
    mine, new = structure(cached), structure(fresh)
    if mine != new:
        return f"the cached view is {mine}; a new view is {new}"
    c, f = mok_view(cached), mok_view(fresh)
    assert c is not None and f is not None
    for (name, d), (_, n) in zip(_directions(c), _directions(f), strict=True):
        if d is not None and n is not None and d.scales_zero_copy and not n.scales_zero_copy:
            return f"the cached view's {name} scales are TE's own; a new view's are not"
    return None


@dataclass(frozen=True)
class Held:
    """A tensor of a view, recorded: where it is (address, shape, strides) and, for a buffer of
    the view's own (a scale layout, a pointer table, a payload mok quantised), its bytes; None
    for one over TE's memory (a payload, an amax, TE's own scales)."""

    name: str
    tensor: torch.Tensor
    where: tuple[int, tuple[int, ...], tuple[int, ...]]
    data: torch.Tensor | None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _where(t: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    return t.data_ptr(), tuple(t.shape), t.stride()


def held(view: Any) -> list[Held]:
    """Every tensor of the view, recorded now."""
    v = mok_view(view)
    if v is None:
        return []
    found: list[tuple[str, torch.Tensor, bool]] = []
    for name, d in _directions(v):
        if d is None:
            continue
        tables = (("data table", d.data_ptrs), ("scale table", d.scale_ptrs), ("amax table", d.amax_ptrs))
        found += [(f"{name} {what}", t, True) for what, t in tables if t is not None]
        found += [(f"{name} scales {i}", t, not d.scales_zero_copy) for i, t in enumerate(d.scales or ())]
        found += [(f"{name} data {i}", t, v.quantized_on_the_fly) for i, t in enumerate(d.data)]
        found += [(f"{name} amax {i}", t, False) for i, t in enumerate(d.amax or ())]
    return [Held(n, t, _where(t), _bytes(t).clone() if own else None) for n, t, own in found]


def _lists(table: torch.Tensor | None, tensors: Sequence[torch.Tensor] | None, what: str) -> None:
    if table is not None:
        assert tensors is not None, f"{what}: a pointer table of nothing"
        found, expected = table.tolist(), [t.data_ptr() for t in tensors]
        assert found == expected, f"{what}: the pointer table lists {found}; the view's tensors are at {expected}"


def _same_bytes(mine: torch.Tensor, new: torch.Tensor, what: str) -> None:
    assert _alive(mine), f"{what}: the view's tensor spans memory its storage no longer holds"
    assert torch.equal(_bytes(mine), _bytes(new)), f"{what}: bytes differ from a new view's"


def assert_same_view(cached: Any, fresh: Any, what: str) -> None:
    """The refreshed view equals a new one: the same structure; payloads and amax at the new
    view's addresses (or, quantised by mok, the same bytes); scale layouts byte for byte (TE's
    own at the same addresses where zero-copy); pointer tables listing the view's tensors."""
    assert structure(cached) == structure(fresh), (
        f"{what}: the view is {structure(cached)}; a new view {structure(fresh)}"
    )
    c, f = mok_view(cached), mok_view(fresh)
    assert c is not None and f is not None
    for (name, d), (_, n) in zip(_directions(c), _directions(f), strict=True):
        if d is None or n is None:
            continue
        at = f"{what}: {name}"
        assert len(d.data) == len(n.data), f"{at} data: {len(d.data)} tensors; a new view {len(n.data)}"
        for i, (a, b) in enumerate(zip(d.data, n.data, strict=True)):
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (
                f"{at} data {i}: {a.dtype}{list(a.shape)}; new {b.dtype}{list(b.shape)}"
            )
            if c.quantized_on_the_fly:
                _same_bytes(a, b, f"{at} data {i}")
            else:
                found, expected = (a.data_ptr(), a.stride()), (b.data_ptr(), b.stride())
                assert found == expected, f"{at} data {i}: at (address, strides) {found}; a new view {expected}"
        _lists(d.data_ptrs, d.data, f"{at} data")
        assert (d.scales is None) == (n.scales is None), f"{at} scales: {d.scales is None=}; new {n.scales is None=}"
        if d.scales is not None and n.scales is not None:
            assert len(d.scales) == len(n.scales), f"{at} scales: {len(d.scales)}; a new view {len(n.scales)}"
            for i, (a, b) in enumerate(zip(d.scales, n.scales, strict=True)):
                _same_bytes(a, b, f"{at} scales {i}")
                if d.scales_zero_copy:
                    assert a.data_ptr() == b.data_ptr(), f"{at} scales {i}: TE's own, not where a new view has them"
        _lists(d.scale_ptrs, d.scales, f"{at} scales")
        assert (d.amax is None) == (n.amax is None), f"{at} amax: {d.amax is None=}; new {n.amax is None=}"
        if d.amax is not None and n.amax is not None:
            found_amax, expected_amax = [t.data_ptr() for t in d.amax], [t.data_ptr() for t in n.amax]
            assert found_amax == expected_amax, f"{at} amax at {found_amax}; a new view's at {expected_amax}"
        _lists(d.amax_ptrs, d.amax, f"{at} amax")


def _own_error(exc: BaseException) -> BaseException:
    """mok.weights raises upstream's RuntimeError, its own error the cause."""
    return exc.__cause__ if type(exc) is RuntimeError and exc.__cause__ is not None else exc


def judge_refresh(world: World, what: str) -> None:
    """The oracle: the refresh of every cached view judged against F, a fresh view of the
    weights as they now are, by the same route (made before the refresh runs).

    - F raises X: the refresh raises X's class, X's message inside its own (mok.weights raises
      upstream's RuntimeError, its own error the cause: compared is the cause). In a layer, whose
      entries are read in order, an earlier entry that cannot become its F may refuse first.
    - F succeeds: the refresh returns the cached view itself, equal to F (:func:`assert_same_view`),
      its own buffers (scale layouts, pointer tables, payloads mok quantised) still where they
      were; OR it raises ``mok.RefreshError`` saying "new view", and that only where the view
      cannot become F in place (:func:`cannot_become`: another structure, or scales that were
      TE's own and are not F's). Where it can, the refresh must not raise; where it cannot, it
      must. A layer's refusal names the entry it is about: one that cannot become its F.
    - A refresh that raises writes nothing: every view's own buffers keep their bytes, and no
      tensor of any view is pointed elsewhere.
    """
    fresh = [attempt(functools.partial(world.new_view, e)) for e in world.entries]
    owned = [held(e.view) for e in world.entries]
    ok, result = world.refresh()
    refused: BaseException | None = None  # what the first new view that raises raised
    reasons: dict[int, str] = {}  # why entries before it cannot become their new view in place
    for i, (entry, (fresh_ok, new)) in enumerate(zip(world.entries, fresh, strict=True)):
        if not fresh_ok:
            refused = new
            break
        why = cannot_become(entry.view, new)
        reasons.update({i: why} if why else {})
    if not ok:
        _assert_wrote_nothing(owned, what)
        mine = _own_error(result)
        about = set(reasons) if world.layer is None else {i for i in reasons if f"entry {i}:" in str(mine)}
        if about and isinstance(mine, mok.RefreshError) and "new view" in str(mine):
            return  # allowed, and where reasons are and no new view raises, required
    if refused is not None:
        assert not ok, f"after {what}: the refresh returned; a new view raises {refused!r}"
        theirs = _own_error(refused)
        assert type(mine) is type(theirs), f"after {what}: the refresh raised {mine!r}; a new view raises {theirs!r}"
        assert str(theirs) in str(mine), f"after {what}: the refresh raised {mine}; a new view raises {theirs}"
        return
    if reasons:
        found = "returned" if ok else f"raised {result!r}"
        raise AssertionError(
            f"after {what}: the refresh {found}; expected a RefreshError saying 'new view'"
            + "".join(f"; entry {i}: {why}" for i, why in reasons.items())
        )
    assert ok, f"after {what}: the refresh raised {result!r}; a new view is fine and the same in structure"
    for i, (entry, (_, new), returned, own) in enumerate(zip(world.entries, fresh, result, owned, strict=True)):
        assert returned is None or returned is entry.view, f"after {what}: entry {i}'s refresh returned another object"
        assert_same_view(entry.view, new, f"after {what}: entry {i}")
        for h in own:
            if h.data is not None:  # the view's own: never moved
                assert _where(h.tensor) == h.where, f"after {what}: entry {i} {h.name} moved from {h.where}"


def _assert_wrote_nothing(owned: list[list[Held]], what: str) -> None:
    for i, before in enumerate(owned):
        for h in before:
            at = f"after {what}: entry {i} {h.name}"
            assert _where(h.tensor) == h.where, (
                f"{at}: at {_where(h.tensor)}, not {h.where}, after a refresh that raised"
            )
            if h.data is not None:
                assert torch.equal(_bytes(h.tensor), h.data), f"{at}: written by a refresh that raised"


# ------------------------------------------------------------------------------ the property

ROUTES = [
    ("split", "mxfp8"),
    ("split", "nvfp4"),
    ("split", "hybrid"),
    ("split", "bf16"),
    ("grouped", "mxfp8"),
    ("grouped", "nvfp4"),
    ("grouped", "bf16"),
    ("layer", "mxfp8"),
    ("layer", "nvfp4"),
    ("layer", "hybrid"),
    ("layer", "bf16"),
    ("weights split", "mxfp8"),  # mok.weights refreshes MXFP8 views only (BF16 ones are plain tensors)
    ("weights grouped", "mxfp8"),
]


@contextlib.contextmanager
def _release() -> Iterator[None]:
    with installed_release(RELEASE):
        yield


@pytest.mark.usefixtures("memory_reader")  # with the compiled memory reader and the Python one
@pytest.mark.parametrize(("route", "fmt"), ROUTES)
@PROPERTY
@given(data=st.data())
def test_a_refresh_is_a_fresh_view(route: str, fmt: str, data: st.DataObject) -> None:
    plan = data.draw(plans(route, fmt), label="plan")  # the only draw: see the module's docstring
    with _release():
        world = World.build(route, fmt, plan.a, ALIGNED if plan.aligned else PADDED, plan.seed)
        judge_refresh(world, "state A, unchanged")
        world.requantise(plan.b, plan.how)
        done = ["state B"]
        judge_refresh(world, done[0])
        g = torch.Generator().manual_seed(plan.seed)
        for step in plan.steps:
            done.append(apply_step(world, step, g))
            judge_refresh(world, ", then ".join(done))


# ------------------------------------------------------------------------------ the refusals, by name

# (route, format, kind of the weights): every route, TE's weights and BF16 weights mok quantises
NAMED = [(route, fmt, kind) for route, fmt in ROUTES for kind in A_KINDS[fmt] if route != "layer"]


def _views_of(route: str, fmt: str, kind: str) -> World:
    state = State(kind, (kind, kind) if kind != "hybrid" else ("mxfp8", "nvfp4"), ("both",) * E, (False,) * E, "own")
    return World.build(route, fmt, state)


def _scale_bytes(world: World) -> list[torch.Tensor]:
    return [h.data for e in world.entries for h in held(e.view) if h.data is not None]


def _plans(view: Any) -> int:
    found = mok_view(view)
    return int(found.refresh_plan.plans) if found is not None else -1


@pytest.mark.parametrize(("route", "fmt", "kind"), NAMED)
@pytest.mark.parametrize(
    ("rows", "columns"), [(2 * PADDED[0], PADDED[1]), (PADDED[0], 2 * PADDED[1]), (2 * PADDED[0], PADDED[1] // 2)]
)
def test_a_refresh_with_other_rows_or_columns_is_refused(
    route: str, fmt: str, kind: str, rows: int, columns: int
) -> None:
    """The same weights and expert count, other ``rows``/``columns``: not the view's shape, so the
    refresh refuses (a new view of that shape may be fine) and writes nothing."""
    with _release():
        world = _views_of(route, fmt, kind)
        entry = world.entries[0]
        before, plans_before = _scale_bytes(world), _plans(entry.view)
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
                make(entry.arg, rows=rows, columns=columns, format=fmt, cached=entry.view, **sizes)
        assert all(map(torch.equal, _scale_bytes(world), before)) and _plans(entry.view) == plans_before


@pytest.mark.parametrize(("fmt", "kind"), [("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("bf16", "bf16"), ("mxfp8", "bf16")])
def test_a_layer_reads_a_parameter_put_into_its_list_in_place(fmt: str, kind: str) -> None:
    """``fc1[2] = other`` after the layer was refreshed: the next call reads ``other``, as a new
    view of the list would."""
    with _release():
        world = _views_of("layer", fmt, kind)
        assert world.layer is not None
        world.layer()
        entry = next(e for e in world.entries if not e.grouped)
        entry.weights[2] = make_expert(world.state, 2, world.dims, next(world.seeds))
        world.layer()
        fresh = mok.split_weight_view(entry.weights, rows=PADDED[0], columns=PADDED[1], format=fmt)
        assert_same_view(entry.view, fresh, "after fc1[2] = other")
        if not fresh.quantized_on_the_fly:  # TE's memory (or the BF16 weight's) is what the view lists
            assert entry.view.rowwise.data[2].data_ptr() == fresh.rowwise.data[2].data_ptr() != 0


@pytest.mark.parametrize(("route", "fmt", "kind"), [n for n in NAMED if n[1] != "bf16"])
def test_a_buffer_of_the_views_own_freed_is_refused(route: str, fmt: str, kind: str) -> None:
    """A layout buffer (or, for weights mok quantises, an output) the view owns, freed: the refresh
    would write into memory that is gone, so it refuses, naming it, however unchanged TE is."""
    with _release():
        world = _views_of(route, fmt, kind)
        entry = world.entries[0]
        view = mok_view(entry.view)
        assert view is not None
        direction = view.rowwise
        own = (direction.data if view.quantized_on_the_fly else direction.scales or ())[0]
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
        world = _views_of("split", "mxfp8", "mxfp8")
        mok.refresh_layer([(world.entries[0].arg, world.entries[0].view)])
        capabilities.cuda_device()
        probe.verified_rows(Version(RELEASE))
        filled = (len(layer._LAYERS), len(memory._HOLDS_MEMORY), probe.verified_rows.cache_info().currsize)
        assert all(filled), filled
    assert not layer._LAYERS and not memory._HOLDS_MEMORY
    assert probe.verified_rows.cache_info().currsize == 0 and capabilities.cuda_device.cache_info().currsize == 0
