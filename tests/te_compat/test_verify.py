"""te_compat.verify_installed and ``te-compat verify`` on real TE sources (the matrix's wheels).

Each release's wheel (matrix/.cache, downloaded once when missing) is unpacked into a temporary
folder and read as if it were the installed TE. Expectations come from the matrix: the committed
records (extracted from the same wheels) and ``matrix.check``. Without a cached wheel, a test
that reads a wheel skips, saying why, when pip is told to use no package index (PIP_NO_INDEX,
or no-index in a pip configuration file) or the index cannot be reached; CI downloads every
wheel first (``nox -s release``). The table against the records needs no wheel:
tests/matrix/test_matrix.py.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

import te_compat
import te_compat.verify as verify_module
from matrix.check import check_record, check_release
from matrix.extract import WHEEL_CACHE, IndexUnreachable, index_unreachable, load_record, package_index, wheel_path
from matrix.releases import matrix_release, release_versions
from te_compat import table
from te_compat.cli import main
from te_compat.errors import TENotFoundError, TEVersionError
from te_compat.table import TensorKind
from te_compat.verify import read_source_dir, verify_installed

Installer = Callable[..., None]
Unpacker = Callable[[str], Path]
MXFP8_STORAGE = "transformer_engine/pytorch/tensor/storage/mxfp8_tensor_storage.py"
MXFP8_STORAGE_CLASS = "MXFP8TensorStorage"
MXFP8_STORAGE_MODULE = "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage"
DEV_BUILD = "2.21.0.dev0+5fdd7bb"


PIP_TRUE, PIP_FALSE = {"y", "yes", "t", "true", "on", "1"}, {"n", "no", "f", "false", "off", "0"}  # pip's strtobool


def pip_offline() -> str | None:
    """Where pip is told to use no package index (``--no-index`` as PIP_NO_INDEX or in a pip
    configuration file, the environment first, then ``download``, then ``global``), else None."""
    keys = ("HOME", "XDG_CONFIG_HOME", "VIRTUAL_ENV", "APPDATA")
    return _pip_offline(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_") or k in keys)))


@functools.cache
def _pip_offline(environment: tuple[tuple[str, str], ...]) -> str | None:
    """pip_offline for one environment (pip's configuration asked once per environment)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False, timeout=120
    ).stdout
    values = {
        key: value.strip("'\"").lower() for key, _, value in (line.partition("=") for line in listed.splitlines())
    }
    for key, where in ((":env:.no-index", "PIP_NO_INDEX"), ("download.no-index", None), ("global.no-index", None)):
        value = values.get(key)
        if value in PIP_TRUE:
            return where or f"pip config {key}"
        if value in PIP_FALSE:
            return None
    return None


def wheel_or_skip(release: str, cache: Path = WHEEL_CACHE) -> Path:
    """The release's wheel from matrix/.cache (downloaded when missing); the test skips, saying
    why, when it is missing and pip is told to stay offline or its package index cannot be reached."""
    name = f"transformer_engine-{release}-py3-none-any.whl"
    offline = None if (cache / name).is_file() else pip_offline()
    if offline is not None:
        pytest.skip(
            f"no TE {release} wheel: pip is told to use no package index ({offline}); to run this test "
            f"offline, put {name} in {cache}"
        )
    try:
        return wheel_path(release, cache)
    except IndexUnreachable as exc:
        pytest.skip(f"no TE {release} wheel: {exc}")


@pytest.fixture(scope="session")
def te_source(tmp_path_factory: pytest.TempPathFactory) -> Unpacker:
    """The unpacked wheel of a matrix release (its source release's wheel), unpacked once."""
    root = tmp_path_factory.mktemp("te-sources")

    def unpack(release: str) -> Path:
        source = matrix_release(release).source_from
        target = root / source
        if not target.exists():
            with zipfile.ZipFile(wheel_or_skip(source)) as archive:
                archive.extractall(target)
        return target

    return unpack


