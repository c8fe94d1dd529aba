"""te_compat.providers: the packages that provide checks and report sections, found through
installed entry points and through declaration files on sys.path, without importing them."""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from te_compat import providers
from te_compat.providers import DECLARATION, DeclarationError, declaration_files, find, on_path, read_declaration
from tests.entry_points import ROOT

GROUP = "te_compat.selftest"


def _declare(folder: Path, package: str, text: str | None) -> Path:
    """``folder/package/`` (a package), holding a declaration of ``text`` unless None."""
    (folder / package).mkdir(parents=True, exist_ok=True)
    (folder / package / "__init__.py").write_text("")
    file = folder / package / DECLARATION
    if text is not None:
        file.write_text(text)
    return file


def test_only_the_first_folder_of_each_name_along_the_path_is_read(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    found_first = _declare(first, "pkg", "[g]\n")
    _declare(second, "pkg", "[g]\n")  # shadowed: import finds first/pkg
    _declare(first, "quiet", None)
    _declare(second, "quiet", "[g]\n")  # shadowed by first/quiet, which declares nothing
    found_other = _declare(second, "other", "[g]\n")
    _declare(first, "not-a-package", "[g]\n")
    (first / "loose.txt").write_text("")
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"zipped/{DECLARATION}", "[g]\n")
    path = [str(archive), str(tmp_path / "gone"), str(first), str(second)]
    assert declaration_files(path) == [("pkg", str(found_first)), ("other", str(found_other))]


def test_the_current_folder_is_read_as_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _declare(tmp_path, "pkg", "[g]\n")
    monkeypatch.chdir(tmp_path)
    assert declaration_files([""]) == [("pkg", str(file))]


def test_a_declaration_reads_as_entry_points_txt(tmp_path: Path) -> None:
    text = "# a comment\n[te_compat.selftest]\nPkg = pkg.checks:listed\n\n[te_compat.report]\npkg.sub = pkg:Rows.rows\n"
    file = _declare(tmp_path, "pkg", text)
    got = [(p.group, p.name, p.value, p.origin) for p in read_declaration("pkg", str(file))]
    assert got == [
        ("te_compat.selftest", "Pkg", "pkg.checks:listed", str(file)),
        ("te_compat.report", "pkg.sub", "pkg:Rows.rows", str(file)),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[g]\nname = pkg.checks\n", r"\[g\] name: expected module:attribute; found 'pkg.checks'"),
        ("[g]\nname = other.checks:f\n", r"\[g\] name: expected a module of package 'pkg', .*; found 'other.checks'"),
        ("name = pkg:f\n", r"expected \[group\] sections .*raised MissingSectionHeaderError"),
        ("[g]\na = pkg:f\na = pkg:g\n", r"raised DuplicateOptionError"),
        ("[g]\n\udcff = pkg:f\n", r"raised UnicodeDecodeError"),
    ],
)
def test_a_bad_declaration_says_what_was_expected(tmp_path: Path, text: str, message: str) -> None:
    file = _declare(tmp_path, "pkg", None)
    file.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(DeclarationError, match=message) as info:
        read_declaration("pkg", str(file))
    assert str(info.value).startswith(str(file))


def test_an_unreadable_declaration_is_one_provider_that_fails_to_load(tmp_path: Path) -> None:
    _declare(tmp_path, "pkg", "[g]\nname = pkg.checks\n")
    (broken,) = on_path(GROUP, [str(tmp_path)])
    assert (broken.name, broken.value, broken.origin) == ("pkg", DECLARATION, str(tmp_path / "pkg" / DECLARATION))
    with pytest.raises(DeclarationError, match="expected module:attribute"):
        broken.load()


def test_a_declared_provider_loads_its_callable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _declare(tmp_path, "declaredpkg", f"[{GROUP}]\nmine = declaredpkg.checks:listed\n")
    (tmp_path / "declaredpkg" / "checks.py").write_text("def listed():\n    return {'declaredpkg.one': print}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (provider,) = [p for p in on_path(GROUP) if p.name == "mine"]  # beside mok's, on sys.path too
    loaded = provider.load()
    assert callable(loaded) and loaded() == {"declaredpkg.one": print}


def _installed(name: str, value: str, dist: object = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, value=value, load=lambda: None, dist=dist)


def test_find_reads_each_provider_once_and_the_file_beside_the_code_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = _declare(tmp_path, "pkg", f"[{GROUP}]\nmok = pkg.checks:new\nsame = pkg.checks:same\n[other]\nx = pkg:x\n")
    installed = [
        _installed("mok", "pkg.old:checks", SimpleNamespace(name="pkg-dist", version="0.9")),  # an older install
        _installed("same", "pkg.checks:same"),  # the same provider, installed too
        _installed("mok", "third.checks:f", SimpleNamespace(name="third", version="2.0")),  # another package's
        _installed("alpha", "alpha:checks"),
    ]
    monkeypatch.setattr(providers, "entry_points", lambda *, group: installed if group == GROUP else [])
    monkeypatch.setattr(providers, "search_path", lambda: [str(tmp_path)])
    got = [(p.name, p.value, p.origin) for p in find(GROUP)]
    assert got == [
        ("alpha", "alpha:checks", "install metadata"),
        ("mok", "pkg.checks:new", str(file)),
        ("mok", "third.checks:f", "the installed distribution third 2.0"),
        ("same", "pkg.checks:same", str(file)),
    ]
    assert [p.name for p in find("other")] == ["x"]


def test_unreadable_metadata_is_one_provider_that_fails_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*, group: str) -> list[object]:
        raise OSError("metadata unreadable")

    monkeypatch.setattr(providers, "entry_points", broken)
    monkeypatch.setattr(providers, "search_path", list)
    (provider,) = find(GROUP)
    assert (provider.name, provider.value, provider.origin) == (
        GROUP,
        "importlib.metadata.entry_points",
        "install metadata",
    )
    with pytest.raises(OSError, match="metadata unreadable"):
        provider.load()


def test_this_checkout_declares_mok_beside_its_code() -> None:
    """The checkout's folder is on sys.path here (tests/conftest.py): mok's file is found there,
    and it wins over, or is the same as, whatever an install of the project declares."""
    by_group = {group: [(p.name, p.value, p.origin) for p in find(group)] for group in (GROUP, "te_compat.report")}
    file = str(ROOT / "mok" / DECLARATION)
    assert ("mok", "mok.selftest:checks", file) in by_group[GROUP]
    assert {("mok", "mok.backend:report", file), ("mok.quantize", "mok.selftest:report", file)} <= set(
        by_group["te_compat.report"]
    )
    assert len([p for p in by_group[GROUP] if p[0] == "mok"]) == 1


def test_a_real_entry_point_of_an_installed_distribution_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """importlib.metadata's own EntryPoint, as te_compat meets it (its dist set by importlib)."""
    dist = importlib.metadata.distribution("pytest")
    points = [p for p in dist.entry_points if p.group == "console_scripts"]
    assert points
    monkeypatch.setattr(providers, "entry_points", lambda *, group: points)
    monkeypatch.setattr(providers, "search_path", list)
    assert {p.origin for p in find("console_scripts")} == {f"the installed distribution pytest {dist.version}"}
