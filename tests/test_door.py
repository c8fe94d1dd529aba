"""mok.door: the one way in. Whatever is passed as ``cached=``, a view of the right kind or
something else, the refusal is the project's, names what it got and what it takes, and nothing
of the view or the weights is touched; the reader is chosen from the weights as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mok
from mok import weights as W
from te_compat.testing import fake_grouped, fake_mxfp8, installed_release

E, R, C = 3, 128, 256


def _views() -> tuple[list[Any], Any, Any, Any, Any]:
    experts = [fake_mxfp8((R, C), param=True, seed=e) for e in range(E)]
    group = fake_grouped((E, R, C), format="mxfp8", param=True)
    split = mok.split_weight_view(experts, rows=R, columns=C, format="mxfp8")
    grouped = mok.grouped_weight_view(group, num_experts=E, rows=R, columns=C, format="mxfp8")
    return experts, group, split, grouped, W._native_split_weight_view(experts, rows=R, columns=C, use_mxfp8=True)


WRONG: dict[str, Callable[[Any, Any, Any], object]] = {
    "the other kind of view": lambda split, grouped, routed: None,  # filled per entry below
    "mok.weights' split result": lambda split, grouped, routed: routed,
    "a tuple": lambda split, grouped, routed: (split, grouped),
    "a dict of tensors": lambda split, grouped, routed: {"rowwise": split.rowwise.data[0]},
    "a list of tensors": lambda split, grouped, routed: list(split.rowwise.data),
    "an int": lambda split, grouped, routed: 3,
}


@pytest.mark.parametrize("wrong", sorted(WRONG))
@pytest.mark.parametrize("entry", ["split", "grouped"])
def test_a_cached_view_of_the_wrong_kind_is_refused_by_name(entry: str, wrong: str) -> None:
    with installed_release("2.20.2"):
        experts, group, split, grouped, routed = _views()
        bad = WRONG[wrong](split, grouped, routed)
        if wrong == "the other kind of view":
            bad = grouped if entry == "split" else split
        expected = "SplitExpertWeights" if entry == "split" else "GroupedExpertWeights"
        before = [t.clone() for t in (*(split.rowwise.scales or ()), *(grouped.rowwise.scales or ()))]
        with pytest.raises(mok.RefreshError, match=rf"cached: expected a {expected} .*; found {type(bad).__name__}$"):
            if entry == "split":
                mok.split_weight_view(experts, rows=R, columns=C, format="mxfp8", cached=bad)  # type: ignore[arg-type]
            else:
                mok.grouped_weight_view(group, num_experts=E, rows=R, columns=C, format="mxfp8", cached=bad)  # type: ignore[arg-type]
        after = [*(split.rowwise.scales or ()), *(grouped.rowwise.scales or ())]
        assert all(map(torch.equal, before, after))


def test_weights_that_became_bf16_are_quantised_by_a_new_view_and_refused_by_a_refresh() -> None:
    """TE's MXFP8 weights replaced by BF16 Parameters: MXFP8 asked of them means mok quantises them
    (a new view does); the cached view holds TE's memory, so its refresh says what changed."""
    with installed_release("2.20.2"):
        experts, _, split, _, _ = _views()
        bf16 = [torch.nn.Parameter(torch.randn(R, C).to(torch.bfloat16)) for _ in range(E)]
        assert mok.split_weight_view(bf16, rows=R, columns=C, format="mxfp8").quantized_on_the_fly
        with pytest.raises(mok.RefreshError, match="now BF16 weights.*holds views of TE's quantized storage.*new view"):
            mok.split_weight_view(bf16, rows=R, columns=C, format="mxfp8", cached=split)
        on_the_fly = mok.split_weight_view(bf16, rows=R, columns=C, format="mxfp8")
        assert not mok.split_weight_view(experts, rows=R, columns=C, format="mxfp8").quantized_on_the_fly
        with pytest.raises(mok.RefreshError, match="now TE's quantized storage.*holds mok's own buffers.*new view"):
            mok.split_weight_view(experts, rows=R, columns=C, format="mxfp8", cached=on_the_fly)
