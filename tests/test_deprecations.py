"""Names mok renamed keep working for a release, each use warning with its successor's name, and
giving what the successor gives; the successors themselves never warn."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mok
from te_compat.testing import fake_grouped, fake_mxfp8, installed_release

E, R, C = 2, 128, 64


def _no_warning(call: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return call()


@pytest.mark.parametrize("flag", [True, False])
def test_use_mxfp8_of_the_view_functions_warns_naming_format(flag: bool) -> None:
    fmt = "mxfp8" if flag else "bf16"
    with installed_release("2.20.2"):
        experts = [fake_mxfp8((R, C), param=True, seed=e) for e in range(E)] if flag else [torch.zeros(R, C).bfloat16()]
        group = fake_grouped((E, R, C), format=fmt, param=True)
        for view, old_kw, new_kw in (
            (mok.split_weight_view, {"params": experts}, {"params": experts}),
            (mok.grouped_weight_view, {"weight": group, "num_experts": E}, {"weight": group, "num_experts": E}),
        ):
            with pytest.warns(
                DeprecationWarning, match=r"use_mxfp8= .* deprecated.*use format='mxfp8' or format='bf16'"
            ):
                old = view(**old_kw, rows=R, columns=C, use_mxfp8=flag, backend="torch")
            new = _no_warning(lambda: view(**new_kw, rows=R, columns=C, format=fmt, backend="torch"))  # noqa: B023
            assert old.format is new.format is mok.Format(fmt)
            assert [t.data_ptr() for t in old.rowwise.data] == [t.data_ptr() for t in new.rowwise.data]


def test_use_mxfp8_and_format_must_still_agree() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="use_mxfp8=True contradicts format='bf16'"):
        mok.split_weight_view([torch.zeros(R, C).bfloat16()], rows=R, columns=C, use_mxfp8=True, format="bf16")
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="use_mxfp8: expected a bool; found 'yes'"):
        mok.split_weight_view([torch.zeros(R, C).bfloat16()], rows=R, columns=C, use_mxfp8="yes")  # type: ignore[arg-type]


def test_a_views_use_mxfp8_warns_naming_format() -> None:
    view = mok.split_weight_view([torch.zeros(R, C).bfloat16()], rows=R, columns=C, format="mxfp8", backend="torch")
    with pytest.warns(DeprecationWarning, match=r"ExpertWeights.use_mxfp8 .*use ExpertWeights.format"):
        assert view.use_mxfp8 is True
    bf16 = mok.split_weight_view([torch.zeros(R, C).bfloat16()], rows=R, columns=C, format="bf16")
    with pytest.warns(DeprecationWarning):
        assert bf16.use_mxfp8 is False


@pytest.mark.parametrize(
    ("function", "args"),
    [
        (mok.layout_shape, {"rows": 200, "experts": 3}),
        (mok.padded_shape, {"rows": 200}),
        (mok.layout_offset, {"r": 130, "c": 5, "rows": 200}),
    ],
)
def test_cols_keyword_warns_naming_columns(function: Callable[..., Any], args: dict[str, int]) -> None:
    name = function.__name__
    with pytest.warns(DeprecationWarning, match=rf"{name}\(cols=\) is deprecated.*use {name}\(columns=\)"):
        old = function(**args, cols=7)
    assert old == _no_warning(lambda: function(**args, columns=7))
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match=rf"{name}: expected columns= alone"):
        function(**args, cols=7, columns=7)


def test_the_deprecation_points_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        mok.layout_shape(128, cols=4)  # type: ignore[call-arg]
        mok.split_weight_view([torch.zeros(R, C).bfloat16()], rows=R, columns=C, use_mxfp8=False)
    assert {w.filename for w in caught} == {__file__}
