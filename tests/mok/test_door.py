"""The one way in (mok/door.py) seen from a caller: what a view or refresh of BF16 weights is
asked for is checked as for any other weights.

- NVFP4 is TE's storage only: mok quantises BF16 weights to MXFP8 and nothing else, so NVFP4
  asked of BF16 weights is refused by a new view and by a refresh, whatever the cached view is
  (tests/mok/test_views.py's grouped BF16 case: "NVFP4: TE's storage only"). A BF16 view handed
  back instead would be a silent wrong result: a kernel expecting FP4 payloads reading BF16.
- ``backend=`` is validated on every path, "though a BF16 view converts nothing": a BF16 view
  given a backend refuses exactly what a view of TE's MXFP8 weights refuses.
- Whatever is passed as ``cached=``, a view of the right kind or something else, the refusal is
  the project's, names what it got and what it takes, and nothing is touched; the reader is
  chosen from the weights as they are, so weights that changed between TE's storage and BF16
  are refused by a refresh, by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mok
import te_compat
from mok import weights as W
from te_compat.testing import fake_grouped, fake_mxfp8, fake_nvfp4, installed_release

E, R, C = 2, 64, 64
RELEASE = "2.20.2"


@contextmanager
def _release() -> Iterator[None]:
    with installed_release(RELEASE):
        yield


def _bf16(grouped: bool, te_group: bool = False) -> Any:
    """BF16 weights: one Parameter per expert, or one grouped ``[E, R, C]`` tensor (or TE's BF16
    GroupedTensor)."""
    if not grouped:
        return [torch.nn.Parameter(torch.randn(R, C).bfloat16(), requires_grad=False) for _ in range(E)]
    if te_group:
        return fake_grouped((E, R, C), format="bf16", param=True)
    return torch.randn(E, R, C).bfloat16()


def _view(weights: Any, grouped: bool, fmt: str, **kwargs: Any) -> Any:
    if grouped:
        return mok.grouped_weight_view(weights, num_experts=E, rows=R, columns=C, format=fmt, **kwargs)
    return mok.split_weight_view(weights, rows=R, columns=C, format=fmt, **kwargs)


# ------------------------------------------------------------------------------ NVFP4 of BF16 weights

REFUSALS = (mok.MokError, te_compat.TECompatError)


@pytest.mark.parametrize(
    ("grouped", "te_group"), [(False, False), (True, False), (True, True)], ids=["split", "grouped", "TE group"]
)
def test_nvfp4_of_bf16_weights_is_refused_by_a_new_view(grouped: bool, te_group: bool) -> None:
    with _release():
        weights = _bf16(grouped, te_group)
        with pytest.raises(REFUSALS):
            _view(weights, grouped, "nvfp4")


@pytest.mark.parametrize("cached_as", ["bf16", "mxfp8"])  # mxfp8: quantised by mok
@pytest.mark.parametrize(
    ("grouped", "te_group"), [(False, False), (True, False), (True, True)], ids=["split", "grouped", "TE group"]
)
def test_nvfp4_of_bf16_weights_is_refused_by_a_refresh(grouped: bool, te_group: bool, cached_as: str) -> None:
    """A refresh of an earlier view of the same BF16 weights, asked for NVFP4: refused, naming the
    NVFP4 asked for (the cached view is a BF16 or MXFP8 one), and the view left as it was."""
    with _release():
        weights = _bf16(grouped, te_group)
        cached = _view(weights, grouped, cached_as)
        before = [t.view(torch.uint8).clone() for d in cached.directions for t in (*d.data, *(d.scales or ()))]
        with pytest.raises(mok.RefreshError, match="(?i)nvfp4 view, as asked for"):
            _view(weights, grouped, "nvfp4", cached=cached)
        after = [t.view(torch.uint8) for d in cached.directions for t in (*d.data, *(d.scales or ()))]
        assert cached.format == cached_as and all(map(torch.equal, after, before))


def test_nvfp4_weights_turned_bf16_are_refused_by_a_refresh() -> None:
    """A view of TE's NVFP4 experts refreshed with BF16 weights in their place: refused."""
    with _release():
        params = [fake_nvfp4((R, C), param=True, seed=e) for e in range(E)]
        cached = mok.split_weight_view(params, rows=R, columns=C, format="nvfp4")
        with pytest.raises(mok.ExpertWeightError, match="expert 0: expected an NVFP4 parameter"):
            mok.split_weight_view(_bf16(False), rows=R, columns=C, format="nvfp4", cached=cached)


