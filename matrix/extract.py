"""Extract the facts te_compat relies on from one TE release's real Python source.

Reads the pure-Python ``transformer-engine`` wheel of a release with :mod:`ast` (no import of
TE, no GPU) and writes ``matrix/records/<release>.json``: for every class defined in TE's
PyTorch tensor modules, its module path, bases (resolved through the module's imports), the
attributes it assigns in its constructors, its properties and its methods. The rules live in
``te_compat/source_facts.py``, shared with ``te-compat verify``, which reads an installed TE.

    python -m matrix.extract 2.14.1            # download (cached) and write the record
    python -m matrix.extract --all             # every release in matrix/releases.toml
    python -m matrix.extract 2.14.1 --check    # fail if the committed record differs

A wheel missing from the cache is downloaded with pip from the package index pip is configured
with; when that index cannot be reached (offline), :class:`IndexUnreachable` says which one.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from te_compat.source_facts import extract_functions, extract_sources, is_source_file

MATRIX_DIR = Path(__file__).resolve().parent
RECORDS_DIR = MATRIX_DIR / "records"
WHEEL_CACHE = MATRIX_DIR / ".cache"
PIP_DEFAULT_INDEX = "https://pypi.org/simple"
PACKAGE = "transformer-engine"
PROBE_TIMEOUT_S = 10.0


class IndexUnreachable(OSError):
    """The package index pip would download a TE wheel from cannot be reached (offline)."""


@functools.cache
def _pip_config_index() -> str | None:
    """The index-url of pip's configuration files (``download.`` over ``global.``), if set."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    values = dict(line.split("=", 1) for line in listed.splitlines() if "=" in line)
    for key in ("download.index-url", "global.index-url"):
        if key in values:
            return values[key].strip().strip("'\"")
    return None


def package_index() -> tuple[str, str]:
    """(URL, where it is set) of the index pip downloads from: ``PIP_INDEX_URL``, else pip's
    configuration, else pip's default, https://pypi.org/simple."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"], "PIP_INDEX_URL"
    configured = _pip_config_index()
    if configured:
        return configured, "pip config index-url"
    return PIP_DEFAULT_INDEX, "pip's default; PIP_INDEX_URL sets another"


@functools.cache
def index_unreachable(url: str) -> str | None:
    """Why the index at ``url`` cannot be reached (its TE page asked once, within
    PROBE_TIMEOUT_S), or None when it answers at all (an HTTP error is an answer)."""
    page = url.rstrip("/") + f"/{PACKAGE}/"
    if page.startswith("file:"):
        folder = urllib.request.url2pathname(urllib.parse.urlparse(page).path)
        return None if Path(folder).is_dir() else f"no folder {folder}"
    cert = os.environ.get("PIP_CERT")  # pip's CA bundle, where one is set
    context = ssl.create_default_context(cafile=cert if cert and Path(cert).is_file() else None)
    try:
        with urllib.request.urlopen(
            urllib.request.Request(page, method="HEAD"), timeout=PROBE_TIMEOUT_S, context=context
        ):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"{type(reason).__name__}: {reason}"


def wheel_path(release: str, cache: Path = WHEEL_CACHE) -> Path:
    """Return the cached wheel of ``transformer-engine==release``, downloading it if needed.

    Raises :class:`IndexUnreachable`, naming the index and why, when the wheel is not cached and
    the index cannot be reached; a download that fails from a reachable index raises as pip did.
    """
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"transformer_engine-{release}-py3-none-any.whl"))
    if found:
        return found[0]
    url, where = package_index()
    why = index_unreachable(url)
    if why is not None:
        raise IndexUnreachable(
            f"{url} ({where}) unreachable: {why}; needed to download {PACKAGE}=={release} into {cache}"
        )
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
    """The record of one release: every class of its PyTorch tensor modules, and the functions
    whose behaviour the table records (te_compat.source_facts.FUNCTIONS; absent ones left out)."""
    release = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        sources = [(n, archive.read(n)) for n in archive.namelist() if is_source_file(n)]
    return {
        "release": release,
        "source": wheel.name,
        "classes": extract_sources(sources),
        "functions": extract_functions(sources),
    }


def record_path(release: str) -> Path:
    return RECORDS_DIR / f"{release}.json"


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=False) + "\n"


def load_record(release: str) -> dict[str, Any]:
    path = record_path(release)
    if not path.exists():
        raise FileNotFoundError(f"no record for TE {release} at {path}; run `python -m matrix.extract {release}`")
    return json.loads(path.read_text())


def records_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    fresh: Callable[[str, Path], str],
    path_of: Callable[[str], Path],
    source: str,
) -> int:
    """The command line of a per-release record (this module's, matrix.native's): write the
    records of the named releases, or with ``--check`` compare them with the committed ones.
    ``fresh(release, cache)`` is the record as read from the release's ``source`` now."""
    from matrix.releases import release_versions

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("releases", nargs="*", help="TE releases, e.g. 2.14.1")
    parser.add_argument("--all", action="store_true", help="every release in matrix/releases.toml")
    parser.add_argument("--check", action="store_true", help="compare with the committed record")
    parser.add_argument("--cache", type=Path, default=WHEEL_CACHE, help="download cache folder")
    args = parser.parse_args(argv)
    releases = release_versions() if args.all else args.releases
    if not releases:
        parser.error("name at least one release, or --all")
    failed = 0
    for release in releases:
        try:
            record = fresh(release, args.cache)
        except IndexUnreachable as exc:
            print(f"TE {release}: {exc}", file=sys.stderr)
            return 2
        path = path_of(release)
        if args.check:
            committed = path.read_text() if path.exists() else ""
            if record != committed:
                failed += 1
                diff = difflib.unified_diff(
                    committed.splitlines(), record.splitlines(), "committed", source, lineterm=""
                )
                print(f"TE {release}: {path.name} differs from the {source}:")
                print("\n".join(list(diff)[:60]))
            else:
                print(f"TE {release}: {path.name} matches the {source}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(record)
            shown = path.relative_to(MATRIX_DIR.parent) if path.is_relative_to(MATRIX_DIR.parent) else path
            print(f"TE {release}: wrote {shown}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return records_main(
        argv,
        prog="python -m matrix.extract",
        description=__doc__.split("\n")[0],
        fresh=lambda release, cache: dumps(extract_wheel(wheel_path(release, cache))),
        path_of=record_path,
        source="release's wheel",
    )


if __name__ == "__main__":
    raise SystemExit(main())
