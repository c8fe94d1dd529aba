"""TE version detection: every string form, TE absent, TE present but broken."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from packaging.version import Version

import te_compat
from te_compat import TENotFoundError, TEVersionError, parse_te_version, require_te, te_min_version, testing
from tests import ROOT


@pytest.mark.parametrize(
    ("raw", "release"),
    [
        ("2.14.1", "2.14.1"),
        ("2.3.0.dev0+5fdd7bb", "2.3.0"),
        ("2.14.0.dev0", "2.14.0"),
        ("2.6.0.post1", "2.6.0"),
        ("2.14.0rc1", "2.14.0"),
        ("1.9.0", "1.9.0"),
        ("0.1.0+te2.9.0", "2.9.0"),  # a fork naming the TE release in its local part
        (" 2.20.2\n", "2.20.2"),
    ],
)
def test_parse(raw: str, release: str) -> None:
    assert te_compat.version.release_of(parse_te_version(raw)) == Version(release)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(TEVersionError, match="cannot read Transformer Engine version 'banana'"):
        parse_te_version("banana")


def test_dev_build_counts_as_its_release(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.14.0.dev0+abc123")
    assert te_min_version("2.14")
    assert te_min_version("2.14.0")
    assert not te_min_version("2.14.1")
    assert te_compat.te_version() == Version("2.14.0.dev0+abc123")
    assert require_te("2.13", feature="grouped") == Version("2.14.0.dev0+abc123")


def test_absent(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te(None)
    status = te_compat.te_status()
    assert not status.present and status.version is None
    assert "not installed" in status.reason
    assert not te_min_version("1.0")
    with pytest.raises(
        TENotFoundError,
        match=r"Transformer Engine >= 2.12 is required for swizzle; found: "
        r"transformer_engine is not installed",
    ):
        require_te("2.12", feature="swizzle")


def test_too_old(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.11.0", "transformer-engine-cu13")
    with pytest.raises(
        TEVersionError,
        match=r">= 2.12 is required for the flag; found 2.11.0 \(from "
        r"transformer-engine-cu13\)",
    ):
        require_te("2.12", feature="the flag")


def test_unparseable_metadata_is_reported_not_raised(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("not-a-version")
    status = te_compat.te_status()
    assert status.version is None and status.raw_version == "not-a-version"
    assert "cannot read" in status.reason


def _run(code: str, path: Path) -> str:
    env_code = f"import sys; sys.path.insert(0, {str(path)!r}); " + textwrap.dedent(code)
    root = ROOT
    done = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, cwd=root, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("dist", "version"),
    [
        ("transformer_engine", "2.3.0.dev0+5fdd7bb"),
        ("transformer_engine_cu13", "2.20.2"),
        ("transformer_engine_cu12", "1.13.0"),
        ("transformer_engine_torch", "2.9.0"),
    ],
)
def test_version_from_real_package_metadata(tmp_path: Path, dist: str, version: str) -> None:
    info = tmp_path / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    out = _run("import te_compat; s = te_compat.te_status(); print(s.raw_version, s.source)", tmp_path)
    assert out.split()[0] == version
    assert out.split()[1].replace("-", "_") == dist


def test_module_version_wins_when_imported(tmp_path: Path) -> None:
    pkg = tmp_path / "transformer_engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '2.14.1'\n")
    out = _run(
        "import transformer_engine, te_compat; s = te_compat.te_status(); print(s.raw_version, s.source)", tmp_path
    )
    assert out == "2.14.1 transformer_engine.__version__"


def fake_te(root: Path, *, metadata: str | None, init: str = "", pytorch_init: str = "") -> Path:
    """A transformer_engine package in ``root`` (for sys.path): with a dist-info of version
    ``metadata`` or none (a source checkout), and the given ``__init__`` sources."""
    if metadata is not None:
        info = root / f"transformer_engine-{metadata}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformer_engine\nVersion: {metadata}\n")
    pkg = root / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    (pkg / "pytorch" / "__init__.py").write_text(pytorch_init)
    return root


def test_te_whose_import_raises_is_present_but_unusable(tmp_path: Path) -> None:
    # A TE that installs (metadata) but whose native loader fails, as on a machine without CUDA.
    raises = "raise OSError('libcudart.so.13: cannot open shared object file')\n"
    fake_te(tmp_path, metadata="2.20.2", pytorch_init=raises)
    out = _run(
        """
        import json, te_compat
        c = te_compat.capabilities()
        print(json.dumps([c.te_present, c.te_usable, c.te_version, c.te_reason]))
        """,
        tmp_path,
    )
    import json

    present, usable, version, reason = json.loads(out)
    assert present is True and usable is False and version == "2.20.2"
    assert "OSError: libcudart.so.13" in reason


# Installed release, asked minimum, answer. As strings "2.9.0" >= "2.14" and "2.10.0" < "2.9";
# the answers below are what the release numbers say.
MIN_VERSION_CASES = [
    ("2.9.0", "2.14", False),
    ("2.14.0", "2.9", True),
    ("2.14.1", "2.9.0", True),
    ("2.10.0", "2.9", True),
    ("2.9.0", "2.10", False),
    ("1.13.0", "1.9", True),
    ("1.9.0", "1.13", False),
    ("2.20.2", "2.20.10", False),
    ("2.20.10", "2.20.2", True),
    ("2.14.0", "2.14", True),
    ("2.14", "2.14.0", True),  # releases of different lengths: 2.14 is 2.14.0
    ("2.13.99", "2.14", False),
    # dev, pre, post and local builds count as their release
    ("2.9.0.dev0+5fdd7bb", "2.14", False),
    ("2.14.0.dev0+5fdd7bb", "2.9", True),
    ("2.10.0rc1", "2.9", True),
    ("2.9.0.post1", "2.10", False),
    ("0.1.0+te2.10.0", "2.9", True),  # a fork naming its TE release in the local part
    ("0.1.0+te2.9.0", "2.10", False),
    ("0.1.0+te2.14", "2.14.0", True),
]


@pytest.mark.parametrize(("installed", "asked", "expected"), MIN_VERSION_CASES)
def test_min_version_compares_releases_not_strings(installed: str, asked: str, expected: bool, installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te(installed)
    assert te_min_version(asked) is expected


# The newest release matrix/ checked the table against, when these literals were written.
LAST_CHECKED = "2.20.2"


@pytest.mark.parametrize(
    ("installed", "in_table"),
    [
        ("2.20.2", True),  # exactly the last checked release
        ("2.20.2.dev0+abc123", True),  # a dev build of it counts as it
        ("2.20.2.post1", True),
        ("2.19.0", True),
        ("1.9.0", True),
        ("2.20.3", False),
        ("2.21.0.dev0", False),
        ("2.21.0", False),
        ("3.0.0", False),
    ],
)
def test_te_in_table_up_to_the_last_checked_release(installed: str, in_table: bool, installed_te) -> None:  # type: ignore[no-untyped-def]
    from matrix.releases import release_versions

    assert release_versions()[-1] == LAST_CHECKED, "the matrix moved on: update LAST_CHECKED and these cases"
    installed_te(installed)
    caps = te_compat.capabilities(import_te=False)
    assert caps.te_in_table is in_table
    assert caps.table_checked_through == LAST_CHECKED


def test_a_te_without_metadata_has_its_version_once_imported(tmp_path: Path) -> None:
    # A TE source checkout on PYTHONPATH has no dist-info: before its import, only find_spec sees
    # it (no version); once imported, its __version__ is the version, for every later question.
    fake_te(tmp_path, metadata=None, init="__version__ = '2.14.1'\n")
    out = _run(
        """
        import json, te_compat
        before = te_compat.te_status()
        caps = te_compat.capabilities(verify=False)
        after = te_compat.te_status()
        print(json.dumps([before.version is None, before.source, caps.te_version, caps.te_usable,
                          str(after.version), after.source, str(te_compat.te_version()), caps.tensor_kinds]))
        """,
        tmp_path,
    )
    import json

    no_version, source, caps_version, usable, version, after_source, te_version, kinds = json.loads(out)
    assert no_version is True and source == "transformer_engine (no version metadata)"
    assert caps_version == "2.14.1" and usable is True and "grouped" in kinds
    assert version == te_version == "2.14.1" and after_source == "transformer_engine.__version__"


# ------------------------------------------------------------------------------ builds of a release


def _boundaries() -> list[str]:
    """Every release (``X.Y.Z``) where a row of te_compat's tables starts or stops: where a build
    of it read as an earlier version (2.13.0.dev0 and 2.13.0rc1 sort before 2.13.0 in PEP 440)
    would get the rows of the release before."""
    from te_compat import table

    ranges = [*table.ROWS, *table.RECIPROCAL_ROWS, *table.POST_ALL_GATHER_ROWS, *table.QUANTIZER_FLAG_ROWS]
    found = {r.since for r in ranges} | {r.until for r in ranges if r.until is not None}
    return sorted({".".join(map(str, (*Version(v).release, 0, 0)[:3])) for v in found}, key=Version)


def _reported(raw: str) -> dict[str, Any]:
    """What te_compat reports of its tables with TE ``raw`` installed: the capabilities (less the
    version string itself), and for each tensor kind it reports, the class and attributes of
    te_compat.testing's fake of that release and the storage te_compat reads off it."""
    with testing.installed_release(raw):
        capabilities = te_compat.capabilities(import_te=False, verify=False).as_dict()
        del capabilities["te_version"]
        fakes = {}
        for kind in capabilities["tensor_kinds"]:
            fake = testing.fake_tensor(kind, (2, 64, 64) if kind == "grouped" else (64, 64))
            cls = type(fake)
            fakes[kind] = (
                f"{cls.__module__}.{cls.__qualname__}",
                sorted(vars(fake)),
                sorted(te_compat.storage_values(fake)),
            )
        return {"capabilities": capabilities, "fakes": fakes, "rule": te_compat.mxfp8_reciprocal_rule()}


BUILDS = st.tuples(  # PEP 440's order: pre-release, post, dev, local
    st.sampled_from(["", "a1", "b1", "rc1", "rc2"]),
    st.sampled_from(["", ".post1"]),
    st.sampled_from(["", ".dev0", ".dev3"]),
    st.sampled_from(["", "+abc", "+5fdd7bb", "+cu13.torch2.9"]),
).map("".join)


@settings(max_examples=40, deadline=None)
@given(release=st.sampled_from(_boundaries()), build=BUILDS)
@example(release="2.13.0", build=".dev0")
@example(release="2.13.0", build="rc1")
@example(release="2.13.0", build="+abc")
def test_a_build_of_a_release_gets_that_release_s_rows(release: str, build: str) -> None:
    """A dev, pre-release, post or local build of a release (``2.13.0.dev0``, ``2.13.0rc1``,
    ``2.13.0+abc``) has that release's classes: te_compat reports of it exactly what it reports of
    the release, at every release where its tables change."""
    assert _reported(release + build) == _reported(release)
