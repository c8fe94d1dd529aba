"""mok's errors (mok/errors.py) as a caller catches them: each refusal is caught by every except
clause docs/views-and-refresh.md promises for it.

A freed storage is refused with mok.StorageFreedError by a new view and a refresh alike; the docs
make it both an ExpertWeightError (a ValueError: the weights are not what a view needs) and a
RefreshError (a RuntimeError: the refresh cannot run), so code written against either holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mok
from te_compat.testing import installed_release

R, C, E = 64, 64, 3
CLAUSES = [mok.StorageFreedError, mok.RefreshError, RuntimeError, mok.ExpertWeightError, ValueError, mok.MokError]


def _call(how: str, params: list[torch.nn.Parameter], fmt: str) -> Callable[[], Any]:
    """What the caller does after the weights were freed: a new view, a refresh of one made
    before, or a layer's refresh of it."""
    view = mok.split_weight_view(params, rows=R, columns=C, format=fmt)
    if how == "new view":
        return lambda: mok.split_weight_view(params, rows=R, columns=C, format=fmt)
    if how == "refresh":
        return lambda: mok.split_weight_view(params, rows=R, columns=C, format=fmt, cached=view)
    return mok.LayerRefresh([(params, view)])


@pytest.mark.parametrize("clause", CLAUSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("how", ["new view", "refresh", "layer"])
@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])  # mxfp8: BF16 weights mok quantises itself
def test_freed_storage_is_caught_by_every_documented_clause(clause: type[Exception], how: str, fmt: str) -> None:
    with installed_release("2.20.2"):
        params = [torch.nn.Parameter(torch.randn(R, C).bfloat16(), requires_grad=False) for _ in range(E)]
        call = _call(how, params, fmt)
        params[1].untyped_storage().resize_(0)  # FSDP between steps
        with pytest.raises(clause, match="expert 1 weight: its storage holds 0 bytes"):
            call()