# ---- offline -------------------------------------------------------------------------------------


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released): connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_index_skips_the_test_and_names_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_NO_INDEX", "0")  # pip may use an index (whatever the caller's setting)
    start = time.perf_counter()
    with pytest.raises(pytest.skip.Exception) as skipped:
        wheel_or_skip("2.20.2", tmp_path)  # an empty cache: the wheel must be downloaded
    reason = str(skipped.value)
    # refused, or with no network at all, unreachable: either way the index is named, and why
    assert re.match(rf"no TE 2\.20\.2 wheel: {re.escape(index)} \(PIP_INDEX_URL\) unreachable: \w+Error: ", reason)
    assert f"transformer-engine==2.20.2 into {tmp_path}" in reason
    assert list(tmp_path.iterdir()) == [] and time.perf_counter() - start < 5  # pip never ran


@pytest.mark.parametrize("value", ["1", "yes", "true", "on"])
def test_pip_told_to_stay_offline_skips_at_once_naming_why(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", value)
    start = time.perf_counter()
    with pytest.raises(pytest.skip.Exception) as skipped:
        wheel_or_skip("2.20.2", tmp_path)
    assert str(skipped.value) == (
        "no TE 2.20.2 wheel: pip is told to use no package index (PIP_NO_INDEX); to run this test offline, "
        f"put transformer_engine-2.20.2-py3-none-any.whl in {tmp_path}"
    )
    assert list(tmp_path.iterdir()) == [] and time.perf_counter() - start < 30  # no download, no probe


@pytest.mark.parametrize("section", ["global", "download"])
def test_no_index_in_a_pip_config_file_skips_too(section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text(f"[{section}]\nno_index = true\n")
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(pytest.skip.Exception, match=rf"\(pip config {section}\.no-index\); to run this test offline"):
        wheel_or_skip("2.20.2", cache)
    monkeypatch.setenv("PIP_NO_INDEX", "0")  # the environment overrides pip's files, as in pip
    assert pip_offline() is None


def test_offline_a_cached_wheel_is_still_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    wheel = tmp_path / "transformer_engine-2.20.2-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert wheel_or_skip("2.20.2", tmp_path) == wheel


def test_a_cached_wheel_needs_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    wheel = tmp_path / "transformer_engine-2.20.2-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert wheel_or_skip("2.20.2", tmp_path) == wheel


def test_the_index_is_the_one_pip_is_configured_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "simple" / "transformer-engine").mkdir(parents=True)
    local = (tmp_path / "simple").as_uri()
    monkeypatch.setenv("PIP_INDEX_URL", local)
    assert package_index() == (local, "PIP_INDEX_URL") and index_unreachable(local) is None
    assert (
        index_unreachable((tmp_path / "elsewhere").as_uri())
        == f"no folder {tmp_path / 'elsewhere'}/transformer-engine/"
    )
    monkeypatch.delenv("PIP_INDEX_URL")
    url, where = package_index()  # pip's config files, else pip's default
    assert (url, where) == ("https://pypi.org/simple", "pip's default; PIP_INDEX_URL sets another") or (
        where == "pip config index-url" and "://" in url
    )


def _copy_with(src: Path, dst: Path, relpath: str, old: str, new: str) -> Path:
    """A copy of a TE source tree with ``old`` replaced by ``new`` in one file (which must hold it)."""
    shutil.copytree(src, dst)
    path = dst / relpath
    text = path.read_text()
    assert old in text, f"{relpath} no longer holds {old!r}: pick another edit"
    path.write_text(text.replace(old, new))
    return dst


@pytest.mark.parametrize("version", release_versions())
def test_verify_agrees_with_the_matrix(version: str, te_source: Unpacker) -> None:
    src = te_source(version)
    result = verify_installed(source_dir=src, release=version)
    assert result.problems == tuple(check_release(version))
    assert result.ok, result.problems
    assert result.release == version and not result.beyond_table and result.newest_rows_verified is None
    assert result.checked > 0 and result.source_dir == str(src / "transformer_engine")
    # the facts read from the files are the committed record's (extracted from the zip by matrix)
    classes, files = read_source_dir(src)
    assert classes == load_record(matrix_release(version).source_from)["classes"]
    assert files == result.files


def test_1_9_0_reads_the_post_release_source(te_source: Unpacker) -> None:
    assert te_source("1.9.0").name == "1.9.0.post1"
    assert verify_installed(te_source("1.9.0"), "1.9.0").rows == ("float8 1.0 .. 1.11",)


def test_a_renamed_storage_attribute_fails(te_source: Unpacker, tmp_path: Path) -> None:
    copy = _copy_with(te_source("2.20.2"), tmp_path / "te", MXFP8_STORAGE, "_rowwise_scale_inv", "_rowwise_scales")
    result = verify_installed(copy, "2.20.2")
    assert not result.ok
    missing = [p for p in result.problems if "'_rowwise_scale_inv'" in p]
    assert missing and all("never assigns it" in p for p in missing)
    renamed = [p for p in result.problems if "'_rowwise_scales'" in p]
    assert len(renamed) == 1
    assert f"class {MXFP8_STORAGE_CLASS} of module {MXFP8_STORAGE_MODULE} assigns '_rowwise_scales'" in renamed[0]
    assert "unknown to the mxfp8 row 2.12" in renamed[0]
    assert result.verdict.startswith("TE 2.20.2: 2 disagreement(s)")  # the probe misses, the new name is unknown
    # a dev build past the table fails the same way: no older mxfp8 row probes another name
    beyond = verify_installed(copy, DEV_BUILD)
    assert not beyond.ok and beyond.newest_rows_verified is False
    assert any("'_rowwise_scales'" in p for p in beyond.problems)


def test_a_dev_build_beyond_the_table_uses_the_newest_rows(te_source: Unpacker) -> None:
    result = verify_installed(te_source("2.20.2"), DEV_BUILD)
    assert result.ok and result.beyond_table and result.newest_rows_verified is True
    assert result.release == DEV_BUILD
    newest = {f"{r.kind} {r.span}" for r in table.ROWS if r.until is None}
    assert set(result.rows) == newest and all(span.endswith("+") for span in result.rows)
    assert f"newer than the last checked release {table.CHECKED_THROUGH}" in result.verdict
    assert "the newest rows verified" in result.verdict


def test_beyond_the_table_an_older_row_that_verifies_is_used_and_named(te_source: Unpacker, tmp_path: Path) -> None:
    # a future TE that dropped the 2.12 swizzled-scales flag from MXFP8 storage
    flag = "instance._with_gemm_swizzled_scales = "
    copy = _copy_with(te_source("2.20.2"), tmp_path / "te", MXFP8_STORAGE, flag, "_dropped_flag = ")
    in_table = verify_installed(copy, "2.20.2")
    assert not in_table.ok and any("'_with_gemm_swizzled_scales'" in p for p in in_table.problems)
    beyond = verify_installed(copy, DEV_BUILD)
    assert beyond.ok and beyond.newest_rows_verified is False
    mxfp8 = [r for r in beyond.rows if r.startswith("mxfp8 ")]
    assert mxfp8 == ["mxfp8 2.9 .. 2.12"]  # the newest mxfp8 row without the flag
    assert "did not all verify" in beyond.verdict and "mxfp8 2.9 .. 2.12" in beyond.verdict


def test_beyond_the_table_the_newest_of_several_verifying_rows_wins(te_source: Unpacker, tmp_path: Path) -> None:
    # candidate rows: the 2.9 .. 2.12 mxfp8 row twice, the copy starting at 2.10; both verify the
    # flag-less source, and the newer one must be the one used
    flag = "instance._with_gemm_swizzled_scales = "
    copy = _copy_with(te_source("2.20.2"), tmp_path / "te", MXFP8_STORAGE, flag, "_dropped_flag = ")
    rows = list(table.ROWS)
    at = next(i for i, r in enumerate(rows) if r.kind is TensorKind.MXFP8 and r.since == "2.9")
    rows.insert(at + 1, dataclasses.replace(rows[at], since="2.10", introduced_by="TE 2.10: a candidate row"))
    beyond = verify_installed(copy, DEV_BUILD, rows=rows)
    assert beyond.ok and [r for r in beyond.rows if r.startswith("mxfp8 ")] == ["mxfp8 2.10 .. 2.12"]


def test_quantized_classes_no_row_covers_are_listed(te_source: Unpacker) -> None:
    assert verify_installed(te_source("2.20.2"), "2.20.2").uncovered == ()
    without_mxfp8 = [r for r in table.ROWS if r.kind is not TensorKind.MXFP8]
    result = verify_installed(te_source("2.20.2"), "2.20.2", rows=without_mxfp8)
    assert result.ok and "mxfp8" not in {r.split()[0] for r in result.rows}
    assert "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor" in result.uncovered
    assert f"{MXFP8_STORAGE_MODULE}.{MXFP8_STORAGE_CLASS}" in result.uncovered


def test_the_cache_reparses_only_changed_files(
    te_source: Unpacker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = shutil.copytree(te_source("2.20.2"), tmp_path / "te")
    parsed: list[str] = []
    real = verify_module.file_classes

    def counting(source: bytes | str, name: str) -> dict[str, verify_module.ClassFacts]:
        parsed.append(name)
        return real(source, name)

    monkeypatch.setattr(verify_module, "file_classes", counting)
    first = verify_installed(copy, "2.20.2")
    assert first.ok and len(parsed) == first.files > 10
    parsed.clear()
    assert verify_installed(copy, "2.20.2") == first and parsed == []
    path = copy / MXFP8_STORAGE
    path.write_text(path.read_text().replace("_rowwise_scale_inv", "_rowwise_scales"))
    assert not verify_installed(copy, "2.20.2").ok and parsed == [MXFP8_STORAGE]


def test_the_installed_te_is_found_without_running_it(
    te_source: Unpacker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed_te: Installer
) -> None:
    site = tmp_path / "site"
    shutil.copytree(te_source("2.20.2") / "transformer_engine", site / "transformer_engine")
    for init in ("transformer_engine/__init__.py", "transformer_engine/pytorch/__init__.py"):
        (site / init).write_text("raise RuntimeError('TE code ran')\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    installed_te("2.20.2")
    assert not [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]
    result = verify_installed()
    assert result.ok and result.source_dir == str(site / "transformer_engine") and result.release == "2.20.2"
    assert not [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]


def test_no_te_and_bad_input(installed_te: Installer, tmp_path: Path) -> None:
    # no wheel needed: the version is checked before any source file is read
    installed_te(None)
    with pytest.raises(TENotFoundError, match="Transformer Engine is not installed"):
        verify_installed()
    with pytest.raises(TENotFoundError, match=f"found no pytorch/ folder in {tmp_path}"):
        verify_installed(tmp_path, "2.20.2")
    installed_te("not a version")
    with pytest.raises(TEVersionError, match="cannot verify the installed Transformer Engine"):
        verify_installed()
    (tmp_path / "transformer_engine" / "pytorch").mkdir(parents=True)  # an empty TE source tree
    with pytest.raises(TEVersionError, match="'2.x'"):
        verify_installed(tmp_path, "2.x")


PYTHON_WORDS = re.compile(r"source_dir|release=|verify_installed")


def test_errors_name_what_the_caller_can_pass(
    installed_te: Installer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no wheel needed: both errors come before any source file is read
    installed_te(None)
    with pytest.raises(
        TENotFoundError, match=r"to verify a source tree, name it: verify_installed\(source_dir=\.\.\.\)$"
    ):
        verify_installed()
    assert main(["verify"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("to verify a source tree, name it: te-compat verify --source DIR\n") and err.count("\n") == 1
    assert not PYTHON_WORDS.search(err), err
    (tmp_path / "transformer_engine" / "pytorch").mkdir(parents=True)  # a tree that states no release
    with pytest.raises(TEVersionError, match=r"Name the release: verify_installed\(release=\.\.\.\)$"):
        verify_installed(tmp_path)
    assert main(["verify", "--source", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.endswith("Name the release: te-compat verify --release VERSION\n") and err.count("\n") == 1
    assert not PYTHON_WORDS.search(err), err


def test_a_source_tree_given_states_its_own_release(installed_te: Installer, te_source: Unpacker) -> None:
    installed_te("not a version")
    # a source tree given says its own release (here its dist-info): the installed TE's is not asked
    assert verify_installed(te_source("2.20.2")).release == "2.20.2"


def test_a_kind_of_the_table_is_checked_in_the_right_release_only(te_source: Unpacker) -> None:
    # 2.12.0's source read as 2.11.0: the swizzled flag is assigned but the 2.11 row does not know it
    result = verify_installed(te_source("2.12.0"), "2.11.0")
    assert not result.ok
    assert any("assigns '_with_gemm_swizzled_scales', unknown to the mxfp8 row" in p for p in result.problems)
    assert TensorKind.MXFP8.value in {r.split()[0] for r in result.rows}
    # verify's check is the matrix's: the committed record gives the same verdict offline
    assert result.problems == tuple(check_record({**load_record("2.12.0"), "release": "2.11.0"}))


def test_the_same_check_on_the_committed_record_needs_no_wheel() -> None:
    problems = check_record({**load_record("2.12.0"), "release": "2.11.0"})
    assert any("assigns '_with_gemm_swizzled_scales', unknown to the mxfp8 row" in p for p in problems)
    assert check_record(load_record("2.12.0")) == []


# ---- te-compat verify ----


def test_cli_verify_exit_codes(
    te_source: Unpacker, tmp_path: Path, installed_te: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    src = te_source("2.20.2")
    assert main(["verify", "--source", str(src), "--release", "2.20.2"]) == 0
    assert "agrees with the release table" in capsys.readouterr().out
    bad = _copy_with(src, tmp_path / "te", MXFP8_STORAGE, "_rowwise_scale_inv", "_rowwise_scales")
    assert main(["verify", "--source", str(bad), "--release", "2.20.2"]) == 1
    out = capsys.readouterr().out
    assert "disagreement(s)" in out and "'_rowwise_scales'" in out and MXFP8_STORAGE_MODULE in out
    installed_te(None)
    assert main(["verify"]) == 2
    assert "Transformer Engine is not installed" in capsys.readouterr().err
    installed_te("2.20.2")
    assert main(["verify", "--source", str(src), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["release"] == "2.20.2" and data["problems"] == []
    assert data["source_dir"] == str(src / "transformer_engine") and data["checked"] > 0


def test_cli_verify_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--help"]) == 0
    out = capsys.readouterr().out
    assert "  0  the TE source agrees" in out and "  1  disagreements found" in out and "  2  no TE to verify" in out


def test_an_unparsable_source_file_is_a_named_error_not_a_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "transformer_engine" / "pytorch" / "tensor" / "broken.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def broken(:\n")
    with pytest.raises(
        te_compat.TECompatError, match=r"cannot read Transformer Engine source .*broken\.py.*SyntaxError"
    ):
        te_compat.verify_installed(source_dir=tmp_path / "transformer_engine", release="2.20.2")


# ---- a source tree that cannot be read, or that says which release it is ----


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b'NAME = "\xff\xfe"\n', "not UTF-8"),
        (b"x = 1\n# caf\xe9\n", "not UTF-8 in a comment"),
        (b"class Broken(:\n", "not Python"),
        (b"x = 1\x00\n", "a NUL byte"),
    ],
)
def test_cli_verify_an_unreadable_source_file_is_one_line_and_exit_2(
    content: bytes, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "transformer_engine" / "pytorch" / "tensor" / "broken.py"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    assert main(["verify", "--source", str(tmp_path), "--release", "2.20.2"]) == 2, what
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert (
        captured.err.startswith("te-compat verify: cannot read Transformer Engine source")
        and "broken.py" in captured.err
    )
    assert main(["verify", "--json", "--source", str(tmp_path), "--release", "2.20.2"]) == 2
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["ok"] is False and "broken.py" in data["error"] and "SyntaxError" in data["error"]


def test_a_file_python_would_not_decode_fails_a_tree_that_otherwise_agrees(
    te_source: Unpacker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(te_source("2.20.2"), tmp_path / "te")
    extra = copy / "transformer_engine" / "pytorch" / "tensor" / "extra.py"
    extra.write_bytes(b'"""Module."""\n\nVALUE = 1  # caf\xe9, in Latin-1\n')  # no coding cookie: UTF-8
    assert main(["verify", "--source", str(copy), "--release", "2.20.2"]) == 2
    err = capsys.readouterr().err
    assert "extra.py" in err and "line 3: byte 0xe9 does not decode as utf-8" in err and err.count("\n") == 1
    extra.write_bytes(b"# -*- coding: latin-1 -*-\n" + extra.read_bytes())  # PEP 263: Latin-1, as Python reads it
    assert main(["verify", "--source", str(copy), "--release", "2.20.2"]) == 0
    assert "agrees with the release table" in capsys.readouterr().out


def test_cli_verify_source_reads_the_release_the_tree_states(
    te_source: Unpacker, installed_te: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    # an unpacked wheel states its release in its dist-info; the installed TE (none, or another
    # release) is not asked
    for installed in (None, "2.20.2"):
        installed_te(installed)
        assert main(["verify", "--json", "--source", str(te_source("2.14.1"))]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["release"] == "2.14.1" and data["ok"] is True
        assert {"grouped 2.14 +", "mxfp8 2.12 +"} <= set(data["rows"])


def test_a_te_checkout_states_its_release_in_build_tools(te_source: Unpacker, tmp_path: Path) -> None:
    # TE's own build reads the first line of build_tools/VERSION.txt (build_tools/te_version.py),
    # "2.21.0-dev0" on its main branch
    checkout = tmp_path / "TransformerEngine"
    shutil.copytree(te_source("2.20.2") / "transformer_engine", checkout / "transformer_engine")
    (checkout / "build_tools").mkdir()
    (checkout / "build_tools" / "VERSION.txt").write_text("2.21.0-dev0\n")
    result = verify_installed(checkout)
    assert result.release == "2.21.0.dev0" and result.beyond_table and result.ok
    assert verify_installed(checkout / "transformer_engine").release == "2.21.0.dev0"
    assert verify_installed(checkout, "2.20.2").release == "2.20.2"  # --release wins


def test_a_tree_that_states_no_release_asks_for_one(
    te_source: Unpacker, tmp_path: Path, installed_te: Installer, capsys: pytest.CaptureFixture[str]
) -> None:
    installed_te("2.20.2")
    bare = shutil.copytree(te_source("2.20.2") / "transformer_engine", tmp_path / "transformer_engine")
    with pytest.raises(
        TEVersionError, match=r"cannot tell which TE release the source at .* verify_installed\(release=\.\.\.\)"
    ):
        verify_installed(bare)
    assert main(["verify", "--source", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which TE release" in err and "--release VERSION" in err and err.count("\n") == 1
    assert main(["verify", "--source", str(tmp_path), "--release", "2.20.2"]) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"release": 2.14}, r"release: expected a version string such as '2.14.1'.*; found 2.14 \(float\)"),
        ({"release": b"2.14"}, r"release: expected .*; found b'2.14' \(bytes\)"),
        ({"source_dir": 123}, r"source_dir: expected a path \(str or os.PathLike\) or None; found 123 \(int\)"),
        ({"source_dir": ["te"]}, r"source_dir: expected a path .*; found \['te'\] \(list\)"),
    ],
)
def test_verify_installed_names_a_bad_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        verify_installed(**kwargs)  # type: ignore[arg-type]
