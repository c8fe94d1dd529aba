"""The TE releases in the matrix (``matrix/releases.toml``), in release order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib arrived in 3.11
    import tomli as tomllib  # type: ignore[no-redef]
from packaging.version import Version

RELEASES_FILE = Path(__file__).resolve().parent / "releases.toml"


@dataclass(frozen=True)
class MatrixRelease:
    version: str
    live_cuda: int  # CUDA major version a real install of this release needs
    source_from: str  # the release whose wheel carries this release's source (itself, mostly)

    @property
    def testable_with(self) -> str:
        return f"source everywhere; live on a GPU with CUDA {self.live_cuda} libraries"


def matrix_releases(path: Path = RELEASES_FILE) -> list[MatrixRelease]:
    data = tomllib.loads(path.read_text())
    rows = [
        MatrixRelease(r["version"], int(r["live_cuda"]), r.get("source_from", r["version"])) for r in data["release"]
    ]
    return sorted(rows, key=lambda r: Version(r.version))


def release_versions(path: Path = RELEASES_FILE) -> list[str]:
    return [r.version for r in matrix_releases(path)]


def matrix_release(version: str, path: Path = RELEASES_FILE) -> MatrixRelease:
    for row in matrix_releases(path):
        if row.version == version:
            return row
    raise KeyError(f"TE {version} is not in {path.name}; known: {', '.join(release_versions(path))}")
