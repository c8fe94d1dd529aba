"""The entry points pyproject.toml declares, made visible to a subprocess without installing the
checkout: a dist-info folder holding them, for its PYTHONPATH (the GPU machine runs the checkout
from PYTHONPATH, and the editable install of a worktree's environment may be another checkout's).
te_compat reads each (name, value) once, so one also installed is not run twice."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def declared() -> dict[str, dict[str, str]]:
    """group -> {name: value} of pyproject.toml's [project.entry-points]."""
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"])


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


def environ(folder: Path) -> dict[str, str]:
    """os.environ with the checkout and ``dist_info(folder)`` first on PYTHONPATH."""
    path = os.pathsep.join([str(ROOT), str(dist_info(folder)), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}
