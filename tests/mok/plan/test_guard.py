"""The refresh guard (mok/plan/guard.py, and the memory comparison it uses, mok/read/memory.py)
seen from a caller: a checked refresh after TE's scale buffer was re-viewed over the same memory
with other strides equals a new view of the weights.

mok reads TE's scale buffers with whatever strides they have (a new view reads them by their
strides), so two tensors at one address, of one shape and dtype, that differ only in strides or
in contiguity hold different scales. A guard that let either pass would rerun a launch planned
for the old strides: silently stale scales.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mok
from te_compat.testing import fake_mxfp8, installed_release

pytestmark = pytest.mark.usefixtures("memory_reader")  # both memory readers
RELEASE = "2.20.2"
E, R, C = 3, 64, 96  # padded both ways, as in tests/mok/test_refresh_invariant.py
BUFFERS = {"rowwise": "_rowwise_scale_inv", "columnwise": "_columnwise_scale_inv"}

# How a [rows, columns] buffer lies over its storage, as (row stride, column stride) given
# its shape; only the first is contiguous. Every one starts at the storage's first byte.
LAYOUTS: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "contiguous": lambda r, c: (c, 1),
    "rows padded": lambda r, c: (c + 3, 1),
    "every other column": lambda r, c: (2 * c, 2),
    "column-major": lambda r, c: (1, r),
    "column-major padded": lambda r, c: (1, r + 5),
}
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def _release() -> Iterator[None]:
    with installed_release(RELEASE):
        yield


def _laid_out(storage: torch.Tensor, shape: torch.Size, layout: str) -> torch.Tensor:
    """A new tensor over ``storage`` (uint8, from its first byte) of ``shape`` laid out as ``layout``."""
    rows, columns = shape
    strides = LAYOUTS[layout](rows, columns)
    return storage.as_strided((rows, columns), strides, 0)


def _scale_bytes(view: mok.ExpertWeights) -> list[torch.Tensor]:
    return [t.view(torch.uint8).clone() for d in view.directions for t in d.scales or ()]


def _refresh(route: str, params: list[Any], view: mok.SplitExpertWeights, layer: Any) -> None:
    if route == "layer":
        layer()
    else:
        assert mok.split_weight_view(params, rows=R, columns=C, format="mxfp8", cached=view) is view


@PROPERTY
@given(
    route=st.sampled_from(["split", "layer"]),
    direction=st.sampled_from(sorted(BUFFERS)),
    expert=st.integers(0, E - 1),
    first=st.sampled_from(list(LAYOUTS)),
    then=st.sampled_from(list(LAYOUTS)),
    seed=st.integers(0, 2**16),
)
@example(route="split", direction="rowwise", expert=1, first="contiguous", then="rows padded", seed=0)
@example(route="split", direction="rowwise", expert=1, first="rows padded", then="column-major", seed=0)
@example(route="layer", direction="columnwise", expert=0, first="column-major", then="every other column", seed=1)
def test_a_scale_buffer_re_viewed_with_other_strides_is_read_again(
    route: str, direction: str, expert: int, first: str, then: str, seed: int
) -> None:
    """TE's scale buffer, first laid out one way over some memory, is replaced by a tensor at the
    same address, of the same shape and dtype, laid out another way (other strides, contiguous or
    not): the checked refresh leaves the view's scales as a new view of the weights has them."""
    with _release():
        params = [fake_mxfp8((R, C), param=True, seed=seed + e) for e in range(E)]
        name = BUFFERS[direction]
        shape = getattr(params[expert], name).shape
        storage = torch.randint(
            0, 256, (4 * shape.numel() + 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
        )
        setattr(params[expert], name, _laid_out(storage, shape, first))
        view = mok.split_weight_view(params, rows=R, columns=C, format="mxfp8")
        layer = mok.LayerRefresh([(params, view)]) if route == "layer" else None
        _refresh(route, params, view, layer)  # a refresh of unchanged weights first: the guard is armed
        moved = _laid_out(storage, shape, then)
        assert moved.data_ptr() == getattr(params[expert], name).data_ptr()
        setattr(params[expert], name, moved)
        _refresh(route, params, view, layer)
        fresh = mok.split_weight_view(params, rows=R, columns=C, format="mxfp8")
        got, want = _scale_bytes(view), _scale_bytes(fresh)
        assert all(map(torch.equal, got, want)), f"{direction} scales of expert {expert}: {first} -> {then}"
