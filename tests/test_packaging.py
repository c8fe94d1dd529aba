"""What the wheel ships agrees with the source tree: every file the packages hold besides their
Python modules is package data in pyproject.toml (the kernel source, the type markers), or the
source of the optional extension setup.py builds (and the extension built from it in place)."""

from __future__ import annotations

import sys
from fnmatch import fnmatch
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_non_python_file_of_the_packages_is_package_data() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, data = setuptools["packages"], setuptools["package-data"]
    assert "mok.kernels" in packages and any(fnmatch("kernels/mxfp8_swizzle.cu", g) for g in data["mok"])
    built = (ROOT / "setup.py").read_text()
    for top in {p.split(".")[0] for p in packages}:
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc", ".so", ".pyd"):
                continue
            if f'"{path.relative_to(ROOT).as_posix()}"' in built:  # an extension's source, compiled at install
                continue
            inside = path.relative_to(ROOT / top).as_posix()
            assert any(fnmatch(inside, g) for g in data.get(top, [])), f"{top}/{inside} is not package data"
