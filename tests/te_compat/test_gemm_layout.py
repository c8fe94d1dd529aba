"""request_gemm_layout_scales and its quantizer table, on stand-ins built from each release's record.

Which attribute asks for GEMM-layout scales, and from which release, is read here off the records
(the attribute TE's Quantizer lineage gains between two releases), not off te_compat's table.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from packaging.version import Version

from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from te_compat import TENotFoundError, TensorKind, UnsupportedTensorError
from te_compat.gemm_layout import (
    MODULE_RESET_ROWS,
    QUANTIZER_ROWS,
    GemmLayoutReport,
    GemmLayoutStatus,
    check_quantizer_rows,
    request_gemm_layout_scales,
)
from tests import te_objects as T
from tests.conftest import ROOT
from tests.standins import assigned_names, make_standin

Installer = Callable[..., None]
ENABLED, ALREADY_ON = GemmLayoutStatus.ENABLED, GemmLayoutStatus.ALREADY_ON
UNSUPPORTED, NOT_QUANTIZED = GemmLayoutStatus.UNSUPPORTED, GemmLayoutStatus.NOT_QUANTIZED
BLACKWELL = (10, 0)


def _classes(release: str) -> dict[str, Any]:
    return load_record(matrix_release(release).source_from)["classes"]


def _quantizer_attrs(release: str, name: str) -> set[str]:
    return assigned_names(release, T.class_path(release, name))


def _attribute_history(name: str) -> tuple[str, str, str]:
    """(attribute, release before, first release): the one attribute TE's quantizer lineage of
    ``name`` gained that asks for GEMM-layout scales, found by walking the records."""
    versions = [v for v in release_versions() if T.releases_with(name).count(v)]
    for before, after in itertools.pairwise(versions):
        gained = _quantizer_attrs(after, name) - _quantizer_attrs(before, name)
        if any("gemm" in a for a in gained):
            (attr,) = [a for a in gained if "gemm" in a]
            return attr, before, after
    raise AssertionError(f"no release adds a GEMM attribute to {name}")


GEMM_ATTR, LAST_WITHOUT, FIRST_WITH = _attribute_history("MXFP8Quantizer")
RELEASES_WITH = [v for v in release_versions() if Version(v) >= Version(FIRST_WITH)]
GROUPED_RELEASES = [v for v in RELEASES_WITH if v in T.releases_with("GroupedTensor")]


def _quantizer(release: str, name: str = "MXFP8Quantizer", **attrs: Any) -> Any:
    return make_standin(release, T.class_path(release, name), attrs)


def _mxfp8(release: str, m: int = 64, k: int = 128, *, on: bool = False, swizzled: bool = False) -> tuple[Any, Any]:
    flags = {GEMM_ATTR: on} if Version(release) >= Version(FIRST_WITH) else {}
    q = _quantizer(release, **flags)
    extra = {"_with_gemm_swizzled_scales": swizzled} if Version(release) >= T.SWIZZLE_FLAG_SINCE else {}
    return T.mxfp8_tensor(release, m, k, param=True, _quantizer=q, **extra), q


# --- the table against every release's record -------------------------------------------------


@pytest.mark.parametrize("release", release_versions())
def test_rows_agree_with_every_release_record(release: str) -> None:
    assert check_quantizer_rows(release, _classes(release)) == []


def test_the_mxfp8_row_starts_where_the_records_say_the_attribute_appeared() -> None:
    (row,) = [r for r in QUANTIZER_ROWS if r.quantizer.endswith(".MXFP8Quantizer")]
    assert (row.attribute, Version(row.since).release[:2]) == (GEMM_ATTR, Version(FIRST_WITH).release[:2])


def _rename(classes: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    changed = copy.deepcopy(classes)
    hits = 0
    for facts in changed.values():
        if old in facts["assigns"]:
            facts["assigns"] = [new if a == old else a for a in facts["assigns"]]
            hits += 1
    assert hits, f"the record assigns no {old!r}"
    return changed


@pytest.mark.parametrize("attr", [GEMM_ATTR])
def test_a_renamed_attribute_in_a_record_is_caught(attr: str) -> None:
    release = release_versions()[-1]
    problems = check_quantizer_rows(release, _rename(_classes(release), attr, attr + "_v2"))
    assert problems and all(repr(attr) in p and release in p for p in problems), problems


def test_a_quantizer_class_missing_from_a_record_is_caught() -> None:
    release = release_versions()[-1]
    classes = dict(_classes(release))
    path = T.class_path(release, "MXFP8Quantizer")
    del classes[path]
    assert any(path in p and "does not define" in p for p in check_quantizer_rows(release, classes))


# --- per-expert MXFP8 -------------------------------------------------------------------------


def test_the_release_before_says_unsupported_and_names_the_release_that_added_it(installed_te: Installer) -> None:
    installed_te(LAST_WITHOUT)
    param, q = _mxfp8(LAST_WITHOUT)
    before = dict(vars(q))
    report = request_gemm_layout_scales(param)
    (entry,) = report.entries
    assert (entry.status, entry.kind) == (UNSUPPORTED, TensorKind.MXFP8)
    first = ".".join(FIRST_WITH.split(".")[:2])
    assert f">= {first}" in entry.reason and LAST_WITHOUT in entry.reason
    assert vars(q) == before and not hasattr(q, GEMM_ATTR)


@pytest.mark.parametrize("release", RELEASES_WITH)
def test_flips_exactly_the_recorded_attribute(installed_te: Installer, release: str) -> None:
    installed_te(release)
    param, q = _mxfp8(release)
    before = dict(vars(q))
    report = request_gemm_layout_scales(param)
    assert report.enabled == ("<parameter>",) and report.release == Version(release)
    changed = {k for k in vars(q) if vars(q)[k] != before.get(k)}
    assert changed == {GEMM_ATTR} and getattr(q, GEMM_ATTR) is True
    assert param._with_gemm_swizzled_scales is False  # no bytes, no flag of the tensor touched
    assert "compact until TE re-quantises" in report.entries[0].reason


def test_an_already_on_quantizer_is_reported_and_left_alone(installed_te: Installer) -> None:
    release = RELEASES_WITH[-1]
    installed_te(release)
    param, q = _mxfp8(release, on=True, swizzled=True)
    before = dict(vars(q))
    report = request_gemm_layout_scales([param])
    assert report.already_on == ("[0]",) and report.enabled == () and vars(q) == before


def test_a_shape_mxfp8_cannot_quantize_is_named(installed_te: Installer) -> None:
    release = RELEASES_WITH[-1]
    installed_te(release)
    q = _quantizer(release, **{GEMM_ATTR: False})
    param = make_standin(release, T.class_path(release, "MXFP8Tensor"), {"_quantizer": q}, shape=(48, 64))
    (entry,) = request_gemm_layout_scales(param).entries
    assert entry.status is UNSUPPORTED and "(48, 64)" in entry.reason and "32" in entry.reason
    assert getattr(q, GEMM_ATTR) is False


class _Experts(torch.nn.Module):
    def __init__(self, release: str) -> None:
        super().__init__()
        self.weight0, self.q0 = _mxfp8(release)
        self.weight1, self.q1 = _mxfp8(release, on=True)
        self.weight2 = T.mxfp8_tensor(release, 64, 128, param=True)  # no quantizer
        self.bias = torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))


@pytest.mark.parametrize("release", [RELEASES_WITH[0], RELEASES_WITH[-1]])
def test_a_module_of_mixed_parameters(installed_te: Installer, release: str) -> None:
    installed_te(release)
    module = _Experts(release)
    report = request_gemm_layout_scales(module)
    got = {e.name: e.status for e in report.entries}
    assert got == {"weight0": ENABLED, "weight1": ALREADY_ON, "weight2": UNSUPPORTED, "bias": NOT_QUANTIZED}
    assert "no quantizer" in next(e.reason for e in report.entries if e.name == "weight2")
    assert getattr(module.q0, GEMM_ATTR) is True
    text = str(report)
    assert "1 enabled, 1 already on, 1 unsupported, 1 not quantized" in text
    assert all(name in text for name in got) and "already on" in text


def test_a_float8_parameter_is_a_kind_no_row_covers(installed_te: Installer) -> None:
    release = RELEASES_WITH[-1]
    installed_te(release)
    param = T.float8_tensor(release, 64, 128, param=True)
    param._quantizer = _quantizer(release, "Float8Quantizer")
    (entry,) = request_gemm_layout_scales(param).entries
    assert (entry.kind, entry.status) == (TensorKind.FLOAT8, UNSUPPORTED)
    assert "float8" in entry.reason and "Float8Quantizer" in entry.reason


# --- grouped ----------------------------------------------------------------------------------


def _grouped(release: str, experts: int = 3) -> tuple[Any, Any, list[Any]]:
    weight = T.grouped_tensor(release, experts, 64, 128, mxfp8=True)
    q = _quantizer(release, **{GEMM_ATTR: False})
    weight.quantizer = q
    members = [_quantizer(release, **{GEMM_ATTR: False}) for _ in range(experts)]
    for member, mq in zip(weight.quantized_tensors, members, strict=True):
        member._quantizer = mq
    return weight, q, members


@pytest.mark.parametrize("release", [GROUPED_RELEASES[0], GROUPED_RELEASES[-1]])
def test_a_grouped_weight_sets_the_grouped_and_member_quantizers(installed_te: Installer, release: str) -> None:
    installed_te(release)
    weight, q, members = _grouped(release)
    (entry,) = request_gemm_layout_scales(weight).entries
    assert (entry.kind, entry.status) == (TensorKind.GROUPED, ENABLED)
    assert all(getattr(x, GEMM_ATTR) is True for x in [q, *members])
    assert "4 quantizers" in entry.reason


class _FakeGroupedLinear(torch.nn.Module):
    """Only what TE 2.18+ GroupedLinear has that matters here (module/base.py, grouped_linear.py):
    the module's forward quantizers and its decision method, which it applies at every forward."""

    def __init__(self, weight: Any, quantizer: Any, primary: bool) -> None:
        super().__init__()
        self.weight = weight
        self.quantizers = {"scaling_fwd": [None, quantizer]}
        self.primary_weights_in_fp8 = primary

    def _enable_weight_preswizzle(self, quantizer: Any, weight: Any) -> bool:
        return not self.primary_weights_in_fp8


