"""One kernel launch for every cached view of a MoE layer, planned once and owned by the layer."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from mok.backend import backend_argument, preference
from mok.errors import MokError, RefreshError
from mok.formats import Format
from mok.grouped import read_grouped, watched_group
from mok.per_expert import guarded_names, read_split, watched
from mok.plan import check_cached, plan_directions
from mok.refresh import RefreshPlan
from mok.views import ExpertWeights, GroupedExpertWeights, SplitExpertWeights, param_list
from mok.work import ScaleWork
from te_compat import TECompatError, on_refresh

LayerEntry = tuple[object, ExpertWeights]


def _plan_entry(i: int, entry: LayerEntry) -> tuple[list[object], list[ScaleWork]]:
    """The weights and the planned work of one ``(weights, cached view)`` entry of a layer."""
    weight, cached = entry
    try:
        if isinstance(cached, GroupedExpertWeights) and cached.format is not Format.BF16:
            dims = (cached.num_experts, cached.rows, cached.columns)
            sources = read_grouped(weight, cached.format.block_format, dims)
            return list(watched_group(weight)), plan_directions(sources, cached, "grouped ")[1]
        if isinstance(cached, SplitExpertWeights) and cached.format is not Format.BF16:
            params = param_list(weight)
            check_cached(cached, SplitExpertWeights, cached.format, (len(params), cached.rows, cached.columns))
            sources = read_split(params, cached.format, cached.rows, cached.columns)
            return list(watched(params, cached.format)), plan_directions(sources, cached, "")[1]
        raise RefreshError(
            "expected a GroupedExpertWeights or SplitExpertWeights view of quantized weights; "
            f"found {type(cached).__name__}"
        )
    except (MokError, TECompatError, TypeError, ValueError) as exc:  # every refusal names its entry
        raise type(exc)(f"refresh_layer entry {i}: {exc}") from exc


class LayerRefresh:
    """Every cached view of one layer (fc1 and fc2, grouped and per expert, MXFP8 and NVFP4),
    refreshed in ONE kernel launch per call. The layer owns this plan; while TE reassigned no
    storage of its weights, a call reruns the prepared launch after a bulk identity check."""

    def __init__(self, entries: Sequence[LayerEntry], *, backend: str | None = None) -> None:
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
            raise TypeError(
                f"entries: expected a sequence of (weights, cached view) pairs; found {type(entries).__name__}"
            )
        for i, entry in enumerate(entries):
            if not isinstance(entry, tuple) or len(entry) != 2:
                found = type(entry).__name__
                raise TypeError(f"refresh_layer entry {i}: expected a (weights, cached view) pair; found {found}")
        self.entries = tuple(entries)
        self.backend = backend_argument(backend)
        self.plan = RefreshPlan()
        self.key = tuple(id(view) for _, view in self.entries)
        self._members: dict[int, list[object]] = {}  # grouped entry -> members its guard watches

    def weights(self) -> list[object]:
        """What the guard watches, in planning order (a grouped entry's members as planned: see
        mok.grouped.watched_group)."""
        out: list[object] = []
        for i, (weight, cached) in enumerate(self.entries):
            if isinstance(cached, SplitExpertWeights):
                out.extend(watched(weight, cached.format))  # type: ignore[arg-type]
            else:
                out.append(weight)
                out.extend(self._members.get(i, ()))
        return out

    def __call__(self) -> None:
        """Check every entry (nothing is written unless all pass), then launch once."""
        key = (self.key, preference(self.backend))
        if self.plan.rerun(self.weights(), key):
            return
        weights: list[object] = []
        work: list[ScaleWork] = []
        for i, entry in enumerate(self.entries):
            w, items = _plan_entry(i, entry)
            if not isinstance(entry[1], SplitExpertWeights):
                self._members[i] = w[1:]
            weights.extend(w)
            work.extend(items)
        self.plan.prepare(weights, key, work, self.backend, self._guarded_names())

    def _guarded_names(self) -> tuple[str, ...] | None:
        """The storage the layer's refresh depends on: what its split views of one format read
        (None, read everything: grouped, hybrid or mixed-format layers)."""
        names: list[str] = []
        formats = {view.format for _, view in self.entries}
        for _, view in self.entries:
            if not isinstance(view, SplitExpertWeights) or len(formats) != 1:
                return None
            own = guarded_names(view.format, view.columnwise is not None)
            if own is None:
                return None
            names += [n for n in own if n not in names]
        return tuple(names)


# refresh_layer's plans, by the ids of the layer's views. Bounded, and it keeps those views and
# weights alive until evicted or te_compat.refresh(): own a LayerRefresh to avoid both.
_LAYERS: dict[tuple[Any, ...], LayerRefresh] = {}
_LAYERS_LOCK = threading.Lock()
_LAYER_CACHE_SIZE = 64
on_refresh(_LAYERS.clear)


def refresh_layer(entries: Sequence[LayerEntry], *, backend: str | None = None) -> None:
    """Refresh every cached view of a layer in ONE kernel launch (see :class:`LayerRefresh`).

    ``entries`` pairs each weight with its cached view: ``(grouped_parameter, GroupedExpertWeights)``
    or ``(list_of_expert_parameters, SplitExpertWeights)``, any mix. The layer's prepared plan is
    kept per set of views (a bounded cache); keep a :class:`LayerRefresh` to own it yourself.

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers is not: the check can pass just
    before TE moves a buffer, and the launch then reads the old one. Order the two yourself.
    """
    layer = LayerRefresh(entries, backend=backend)
    if not layer.entries:
        raise ValueError("refresh_layer: expected at least one (weights, cached view) pair; found none")
    cache_key = (layer.key, backend)
    known = _LAYERS.get(cache_key)
    if known is not None and all(a[1] is b[1] for a, b in zip(known.entries, layer.entries, strict=True)):
        known.entries = layer.entries  # the same views; the weights lists may be new objects
        known()
        return
    layer()
    with _LAYERS_LOCK:  # refreshes of different layers may evict at once
        _LAYERS[cache_key] = layer
        while len(_LAYERS) > _LAYER_CACHE_SIZE:
            _LAYERS.pop(next(iter(_LAYERS)))
