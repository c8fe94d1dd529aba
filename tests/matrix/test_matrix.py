"""The release table against the committed per-release records, and the check's teeth."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from matrix.check import check_record, check_release, lineage
from matrix.extract import IndexUnreachable, dumps, extract_wheel, load_record, record_path, records_main
from matrix.releases import matrix_release, matrix_releases, release_versions
from te_compat import table
from te_compat.gemm_layout import QUANTIZER_ROWS, check_quantizer_rows
from te_compat.table import TensorKind


def test_matrix_lists_every_pypi_release() -> None:
    versions = release_versions()
    assert len(versions) == 30
    assert versions[0] == "1.9.0" and versions[-1] == table.CHECKED_THROUGH
    assert "2.0.0" not in versions and "0.0.0" not in versions
    for r in matrix_releases():
        assert r.live_cuda == (13 if Version(r.version) >= Version("2.9") else 12)
        assert record_path(r.source_from).exists()


@pytest.mark.parametrize("version", release_versions())
def test_table_agrees_with_release(version: str) -> None:
    assert check_release(version) == []


def _with_row(kind: TensorKind, first: str, **changes: object) -> tuple[table.StorageRow, ...]:
    rows = list(table.ROWS)
    i = next(i for i, r in enumerate(rows) if r.kind is kind and r.since == first)
    rows[i] = dataclasses.replace(rows[i], **changes)  # type: ignore[arg-type]
    return tuple(rows)


def test_a_wrong_attribute_name_fails() -> None:
    row = next(r for r in table.ROWS if r.kind is TensorKind.MXFP8 and r.since == "2.12")
    bad = _with_row(TensorKind.MXFP8, "2.12", storage={**row.storage, "rowwise_data": "_rowwise_payload"})
    problems = check_record(load_record("2.14.1"), bad)
    assert any("probes 'rowwise_data' as attribute '_rowwise_payload'" in p for p in problems)
    assert any("assigns '_rowwise_data', unknown to the mxfp8 row" in p for p in problems)


def test_a_wrong_release_range_fails() -> None:
    bad = _with_row(TensorKind.GROUPED, "2.14", since="2.15")
    problems = check_record(load_record("2.14.1"), bad)
    assert any("no grouped row of the table covers 2.14.1" in p for p in problems)


def test_a_wrong_module_path_fails() -> None:
    bad = _with_row(
        TensorKind.FLOAT8,
        "2.9",
        classes=(
            "transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor",
            "transformer_engine.pytorch.tensor._internal.float8_tensor_base.Float8TensorBase",
        ),
    )
    problems = check_record(load_record("2.9.0"), bad)
    assert any(
        "looks for class transformer_engine.pytorch.tensor._internal.float8_tensor_base."
        "Float8TensorBase, which this release does not define" in p
        for p in problems
    )


def test_flag_claimed_too_early_fails() -> None:
    row = next(r for r in table.ROWS if r.kind is TensorKind.MXFP8 and r.since == "2.9")
    bad = _with_row(TensorKind.MXFP8, "2.9", storage={**row.storage, "scales_swizzled": "_with_gemm_swizzled_scales"})
    assert any("_with_gemm_swizzled_scales" in p for p in check_record(load_record("2.11.0"), bad))


def test_a_future_rename_is_caught() -> None:
    record = json.loads(json.dumps(load_record("2.20.2")))
    cls = record["classes"]["transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage.MXFP8TensorStorage"]
    cls["assigns"] = [a.replace("_rowwise_scale_inv", "_rowwise_scales") for a in cls["assigns"]]
    problems = check_record({**record, "release": "2.21.0"})
    assert any("'_rowwise_scale_inv'" in p and "never assign" in p for p in problems)
    # the problem names the class that assigns the new name, its module, and the row
    assert any(
        "class MXFP8TensorStorage of module transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage "
        "assigns '_rowwise_scales', unknown to the mxfp8 row 2.12" in p
        for p in problems
    )


def test_matrix_and_te_compat_share_one_check() -> None:
    # te-compat verify and the matrix must not drift apart: one implementation, in te_compat
    from matrix import check, extract
    from te_compat import source_facts

    assert check.lineage is source_facts.lineage
    assert extract.extract_sources is source_facts.extract_sources
    assert not any(name.startswith("_class_facts") or name == "_assigned_attrs" for name in vars(extract))


def test_extractor_reads_a_wheel(tmp_path: Path) -> None:
    # a tiny wheel with one storage class: bases resolved through imports, constructor attrs
    wheel = tmp_path / "transformer_engine-9.9.9-py3-none-any.whl"
    src = (
        "from ..quantized_tensor import QuantizedTensorStorage\n"
        "class MXFP8TensorStorage(QuantizedTensorStorage):\n"
        "    def __new__(cls, *a, rowwise_data=None, **k):\n"
        "        instance = super().__new__(cls)\n"
        "        instance._rowwise_data = rowwise_data\n"
        "        return instance\n"
        "    @property\n"
        "    def device(self):\n"
        "        return None\n"
        "    def get_data_tensors(self):\n"
        "        self._scratch = 1\n"
    )
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("transformer_engine/pytorch/tensor/storage/mxfp8_tensor_storage.py", src)
    rec = extract_wheel(wheel)
    facts = rec["classes"]["transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage.MXFP8TensorStorage"]
    assert rec["release"] == "9.9.9"
    assert facts["bases"] == ["transformer_engine.pytorch.tensor.quantized_tensor.QuantizedTensorStorage"]
    assert facts["assigns"] == ["_rowwise_data"]  # not _scratch: only constructors count
    assert facts["properties"] == ["device"] and facts["methods"] == ["__new__", "get_data_tensors"]
    assert dumps(rec).endswith("\n")


def test_every_row_cites_its_release() -> None:
    for row in table.ROWS:
        assert row.introduced_by.startswith(f"TE {row.since}"), row


def test_support_table_and_readme_line_are_generated_from_the_matrix() -> None:
    from matrix.support import PAGE, README, page_with_table, readme_with_summary, rows

    found = rows()
    page, readme = PAGE.read_text(), README.read_text()
    assert page == page_with_table(page, found), "docs/support.md's table is stale: python -m matrix.support --write"
    assert readme == readme_with_summary(readme, found), "README's support line is stale: same command"


def _fake_rows() -> list[Any]:
    """Four releases: one CUDA-12, one CUDA-13 not run, one current and passing, one stale with
    failures and two disagreements with the table."""
    from matrix.provenance import Freshness
    from matrix.releases import MatrixRelease
    from matrix.support import Row

    def record(failed: int, commit: str) -> dict[str, Any]:
        counts = {"passed": 9, "failed": failed, "skipped": 1, "skipped_tests": {}}
        return {**counts, "gpu": "NVIDIA H200", "date": "2026-12-04", "commit": commit}

    return [
        Row(MatrixRelease("2.8.0", 12, "2.8.0"), [], None, None),
        Row(MatrixRelease("2.18.0", 13, "2.18.0"), [], None, None),
        Row(MatrixRelease("2.19.0", 13, "2.19.0"), [], record(0, "a" * 40), Freshness("current", "same")),
        Row(MatrixRelease("2.20.2", 13, "2.20.2"), ["x", "y"], record(2, "b" * 40), Freshness("stale", "mok")),
    ]


def test_the_readme_line_counts_the_table() -> None:
    from matrix.support import support_summary, support_table

    found = _fake_rows()
    line, table_text = support_summary(found), support_table(found)
    assert "\n" not in line and line.endswith("[docs/support.md](docs/support.md).")
    assert line.startswith("4 TE releases, 2.8.0 to 2.20.2, checked from source: 1 disagree with te_compat's table.")
    assert "2 of the 3 CUDA-13 releases ran live on NVIDIA H200, 1 with failures;" in line
    assert "1 of those records are current with mok/ and te_compat/ here, 1 stale." in line
    assert table_text.count("\n| 2.") == 4 and "| 2.20.2 | 2 disagreement(s) |" in table_text


def test_checked_through_is_the_newest_matrix_release() -> None:
    assert table.CHECKED_THROUGH == release_versions()[-1]


def test_release_check_covers_the_quantizer_rows() -> None:
    """A rename of the quantizer attribute te_compat.request_gemm_layout_scales sets fails the release check."""
    import copy

    from matrix.check import check_release
    from matrix.extract import load_record

    record = copy.deepcopy(load_record("2.20.2"))
    for cls in record["classes"].values():
        cls["assigns"] = ["optimise_for_gemm" if a == "optimize_for_gemm" else a for a in cls["assigns"]]
    problems = check_release("2.20.2", record)
    assert any("'optimize_for_gemm'" in p and "MXFP8Quantizer" in p for p in problems), problems
    assert check_release("2.20.2") == []


def test_a_row_that_leaves_out_a_class_the_release_defines_fails() -> None:
    # 2.20.2 defines MXFP8TensorStorage (the 2.9+ rows name it); a 2.12+ row without it must fail
    # on that alone: its probes are still found through MXFP8Tensor's bases
    storage_class = "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage.MXFP8TensorStorage"
    assert storage_class in load_record("2.20.2")["classes"]
    row = next(r for r in table.ROWS if r.kind is TensorKind.MXFP8 and r.since == "2.12")
    kept = tuple(c for c in row.classes if c != storage_class)
    assert len(kept) == len(row.classes) - 1
    problems = check_record(load_record("2.20.2"), _with_row(TensorKind.MXFP8, "2.12", classes=kept))
    assert problems == [f"TE 2.20.2: defines {storage_class} (mxfp8), which mxfp8 row 2.12 + does not name"]


# ---- lineage: the order of a class and its TE bases ----


def _python_mro(classes: dict[str, dict[str, list[str]]], path: str) -> list[str]:
    """What Python itself makes of the hierarchy: empty classes with the record's bases (those
    the record defines), and their ``__mro__``."""
    made: dict[str, type] = {}

    def make(p: str) -> type:
        if p not in made:
            bases = tuple(make(b) for b in classes[p]["bases"] if b in classes)
            made[p] = type(p.rsplit(".", 1)[1], bases, {"path": p})
        return made[p]

    return [k.path for k in make(path).__mro__[:-1]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", release_versions())
def test_lineage_is_pythons_method_resolution_order(version: str) -> None:
    classes = load_record(matrix_release(version).source_from)["classes"]
    for path in classes:
        assert lineage(classes, path) == _python_mro(classes, path), path


def test_lineage_orders_a_diamond_as_python_does() -> None:
    # D(B, C), B(A), C(A): attribute lookup on a D tries B, then C, then A; a depth-first walk
    # would put A before C, a walk from the last base would put C before B
    def cls(name: str, *bases: str) -> dict[str, list[str]]:
        return {"bases": [f"m.{b}" for b in bases], "assigns": [], "properties": []}

    classes = {"m.A": cls("A"), "m.B": cls("B", "A"), "m.C": cls("C", "A"), "m.D": cls("D", "B", "C")}

    class A: ...

    class B(A): ...

    class C(A): ...

    class D(B, C): ...

    expected = [f"m.{k.__name__}" for k in D.__mro__[:-1]]
    assert expected == ["m.D", "m.B", "m.C", "m.A"]
    assert lineage(classes, "m.D") == expected == _python_mro(classes, "m.D")  # type: ignore[arg-type]
    # a class naming itself (or a cycle) ends the walk instead of looping
    assert lineage({"m.X": cls("X", "X")}, "m.X") == ["m.X"]
    assert lineage(classes, "m.Missing") == []


def test_the_quantizer_check_walks_the_same_lineage() -> None:
    # the quantizer rows' check names the bases it looked in, in the same (Python's) order
    row = next(r for r in QUANTIZER_ROWS if r.quantizer.endswith(".MXFP8Quantizer"))
    quantizer = row.quantizer
    module = quantizer.rsplit(".", 1)[0]
    classes = {
        quantizer: {"bases": [f"{module}.B", f"{module}.C"], "assigns": [], "properties": []},
        f"{module}.B": {"bases": [f"{module}.A"], "assigns": [], "properties": []},
        f"{module}.C": {"bases": [f"{module}.A"], "assigns": [], "properties": []},
        f"{module}.A": {"bases": [], "assigns": [], "properties": []},
    }
    (problem,) = check_quantizer_rows("2.20.2", classes, (row,))
    assert f"its TE bases {module}.B, {module}.C, {module}.A" in problem


def test_a_record_command_writes_then_checks_and_shows_the_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """matrix.extract's and matrix.native's command line: write, a check that agrees (0), a
    committed record that differs (1, with the diff), an unreachable index (2)."""
    found = {"2.20.2": '{"a": 1}\n'}

    def fresh(release: str, cache: Path) -> str:
        if release not in found:
            raise IndexUnreachable(f"no index for {release}")
        return found[release]

    def run(*argv: str) -> int:
        return records_main(
            list(argv), prog="t", description="t", fresh=fresh, path_of=lambda r: tmp_path / f"{r}.json", source="src"
        )

    assert run("2.20.2") == 0 and (tmp_path / "2.20.2.json").read_text() == '{"a": 1}\n'
    assert run("--check", "2.20.2") == 0 and "2.20.2.json matches the src" in capsys.readouterr().out
    found["2.20.2"] = '{"a": 2}\n'
    assert run("--check", "2.20.2") == 1
    out = capsys.readouterr().out
    assert "2.20.2.json differs from the src" in out and '-{"a": 1}' in out and '+{"a": 2}' in out
    assert (tmp_path / "2.20.2.json").read_text() == '{"a": 1}\n'  # a check writes nothing
    assert run("2.9.0") == 2 and "no index for 2.9.0" in capsys.readouterr().err