def test_a_quantizer_te_resets_at_every_forward_is_refused(installed_te: Installer) -> None:
    release = GROUPED_RELEASES[-1]
    installed_te(release)
    weight, q, _ = _grouped(release)
    report = request_gemm_layout_scales(_FakeGroupedLinear(weight, q, primary=True))
    (entry,) = report.entries
    assert entry.status is UNSUPPORTED and "resets" in entry.reason and "_FakeGroupedLinear" in entry.reason
    assert getattr(q, GEMM_ATTR) is False


def test_a_module_that_keeps_the_request_is_enabled(installed_te: Installer) -> None:
    release = GROUPED_RELEASES[-1]
    installed_te(release)
    weight, q, _ = _grouped(release)
    report = request_gemm_layout_scales(_FakeGroupedLinear(weight, q, primary=False))
    assert report.enabled == ("weight",) and getattr(q, GEMM_ATTR) is True


def test_the_same_module_before_the_reset_release_is_enabled(installed_te: Installer) -> None:
    (row,) = MODULE_RESET_ROWS
    release = [v for v in GROUPED_RELEASES if Version(v) < Version(row.since)][-1]
    installed_te(release)
    weight, q, _ = _grouped(release)
    report = request_gemm_layout_scales(_FakeGroupedLinear(weight, q, primary=True))
    assert report.enabled == ("weight",)


