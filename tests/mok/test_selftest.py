"""te_compat.selftest() and `te-compat selftest`: the framework (statuses, providers, the cache,
the CLI's exit codes and JSON), the same checks and report sections installed and run from a path
(on clean copies of the packages, the installed distribution hidden), and mok's checks on this
CPU: the ones that need neither TE nor a GPU pass, each catches what it is there to catch, the GPU
ones run their bodies here on the torch backend, and the TE ones run against tests/fake_te.py's
stand-in TE."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import mok
import mok.selftest as ms
import te_compat
from mok.quantize_reference import ReciprocalRule, quantize_mxfp8_reference
from te_compat import SkipCheck, selfcheck
from te_compat.cli import main
from te_compat.testing import installed_release
from tests.entry_points import (
    ROOT,
    copy_packages,
    declaration,
    declared,
    dist_info,
    hidden_install,
    isolated,
    only_installed,
)
from tests.fake_te import fake_te
from tests.spec_oracle import spec_layout as oracle_layout


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """Every test sees a self-test not yet run, and leaves none cached."""
    selfcheck._forget()
    yield
    selfcheck._forget()


def _entry(name: str, value: str, load: Callable[[], object]) -> SimpleNamespace:
    return SimpleNamespace(name=name, value=value, load=load)


def _only(monkeypatch: pytest.MonkeyPatch, checks: dict[str, Callable[[], object]]) -> None:
    """te_compat's own checks replaced by ``checks``, no provider contributing any."""
    monkeypatch.setattr(selfcheck, "builtin_checks", lambda: checks)
    only_installed(monkeypatch, {})


def _fails() -> None:
    raise AssertionError("expert 1 rowwise: 3 of 512 bytes differ")


def _skips() -> None:
    raise SkipCheck("needs a CUDA device: none here")


# --- the framework -----------------------------------------------------------------------------


def test_each_check_is_passed_skipped_or_failed_with_why() -> None:
    result = selfcheck.run_selftest(
        [("a", lambda: "a note"), ("b", _skips), ("c", _fails), ("d", lambda: None), ("e", lambda: 1 / 0)]
    )
    got = [(c.name, c.status, c.why) for c in result.checks]
    assert got == [
        ("a", "passed", "a note"),
        ("b", "skipped", "needs a CUDA device: none here"),
        ("c", "failed", "AssertionError: expert 1 rowwise: 3 of 512 bytes differ"),
        ("d", "passed", ""),
        ("e", "failed", "ZeroDivisionError: division by zero"),
    ]
    assert not result.ok and [c.name for c in result.failed] == ["c", "e"]
    assert result.failures().startswith("2 check(s) failed: c: AssertionError: expert 1")
    assert all(c.seconds >= 0 for c in result.checks) and result.seconds >= 0
    data = result.as_dict()
    assert set(data) == {"ok", "failures", "checks", "providers", "te_version", "device", "seconds"}
    assert data["ok"] is False and data["failures"] == result.failures() and data["providers"] is None
    assert set(data["checks"][0]) == {"name", "status", "why", "seconds"}


def test_skips_alone_are_not_ok_and_say_what_was_expected() -> None:
    result = selfcheck.run_selftest([("b", _skips)])
    assert not result.ok and not result.failed and result.verdict() == "NOT OK"
    assert result.failures() == (
        "no check passed: expected at least one check to pass; found all 1 skipped (b: needs a CUDA device: none here)"
    )
    assert result.as_dict()["ok"] is False and result.as_dict()["failures"] == result.failures()
    assert selfcheck.run_selftest([("a", lambda: None), ("b", _skips)]).ok


def test_no_checks_at_all_is_not_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        selfcheck.run_selftest([]).failures() == "no check passed: expected at least one check to pass; found no checks"
    )
    _only(monkeypatch, {})
    result = selfcheck.run_selftest()
    assert not result.ok and result.checks == () and result.verdict() == "NOT OK"
    assert result.failures().startswith("no check passed: expected at least one check to pass; found no checks;")
    assert "checks from te_compat: 0; no other package provides checks (entry points of group te_compat.selftest" in (
        result.failures()
    )
    assert "te_compat_entry_points.txt in a package folder on sys.path" in result.failures()


