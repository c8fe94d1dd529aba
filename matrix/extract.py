"""Extract the facts te_compat relies on from one TE release's real Python source.

Reads the pure-Python ``transformer-engine`` wheel of a release with :mod:`ast` (no import of
TE, no GPU) and writes ``matrix/records/<release>.json``: for every class defined in TE's
PyTorch tensor modules, its module path, bases (resolved through the module's imports), the
attributes it assigns in its constructors, its properties and its methods. The rules live in
``te_compat/source_facts.py``, shared with ``te-compat verify``, which reads an installed TE.

    python -m matrix.extract 2.14.1            # download (cached) and write the record
    python -m matrix.extract --all             # every release in matrix/releases.toml
    python -m matrix.extract 2.14.1 --check    # fail if the committed record differs
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from te_compat.source_facts import extract_sources, is_source_file

MATRIX_DIR = Path(__file__).resolve().parent
RECORDS_DIR = MATRIX_DIR / "records"
WHEEL_CACHE = MATRIX_DIR / ".cache"


def wheel_path(release: str, cache: Path = WHEEL_CACHE) -> Path:
    """Return the cached wheel of ``transformer-engine==release``, downloading it if needed."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"transformer_engine-{release}-py3-none-any.whl"))
    if found:
        return found[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(cache),
            f"transformer-engine=={release}",
        ],
        check=True,
    )
    found = sorted(cache.glob(f"transformer_engine-{release}-py3-none-any.whl"))
    if not found:
        raise FileNotFoundError(f"pip download of transformer-engine=={release} left no pure-Python wheel in {cache}")
    return found[0]


def extract_wheel(wheel: Path) -> dict[str, Any]:
    """The record of one release: every class of its PyTorch tensor modules."""
    release = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        sources = [(n, archive.read(n)) for n in archive.namelist() if is_source_file(n)]
    return {"release": release, "source": wheel.name, "classes": extract_sources(sources)}


def record_path(release: str) -> Path:
    return RECORDS_DIR / f"{release}.json"


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=False) + "\n"


def load_record(release: str) -> dict[str, Any]:
    path = record_path(release)
    if not path.exists():
        raise FileNotFoundError(f"no record for TE {release} at {path}; run `python -m matrix.extract {release}`")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    from matrix.releases import release_versions

    parser = argparse.ArgumentParser(prog="python -m matrix.extract", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="TE releases, e.g. 2.14.1")
    parser.add_argument("--all", action="store_true", help="every release in matrix/releases.toml")
    parser.add_argument("--check", action="store_true", help="compare with the committed record")
    parser.add_argument("--cache", type=Path, default=WHEEL_CACHE, help="wheel cache folder")
    args = parser.parse_args(argv)
    releases = release_versions() if args.all else args.releases
    if not releases:
        parser.error("name at least one release, or --all")
    failed = 0
    for release in releases:
        fresh = dumps(extract_wheel(wheel_path(release, args.cache)))
        if args.check:
            committed = record_path(release).read_text() if record_path(release).exists() else ""
            if fresh != committed:
                failed += 1
                diff = difflib.unified_diff(
                    committed.splitlines(), fresh.splitlines(), "committed", "from wheel", lineterm=""
                )
                print(f"TE {release}: the committed record differs from the release source:")
                print("\n".join(list(diff)[:60]))
            else:
                print(f"TE {release}: record matches the release source")
        else:
            RECORDS_DIR.mkdir(parents=True, exist_ok=True)
            record_path(release).write_text(fresh)
            print(f"TE {release}: wrote {record_path(release).relative_to(MATRIX_DIR.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