# --- NVFP4 ------------------------------------------------------------------------------------


def _nvfp4(release: str, shape: tuple[int, int] = (128, 256), **flags: Any) -> tuple[Any, Any]:
    q = _quantizer(release, "NVFP4Quantizer", **{GEMM_ATTR: False, **flags})
    attrs = {"_quantizer": q, "_with_gemm_swizzled_scales": False}
    return make_standin(release, T.class_path(release, "NVFP4Tensor"), attrs, shape=shape), q


@pytest.mark.parametrize(
    "flags",
    [{"with_rht": True}, {"with_rht": False, "with_2d_quantization": False}, {"with_2d_quantization": True}],
    ids=["rht", "1-D", "2-D"],
)
def test_nvfp4_on_blackwell_is_enabled_on_every_path(installed_te: Installer, flags: dict[str, bool]) -> None:
    # TE 2.17+ (PR 3076): tex.quantize swizzles NVFP4 scales after any path that wrote them compact
    release = release_versions()[-1]
    installed_te(release)
    param, q = _nvfp4(release, **flags)
    report = request_gemm_layout_scales(param, compute_capability=BLACKWELL)
    assert report.entries[0].kind is TensorKind.NVFP4 and report.enabled == ("<parameter>",)
    assert getattr(q, GEMM_ATTR) is True


