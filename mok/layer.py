"""One kernel launch for every cached view of a MoE layer, planned once and owned by the layer:
the layer's entries go through the one pipeline (mok.plan.pipeline.refresh) together."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from mok.backend import backend_argument
from mok.checks import describe
from mok.door import reader_for
from mok.errors import RefreshError
from mok.plan.pipeline import LayerRerun, Reader, refresh
from mok.views import ExpertWeights, GroupedExpertWeights, RefreshPlan, SplitExpertWeights
from te_compat import on_refresh

LayerEntry = tuple[object, ExpertWeights]
_LABEL = "refresh_layer"


def _check_entry(i: int, entry: object) -> None:
    """One ``(weights, cached view)`` entry: a pair whose view is mok's, of the weights' kind (a
    grouped view beside one grouped weight, a per-expert view beside a list of experts)."""
    if not isinstance(entry, tuple) or len(entry) != 2:
        raise TypeError(f"{_LABEL} entry {i}: expected a (weights, cached view) pair; found {describe(entry)}")
    weights, view = entry
    if not isinstance(view, (GroupedExpertWeights, SplitExpertWeights)):
        inner = getattr(view, "expert_view", None)  # mok.weights' results carry the view they came from
        hint = f" (its .expert_view is one: pass {type(inner).__name__})" if isinstance(inner, ExpertWeights) else ""
        raise RefreshError(
            f"{_LABEL} entry {i}: expected a GroupedExpertWeights or SplitExpertWeights view (what "
            f"mok.grouped_weight_view or mok.split_weight_view returns) as the pair's second item; found "
            f"{describe(view)}{hint}"
        )
    # what mok.split_weight_view takes for experts: any sequence (a list, a tuple) but a string
    per_expert = isinstance(weights, Sequence) and not isinstance(weights, (str, bytes, bytearray))
    if isinstance(view, GroupedExpertWeights) and per_expert:
        raise RefreshError(
            f"{_LABEL} entry {i}: the view is grouped (a GroupedExpertWeights of {view.num_experts} experts, "
            f"over one [E, rows, columns] weight) and the weights are not: found {describe(weights)}; pair "
            "per-expert parameters with a SplitExpertWeights view (mok.split_weight_view)"
        )
    if isinstance(view, SplitExpertWeights) and not per_expert:
        raise RefreshError(
            f"{_LABEL} entry {i}: the view is per expert (a SplitExpertWeights of {view.num_experts} experts, "
            f"over a list of expert parameters) and the weights are one grouped weight: found {describe(weights)}; "
            "pair a grouped weight with a GroupedExpertWeights view (mok.grouped_weight_view)"
        )


def _reader(i: int, weights: object, view: ExpertWeights) -> Reader[Any]:
    """The reader of one ``(weights, cached view)`` entry (checked by :func:`_check_entry`), for
    the view's format and shape."""
    grouped = isinstance(view, GroupedExpertWeights)
    experts = view.num_experts if grouped else None  # a split view's experts are its weights, counted
    try:
        return reader_for(
            weights, grouped=grouped, format=view.format, rows=view.rows, columns=view.columns, experts=experts
        )
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{_LABEL} entry {i}: {exc}") from exc


class LayerRefresh:
    """Every cached view of one layer (fc1 and fc2, grouped and per expert, MXFP8 and NVFP4),
    refreshed in ONE kernel launch per call. The layer owns this plan; while TE reassigned no
    storage of its weights, a call reruns the prepared launch after a bulk identity check.

    Entries are checked when given: each view must be mok's (a mok.weights result carries its
    own as ``.expert_view``), grouped beside one grouped weight, per expert beside a list of
    experts; anything else raises :class:`mok.RefreshError` naming the entry."""

    def __init__(self, entries: Sequence[LayerEntry], *, backend: str | None = None) -> None:
        self.backend = backend_argument(backend)
        self.entries = entries
        self.plan = RefreshPlan()

    @property
    def entries(self) -> tuple[LayerEntry, ...]:
        """The ``(weights, cached view)`` pairs; assigning new ones (the same views with new
        weights lists) makes the next call check those."""
        return self._entries_and_rerun[0]

    @entries.setter
    def entries(self, entries: Sequence[LayerEntry]) -> None:
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
            raise TypeError(f"entries: expected a sequence of (weights, cached view) pairs; found {describe(entries)}")
        for i, entry in enumerate(entries):
            _check_entry(i, entry)
        if len(entries) == 0:  # a layer of no views has nothing to launch
            raise ValueError(f"{_LABEL}: expected at least one (weights, cached view) pair; found none")
        entries = tuple(entries)
        # one store: a call racing the assignment sees the old pairs and their rerun, or the new
        self._entries_and_rerun = (entries, LayerRerun(entries))

    def __call__(self) -> None:
        """Check every entry (nothing is written unless all pass), then launch once."""
        entries, rerun = self._entries_and_rerun
        if self.backend is None and rerun(self.plan):
            return
        readers = [(_reader(i, w, view), view) for i, (w, view) in enumerate(entries)]
        refresh(self.plan, readers, self.backend, _LABEL)


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

    Threads: as :func:`mok.split_weight_view`.
    """
    layer = LayerRefresh(entries, backend=backend)
    cache_key = (tuple(id(view) for _, view in layer.entries), backend)
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
