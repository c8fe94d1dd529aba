"""TE's behaviour per release (te_compat/table.py's behaviour rows): the answers te_compat gives
from them, the matrix's checks of them against each release's source (each catches a row that is
wrong), and the extractors those checks read (functions in the wheels, C++ facts in the torch
extension's source archives)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

import te_compat
from matrix import native
from matrix.check import check_release
from matrix.extract import WHEEL_CACHE, load_record
from matrix.releases import matrix_release, release_versions
from te_compat import StorageValueError, TEVersionError, behaviour, table
from te_compat.behaviour import (
    check_post_all_gather_rows,
    check_quantizer_flag_rows,
    check_reciprocal_rows,
    mxfp8_post_all_gather,
    reciprocal_rule_source,
)
from te_compat.cli import main
from te_compat.gemm_layout import QUANTIZER_ROWS, check_native_quantizer_rows
from te_compat.source_facts import extract_functions
from te_compat.testing import fake_mxfp8, installed_release
from tests import ROOT


def _record(release: str) -> dict[str, Any]:
    return load_record(matrix_release(release).source_from)


def _native(release: str) -> dict[str, Any]:
    found = native.load_native(release)
    assert found is not None, f"no matrix/native/{release}.json"
    return found


# --- mxfp8_reciprocal_rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "rule"),
    [
        ("2.1.0", "shift"),
        ("2.5.0", "shift"),
        ("2.6.0", "shift"),
        ("2.9.0", "shift"),
        ("2.12.0", "shift"),
        ("2.13.0", "exact"),
        ("2.20.2", "exact"),
        ("2.21.0.dev0+5fdd7bb", "exact"),
        (Version("2.12"), "shift"),
    ],
)
def test_the_rule_of_a_release(release: Any, rule: str) -> None:
    assert te_compat.mxfp8_reciprocal_rule(release) == rule


def test_the_rule_of_each_release_is_what_its_source_says() -> None:
    # the forms matrix/native.py read from each release's exp2f_rcp, independently of the rows
    rule_of_form = {"exp2f": "shift", "shift": "shift", "exact": "exact"}
    for release in release_versions():
        form = _native(release)["exp2f_rcp"]["form"]
        if form == "absent":
            with pytest.raises(ValueError, match=rf"TE {re.escape(str(Version(release).base_version))}"):
                te_compat.mxfp8_reciprocal_rule(release)
        else:
            assert te_compat.mxfp8_reciprocal_rule(release) == rule_of_form[form], release


def test_bad_releases_are_refused_naming_what_was_found() -> None:
    with pytest.raises(ValueError, match=r"TE 1.13.0 has no MXFP8, so no MXFP8 reciprocal rule; expected TE >= 2.0"):
        te_compat.mxfp8_reciprocal_rule("1.13.0")
    with pytest.raises(TEVersionError, match="cannot read Transformer Engine version 'nope'"):
        te_compat.mxfp8_reciprocal_rule("nope")
    with pytest.raises(TypeError, match=r"release: expected a TE version string .*found 3 \(int\)"):
        te_compat.mxfp8_reciprocal_rule(3)


@pytest.mark.parametrize(
    ("installed", "rule", "because"),
    [
        (None, "exact", "no Transformer Engine: the newest rule, exp2f_rcp of TE 2.13 and later"),
        ("2.12.0", "shift", "TE 2.12.0: exp2f_rcp of transformer_engine/common/util/ptx.cuh, TE 2.6 .. 2.13"),
        ("2.3.0", "shift", "TE 2.3.0: exp2f_rcp of transformer_engine/common/utils.cuh, TE 2.0 .. 2.6"),
        ("1.13.0", "exact", "TE 1.13.0 has no MXFP8: the newest rule"),
        ("not-a-version", "exact", "TE version 'not-a-version' unreadable: the newest rule"),
        ("2.25.0", "exact", "TE 2.25.0 is newer than the table (checked through"),
    ],
)
def test_the_installed_rule(installed: str | None, rule: str, because: str) -> None:
    with installed_release(installed):
        assert te_compat.mxfp8_reciprocal_rule() == rule
        assert because in reciprocal_rule_source()[1]
        caps = te_compat.capabilities(import_te=False, verify=False)
        assert caps.mxfp8_reciprocal_rule == rule and because in caps.mxfp8_reciprocal_rule_source


def test_mok_maps_te_compat_s_answer() -> None:
    from mok.quantize_reference import ReciprocalRule, installed_rule

    with installed_release("2.12.0"):
        assert installed_rule() is ReciprocalRule.SHIFT
    with installed_release("2.13.0"):
        assert installed_rule() is ReciprocalRule.EXACT
    with installed_release(None):
        assert installed_rule() is ReciprocalRule.EXACT


# --- post_all_gather_processing and 2-D MXFP8 in the report --------------------------------------


@pytest.mark.parametrize(
    ("release", "available", "reason"),
    [
        ("2.9.0", False, "TE 2.9.0 has no transformer_engine.pytorch.tensor.utils.post_all_gather_processing"),
        ("2.10.0", False, "TE 2.10.0: raises ValueError for MXFP8 weights"),
        ("2.11.0", True, "TE 2.11.0: a no-op for MXFP8 weights"),
        ("2.20.2", True, "TE 2.20.2: a no-op for MXFP8 weights"),
    ],
)
def test_post_all_gather_processing_is_a_capability(release: str, available: bool, reason: str) -> None:
    with installed_release(release):
        caps = te_compat.capabilities(import_te=False, verify=False)
    assert caps.post_all_gather_processing is available and caps.post_all_gather_processing_reason.startswith(reason)
    assert ("post_all_gather_processing" in caps.missing("post_all_gather_processing")) is not available


def test_the_report_names_the_rule_the_all_gather_and_2d(capsys: pytest.CaptureFixture[str]) -> None:
    with installed_release("2.19.0"):
        assert main(["report", "--no-import"]) == 0
    out = capsys.readouterr().out
    assert "mxfp8 reciprocal rule " in out and "exact" in out and "mxfp8 2d quantization" in out
    assert "post all gather processing" in out


def test_releases_prints_the_behaviour_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases"]) == 0
    out = capsys.readouterr().out
    for row in (*table.RECIPROCAL_ROWS, *table.POST_ALL_GATHER_ROWS, *table.QUANTIZER_FLAG_ROWS):
        assert row.introduced_by in out


# --- 2-D MXFP8: the snapshot reads the flag from the quantizer ----------------------------------


def test_quantized_2d_is_read_from_the_quantizer() -> None:
    with installed_release("2.19.0"):
        two_d = fake_mxfp8((64, 96), quantized_2d=True)
        assert te_compat.mxfp8_storage(two_d).quantized_2d is True
        assert te_compat.mxfp8_storage(fake_mxfp8((64, 96))).quantized_2d is False
        plain = fake_mxfp8((64, 96))
        plain._quantizer = None
        assert te_compat.mxfp8_storage(plain).quantized_2d is None
        odd = fake_mxfp8((64, 96))
        odd._quantizer.with_2d_quantization = "False"
        with pytest.raises(
            StorageValueError, match=r"with_2d_quantization .* expected to be a bool .*found 'False' \(str\)"
        ):
            te_compat.mxfp8_storage(odd)
    with installed_release("2.18.0"):
        assert te_compat.mxfp8_storage(fake_mxfp8((64, 96))).quantized_2d is None
        with pytest.raises(ValueError, match=r"quantized_2d: TE 2.18.0's MXFP8Quantizer has no 2-D .* TE 2.19 \+"):
            fake_mxfp8((64, 96), quantized_2d=True)


def test_a_group_reads_the_flag_of_its_own_mxfp8_quantizer_only() -> None:
    from te_compat.testing import fake_grouped

    with installed_release("2.20.2"):
        group = fake_grouped((2, 64, 64), format="mxfp8")
        assert te_compat.grouped_storage(group).quantized_2d is False
        group.quantizer.with_2d_quantization = True
        assert te_compat.grouped_storage(group).quantized_2d is True
        nvfp4 = fake_grouped((2, 64, 64), format="nvfp4")
        nvfp4.quantizer.with_2d_quantization = True  # NVFP4's 16x16 flag, not MXFP8's
        assert te_compat.grouped_storage(nvfp4).quantized_2d is None
        assert te_compat.grouped_storage(fake_grouped((2, 64, 64), format="bf16")).quantized_2d is None


def test_a_2d_fake_holds_one_scale_per_block_as_te_writes_them() -> None:
    with installed_release("2.20.2"):
        s = te_compat.mxfp8_storage(fake_mxfp8((64, 96), quantized_2d=True))
    row, col = s.rowwise_scale_inv[:64, :3], s.columnwise_scale_inv[:2, :96]
    blocks = row[::32]
    assert row.equal(blocks.repeat_interleave(32, dim=0)) and col.equal(blocks.repeat_interleave(32, dim=1))
    assert s.rowwise_data is not None and s.rowwise_data.equal(s.columnwise_data)


# --- the matrix's checks of the rows --------------------------------------------------------------


@pytest.mark.parametrize("release", release_versions())
def test_every_release_agrees_with_the_behaviour_rows(release: str) -> None:
    record = _record(release)
    assert check_post_all_gather_rows(release, record["classes"], record["functions"]) == []
    assert check_quantizer_flag_rows(release, record["classes"]) == []
    assert check_reciprocal_rows(release, _native(release)) == []
    assert check_native_quantizer_rows(release, _native(release)) == []


def test_the_all_gather_facts_per_release() -> None:
    # B.3 (b) of the research notes, read again here from each record
    found = {r: mxfp8_post_all_gather(_record(r)["classes"], _record(r)["functions"]) for r in release_versions()}
    assert {r for r, v in found.items() if v == "raises"} == {"2.10.0"}
    assert {r for r, v in found.items() if v == "no-op"} == {r for r in found if Version(r) >= Version("2.11")}
    lines = {r: _record(r)["functions"][table.POST_ALL_GATHER_FUNCTION]["line"] for r in ("2.10.0", "2.11.0", "2.20.2")}
    assert lines == {"2.10.0": 470, "2.11.0": 602, "2.20.2": 1404}


@pytest.mark.parametrize(
    ("rows", "release", "expected"),
    [
        (
            (
                table.ReciprocalRow("2.0", "2.6", "shift", "exp2f", "transformer_engine/common/utils.cuh", "x"),
                table.ReciprocalRow("2.6", "2.12", "shift", "shift", table._PTX, "x"),
                table.ReciprocalRow("2.12", None, "exact", "exact", table._PTX, "PR 2647 claimed one release early"),
            ),
            "2.12.0",
            "TE 2.12.0: reciprocal row 2.12 + says exp2f_rcp is 'exact'; the source: shift (transformer_engine/common/"
            "util/ptx.cuh:330)",
        ),
        (
            (table.ReciprocalRow("2.0", None, "shift", "exp2f", table._PTX, "one row for every release"),),
            "2.3.0",
            "TE 2.3.0: reciprocal row 2.0 + cites transformer_engine/common/util/ptx.cuh; exp2f_rcp is in "
            "transformer_engine/common/utils.cuh:967",
        ),
        (
            (),
            "2.1.0",
            "TE 2.1.0: defines exp2f_rcp (exp2f, transformer_engine/common/utils.cuh:967), but no reciprocal",
        ),
    ],
)
def test_a_wrong_reciprocal_row_fails(
    rows: tuple[Any, ...], release: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table, "RECIPROCAL_ROWS", rows)
    problems = check_reciprocal_rows(release, _native(release))
    assert problems and problems[0].startswith(expected), problems


def test_a_wrong_all_gather_row_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    early = (
        table.PostAllGatherRow("1.0", "2.10", "absent", "x"),
        table.PostAllGatherRow("2.10", None, "no-op", "the 2.11 branch claimed for 2.10"),
    )
    monkeypatch.setattr(table, "POST_ALL_GATHER_ROWS", early)
    (problem,) = check_release("2.10.0")
    assert problem == (
        "TE 2.10.0: post_all_gather_processing row 2.10 + says 'no-op' for MXFP8 weights; the release's source "
        "(pytorch/tensor/utils.py:470): 'raises'"
    )


@pytest.mark.parametrize(
    ("since", "release", "expected"), [("2.18", "2.18.0", "never assigns"), ("2.20", "2.19.0", "does not cover")]
)
def test_a_wrong_quantizer_flag_row_fails(
    since: str, release: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (row,) = table.QUANTIZER_FLAG_ROWS
    monkeypatch.setattr(table, "QUANTIZER_FLAG_ROWS", (dataclasses.replace(row, since=since),))
    problems = check_quantizer_flag_rows(release, _record(release)["classes"])
    assert problems and expected in problems[0] and "with_2d_quantization" in problems[0], problems


def test_the_nvfp4_gemm_layout_row_starts_where_its_source_does() -> None:
    """2.17.0's tex.quantize swizzles NVFP4 scales after quantising (PR 3076); 2.16.1's does not.
    The row once said 2.18: the check names the release it leaves out."""
    (row,) = [r for r in QUANTIZER_ROWS if r.quantizer.endswith(".NVFP4Quantizer")]
    assert row.since == "2.17"
    assert _native("2.17.0")["quantize_post_swizzle"] == {
        "file": "transformer_engine/pytorch/csrc/extensions/cast.cpp",
        "line": 79,
        "present": True,
    }
    assert _native("2.16.1")["quantize_post_swizzle"]["present"] is False
    late = tuple(dataclasses.replace(r, since="2.18") if r is row else r for r in QUANTIZER_ROWS)
    for release in ("2.17.0", "2.17.1"):
        (problem,) = check_native_quantizer_rows(release, _native(release), late)
        assert problem.startswith(f"TE {release}: quantize_post_swizzle holds (transformer_engine/pytorch/csrc/")
        assert "no NVFP4Quantizer GEMM-layout row covers it (the first starts at 2.18)" in problem
    early = tuple(dataclasses.replace(r, since="2.16") if r is row else r for r in QUANTIZER_ROWS)
    (problem,) = check_native_quantizer_rows("2.16.1", _native("2.16.1"), early)
    assert "NVFP4Quantizer GEMM-layout row 2.16+ covers it, but quantize_post_swizzle does not hold" in problem


def test_a_release_without_a_native_record_fails() -> None:
    problems = check_release("2.20.2", native={})  # a record that found none of the facts
    assert any("says exp2f_rcp is 'exact'; the source: absent" in p for p in problems), problems
    assert any("GEMM-layout row 2.17+ covers it, but quantize_post_swizzle does not hold" in p for p in problems)
    assert check_release("2.20.2", native=None) == []  # the committed one
    from matrix.check import check_native

    assert check_native("2.20.2", None) == ["TE 2.20.2: no native record (python -m matrix.native 2.20.2)"]


# --- the extractors ------------------------------------------------------------------------------

UTILS = '''
from ..quantized_tensor import QuantizedTensor
from .mxfp8_tensor import MXFP8Tensor
from . import float8_tensor as f8

def post_all_gather_processing(model_weights):
    """Doc."""
    for w in model_weights:
        if isinstance(w, f8.Float8Tensor):
            w._create_transpose()
        elif isinstance(w, (MXFP8Tensor, Local)):
            # nothing to do
            pass
        elif isinstance(w, QuantizedTensor):
            raise ValueError("no")

class Local:
    pass
'''


def test_function_facts_follow_the_isinstance_chain() -> None:
    facts = extract_functions([("transformer_engine/pytorch/tensor/utils.py", UTILS)])
    got = facts[table.POST_ALL_GATHER_FUNCTION]
    assert got["line"] == 6
    assert got["dispatch"] == [
        (["transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor"], "acts"),
        (
            [
                "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor",
                "transformer_engine.pytorch.tensor.utils.Local",
            ],
            "no-op",
        ),
        (["transformer_engine.pytorch.quantized_tensor.QuantizedTensor"], "raises ValueError"),
    ]
    assert extract_functions([("transformer_engine/pytorch/tensor/other.py", UTILS)]) == {}


PTX = {
    "shift": "return (biased_exp == 0) ? 1\n : __int_as_float((254 - biased_exp) << FP32_MANTISSA_BITS); // 127 - x",
    "exact": "// NaN\n if (biased_exp == 255) return __int_as_float(0x7fffffff);\n"
    "if (biased_exp == 254) return __int_as_float(0x00400000);\n"
    "return __int_as_float((254 - biased_exp) << FP32_MANTISSA_BITS);",
    "unknown": "return 0.5f;",
}


def _archive(tmp_path: Path, body: str, post_swizzle: bool) -> Path:
    ptx = f"namespace x {{\n__device__ __forceinline__ float exp2f_rcp(e8m0_t biased_exp) {{\n  {body}\n}}\n}}\n"
    cast = "py::object quantize(const at::Tensor &tensor, py::handle quantizer) {\n  quantizer_cpp->quantize(a, b);\n"
    if post_swizzle:
        cast += "  if (quantizer_cpp->optimize_for_gemm && !output_cpp.get_with_gemm_swizzled_scales()) {\n"
        cast += "    inplace_swizzle_scale_for_gemm(output_py);\n  }\n"
    cast += "  return output_py;\n}\n"
    path = tmp_path / "transformer_engine_torch-9.9.9.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in (("common_headers/common/util/ptx.cuh", ptx), ("csrc/extensions/cast.cpp", cast)):
            data = text.encode()
            info = tarfile.TarInfo(f"transformer_engine_torch-9.9.9/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("form", sorted(PTX))
def test_the_native_extractor_classifies_exp2f_rcp(form: str, tmp_path: Path) -> None:
    facts = native.extract_archive(_archive(tmp_path, PTX[form], post_swizzle=form == "exact"))
    assert facts["exp2f_rcp"]["form"] == form
    assert facts["exp2f_rcp"]["file"] == "transformer_engine/common/util/ptx.cuh" and facts["exp2f_rcp"]["line"] == 2
    assert facts["quantize_post_swizzle"]["present"] is (form == "exact")
    assert facts["mxfp8_create_swizzled"] == {"present": False}
    if form == "unknown":
        assert facts["exp2f_rcp"]["body"] == "return0.5f;"


def test_committed_native_records_match_the_cached_archives() -> None:
    """Each release whose archive is in matrix/.cache/ (nox -s release downloads them): its
    committed record is what the extractor reads from it now."""
    checked = 0
    for release in release_versions():
        name = f"transformer_engine_torch-{native.ARCHIVE_OF.get(release, release)}.tar.gz"
        if not (WHEEL_CACHE / name).exists():
            continue
        fresh = native.dumps({"release": release, **native.extract_archive(WHEEL_CACHE / name)})
        assert fresh == native.record_path(release).read_text(), release
        checked += 1
    if not checked:
        pytest.skip("no TE source archive is downloaded here (python -m matrix.native --all downloads them)")


def test_every_matrix_release_has_a_native_record() -> None:
    assert {p.stem for p in native.NATIVE_DIR.glob("*.json")} == set(release_versions())
    for release in release_versions():
        assert json.loads(native.record_path(release).read_text())["release"] == release


# ------------------------------------------------------------------------------ FSDP2 over TE's Parameters


def _records() -> dict[str, dict[str, Any]]:
    root = ROOT / "matrix" / "records"
    return {p.stem: json.loads(p.read_text()) for p in root.glob("*.json")}


def test_fsdp2_hooks_start_where_the_wheels_first_have_them() -> None:
    """FSDP2_HOOKS_SINCE is the first release whose Float8Tensor and MXFP8Tensor define
    ``fsdp_pre_all_gather``, read from every release's recorded classes."""
    for name, record in _records().items():
        classes = record.get("classes", {})
        for cls in ("float8_tensor.Float8Tensor", "mxfp8_tensor.MXFP8Tensor"):
            found = [v for k, v in classes.items() if k.endswith(cls)]
            hooks = bool(found) and "fsdp_pre_all_gather" in found[0].get("methods", [])
            assert hooks == (Version(name) >= Version(behaviour.FSDP2_HOOKS_SINCE)), (name, cls)


