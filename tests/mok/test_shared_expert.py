from __future__ import annotations

import copy
import dataclasses
import types
import warnings
from typing import Any, NamedTuple

import pytest

import mok
from mok import shared_expert


@pytest.fixture(autouse=True)
def _fresh_warning_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_expert, "_warned", False)


def test_fp8_params_become_bf16_copy() -> None:
    cfg = types.SimpleNamespace(fp8="hybrid", fp8_param=True, hidden_size=7)
    with pytest.warns(UserWarning, match="MOK currently computes shared experts in BF16"):
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
    with pytest.raises(TypeError, match=r"found an object of class types.SimpleNamespace, which lacks fp8_param"):
        mok.prepare_shared_expert_config(types.SimpleNamespace(fp8=None))


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    fp8: str | None
    fp8_param: bool
    hidden_size: int = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SlottedFrozenConfig:
    fp8: str | None
    fp8_param: bool
    num_layers: int = 4


class TupleConfig(NamedTuple):
    fp8: str | None
    fp8_param: bool
    hidden_size: int


@dataclasses.dataclass
class PostInitConfig:
    """Like Megatron's TransformerConfig: a mutable dataclass whose __post_init__ has effects."""

    fp8: str | None
    fp8_param: bool
    post_inits: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.post_inits.append(1)


@pytest.mark.parametrize(
    "cfg",
    [
        FrozenConfig("hybrid", True),
        SlottedFrozenConfig("e4m3", True, num_layers=7),
        TupleConfig("hybrid", True, 4096),
    ],
    ids=["frozen-dataclass", "frozen-slots-dataclass", "namedtuple"],
)
def test_immutable_configs_get_a_bf16_copy(cfg: object) -> None:
    before = copy.deepcopy(cfg)
    with pytest.warns(UserWarning, match="MOK currently computes shared experts in BF16"):
        shared: Any = mok.prepare_shared_expert_config(cfg)
    assert type(shared) is type(cfg) and shared is not cfg
    assert shared.fp8 is None and shared.fp8_param is False
    assert cfg == before  # the argument is unchanged
    # every other field is carried over
    if isinstance(cfg, TupleConfig):
        assert shared.hidden_size == 4096
    elif isinstance(cfg, SlottedFrozenConfig):
        assert shared.num_layers == 7
    else:
        assert shared.hidden_size == 1024


def test_mutable_dataclass_is_copied_not_rebuilt() -> None:
    cfg = PostInitConfig("hybrid", True)
    assert cfg.post_inits == [1]
    with pytest.warns(UserWarning):
        shared = mok.prepare_shared_expert_config(cfg)
    assert shared is not cfg and shared.fp8 is None and shared.fp8_param is False
    assert cfg.fp8 == "hybrid" and cfg.fp8_param is True
    assert shared.post_inits == [1]  # __post_init__ did not run a second time


@pytest.mark.parametrize("value", ["False", "True", 1, 0, None, 0.0])
def test_fp8_param_must_be_a_real_bool(value: object) -> None:
    cfg = types.SimpleNamespace(fp8="hybrid", fp8_param=value)
    with pytest.raises(TypeError, match=r"fp8_param: expected a bool \(True or False\); found"):
        mok.prepare_shared_expert_config(cfg)
    assert cfg.fp8 == "hybrid" and cfg.fp8_param == value
    assert not shared_expert.bf16_warning_emitted()


def test_string_false_is_not_taken_as_true() -> None:
    # the bug: "False" is truthy, so the config was turned to BF16 anyway
    with pytest.raises(TypeError, match="SimpleNamespace.fp8_param.*'False' \\(str\\)"):
        mok.prepare_shared_expert_config(types.SimpleNamespace(fp8="hybrid", fp8_param="False"))


def test_config_whose_copy_cannot_be_changed() -> None:
    class ReadOnly:
        fp8 = property(lambda self: "hybrid")
        fp8_param = property(lambda self: True)

    cfg = ReadOnly()
    with pytest.raises(TypeError, match="cannot set fp8 and fp8_param on a copy of ReadOnly"):
        mok.prepare_shared_expert_config(cfg)


def test_warning_state_is_readable() -> None:
    assert shared_expert.bf16_warning_emitted() is False
    mok.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=False))
    assert shared_expert.bf16_warning_emitted() is False  # nothing changed, nothing said
    with pytest.warns(UserWarning):
        mok.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))
    assert shared_expert.bf16_warning_emitted() is True


def test_no_warning_state_off_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_expert, "_is_rank_zero", lambda: False)
    mok.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))
    assert shared_expert.bf16_warning_emitted() is False
