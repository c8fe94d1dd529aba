"""capabilities() as data, require(), and the command line, on a machine without TE."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.machinery
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from packaging.version import Version

import te_compat
from te_compat import MissingFeatureError, cli
from te_compat.capabilities import FEATURES, TE_FEATURES, Capabilities
from te_compat.cli import main
from te_compat.testing import installed_release
from tests import ROOT
from tests.entry_points import only_installed
from tests.te_compat.test_version import fake_te

Installer = Callable[..., None]
GROUP = "te_compat.report"


def test_without_te(installed_te: Installer) -> None:
    installed_te(None)
    c = te_compat.capabilities()
    assert not c.te_present and not c.te_usable and c.tensor_kinds == ()
    assert c.missing("te", "mxfp8") == {
        "te": "transformer_engine is not installed",
        "mxfp8": "needs TE >= 2.0; found no TE",
    }
    with pytest.raises(MissingFeatureError, match="grouped: needs TE >= 2.13; found no TE"):
        c.require("grouped")


def test_kinds_follow_the_table(installed_te: Installer) -> None:
    installed_te("2.13.0")
    c = te_compat.capabilities(import_te=False)
    assert c.tensor_kinds == ("float8", "mxfp8", "float8_blockwise", "nvfp4", "grouped")
    assert c.swizzled_scale_flag and c.grouped_tensors and c.te_in_table
    installed_te("2.11.0")
    c = te_compat.capabilities(import_te=False)
    assert not c.swizzled_scale_flag and not c.grouped_tensors
    assert "needs TE >= 2.12; found 2.11.0" in c.missing("swizzled_scale_flag")["swizzled_scale_flag"]
    installed_te("2.99.1")
    assert not te_compat.capabilities(import_te=False).te_in_table
    # the last checked release is in the table; its next patch release is not
    installed_te(te_compat.table.CHECKED_THROUGH)
    assert te_compat.capabilities(import_te=False).te_in_table
    last = Version(te_compat.table.CHECKED_THROUGH).release
    installed_te(".".join(map(str, (*last[:-1], last[-1] + 1))))
    assert not te_compat.capabilities(import_te=False).te_in_table


def test_unknown_feature() -> None:
    with pytest.raises(ValueError, match="unknown feature 'warp_drive'"):
        te_compat.capabilities(import_te=False).require("warp_drive")


def test_cli_report_text(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te(None)
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert "transformer_engine is not installed" in out
    labels = [line.split("  ")[0] for line in out.splitlines()[3:]]
    for f in dataclasses.fields(Capabilities):  # one row per field, none dropped
        assert f.name.replace("_", " ") in labels, f.name


def test_cli_report_json_has_every_field(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te("2.14.1")
    assert main(["report", "--json", "--no-import"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {f.name for f in dataclasses.fields(Capabilities)} | {"sections"}
    assert data["te_version"] == "2.14.1" and data["te_present"] is True


def test_cli_report_json_and_require(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te(None)
    assert main(["report", "--json", "--require", "te", "grouped"]) == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["te_present"] is False and data["table_checked_through"] == te_compat.table.CHECKED_THROUGH
    assert "te: transformer_engine is not installed" in captured.err
    assert "grouped: needs TE >= 2.13" in captured.err


def test_cli_require_exit_codes(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te("2.14.1")  # float8 since 1.x, mxfp8 since 2.0, grouped since 2.13 (facts.md)
    assert main(["report", "--no-import", "--require", "te", "float8", "mxfp8", "grouped"]) == 0
    installed_te("2.11.0")
    assert main(["report", "--no-import", "--require", "mxfp8", "grouped"]) == 1
    assert "grouped: needs TE >= 2.13; found 2.11.0" in capsys.readouterr().err
    # a typo is a usage error (2), even beside a missing feature, and the known names are listed
    assert main(["report", "--no-import", "--require", "grouped", "bogus"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "unknown feature 'bogus'" in captured.err
    for name in FEATURES:
        assert name in captured.err


def test_cli_report_never_shows_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(**_: object) -> Capabilities:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(cli, "capabilities", broken)
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert "could not read the capabilities: RuntimeError: probe exploded" in err and "Traceback" not in err


def test_cli_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--help"]) == 0
    out = capsys.readouterr().out
    assert "  0  the report was printed" in out
    assert "  1  --require: a FEATURE is not available" in out and "  2  usage error" in out
    assert "``" not in out and ":func:" not in out  # plain text, not reST
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "report exit codes:" in out and "verify exit codes:" in out and "``" not in out


def demo_section() -> dict[str, object]:
    """A report section as another package contributes it (the target of an entry point)."""
    return {"kernel_backend": "torch", "reason": "no CUDA device"}


def _failing_section() -> dict[str, object]:
    raise RuntimeError("section exploded")


@dataclasses.dataclass
class _EntryPoint:
    """What the report uses of an importlib.metadata.EntryPoint, with a chosen load()."""

    name: str
    value: str
    load: Callable[[], object]


def _entry_points(monkeypatch: pytest.MonkeyPatch, *found: object) -> None:
    """te_compat finds ``found`` as the installed providers of the report, and no declaration
    file on sys.path."""
    only_installed(monkeypatch, {GROUP: list(found)})


def test_cli_report_sections_from_entry_points(
    installed_te: Installer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    installed_te(None)
    here = "tests.te_compat.test_cli"
    _entry_points(
        monkeypatch,
        importlib.metadata.EntryPoint("mok", f"{here}:demo_section", GROUP),
        importlib.metadata.EntryPoint("gone", "no_such_module_xyz:section", GROUP),
        _EntryPoint("raises", f"{here}:_failing_section", lambda: _failing_section),
        _EntryPoint("not_a_dict", "pkg:rows", lambda: lambda: ["a", "list"]),
    )
    assert main(["report", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["sections"]
    assert data["mok"] == {"kernel_backend": "torch", "reason": "no CUDA device"}
    assert "ModuleNotFoundError" in data["gone"]["error"] and "no_such_module_xyz" in data["gone"]["error"]
    assert data["raises"] == {
        "error": f"{here}:_failing_section() raised RuntimeError: section exploded",
        "declared by": "install metadata",
    }
    assert data["not_a_dict"] == {
        "error": "pkg:rows() returned list; expected a dict of rows",
        "declared by": "install metadata",
    }
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert "\nmok\n" in out and "kernel backend  torch" in out and "RuntimeError: section exploded" in out


def test_cli_report_survives_entry_points_failing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(**_: object) -> list[object]:
        raise OSError("metadata unreadable")

    from te_compat import providers

    monkeypatch.setattr(providers, "entry_points", broken)
    monkeypatch.setattr(providers, "search_path", list)
    assert main(["report", "--json", "--no-import"]) == 0
    section = json.loads(capsys.readouterr().out)["sections"][GROUP]
    assert section == {
        "error": "loading importlib.metadata.entry_points raised OSError: metadata unreadable",
        "declared by": "install metadata",
    }


def test_cli_releases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases"]) == 0
    out = capsys.readouterr().out
    for row in te_compat.table.ROWS:
        assert row.introduced_by in out
    assert main(["releases", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["storage"]) == len(te_compat.table.ROWS)
    assert [(r["since"], r["until"], r["rule"]) for r in data["reciprocal"]] == [
        ("2.0", "2.6", "shift"),
        ("2.6", "2.13", "shift"),
        ("2.13", None, "exact"),
    ]
    assert [r["mxfp8"] for r in data["post_all_gather_processing"]] == ["absent", "raises", "no-op"]
    assert data["quantizer_flags"][0]["attribute"] == "with_2d_quantization"


def test_python_dash_m_and_exit_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "te_compat", "report", "--require", "mxfp8_hardware"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 1 and "te-compat report" in done.stdout and "mxfp8_hardware:" in done.stderr


def test_report_prints_a_dash_for_an_empty_list(installed_te, capsys) -> None:  # type: ignore[no-untyped-def]
    installed_te(None)
    assert main(["report", "--no-import"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("tensor kinds"))
    assert line.split()[-1] == "-"


# ---- --require repeated; a TE that is present but not usable ----


def test_require_may_be_repeated_and_the_lists_merge(
    installed_te: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    installed_te("2.11.0")  # float8 (1.x) and mxfp8 (2.0) are there, grouped (2.13) is not
    assert main(["report", "--no-import", "--require", "grouped", "--require", "te", "float8"]) == 1
    err = capsys.readouterr().err
    assert "grouped: needs TE >= 2.13; found 2.11.0" in err and err.count("\n") == 1
    assert main(["report", "--no-import", "--require", "te", "--require", "float8", "--require", "mxfp8"]) == 0
    assert main(["report", "--no-import", "--require", "float8", "--require", "bogus"]) == 2
    assert "unknown feature 'bogus'" in capsys.readouterr().err


# Every feature that uses the installed TE (docs/te_compat.md and --require's help list them): with TE
# present but unusable, each is missing whatever its release offers; the device features are not.
TE_DEPENDENT = set(
    "te float8 mxfp8 float8_blockwise nvfp4 grouped hybrid verified swizzled_scale_flag mxfp8_quantization "
    "post_all_gather_processing float8_fsdp2 mxfp8_fsdp2".split()
)


def _everything(**changes: object) -> Capabilities:
    """Capabilities of a process that has it all: TE 2.20.2 usable and verified, a B200, cuda.core."""
    full = Capabilities(
        te_present=True,
        te_version="2.20.2",
        te_source="transformer-engine",
        te_usable=True,
        te_reason="imported",
        te_in_table=True,
        te_verified=True,
        te_verification="agrees",
        table_checked_through="2.20.2",
        torch_version="2.13.0",
        cuda_device="NVIDIA B200",
        compute_capability=(10, 0),
        tensor_kinds=("float8", "mxfp8", "float8_blockwise", "nvfp4", "grouped", "hybrid", "identity"),
        grouped_tensors=True,
        swizzled_scale_flag=True,
        mxfp8_hardware=True,
        mxfp8_quantization=True,
        mxfp8_quantize_api="MXFP8Quantizer.update_quantized into a MXFP8Tensor of given buffers",
        mxfp8_reciprocal_rule="exact",
        mxfp8_reciprocal_rule_source="TE 2.20.2: exp2f_rcp of transformer_engine/common/util/ptx.cuh",
        mxfp8_2d_quantization=True,
        post_all_gather_processing=True,
        post_all_gather_processing_reason="TE 2.20.2: a no-op for MXFP8 weights",
        float8_fsdp2=True,
        mxfp8_fsdp2=True,
        fsdp2_reasons={"float8": "TE 2.20.2: FLOAT8 ...", "mxfp8": "TE 2.20.2: MXFP8 ..."},
        cuda_core=True,
    )
    return dataclasses.replace(full, **changes)  # type: ignore[arg-type]


def test_a_te_present_but_unusable_fails_every_te_feature() -> None:
    assert _everything().missing(*FEATURES) == {}
    why = "import transformer_engine.pytorch failed: OSError: libcudart.so.13"
    broken = _everything(te_usable=False, te_reason=why, mxfp8_quantization=False)
    missing = broken.missing(*FEATURES)
    assert set(missing) == TE_DEPENDENT == set(TE_FEATURES)
    for feature, reason in missing.items():
        assert f"Transformer Engine 2.20.2 is present but not usable: {why}" in reason, feature
    with pytest.raises(MissingFeatureError, match="mxfp8: Transformer Engine 2.20.2 is present but not usable"):
        broken.require("cuda", "mxfp8")


def _cli(*args: str, path: Path | None = None, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """``python -m te_compat ARGS`` from the checkout, with ``path`` first on sys.path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, ROOT) if p is not None)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "te_compat", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def test_cli_require_fails_with_a_te_that_does_not_import(tmp_path: Path) -> None:
    broken = fake_te(tmp_path, metadata="2.20.2", pytorch_init="raise OSError('libcudart.so.13')\n")
    done = _cli("report", "--require", "mxfp8", "grouped", path=broken)
    assert done.returncode == 1, done.stderr
    assert "te usable" in done.stdout and "Traceback" not in done.stderr
    assert "mxfp8: Transformer Engine 2.20.2 is present but not usable" in done.stderr
    assert "grouped: Transformer Engine 2.20.2 is present but not usable" in done.stderr