@pytest.mark.parametrize(
    ("shape", "cc", "expected"),
    [((128, 256), (9, 0), "10.0"), ((120, 256), BLACKWELL, "(120, 256)"), ((128, 264), BLACKWELL, "(128, 264)")],
)
def test_nvfp4_cases_te_refuses(
    installed_te: Installer, shape: tuple[int, int], cc: tuple[int, int], expected: str
) -> None:
    release = release_versions()[-1]
    installed_te(release)
    param, q = _nvfp4(release, shape, with_rht=True)
    (entry,) = request_gemm_layout_scales(param, compute_capability=cc).entries
    assert entry.status is UNSUPPORTED and expected in entry.reason, entry.reason
    assert getattr(q, GEMM_ATTR) is False


def test_nvfp4_before_its_row_names_the_release(installed_te: Installer) -> None:
    (row,) = [r for r in QUANTIZER_ROWS if r.quantizer.endswith(".NVFP4Quantizer")]
    release = [v for v in RELEASES_WITH if Version(v) < Version(row.since)][-1]
    installed_te(release)
    param, q = _nvfp4(release, with_rht=True)
    (entry,) = request_gemm_layout_scales(param, compute_capability=BLACKWELL).entries
    assert getattr(q, GEMM_ATTR) is False
    assert entry.status is UNSUPPORTED and f">= {row.since}" in entry.reason and release in entry.reason


# --- inputs, the report, imports --------------------------------------------------------------


def test_plain_tensors_need_no_te(installed_te: Installer) -> None:
    installed_te(None)
    report = request_gemm_layout_scales([torch.zeros(2), torch.nn.Parameter(torch.ones(3))])
    assert report.not_quantized == ("[0]", "[1]") and report.release is None


def test_a_quantized_parameter_without_a_te_version_raises(installed_te: Installer) -> None:
    param, _ = _mxfp8(RELEASES_WITH[-1])
    installed_te(None)
    with pytest.raises(TENotFoundError, match=r"<parameter>"):
        request_gemm_layout_scales(param)


@pytest.mark.parametrize("bad", ["weight", 3, [torch.zeros(1), "x"]])
def test_bad_input_names_what_was_found(installed_te: Installer, bad: object) -> None:
    installed_te(RELEASES_WITH[-1])
    with pytest.raises(UnsupportedTensorError, match=r"expected .*found"):
        request_gemm_layout_scales(bad)


def test_the_report_is_frozen(installed_te: Installer) -> None:
    installed_te(RELEASES_WITH[-1])
    report = request_gemm_layout_scales(torch.zeros(1))
    assert isinstance(report, GemmLayoutReport)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.entries = ()  # type: ignore[misc]


