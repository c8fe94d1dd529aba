"""Every public entry of mok and te_compat, given tensors that cannot be printed.

TE's MXFP8Tensor dequantizes itself to print (and raises where the GPU cannot), so an error
message must never be built from the repr or str of a tensor, or of a list, tuple or dict
holding tensors. Here each argument of each entry in turn gets such a tensor, alone or in a
container, the others valid; the entry must raise the project's error (a mok or te_compat error,
or the TypeError/ValueError its own checks raise; mok.weights' RuntimeError) naming what it got
(the container's type and length or keys, an item's index, shape and dtype), and no repr, str or
format of the tensor may run, even one an error handler would swallow.
"""

from __future__ import annotations

import inspect
import os
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

import mok
import mok.weights
import te_compat
from mok import MokError
from mok.checks import describe  # the helper every message of mok and te_compat uses
from te_compat import TECompatError
from te_compat.testing import fake_grouped, fake_hybrid, fake_mxfp8, installed_release

RELEASE = "2.20.2"
PRINTED: list[str] = []  # every repr, str or format of an Unprintable, in order


class Unprintable(torch.Tensor):
    """A tensor whose repr, str and format record the call and raise, as TE's would dequantize."""

    def __repr__(self, *args: object, **kwargs: object) -> str:
        PRINTED.append("repr")
        raise AssertionError("the tensor's repr was called")

    def __str__(self) -> str:
        PRINTED.append("str")
        raise AssertionError("the tensor's str was called")

    def __format__(self, spec: str) -> str:
        PRINTED.append("format")
        raise AssertionError("the tensor's format was called")


def unprintable() -> torch.Tensor:
    return torch.zeros(4, 8).as_subclass(Unprintable)


# name -> (the bad value, what a message describing it must say)
BAD: dict[str, tuple[Callable[[], object], tuple[str, ...]]] = {
    "tensor": (unprintable, ("Unprintable", "(4, 8)")),
    "list": (lambda: [unprintable(), unprintable()], ("list of 2 items", "Unprintable of shape (4, 8)")),
    "tuple": (lambda: (unprintable(),), ("tuple of 1 item", "[0] a Unprintable of shape (4, 8), dtype torch.float32")),
    "dict": (lambda: {"w0": unprintable(), "w1": unprintable()}, ("dict of 2 entries", "keys 'w0', 'w1'")),
}


def test_describe_names_type_length_keys_index_shape_and_dtype() -> None:
    """The shared helper every message uses, on its own: no call prints a tensor."""
    PRINTED.clear()
    assert describe(unprintable()) == "a Unprintable of shape (4, 8), dtype torch.float32"
    listed = describe([unprintable(), None, 3, unprintable()])
    assert listed.startswith("a list of 4 items ([0] a Unprintable of shape (4, 8), dtype torch.float32; ")
    assert "[1] None (NoneType); [2] 3 (int); and 1 more)" in listed
    keyed = describe({"w0": unprintable(), 7: [unprintable()]})
    assert keyed == (
        "a dict of 2 entries, keys 'w0', 7 (['w0'] a Unprintable of shape (4, 8), dtype torch.float32; "
        "[7] a list of 1 item)"
    )
    assert describe((64, 128)) == "(64, 128) (tuple)" and describe([[1, 2], [3]]) == "[[1, 2], [3]] (list)"
    assert describe("x" * 100).endswith("xxx... (str)") and describe(object()) == "an object of class object"
    assert describe(torch.bfloat16) == "torch.bfloat16 (dtype)" and describe(()) == "() (tuple)"
    assert PRINTED == []