def _recorded_capabilities() -> set[tuple[int, int]]:
    root = ROOT / "matrix" / "live"
    return {tuple(json.loads(p.read_text())["compute_capability"]) for p in root.glob("*.json")}  # type: ignore[misc]


@pytest.mark.parametrize("cc", sorted(_recorded_capabilities() | {(10, 0), (10, 3), (12, 0)}))
@pytest.mark.parametrize("release", ["2.9.0", "2.10.0", "2.20.2"])
def test_fsdp2_over_mxfp8_needs_the_hooks_and_a_device_that_dequantizes(cc: tuple[int, int], release: str) -> None:
    """The GPUs the live matrix ran on (H200: 9.0) cannot shard TE's MXFP8 Parameters; 10.x and
    later can, from TE 2.10; Float8 shards on any of them from TE 2.10."""
    ok, why = behaviour.fsdp2_support("mxfp8", Version(release), cc)
    assert ok == (Version(release) >= Version("2.10") and cc >= (10, 0)), why
    if Version(release) < Version("2.10"):
        assert "needs TE >= 2.10" in why
    elif cc < (10, 0):
        assert f"found {cc[0]}.{cc[1]}" in why and "dequantizes MXFP8 only on compute capability >= 10.0" in why
    float8, _ = behaviour.fsdp2_support("float8", Version(release), cc)
    assert float8 == (Version(release) >= Version("2.10"))
    assert behaviour.fsdp2_support("mxfp8", Version(release), None) == (
        False,
        "needs a CUDA device; found none visible to torch"
        if Version(release) >= Version("2.10")
        else "needs TE >= 2.10 (its FSDP2 all-gather hooks); found " + release,
    )


def test_fsdp2_support_names_the_kinds_it_knows() -> None:
    with pytest.raises(ValueError, match="kind: expected one of 'float8', 'mxfp8'; found 'nvfp4'"):
        behaviour.fsdp2_support("nvfp4", Version("2.20.2"), (10, 0))