def test_importing_the_module_imports_neither_torch_nor_te() -> None:
    code = (
        "import sys, te_compat.gemm_layout; "
        "print(sorted(m for m in ('torch', 'transformer_engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- arguments: compute capability, a mapping of names, elements, flags -----------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((9,), ValueError),
        ((9, 0, 0), ValueError),
        ((9, -1), ValueError),
        ((-1, 0), ValueError),
        ("9.0", TypeError),
        (("a", "b"), TypeError),
        (-1, TypeError),
        (9.0, TypeError),
        ((True, False), TypeError),
        ((9.0, 0), TypeError),
    ],
)
@pytest.mark.parametrize("te", [None, "2.20.2"])
def test_a_bad_compute_capability_is_named(value: object, error: type, te: str | None, installed_te: Installer) -> None:
    installed_te(te)
    with pytest.raises(error, match=r"compute_capability: expected a \(major, minor\) tuple of two ints >= 0") as info:
        request_gemm_layout_scales([torch.zeros(1)], compute_capability=value)  # type: ignore[arg-type]
    assert f"found {value!r} ({type(value).__name__})" in str(info.value)


@pytest.mark.parametrize("cc", [BLACKWELL, [10, 0]])
def test_a_good_compute_capability_is_used(cc: Any, installed_te: Installer) -> None:
    release = release_versions()[-1]
    installed_te(release)
    param, q = _nvfp4(release, with_rht=True)
    assert request_gemm_layout_scales(param, compute_capability=cc).enabled == ("<parameter>",)
    assert getattr(q, GEMM_ATTR) is True


def test_a_mapping_of_names_to_parameters_is_reported_by_name(installed_te: Installer) -> None:
    # like dict(model.named_parameters()): the names are the keys, the parameters the values
    release = RELEASES_WITH[-1]
    installed_te(release)
    weight, q = _mxfp8(release)
    report = request_gemm_layout_scales({"fc1.weight": weight, "fc1.bias": torch.zeros(4)})
    assert report.enabled == ("fc1.weight",) and report.not_quantized == ("fc1.bias",)
    assert getattr(q, GEMM_ATTR) is True
    assert request_gemm_layout_scales({}).entries == ()


@pytest.mark.parametrize(
    ("given", "where"),
    [([torch.zeros(1), "x"], "[1]"), ({"w": torch.zeros(1), "b": 3}, "b"), ((torch.zeros(1), None), "[1]")],
)
def test_an_element_that_is_no_tensor_is_named(given: object, where: str, installed_te: Installer) -> None:
    installed_te(RELEASES_WITH[-1])
    with pytest.raises(UnsupportedTensorError, match=rf"request_gemm_layout_scales: {re.escape(where)}: expected"):
        request_gemm_layout_scales(given)


@pytest.mark.parametrize("value", ["True", 1, "False"])
def test_a_quantizer_flag_that_is_not_a_bool_is_not_guessed(
    value: object, installed_te: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TE's quantizers store True or False; "False" must not read as True (bool("False")). No row
    # has a flag condition today (NVFP4 lost its own in 2.17): one row is given one for the test.
    from te_compat import gemm_layout

    row = next(r for r in QUANTIZER_ROWS if r.quantizer.endswith(".NVFP4Quantizer"))
    flagged = dataclasses.replace(row, conditions=(gemm_layout.LayoutCondition({"with_rht": True}, 16, 16, "a test"),))
    monkeypatch.setattr(gemm_layout, "QUANTIZER_ROWS", tuple(flagged if r is row else r for r in QUANTIZER_ROWS))
    release = release_versions()[-1]
    installed_te(release)
    param, q = _nvfp4(release, with_rht=value)
    (entry,) = request_gemm_layout_scales(param, compute_capability=BLACKWELL).entries
    assert entry.status is UNSUPPORTED and getattr(q, GEMM_ATTR) is False
    assert f"expected bool flags (TE stores True or False); found with_rht={value!r} ({type(value).__name__})" in (
        entry.reason
    )