def test_a_view_repr_prints_no_tensor_in_a_field_of_mixed_items() -> None:
    """A view's repr names per-expert tensors by dtype and shape; a field mixing tensors and None
    is described as messages describe it, never printed."""
    with installed_release(RELEASE):
        experts = [fake_mxfp8((128, 64), param=True, seed=e) for e in range(2)]
        view = mok.split_weight_view(experts, rows=128, columns=64, format="mxfp8")
    odd = replace(view, rowwise=replace(view.rowwise, amax=(unprintable(), None)))
    PRINTED.clear()
    text = repr(odd)
    amax = "amax=a tuple of 2 items ([0] a Unprintable of shape (4, 8), dtype torch.float32; [1] None (NoneType))"
    assert amax in text
    assert "data=2 x torch.float8_e4m3fn[128, 64] cpu" in text and PRINTED == []


# ------------------------------------------------------------------------------ the entries


@pytest.fixture
def te() -> Iterator[None]:
    with installed_release(RELEASE):
        yield


def _valid() -> dict[str, dict[str, Any]]:
    """entry -> valid values of its required parameters (and of those a bad value needs beside it)."""
    experts = [fake_mxfp8((128, 64), param=True, seed=e) for e in range(2)]
    grouped = fake_grouped((2, 128, 64), param=True)
    split = mok.split_weight_view(experts, rows=128, columns=64, format="mxfp8", backend="torch")
    group_view = mok.grouped_weight_view(grouped, num_experts=2, rows=128, columns=64, format="mxfp8")
    scales = torch.zeros(1, 128, 2, dtype=torch.uint8)
    layout = mok.swizzle_mxfp8_scales(scales, backend="torch")

    def without_format(args: dict[str, Any]) -> dict[str, Any]:  # mok.weights takes Megatron's use_mxfp8
        return {k: v for k, v in args.items() if k != "format"}

    split_args = {"params": experts, "rows": 128, "columns": 64, "format": "mxfp8"}
    grouped_args = {"weight": grouped, "num_experts": 2, "rows": 128, "columns": 64, "format": "mxfp8"}
    return {
        "mok.LayerRefresh": {"entries": [(experts, split)]},
        "mok.refresh_layer": {"entries": [(experts, split), (grouped, group_view)]},
        "mok.split_weight_view": split_args,
        "mok.grouped_weight_view": grouped_args,
        "mok.kernel_backend": {},
        "mok.layout_offset": {"r": 0, "c": 0, "rows": 128, "columns": 4},
        "mok.layout_shape": {"rows": 128, "columns": 4},
        "mok.padded_shape": {"rows": 128, "columns": 4},
        "mok.logical_scales": {"source": split},
        "mok.prepare_shared_expert_config": {"config": _Config()},
        "mok.quantize_mxfp8": {"weights": torch.zeros(1, 32, 32, dtype=torch.bfloat16)},
        "mok.storage_view": {"storage": torch.zeros(8), "shape": (2, 4), "dtype": torch.float32, "name": "s"},
        "mok.swizzle_mxfp8_scales": {"scales": scales},
        "mok.swizzle_mxfp8_scales_many": {"scales": [scales[0], scales[0]]},
        "mok.unswizzle_mxfp8_scales": {"layout": layout, "rows": 128, "columns": 64},
        "mok.weights._native_split_weight_view": {**without_format(split_args), "use_mxfp8": True},
        "mok.weights._native_single_grouped_weight_view": {**without_format(grouped_args), "use_mxfp8": True},
        "mok.weights._parameter_storage_attr": {"param": experts[0], "name": "rowwise_data"},
        "mok.weights._storage_view": {"storage": torch.zeros(8), "shape": (2, 4), "dtype": torch.float32, "name": "s"},
        "mok.weights._single_grouped_mxfp8_scale_view": {
            "param": grouped,
            "member_attr": "_rowwise_scale_inv",
            "shape": (2, 128, 2),
            "name": "fc1",
        },
        "mok.weights._swizzle_mxfp8_scale": {"logical_scale": scales, "rows": 128, "columns": 64},
        "mok.weights.prepare_shared_expert_config": {"config": _Config()},
        "te_compat.mxfp8_storage": {"param": experts[0]},
        "te_compat.float8_storage": {"param": experts[0]},
        "te_compat.nvfp4_storage": {"param": experts[0]},
        "te_compat.blockwise_storage": {"param": experts[0]},
        "te_compat.hybrid_storage": {"param": fake_hybrid((128, 64))},
        "te_compat.grouped_storage": {"param": grouped},
        "te_compat.storage_attr": {"param": experts[0], "name": "rowwise_data"},
        "te_compat.storage_field": {"obj": experts[0], "name": "rowwise_data"},
        "te_compat.storage_values": {"obj": experts[0]},
        "te_compat.storage_reader": {"obj": experts[0]},
        "te_compat.storage_fingerprint": {"obj": experts[0]},
        "te_compat.tensor_kind": {"obj": experts[0]},
        "te_compat.known_storage_name": {"attr": "_rowwise_data"},
        "te_compat.logical_storage_name": {"attr": "_rowwise_data"},
        "te_compat.scale_matrix": {"buffer": torch.zeros(128, 4, dtype=torch.uint8), "rows": 128, "columns": 64},
        "te_compat.mxfp8_quantize_into": {  # both directions given: a bad buffer is refused as one
            "src": torch.zeros(32, 32, dtype=torch.bfloat16),
            "rowwise_data": torch.zeros(32, 32, dtype=torch.uint8),
            "rowwise_scale_inv": torch.zeros(128, 4, dtype=torch.uint8),
            "columnwise_data": torch.zeros(32, 32, dtype=torch.uint8),
            "columnwise_scale_inv": torch.zeros(4, 128, dtype=torch.uint8),
        },
        "te_compat.mxfp8_reciprocal_rule": {},
        "te_compat.parse_te_version": {"raw": "2.20.2"},
        "te_compat.te_min_version": {"version": "2.14"},
        "te_compat.require_te": {},
        "te_compat.request_gemm_layout_scales": {"params_or_module": experts},
        "te_compat.verify_installed": {},
        "te_compat.capabilities": {"verify": False},
        "te_compat.selftest": {},
        "te_compat.on_refresh": {"clear": lambda: None},
        "te_compat.testing.fake_float8": {"shape": (128, 64)},
        "te_compat.testing.fake_mxfp8": {"shape": (128, 64)},
        "te_compat.testing.fake_nvfp4": {"shape": (128, 64)},
        "te_compat.testing.fake_blockwise": {"shape": (128, 128)},
        "te_compat.testing.fake_identity": {"shape": (128, 64)},
        "te_compat.testing.fake_hybrid": {"shape": (128, 64)},
        "te_compat.testing.fake_grouped": {"shape": (2, 128, 64)},
        "te_compat.testing.fake_tensor": {"kind": "mxfp8", "shape": (128, 64)},
        "te_compat.testing.fake_class": {"kind": "mxfp8"},
        "te_compat.testing.installed_release": {"release": RELEASE},
    }