def test_entry_points_contribute_checks_and_a_broken_one_fails_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> object:
        raise ImportError("No module named 'gone'")

    def raising() -> object:
        raise RuntimeError("cannot list")

    found = [
        _entry("good", "pkg.checks:good", lambda: lambda: {"pkg.one": lambda: None, "pkg.two": _skips}),
        _entry("good", "pkg.checks:good", lambda: lambda: {"pkg.one": lambda: None}),  # installed twice: once
        _entry("pairs", "pkg.pairs:checks", lambda: lambda: [("pkg.three", lambda: None)]),
        _entry("broken", "gone:checks", missing),
        _entry("raises", "pkg:raising", lambda: raising),
        _entry("notcallable", "pkg:value", lambda: 3),
        _entry("badcheck", "pkg:bad", lambda: lambda: {"pkg.bad": 7}),
        _entry("notmapping", "pkg:int", lambda: lambda: 5),
    ]
    only_installed(monkeypatch, {"te_compat.selftest": found})
    monkeypatch.setattr(selfcheck, "builtin_checks", dict)
    result = selfcheck.run_selftest()
    by_name = {c.name: c for c in result.checks}
    assert by_name["broken"].why.startswith(
        "ProviderError: provider broken of te_compat.selftest, declared by install metadata: loading gone:checks"
    )
    assert [c.name for c in result.checks].count("pkg.one") == 1
    assert by_name["pkg.one"].status == "passed" and by_name["pkg.two"].status == "skipped"
    assert by_name["pkg.three"].status == "passed"
    assert by_name["broken"].status == "failed" and "loading gone:checks raised ImportError" in by_name["broken"].why
    assert "pkg:raising() raised RuntimeError: cannot list" in by_name["raises"].why
    assert "pkg:value is int; expected a callable returning checks" in by_name["notcallable"].why
    assert by_name["pkg.bad"].status == "failed" and "'pkg.bad' is int" in by_name["pkg.bad"].why
    assert "pkg:int() returned int; expected a mapping of checks" in by_name["notmapping"].why
    assert result.providers is not None
    listed = {p.name: (p.checks, p.error) for p in result.providers}
    assert listed["te_compat"] == (0, "") and listed["good"] == (2, "") and listed["badcheck"] == (1, "")
    assert listed["broken"][0] == 0 and "loading gone:checks raised ImportError" in listed["broken"][1]
    assert "broken: none, it could not be loaded (gone:checks, declared by install metadata)" in result.sources()


def test_the_result_is_cached_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    _only(monkeypatch, {"counted": lambda: runs.append(1)})
    first = te_compat.selftest()
    assert te_compat.selftest() is first and len(runs) == 1
    assert te_compat.selftest(refresh=True) is not first and len(runs) == 2
    te_compat.refresh()  # forgets what it knew of TE and the device: the checks too
    te_compat.selftest()
    assert len(runs) == 3


def test_pyproject_declares_mok_checks_and_report_rows() -> None:
    points = declared()
    assert points["te_compat.selftest"] == {"mok": "mok.selftest:checks"}
    assert points["te_compat.report"]["mok.quantize"] == "mok.selftest:report"
    assert selfcheck.SELFTEST_CHECKS == "te_compat.selftest"


def test_mok_s_declaration_file_declares_what_pyproject_does() -> None:
    """Installed and from a path, the same providers: the file beside mok's code holds the
    te_compat groups of pyproject.toml's entry points, no more, no fewer."""
    ours = {group: points for group, points in declared().items() if group.startswith("te_compat.")}
    assert ours.keys() == {"te_compat.selftest", "te_compat.report"}
    assert declaration() == ours


