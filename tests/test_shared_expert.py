from __future__ import annotations

import types
import warnings

import pytest

import mok
from mok import shared_expert


@pytest.fixture(autouse=True)
def _fresh_warning_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_expert, "_warned", False)


def test_fp8_params_become_bf16_copy() -> None:
    cfg = types.SimpleNamespace(fp8="hybrid", fp8_param=True, hidden_size=7)
    with pytest.warns(UserWarning, match="shared experts run in BF16"):
        shared = mok.prepare_shared_expert_config(cfg)
    assert shared is not cfg and shared.fp8 is None and shared.fp8_param is False and shared.hidden_size == 7
    assert cfg.fp8 == "hybrid" and cfg.fp8_param is True  # the original is untouched


def test_warns_once_per_process() -> None:
    cfg = types.SimpleNamespace(fp8="e4m3", fp8_param=True)
    with pytest.warns(UserWarning):
        mok.prepare_shared_expert_config(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mok.prepare_shared_expert_config(cfg)


def test_only_rank_zero_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_expert, "_is_rank_zero", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mok.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True)).fp8 is None


def test_without_fp8_params_is_returned_as_is() -> None:
    cfg = types.SimpleNamespace(fp8="e4m3", fp8_param=False)
    assert mok.prepare_shared_expert_config(cfg) is cfg


def test_config_without_the_attributes() -> None:
    with pytest.raises(TypeError, match="SimpleNamespace lacks fp8_param"):
        mok.prepare_shared_expert_config(types.SimpleNamespace(fp8=None))