class _Config:
    fp8_param = False


# The options every te_compat.testing factory takes (FakeOptions), each given a bad value too.
FAKE_OPTIONS = ("seed", "dtype", "device", "release", "param", "storage")
# Parameters that take any object, as the functions they stand for do: a value is no error there.
ANY_OBJECT = {
    ("mok.weights._parameter_storage_attr", "param"),  # Megatron's lookup: None where nothing is stored
    ("te_compat.request_gemm_layout_scales", "params_or_module"),  # a plain tensor, or several, is reported
    ("te_compat.storage_values", "obj"),  # a plain tensor has no storage of TE's: nothing to read
    ("te_compat.storage_reader", "obj"),
    ("te_compat.storage_fingerprint", "obj"),
    ("te_compat.tensor_kind", "obj"),  # a plain tensor is of kind plain
}
# Megatron's function reads config.fp8_param as it is: Python's AttributeError where there is none.
PYTHONS_OWN = {("mok.weights.prepare_shared_expert_config", "config")}
# Views to refresh that mok.door checks (its `cached=` kind checks): here only that nothing is
# printed and the call is refused.
DOOR_CACHED = {("mok.split_weight_view", "cached"), ("mok.grouped_weight_view", "cached")}


def _entry(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    owner = {"mok": mok, "mok.weights": mok.weights, "te_compat": te_compat}.get(module)
    if owner is None:
        import te_compat.testing as owner
    found: Callable[..., Any] = getattr(owner, name)
    return found


def _cases() -> list[tuple[str, str]]:
    """(entry, parameter) for every parameter of every entry _valid names, options included."""
    with installed_release(RELEASE):
        entries = _valid()
    cases = []
    for path in entries:
        parameters = inspect.signature(_entry(path)).parameters.values()
        for p in parameters:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                cases += [(path, option) for option in FAKE_OPTIONS]
            elif p.kind is not inspect.Parameter.VAR_POSITIONAL:
                cases.append((path, p.name))
    return cases


def _describes(message: str, bad: str, value: Any) -> bool:
    """Whether ``message`` says what ``value`` is: a tensor by shape or class; a container by
    type and length (or keys), by the shape and index of the item refused, or by its count."""
    if bad == "tensor":
        return any(s in message for s in ("(4, 8)", "[4, 8]", "Unprintable"))
    whole = all(s in message for s in BAD[bad][1][:1]) and any(s in message for s in BAD[bad][1][1:])
    item = ("(4, 8)" in message or "[4, 8]" in message) and re.search(r"\b0\b|'w0'", message) is not None
    return whole or item or f"found {len(value)}" in message


def _project_frame(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame of its traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1].filename if frames else ""


def _in_project(filename: str) -> bool:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return any(filename.startswith(os.path.join(here, package) + os.sep) for package in ("mok", "te_compat"))


ERRORS = (MokError, TECompatError, TypeError, ValueError)
UPSTREAM_ERRORS = (*ERRORS, RuntimeError)  # mok.weights refuses as Megatron's module does


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize(("path", "parameter"), _cases())
def test_an_unprintable_argument_is_described_never_printed(path: str, parameter: str, bad: str, te: None) -> None:
    entry, valid = _entry(path), _valid()[path]
    value = BAD[bad][0]()
    PRINTED.clear()
    if (path, parameter) in DOOR_CACHED:
        with pytest.raises(Exception):  # noqa: B017 (which exception is mok.door's to say)
            entry(**{**valid, parameter: value})
        assert PRINTED == [], f"{path}({parameter}=<{bad}>): printed the tensor ({PRINTED})"
        return
    if (path, parameter) in PYTHONS_OWN:
        with pytest.raises(AttributeError, match=f"'{type(value).__name__}' object has no attribute"):
            entry(**{**valid, parameter: value})
        assert PRINTED == [], f"{path}({parameter}=<{bad}>): printed the tensor ({PRINTED})"
        return
    try:
        result = entry(**{**valid, parameter: value})
        if path.endswith("installed_release"):
            with result:
                pass
    except UPSTREAM_ERRORS as exc:
        if not path.startswith("mok.weights."):  # a RuntimeError is Megatron's refusal, no one else's
            assert isinstance(exc, ERRORS), f"{path}({parameter}=<{bad}>): {type(exc).__name__}: {exc}"
        assert PRINTED == [], f"{path}({parameter}=<{bad}>): printed the tensor ({PRINTED})"
        message = str(exc)
        cause = exc.__cause__ if path.startswith("mok.weights.") and exc.__cause__ is not None else exc
        assert _in_project(_project_frame(cause)), (
            f"{path}({parameter}=<{bad}>): {type(exc).__name__} from {_project_frame(cause)}, not mok or "
            f"te_compat: {message}"
        )
        assert _describes(message, bad, value), (
            f"{path}({parameter}=<{bad}>): the message does not describe it: {message}"
        )
        return
    assert PRINTED == [], f"{path}({parameter}=<{bad}>): printed the tensor ({PRINTED})"
    assert (path, parameter) in ANY_OBJECT, f"{path}({parameter}=<{bad}>) was accepted: {type(result).__name__}"