def test_importing_te_compat_still_imports_neither_torch_nor_te() -> None:
    code = "import sys, te_compat; print(sorted(m for m in ('torch', 'transformer_engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_selftest_exit_codes_and_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _only(monkeypatch, {"fine": lambda: "ok", "gpu": _skips})
    assert main(["selftest"]) == 0
    out = capsys.readouterr()
    assert "te-compat selftest: ok" in out.out and "needs a CUDA device" in out.out and out.err == ""
    assert main(["selftest", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and [c["status"] for c in data["checks"]] == ["passed", "skipped"]
    assert {"te_version", "device"} <= set(data)
    _only(monkeypatch, {"fine": lambda: "ok", "mok.te.mxfp8_split": _fails})
    selfcheck._forget()
    assert main(["selftest", "--json"]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["ok"] is False
    assert out.err.count("\n") == 1 and "Traceback" not in out.err
    assert "mok.te.mxfp8_split: AssertionError: expert 1 rowwise: 3 of 512 bytes differ" in out.err
    _only(monkeypatch, {"gpu": _skips})
    selfcheck._forget()
    assert main(["selftest"]) == 1
    out = capsys.readouterr()
    assert out.out.startswith("te-compat selftest: NOT OK: 0 passed, 0 failed, 1 skipped")
    assert out.err == (
        "te-compat selftest: no check passed: expected at least one check to pass; found all 1 skipped "
        "(gpu: needs a CUDA device: none here); checks from te_compat: 1; no other package provides checks "
        "(entry points of group te_compat.selftest of installed distributions, or te_compat_entry_points.txt "
        "in a package folder on sys.path)\n"
    )
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error, as for every command
        main(["selftest", "--bogus"])
    assert usage.value.code == 2


def test_report_require_selftest(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _only(monkeypatch, {"fine": lambda: "ok"})
    assert main(["report", "--require", "selftest"]) == 0
    assert "te-compat selftest: ok" in capsys.readouterr().out
    assert main(["report", "--json", "--require", "selftest"]) == 0
    assert json.loads(capsys.readouterr().out)["selftest"]["ok"] is True
    _only(monkeypatch, {"broken": _fails})
    selfcheck._forget()
    assert main(["report", "--require", "selftest"]) == 1
    err = capsys.readouterr().err
    assert "selftest: 1 check(s) failed: broken: AssertionError" in err and err.count("\n") == 1
    _only(monkeypatch, {"gpu": _skips})
    selfcheck._forget()
    assert main(["report", "--json", "--require", "selftest"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["selftest"]["ok"] is False
    assert captured.err.startswith("te-compat: required feature(s) not available: selftest: no check passed: ")
    assert main(["report", "--no-import", "--require", "selftest"]) == 2
    assert "drop --no-import" in capsys.readouterr().err
    with pytest.raises(te_compat.MissingFeatureError, match="selftest: no check passed: expected at least one"):
        te_compat.capabilities(import_te=False).require("selftest")


# --- installed and from a path: the same checks and sections ---------------------------------------

COMMANDS = (["selftest", "--json"], ["report", "--json", "--require", "selftest"], ["selftest"])
FILE = "te_compat_entry_points.txt"


@pytest.fixture(scope="module")
def site_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hidden_install(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, site_folder: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """layout -> (the copy, what the commands printed) for clean copies of te_compat and mok:
    "path" run from PYTHONPATH with no install metadata (the declaration file alone), "installed"
    with pyproject's entry points as a distribution's metadata and the declaration file removed
    (what an install's metadata gives alone), "both" with both (a wheel installed)."""
    out = {}
    for layout in ("path", "installed", "both"):
        copy = copy_packages(tmp_path_factory.mktemp(layout) / "packages")
        metadata = [dist_info(copy.parent / "metadata")] if layout != "path" else []
        if layout == "installed":
            (copy / "mok" / FILE).unlink()
        out[layout] = (copy, isolated(copy, site_folder, COMMANDS, *metadata))
    return out


def _checks(data: dict[str, Any]) -> list[str]:
    return [c["name"] for c in data["checks"]]


def test_each_layout_runs_only_its_own_copy(runs: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    for layout, (copy, data) in runs.items():
        assert data["te_compat"] == str(copy / "te_compat" / "__init__.py"), layout
        assert data["mok"] == str(copy / "mok" / "__init__.py"), layout
        assert data["distributions"] == ([] if layout == "path" else ["te-compat-checkout"]), layout


def test_installed_and_from_a_path_give_the_same_checks_and_sections(
    runs: dict[str, tuple[Path, dict[str, Any]]],
) -> None:
    selftests = {layout: json.loads(data["results"][0]["out"]) for layout, (_, data) in runs.items()}
    reports = {layout: json.loads(data["results"][1]["out"]) for layout, (_, data) in runs.items()}
    expected = ["te_compat.verify", "te_compat.te_tensors", *ms.checks()]
    for layout in runs:
        assert _checks(selftests[layout]) == expected, layout
        assert _checks(reports[layout]["selftest"]) == expected, layout
        sections = reports[layout]["sections"]
        assert {name: sorted(rows) for name, rows in sections.items()} == {
            name: sorted(rows) for name, rows in reports["path"]["sections"].items()
        }, layout
        assert set(sections) == set(declared()["te_compat.report"]), layout
        assert not [name for name, rows in sections.items() if "error" in rows], sections
        codes = [r["code"] for r in runs[layout][1]["results"]]
        assert codes == [0, 0, 0], (layout, [r["err"] for r in runs[layout][1]["results"]])


def test_each_layout_says_where_mok_s_checks_were_declared(runs: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    origins = {}
    for layout, (_, data) in runs.items():
        providers = json.loads(data["results"][0]["out"])["providers"]
        assert [(p["name"], p["checks"], p["error"]) for p in providers] == [
            ("te_compat", 2, ""),
            ("mok", len(ms.checks()), ""),
        ], layout
        origins[layout] = providers[1]["origin"]
        text = data["results"][2]["out"]
        assert f"checks from te_compat: 2; mok: {len(ms.checks())} (mok.selftest:checks, declared by " in text
        assert text.startswith("te-compat selftest: ok: 4 passed, 0 failed, 14 skipped in"), text.splitlines()[0]
    file = str(runs["path"][0] / "mok" / FILE)
    assert origins == {
        "path": file,
        "installed": "the installed distribution te-compat-checkout 0",
        "both": str(runs["both"][0] / "mok" / FILE),  # the file beside the code import finds
    }


def test_te_compat_selftest_with_mok_from_a_path_on_this_cpu(runs: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """The command as a user who vendors the code runs it: the checks that need neither TE nor a
    GPU pass, the others skip saying why."""
    data = json.loads(runs["path"][1]["results"][0]["out"])
    status = {c["name"]: (c["status"], c["why"]) for c in data["checks"]}
    for name in ("mok.layout.spec", "mok.views.fakes", "mok.quantize.reference", "mok.quantize.rule"):
        assert status[name][0] == "passed", status[name]
    if not torch.cuda.is_available():
        assert status["mok.kernel.swizzle"] == (
            "skipped",
            f"needs a CUDA device: torch {torch.__version__} sees no CUDA device",
        )
    if te_compat.te_status().version is None:
        assert status["mok.te.mxfp8_split"] == ("skipped", "no Transformer Engine installed")
        assert status["te_compat.verify"] == ("skipped", "no Transformer Engine installed")
    assert data["ok"] is True and data["failures"] == ""
    assert data["te_version"] == (str(te_compat.te_version()) if te_compat.te_version() else None)


def test_a_declared_provider_that_fails_to_import_is_named_and_fails(tmp_path: Path, site_folder: Path) -> None:
    copy = copy_packages(tmp_path / "packages")
    (copy / "mok" / "selftest.py").unlink()  # declared by mok's file, gone from the copy
    commands = (["selftest", "--json"], ["selftest"], ["report", "--json", "--require", "selftest"], ["report"])
    results = isolated(copy, site_folder, commands)["results"]
    assert [r["code"] for r in results] == [1, 1, 1, 0]
    file = copy / "mok" / FILE
    why = (
        f"mok: ProviderError: provider mok of te_compat.selftest, declared by {file}: loading mok.selftest:checks "
        "raised ModuleNotFoundError: No module named 'mok.selftest'"
    )
    data = json.loads(results[0]["out"])
    assert data["ok"] is False and data["failures"] == f"1 check(s) failed: {why}"
    assert results[0]["err"] == f"te-compat selftest: 1 check(s) failed: {why}\n"
    assert data["providers"][1] == {
        "name": "mok",
        "value": "mok.selftest:checks",
        "origin": str(file),
        "checks": 0,
        "error": "loading mok.selftest:checks raised ModuleNotFoundError: No module named 'mok.selftest'",
    }
    assert results[1]["out"].startswith("te-compat selftest: FAILED: ")
    assert "mok: none, it could not be loaded (mok.selftest:checks, declared by" in results[1]["out"]
    report = json.loads(results[2]["out"])
    assert report["selftest"]["ok"] is False and why in results[2]["err"]
    assert report["sections"]["mok.quantize"] == {
        "error": "loading mok.selftest:report raised ModuleNotFoundError: No module named 'mok.selftest'",
        "declared by": str(file),
    }
    assert "kernel backend" in report["sections"]["mok"]  # mok.backend still loads
    assert "No module named 'mok.selftest'" in results[3]["out"] and str(file) in results[3]["out"]


def test_te_compat_alone_says_no_check_passed_and_what_was_expected(tmp_path: Path, site_folder: Path) -> None:
    if te_compat.te_status().present:
        pytest.skip("with TE installed, te_compat's own checks run")
    copy = copy_packages(tmp_path / "packages", packages=("te_compat",))
    results = isolated(
        copy, site_folder, (["selftest"], ["selftest", "--json"], ["report", "--json", "--require", "selftest"])
    )
    assert [r["code"] for r in results["results"]] == [1, 1, 1] and results["mok"] is None
    text, data, report = results["results"][0], json.loads(results["results"][1]["out"]), results["results"][2]
    assert text["out"].startswith("te-compat selftest: NOT OK: 0 passed, 0 failed, 2 skipped")
    assert text["err"].startswith(
        "te-compat selftest: no check passed: expected at least one check to pass; found all 2 skipped "
        "(te_compat.verify: no Transformer Engine installed; te_compat.te_tensors: no Transformer Engine installed); "
        "checks from te_compat: 2; no other package provides checks (entry points of group te_compat.selftest"
    )
    assert data["ok"] is False and data["failures"] == text["err"].removeprefix("te-compat selftest: ").rstrip("\n")
    assert json.loads(report["out"])["sections"] == {} and "selftest: no check passed" in report["err"]


# --- mok's checks that need neither TE nor a GPU ------------------------------------------------


def test_the_spec_oracle_is_the_tests_own() -> None:
    logical = torch.randint(0, 256, (3, 200, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ms.spec_layout(logical), oracle_layout(logical).reshape(-1))


def test_the_layout_check_catches_a_wrong_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "16 vectors" in ms.check_layout_spec()
    real = mok.swizzle_mxfp8_scales

    def transposed_blocks(scales: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = real(scales, **kwargs)
        return out.transpose(-1, -2).contiguous().view(out.shape)  # bytes of a 32x16 tile swapped

    monkeypatch.setattr(mok, "swizzle_mxfp8_scales", transposed_blocks)
    with pytest.raises(AssertionError, match=r"the spec's 128x4 vectors: \d+ of 512 bytes differ"):
        ms.check_layout_spec()


@pytest.mark.parametrize("release", ["2.20.2", "2.13.0", "2.12.0", "2.9.0", "2.1.0", "1.13.0"])
def test_the_views_over_fakes_check_each_release(release: str) -> None:
    with installed_release(release):
        if release == "1.13.0":
            with pytest.raises(SkipCheck, match=r"TE 1.13.0 has no MXFP8 tensors"):
                ms.check_views_over_fakes()
            return
        note = ms.check_views_over_fakes()
    expected = {"2.20.2": "mxfp8, 2-D mxfp8, grouped mxfp8, nvfp4, hybrid", "2.13.0": "mxfp8, grouped mxfp8, nvfp4"}
    expected |= {"2.12.0": "mxfp8, nvfp4", "2.9.0": "mxfp8, nvfp4", "2.1.0": "mxfp8"}
    assert note == f"TE {release}'s {expected[release]} fakes"


def test_the_views_check_catches_a_view_that_is_not_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ms.spec_layout
    monkeypatch.setattr(ms, "spec_layout", lambda logical: real(logical.flip(-1)))
    with installed_release("2.20.2"), pytest.raises(AssertionError, match="split mxfp8 expert 0 rowwise"):
        ms.check_views_over_fakes()


def test_the_quantize_reference_check_catches_a_changed_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ms.check_quantize_reference().startswith("zero, tiny")
    monkeypatch.setattr(
        ms, "quantize_mxfp8_reference", lambda x, rule: quantize_mxfp8_reference(x, ReciprocalRule.EXACT)
    )
    with pytest.raises(AssertionError, match=r"reference row_data \(rule shift\)"):
        ms.check_quantize_reference()


def test_the_hand_computed_bytes_tell_the_rules_apart() -> None:
    shift, exact = (ms._hand_expected(rule) for rule in ReciprocalRule)
    assert shift["row_scales"] == exact["row_scales"] and shift["row_data"] != exact["row_data"]


@pytest.mark.parametrize(("release", "rule"), [("2.12.0", ReciprocalRule.SHIFT), ("2.13.0", ReciprocalRule.EXACT)])
def test_mok_s_quantiser_follows_the_installed_release(release: str, rule: ReciprocalRule) -> None:
    with installed_release(release):
        assert ms.followed_rule() is rule
        assert ms.check_quantiser_rule().startswith(f"the {rule.value} rule")


def test_the_rule_check_fails_where_mok_and_te_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    import mok.plan.work

    monkeypatch.setattr(mok.plan.work, "installed_rule", lambda: ReciprocalRule.EXACT)  # a quantiser ignoring TE
    with installed_release("2.12.0"), pytest.raises(AssertionError) as info:
        ms.check_quantiser_rule()
    assert "on the CPU mok's quantiser follows the exact rule; TE's is shift (TE 2.12.0: exp2f_rcp" in str(info.value)


def test_the_report_rows_say_which_rule_mok_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    import mok.plan.work

    assert ms.report()["quantiser reciprocal rule"] == "exact"
    with installed_release("2.12.0"):
        rows = ms.report()
        assert rows["quantiser reciprocal rule"] == "shift"
        assert rows["quantiser reciprocal rule reason"].startswith("as TE's (TE 2.12.0")
        monkeypatch.setattr(mok.plan.work, "installed_rule", lambda: ReciprocalRule.EXACT)
        assert ms.report()["quantiser reciprocal rule reason"].startswith("TE's is shift (TE 2.12.0")


# --- the GPU checks' bodies, on the CPU with the torch backend ------------------------------------


@pytest.fixture
def cpu_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ms, "_kernel_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ms, "KERNEL", "torch")


def test_without_a_gpu_the_kernel_checks_skip_saying_why() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    for check in (ms.check_kernel_swizzle, ms.check_kernel_refresh, ms.check_kernel_quantize):
        with pytest.raises(SkipCheck, match="needs a CUDA device"):
            check()


@pytest.mark.usefixtures("cpu_kernel")
def test_the_kernel_check_bodies_pass_on_the_reference() -> None:
    assert ms.check_kernel_swizzle() == "2 shapes, 3 experts each, on cpu"
    with installed_release("2.20.2"):
        assert ms.check_kernel_refresh() == "TE 2.20.2's layouts on cpu, refreshed in place"
    assert ms.check_kernel_quantize().startswith("[2, 64, 96] on cpu")


@pytest.mark.usefixtures("cpu_kernel")
def test_the_refresh_check_catches_a_refresh_that_converts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = mok.split_weight_view

    def stale(params: Any, **kwargs: Any) -> Any:
        cached = kwargs.get("cached")
        return cached if cached is not None else real(params, **kwargs)

    monkeypatch.setattr(mok, "split_weight_view", stale)
    with installed_release("2.20.2"), pytest.raises(AssertionError, match="kernel refresh expert 0 rowwise"):
        ms.check_kernel_refresh()


# --- the TE checks, against the stand-in TE ------------------------------------------------------

TE_CHECKS = {
    "mok.te.mxfp8_split": ms.check_te_mxfp8_split,
    "mok.te.mxfp8_grouped": ms.check_te_mxfp8_grouped,
    "mok.te.mxfp8_2d": ms.check_te_mxfp8_2d,
    "mok.te.nvfp4": ms.check_te_nvfp4,
    "mok.te.blockwise": ms.check_te_blockwise,
    "mok.te.hybrid": ms.check_te_hybrid,
    "mok.te.bf16": ms.check_te_bf16,
    "mok.te.mxfp8_dequantize": ms.check_te_mxfp8_dequantize,
    "mok.te.quantize": ms.check_te_quantize,
}
# release -> check -> what it says (passed) or why it skips
EXPECTED = {
    "2.20.2": {
        "mok.te.mxfp8_split": "TE 2.20.2: 2 experts, byte for byte with TE's swizzle",
        "mok.te.mxfp8_grouped": "TE 2.20.2: 2 experts in one GroupedTensor, byte for byte with TE's grouped "
        "swizzle and TE's swizzle of each member",
        "mok.te.mxfp8_2d": "TE 2.20.2: flag read and layout checked; TE quantizes no MXFP8 on this device",
        "mok.te.nvfp4": "TE 2.20.2: per expert and grouped, byte for byte with TE's swizzle",
        "mok.te.blockwise": "TE 2.20.2: refused by name as mxfp8, nvfp4 and bf16",
        "mok.te.hybrid": "TE 2.20.2: rowwise mxfp8 and columnwise nvfp4, 2 experts",
        "mok.te.bf16": "TE 2.20.2: per expert and grouped, zero-copy",
        "mok.te.mxfp8_dequantize": "SKIP TE's MXFP8 dequantize kernel has a body only for compute capability >= 10.0",
        "mok.te.quantize": "SKIP TE does not quantise MXFP8 here",
    },
    "2.12.0": {
        "mok.te.mxfp8_split": "TE 2.12.0: 2 experts, byte for byte with TE's swizzle",
        "mok.te.mxfp8_grouped": "SKIP TE 2.12.0 has no grouped tensors (TE 2.13+)",
        "mok.te.mxfp8_2d": "SKIP TE 2.12.0 has no 2-D MXFP8 block scaling (TE 2.19+, PR 2634)",
        "mok.te.nvfp4": "TE 2.12.0: per expert, byte for byte with TE's swizzle",
        "mok.te.hybrid": "SKIP TE 2.12.0 has no hybrid tensors (TE 2.19+)",
        "mok.te.bf16": "TE 2.12.0: per expert, zero-copy",
    },
    "2.9.0": {
        "mok.te.mxfp8_split": "TE 2.9.0 has no swizzle_scales_for_gemm_ (TE 2.12+): compared with the spec",
        "mok.te.nvfp4": "TE 2.9.0: compared with the spec over TE's buffers (no swizzle_scales_for_gemm_)",
    },
    "2.5.0": {"mok.te.nvfp4": "SKIP TE 2.5.0 has no nvfp4 tensors (TE 2.8+)"},
    "2.13.0": {
        "mok.te.mxfp8_grouped": "TE 2.13.0: 2 experts in one GroupedTensor, byte for byte with TE's swizzle of "
        "each member",
    },
}


@pytest.mark.parametrize("release", sorted(EXPECTED))
def test_the_te_checks_against_a_stand_in_te(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_te(monkeypatch, release):
        for name, expected in EXPECTED[release].items():
            result = selfcheck.run_check(name, TE_CHECKS[name])
            if expected.startswith("SKIP "):
                assert result.status == "skipped" and result.why.startswith(expected[5:]), (name, result)
            else:
                assert result.status == "passed" and result.why.startswith(expected), (name, result)


def test_a_te_swizzle_that_differs_fails_naming_the_expert(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import fake_te as stand_in

    def off_by_one(t: Any) -> None:
        stand_in.swizzle_scales_for_gemm_(t)
        t._rowwise_scale_inv.view(torch.uint8).reshape(-1)[5] += 1

    with fake_te(monkeypatch, "2.20.2", swizzle=off_by_one):
        with pytest.raises(AssertionError, match=r"TE mxfp8 expert 0 rowwise against TE's swizzle: 1 of \d+ bytes"):
            ms.check_te_mxfp8_split()


def test_unseeded_te_buffers_cannot_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ms, "fill_random_", lambda *a, **k: None)
    with fake_te(monkeypatch, "2.20.2"):
        # the stand-in's buffers are random already; TE's, on a GPU, may be all zero: make them so
        real = ms._per_expert_mxfp8

        def zeroed(*args: Any) -> Any:
            params = real(*args)
            for p in params:
                s = te_compat.mxfp8_storage(p)
                for b in (s.rowwise_scale_inv, s.columnwise_scale_inv):
                    b.zero_()
            return params

        monkeypatch.setattr(ms, "_per_expert_mxfp8", zeroed)
        with pytest.raises(AssertionError, match="hold only 1 distinct values"):
            ms.check_te_mxfp8_split()


def test_without_te_every_te_check_skips_saying_so() -> None:
    with installed_release(None):
        for name, check in TE_CHECKS.items():
            result = selfcheck.run_check(name, check)
            assert result.status == "skipped" and result.why.startswith("no Transformer Engine installed"), result


# --- docs/selftest.md ------------------------------------------------------------------------------

DOC = ROOT / "docs" / "selftest.md"


def _doc_blocks() -> list[tuple[int, str]]:
    text = DOC.read_text()
    fences = re.finditer(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    return [(text.count("\n", 0, m.start()) + 1, m["body"]) for m in fences if m["lang"] == "python"]


@pytest.mark.parametrize(("line", "code"), _doc_blocks(), ids=[f"line {n}" for n, _ in _doc_blocks()])
def test_every_python_block_of_the_docs_runs(line: int, code: str) -> None:
    exec(compile(code, f"docs/selftest.md:{line}", "exec"), {"__name__": "docs_selftest"})


def test_the_readme_points_at_the_docs_and_shows_the_startup_line() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "te-compat selftest [--json]" in readme and "docs/selftest.md" in readme
    assert 'te_compat.capabilities().require("selftest")' in readme
    assert len(_doc_blocks()) >= 4


def _stand_in_dequantize(t: Any) -> torch.Tensor:
    """TE's MXFP8 dequantize, from TE's own compact buffers (not through mok): payload times 2^(code - 127)."""
    s = te_compat.mxfp8_storage(t)
    rows, columns = s.shape
    codes = s.rowwise_scale_inv[:rows, : columns // 32].to(torch.float32)
    factor = torch.exp2(codes - 127).repeat_interleave(32, dim=1)
    return s.rowwise_data.view(torch.float8_e4m3fn).to(torch.float32) * factor


def test_the_dequantize_check_against_a_stand_in_dequantize(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(te_compat, "cuda_device", lambda: ("NVIDIA B200", (10, 0), ""))
    monkeypatch.setattr(ms, "_te_dequantize", _stand_in_dequantize)
    with fake_te(monkeypatch, "2.20.2"):
        assert ms.check_te_mxfp8_dequantize() == "TE 2.20.2: 2 experts' values equal TE's dequantize"
        monkeypatch.setattr(ms, "_te_dequantize", lambda t: _stand_in_dequantize(t) * 2)
        with pytest.raises(AssertionError, match="expert 0 dequantized through mok's layout against TE's dequantize"):
            ms.check_te_mxfp8_dequantize()


def test_a_te_grouped_swizzle_that_differs_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import fake_te as stand_in

    def off_by_one(t: Any, **usage: bool) -> None:
        stand_in.grouped_swizzle_for_gemm(t, **usage)
        t.columnwise_scale_inv[-1] += 1

    with fake_te(monkeypatch, "2.20.2"):
        monkeypatch.setattr(sys.modules["transformer_engine_torch"], "grouped_swizzle_for_gemm", off_by_one)
        with pytest.raises(AssertionError, match=r"grouped mxfp8 columnwise against TE's grouped swizzle: 1 of"):
            ms.check_te_mxfp8_grouped()


def test_an_internal_error_of_the_selftest_is_one_line_and_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from te_compat import cli

    def broken() -> object:
        raise RuntimeError("cache\nbroke")

    monkeypatch.setattr(cli, "selftest", broken)
    assert main(["selftest", "--json"]) == 4
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "te-compat selftest: internal error: RuntimeError: cache broke\n"
