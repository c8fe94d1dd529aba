"""How te_compat finds the packages that provide checks and report sections, made testable.

- :func:`declared`: the entry points pyproject.toml declares, and :func:`declaration`: what
  mok/te_compat_entry_points.txt declares for runs from a path (the two must agree);
- :func:`dist_info`: a folder holding pyproject's entry points as an installed distribution's
  metadata, for a subprocess's sys.path (what a wheel's install gives, without installing);
- :func:`isolated`: a subprocess on a clean copy of the packages, with the installed te-compat
  distribution hidden (``python -S`` and a sys.path that holds the site-packages without it), so
  what it finds comes from the copy alone;
- :func:`only_installed`: in this process, te_compat sees the given entry points and no
  declaration file on sys.path.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DECLARATION = ROOT / "mok" / "te_compat_entry_points.txt"
# what hides this project's installs from a subprocess: the distribution's metadata and the
# editable install's import hooks
INSTALL_NAMES = ("te_compat", "te-compat", "__editable__")


class _CaseKept(configparser.ConfigParser):
    def optionxform(self, optionstr: str) -> str:
        return optionstr


def declared() -> dict[str, dict[str, str]]:
    """group -> {name: value} of pyproject.toml's [project.entry-points]."""
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"])


def declaration(path: Path = DECLARATION) -> dict[str, dict[str, str]]:
    """group -> {name: value} of a declaration file, read as entry_points.txt is."""
    parser = _CaseKept(delimiters=("=",), interpolation=None)
    parser.read_string(path.read_text())
    return {group: dict(parser.items(group)) for group in parser.sections()}


def dist_info(folder: Path) -> Path:
    """A folder (made in ``folder``) for sys.path that declares the checkout's entry points."""
    info = folder / "te_compat_checkout-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: te-compat-checkout\nVersion: 0\n")
    lines = []
    for group, points in declared().items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in points.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return folder


def path_environ() -> dict[str, str]:
    """os.environ with the checkout first on PYTHONPATH: the project run from a path, as the GPU
    machine runs it (no install metadata of its own needed)."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def copy_packages(dest: Path, packages: Sequence[str] = ("te_compat", "mok")) -> Path:
    """A clean copy of ``packages`` in ``dest`` (no caches, no metadata), as a vendoring user makes."""
    dest.mkdir(parents=True, exist_ok=True)
    for package in packages:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def hidden_install(dest: Path) -> Path:
    """A folder of links to every entry of this interpreter's site-packages but this project's
    install (its metadata and editable hooks): torch and the rest, without te-compat."""
    dest.mkdir(parents=True, exist_ok=True)
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        if not os.path.isdir(folder):
            continue
        for entry in sorted(os.listdir(folder)):
            if entry.startswith(INSTALL_NAMES) or entry.endswith(".pth") or (dest / entry).exists():
                continue
            (dest / entry).symlink_to(os.path.join(folder, entry))
    return dest


# Runs te-compat commands in one process and prints, as JSON, what each printed and returned,
# beside where te_compat and mok came from and which of this project's distributions were visible.
RUNNER = """
import contextlib, importlib.metadata, importlib.util, io, json, sys
from te_compat.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue()})
names = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()})
mok = importlib.util.find_spec("mok")
print(json.dumps({
    "te_compat": sys.modules["te_compat"].__file__,
    "mok": None if mok is None else mok.origin,
    "distributions": [n for n in names if n.lower().startswith("te-compat")],
    "results": results,
}))
"""


def isolated(copy: Path, site_folder: Path, commands: Sequence[Sequence[str]], *extra_path: Path) -> dict[str, Any]:
    """Run te-compat ``commands`` in one ``python -S`` subprocess whose sys.path is the standard
    library, ``copy``, ``extra_path`` and ``site_folder`` (from :func:`hidden_install`), from an
    empty folder; what :data:`RUNNER` prints."""
    scratch = copy.parent / f"{copy.name}-cwd"
    scratch.mkdir(exist_ok=True)
    path = os.pathsep.join(str(p) for p in (copy, *extra_path, site_folder))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-S", "-c", RUNNER, json.dumps([list(c) for c in commands])],
        capture_output=True,
        text=True,
        cwd=scratch,
        env=env,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def only_installed(monkeypatch: pytest.MonkeyPatch, found: dict[str, list[Any]]) -> None:
    """te_compat.providers sees ``found`` (group -> entry points) as what is installed, and no
    declaration file on sys.path."""
    from te_compat import providers

    monkeypatch.setattr(providers, "entry_points", lambda *, group: list(found.get(group, [])))
    monkeypatch.setattr(providers, "search_path", list)