# ---- never a traceback: output that cannot be written, internal errors, a bare call ----


HELP_COMMANDS = [["--help"], ["report", "--help"], ["verify", "-h"], ["releases", "--help"], ["selftest", "--help"]]


@pytest.mark.parametrize("command", [["releases", "--json"], ["selftest", "--json"], *HELP_COMMANDS])
def test_a_closed_pipe_is_one_line_and_exit_3(command: list[str]) -> None:
    # te-compat releases | true (or te-compat --help | head -0): the reader is gone before the
    # output is written
    proc = subprocess.Popen(
        [sys.executable, "-m", "te_compat", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert err == "te-compat: the output could not be written: Broken pipe\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "command", [["report"], ["report", "--json"], ["releases"], ["verify", "--json"], ["selftest"], *HELP_COMMANDS]
)
def test_a_full_disk_is_one_line_and_exit_3(command: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = _cli(*command, stdout=full)
    assert done.returncode == 3, done.stderr
    assert done.stderr == "te-compat: the output could not be written: No space left on device\n"


@pytest.mark.parametrize(
    "command",
    [
        "report",
        "report --json",
        "releases",
        "releases --json",
        "verify --json",
        "selftest --json",
        "--help",
        "verify -h",
    ],
)
def test_a_closed_stdout_is_one_line_and_exit_3(command: str) -> None:
    # te-compat releases >&-: Python starts with sys.stdout None
    shell = f"exec {sys.executable} -m te_compat {command} >&-"
    done = subprocess.run(["sh", "-c", shell], stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr == "te-compat: the output could not be written: standard output is closed\n"


def test_a_closed_stdout_with_nothing_to_write_keeps_the_command_s_code() -> None:
    shell = f"exec {sys.executable} -m te_compat report --require nope >&-"
    done = subprocess.run(["sh", "-c", shell], stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("te-compat report: unknown feature 'nope'; known")
    assert done.stderr.count("\n") == 1


def test_stdout_and_stderr_closed_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["releases"]) == 3
    assert capsys.readouterr().err == "te-compat: the output could not be written: standard output is closed\n"
    monkeypatch.setattr(sys, "stderr", None)
    assert main(["releases"]) == 3  # nowhere to say it: the code alone
    assert main(["report", "--require", "nope"]) == 2


class _FailingStdout:
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_output_errors_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdout", _FailingStdout())
    assert main(["releases"]) == 3
    assert capsys.readouterr().err == "te-compat: the output could not be written: Broken pipe\n"


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_help_is_written_as_every_output_is(command: list[str]) -> None:
    done = _cli(*command)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("usage: te-compat") and "exit codes:" in done.stdout


def test_help_that_cannot_be_written_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", _FailingStdout())
    assert main(["report", "--help"]) == 3
    assert capsys.readouterr().err == "te-compat: the output could not be written: Broken pipe\n"


def test_an_internal_error_is_one_line_and_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: object) -> object:
        raise RuntimeError("table\nexploded")

    monkeypatch.setattr(cli, "releases", broken)
    assert main(["releases"]) == 4
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "te-compat releases: internal error: RuntimeError: table exploded\n"


def test_a_bare_call_prints_the_report(installed_te: Installer, capsys: pytest.CaptureFixture[str]) -> None:
    installed_te(None)
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("te-compat report\n")
    done = _cli()
    assert done.returncode == 0 and done.stdout.startswith("te-compat report\n"), done.stderr


def test_the_exit_codes_are_documented_in_help_and_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "releases exit codes:" in out
    assert out.count("  3  the output could not be written") == 4 and out.count("  4  an unexpected error") == 4
    assert "selftest exit codes:" in out
    page = (ROOT / "docs" / "te_compat.md").read_text()
    commands = page.split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    for line in ("3 the output could not be written", "4 an unexpected error", "python -m te_compat"):
        assert line in " ".join(commands.split()), line


def _installed(name: str) -> types.ModuleType:
    """A module ``name`` that importlib finds (with a spec), standing for an installed package."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module


# Capabilities that need a CUDA device (and, for the MXFP8 ones, its compute capability).
DEVICE_BOUND = ("cuda", "mxfp8_hardware", "mxfp8_quantization", "cuda_kernel")


@settings(max_examples=30, deadline=None)
@given(
    release=st.one_of(
        st.none(),
        st.sampled_from(["1.13.0", "2.0.0", "2.11.0", "2.13.0", "2.14.1", "2.20.2", "2.21.0.dev0+abc", "2.99.0"]),
    ),
    import_te=st.booleans(),
    cuda_core=st.booleans(),
)
@example(release="2.20.2", import_te=False, cuda_core=True)
def test_no_cuda_device_no_device_bound_capability(release: str | None, import_te: bool, cuda_core: bool) -> None:
    """On a machine where torch sees no CUDA device, whatever TE is installed (or none), with
    cuda.core installed or not, every capability bound to the device or its compute capability
    is reported missing, saying why, by capabilities() and by ``te-compat report --require``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)  # what torch says with no CUDA device
        patch.setitem(sys.modules, "cuda.core", _installed("cuda.core") if cuda_core else None)
        with installed_release(release):  # te_compat's caches cleared: the device is probed again
            c = te_compat.capabilities(import_te=import_te, verify=False)
            assert c.cuda_device is None and c.compute_capability is None
            assert not c.mxfp8_hardware and not c.mxfp8_quantization
            missing = c.missing(*DEVICE_BOUND)
            assert set(missing) == set(DEVICE_BOUND), missing
            assert "no CUDA device" in missing["mxfp8_hardware"]
            for feature in DEVICE_BOUND:
                with pytest.raises(MissingFeatureError, match=feature):
                    c.require(feature)
                err = io.StringIO()
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    assert main(["report", "--no-import", "--require", feature]) == 1, feature
                assert f"{feature}:" in err.getvalue()


def test_mok_s_device_facts_are_mok_s_and_te_compat_s_names_deprecated() -> None:
    """cuda.core is a fact of mok's kernel: mok.backend answers it (and mok's report section shows
    it); te_compat's old names answer the same for one release, warning with their successor."""
    import mok.backend

    with pytest.warns(
        DeprecationWarning, match=r"te_compat.has_cuda_core is deprecated; use mok.backend.has_cuda_core"
    ):
        old = te_compat.has_cuda_core()
    assert old == mok.backend.has_cuda_core()
    assert mok.backend.report()["cuda core"] == mok.backend.has_cuda_core()
    caps = te_compat.capabilities(import_te=False, verify=False)
    assert caps.cuda_core == mok.backend.has_cuda_core()
    with pytest.warns(
        DeprecationWarning, match=r"'cuda_kernel' feature is deprecated; use mok.kernel_backend\('cuda'\)"
    ):
        caps.missing("cuda_kernel")


def test_the_cuda_kernel_deprecation_points_at_the_callers_line() -> None:
    """Through missing() and require() alike, the warning names the caller's line (where Python's
    default filters show a DeprecationWarning), not te_compat's."""
    caps = te_compat.capabilities(import_te=False, verify=False)
    with pytest.warns(DeprecationWarning, match="'cuda_kernel' feature is deprecated") as caught:
        caps.missing("cuda_kernel")
        with contextlib.suppress(te_compat.MissingFeatureError):
            caps.require("cuda_kernel")
    assert [w.filename for w in caught] == [__file__] * 2