# ------------------------------------------------------------------------------ backend=

Outcome = tuple[str, str]  # ("ok", "") or (exception class, message)


def _outcome(call: Callable[[], object]) -> Outcome:
    try:
        call()
    except Exception as exc:  # the property compares whatever is raised
        return type(exc).__name__, str(exc)
    return "ok", ""


BACKENDS = st.one_of(
    st.sampled_from(["auto", "cuda", "torch", "CUDA", "Torch", "bogus", "", None]),
    st.text(max_size=6),
    st.integers(-2, 2),
)


@settings(max_examples=40, deadline=None)
@given(backend=BACKENDS, grouped=st.booleans(), refresh=st.booleans())
@example(backend="cuda", grouped=False, refresh=False)
@example(backend="cuda", grouped=True, refresh=True)
@example(backend="bogus", grouped=False, refresh=True)
def test_a_bf16_view_checks_its_backend_as_any_view_does(backend: object, grouped: bool, refresh: bool) -> None:
    """The same ``backend=`` given to a view (or refresh) of BF16 weights and of TE's MXFP8
    weights on the same device: the same outcome, the same refusal (an unknown name; "cuda" for
    tensors off CUDA)."""
    with _release():
        bf16 = _bf16(grouped)
        mxfp8 = (
            fake_grouped((E, R, C), format="mxfp8", param=True)
            if grouped
            else [fake_mxfp8((R, C), param=True, seed=e) for e in range(E)]
        )
        cached = {"bf16": _view(bf16, grouped, "bf16"), "mxfp8": _view(mxfp8, grouped, "mxfp8")} if refresh else {}
        got = _outcome(lambda: _view(bf16, grouped, "bf16", backend=backend, cached=cached.get("bf16")))
        want = _outcome(lambda: _view(mxfp8, grouped, "mxfp8", backend=backend, cached=cached.get("mxfp8")))
        assert got == want


# ------------------------------------------------------------------------------ cached= of every kind

VE, VR, VC = 3, 128, 256  # the views of the cached= cases


def _views() -> tuple[list[Any], Any, Any, Any, Any]:
    experts = [fake_mxfp8((VR, VC), param=True, seed=e) for e in range(VE)]
    group = fake_grouped((VE, VR, VC), format="mxfp8", param=True)
    split = mok.split_weight_view(experts, rows=VR, columns=VC, format="mxfp8")
    grouped = mok.grouped_weight_view(group, num_experts=VE, rows=VR, columns=VC, format="mxfp8")
    return experts, group, split, grouped, W._native_split_weight_view(experts, rows=VR, columns=VC, use_mxfp8=True)


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
                mok.split_weight_view(experts, rows=VR, columns=VC, format="mxfp8", cached=bad)  # type: ignore[arg-type]
            else:
                mok.grouped_weight_view(group, num_experts=VE, rows=VR, columns=VC, format="mxfp8", cached=bad)  # type: ignore[arg-type]
        after = [*(split.rowwise.scales or ()), *(grouped.rowwise.scales or ())]
        assert all(map(torch.equal, before, after))


def test_weights_that_became_bf16_are_quantised_by_a_new_view_and_refused_by_a_refresh() -> None:
    """TE's MXFP8 weights replaced by BF16 Parameters: MXFP8 asked of them means mok quantises them
    (a new view does); the cached view holds TE's memory, so its refresh says what changed."""
    with installed_release("2.20.2"):
        experts, _, split, _, _ = _views()
        bf16 = [torch.nn.Parameter(torch.randn(VR, VC).to(torch.bfloat16)) for _ in range(VE)]
        assert mok.split_weight_view(bf16, rows=VR, columns=VC, format="mxfp8").quantized_on_the_fly
        with pytest.raises(mok.RefreshError, match="now BF16 weights.*holds views of TE's quantized storage.*new view"):
            mok.split_weight_view(bf16, rows=VR, columns=VC, format="mxfp8", cached=split)
        on_the_fly = mok.split_weight_view(bf16, rows=VR, columns=VC, format="mxfp8")
        assert not mok.split_weight_view(experts, rows=VR, columns=VC, format="mxfp8").quantized_on_the_fly
        with pytest.raises(mok.RefreshError, match="now TE's quantized storage.*holds mok's own buffers.*new view"):
            mok.split_weight_view(experts, rows=VR, columns=VC, format="mxfp8", cached=on_the_fly)
