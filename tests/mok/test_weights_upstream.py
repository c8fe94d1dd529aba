"""Megatron's own tests of the module mok.weights stands in for, run against it, and the functions
of Megatron's ``fp8_utils`` it looks up at each call.

Megatron is not installed here: ``megatron.core.fp8_utils`` is stood in by a module holding only
the functions Megatron's tests patch, put in ``sys.modules`` for the test (as an installed
Megatron would be). Megatron's test allocates on CUDA; here the device is CUDA where there is one,
else the CPU (the contract is about addresses and storages, on any device).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import mok.seams
from mok import weights as mok_weights
from te_compat.testing import fake_grouped, fake_mxfp8, installed_release

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def fp8_utils(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for ``megatron.core.fp8_utils``, importable as ``from megatron.core import fp8_utils``."""

    def unpatched(*args: Any) -> Any:
        raise AssertionError("the test patches this function")

    megatron, core = types.ModuleType("megatron"), types.ModuleType("megatron.core")
    utils = types.ModuleType("megatron.core.fp8_utils")
    utils.get_grouped_quantized_members = unpatched  # type: ignore[attr-defined]
    megatron.core = core  # type: ignore[attr-defined]
    core.fp8_utils = utils  # type: ignore[attr-defined]
    for name, module in (("megatron", megatron), ("megatron.core", core), ("megatron.core.fp8_utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    yield utils


def test_mxfp8_scale_layout_and_single_grouped_storage_contract(
    monkeypatch: pytest.MonkeyPatch, fp8_utils: types.ModuleType
) -> None:
    # Megatron's test, tests/unit_tests/transformer/moe/test_mok_megakernel.py (NVIDIA/Megatron-LM
    # @0cd0361d, lines 27-64), as it stands but for the device
    from types import SimpleNamespace

    from megatron.core import fp8_utils  # type: ignore[import-not-found]

    rows = columns = 128
    logical = torch.arange(rows * (columns // 32), dtype=torch.int32).to(torch.uint8)
    logical = logical.reshape(1, rows, columns // 32)
    swizzled = mok_weights._swizzle_mxfp8_scale(logical, rows=rows, columns=columns)

    assert swizzled.shape == (1, 1, 32, 16)
    for lane, row_group, column_scale in ((0, 0, 0), (7, 2, 1), (31, 3, 3)):
        assert swizzled[0, 0, lane, row_group * 4 + column_scale] == logical[0, row_group * 32 + lane, column_scale]

    num_experts = 3
    member_shape = (4, 2)
    backing = torch.empty((num_experts, *member_shape), device=DEVICE, dtype=torch.uint8)
    members = [SimpleNamespace(_rowwise_scale_inv=backing[index]) for index in range(num_experts)]
    monkeypatch.setattr(fp8_utils, "get_grouped_quantized_members", lambda _: members)

    view = mok_weights._single_grouped_mxfp8_scale_view(
        object(), "_rowwise_scale_inv", (num_experts, *member_shape), name="test rowwise"
    )
    assert view.data_ptr() == backing.data_ptr()

    separate_members = [
        SimpleNamespace(_rowwise_scale_inv=torch.empty(member_shape, device=DEVICE, dtype=torch.uint8))
        for _ in range(2)
    ]
    monkeypatch.setattr(fp8_utils, "get_grouped_quantized_members", lambda _: separate_members)
    with pytest.raises(RuntimeError, match="not packed expert-major"):
        mok_weights._single_grouped_mxfp8_scale_view(
            object(), "_rowwise_scale_inv", (2, *member_shape), name="test rowwise"
        )


def test_fp8_utils_is_looked_up_at_each_call(monkeypatch: pytest.MonkeyPatch, fp8_utils: types.ModuleType) -> None:
    """Megatron's ``is_mxfp8tensor`` and ``is_grouped_mxfp8tensor`` decide, as they are at the call."""
    with installed_release("2.20.2"):
        experts = [fake_mxfp8((128, 128), param=True, seed=e) for e in range(2)]
        group = fake_grouped((2, 128, 128), format="mxfp8", param=True)
        monkeypatch.setattr(fp8_utils, "is_mxfp8tensor", lambda p: False, raising=False)
        monkeypatch.setattr(fp8_utils, "is_grouped_mxfp8tensor", lambda p: False, raising=False)
        monkeypatch.setattr(mok_weights, "_storage_view", mok_weights._storage_view.__wrapped__)  # composed, not mok's
        with pytest.raises(RuntimeError, match="expert 0: expected native TE MXFP8 storage"):
            mok_weights._native_split_weight_view(experts, rows=128, columns=128, use_mxfp8=True)
        with pytest.raises(RuntimeError, match="grouped weight: expected native TE grouped MXFP8 parameters"):
            mok_weights._native_single_grouped_weight_view(group, num_experts=2, rows=128, columns=128, use_mxfp8=True)
        monkeypatch.setattr(fp8_utils, "is_mxfp8tensor", lambda p: True)
        view = mok_weights._native_split_weight_view(experts, rows=128, columns=128, use_mxfp8=True)
        assert view.storage_table.tolist() == [p._rowwise_data.data_ptr() for p in experts]


def test_without_megatron_te_compat_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Megatron: te_compat's kinds stand in for its tests, and a grouped weight's members are
    its ``quantized_tensors``."""
    monkeypatch.delitem(sys.modules, "megatron.core.fp8_utils", raising=False)
    monkeypatch.setattr(mok.seams, "_no_megatron", True)
    with installed_release("2.20.2"):
        group = fake_grouped((2, 128, 128), format="mxfp8", param=True)
        view = mok_weights._single_grouped_mxfp8_scale_view(group, "_rowwise_scale_inv", (2, 128, 4), name="fc1")
        assert view.data_ptr() == group.scale_inv.data_ptr()


@pytest.mark.parametrize("grouped_answer", [True, False])
@pytest.mark.parametrize("per_tensor_answer", [True, False])
def test_each_view_is_decided_by_its_own_megatron_predicate(
    monkeypatch: pytest.MonkeyPatch, fp8_utils: types.ModuleType, per_tensor_answer: bool, grouped_answer: bool
) -> None:
    """Megatron's ``is_mxfp8tensor`` and ``is_grouped_mxfp8tensor`` answer differently about the
    same weights: a grouped view goes ahead exactly when the grouped predicate says MXFP8, a
    per-expert view exactly when the per-tensor one does."""
    monkeypatch.setattr(fp8_utils, "is_mxfp8tensor", lambda p: per_tensor_answer, raising=False)
    monkeypatch.setattr(fp8_utils, "is_grouped_mxfp8tensor", lambda p: grouped_answer, raising=False)
    monkeypatch.setattr(fp8_utils, "get_grouped_quantized_members", lambda p: p.quantized_tensors)
    monkeypatch.setattr(mok_weights, "_storage_view", mok_weights._storage_view.__wrapped__)  # composed, not mok's
    with installed_release("2.20.2"):
        group = fake_grouped((2, 128, 128), format="mxfp8", param=True)
        experts = [fake_mxfp8((128, 128), param=True, seed=e) for e in range(2)]
        if grouped_answer:
            view = mok_weights._native_single_grouped_weight_view(
                group, num_experts=2, rows=128, columns=128, use_mxfp8=True
            )
            assert view[0].data_ptr() == group.rowwise_data.data_ptr()
        else:
            with pytest.raises(RuntimeError, match="grouped weight: expected native TE grouped MXFP8 parameters"):
                mok_weights._native_single_grouped_weight_view(
                    group, num_experts=2, rows=128, columns=128, use_mxfp8=True
                )
        if per_tensor_answer:
            split = mok_weights._native_split_weight_view(experts, rows=128, columns=128, use_mxfp8=True)
            assert split.storage_table.tolist() == [p._rowwise_data.data_ptr() for p in experts]
        else:
            with pytest.raises(RuntimeError, match="expert 0: expected native TE MXFP8 storage"):
                mok_weights._native_split_weight_view(experts, rows=128, columns=128, use_mxfp8=True)
