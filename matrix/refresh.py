"""Bring the matrix up to date with PyPI in one command.

    python -m matrix.refresh            (or: nox -s refresh)

Lists transformer-engine releases on PyPI, adds the new ones to matrix/releases.toml, writes
their records (python -m matrix.extract) and native records (python -m matrix.native: the C++
facts, from each release's torch source archive), checks te_compat's table against them, regenerates
the support table (docs/support.md) and its line in README.md, and, when every check passes, moves CHECKED_THROUGH in
te_compat/table.py to the newest release. Review the diff and commit it.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from pathlib import Path

from packaging.version import InvalidVersion, Version

from matrix import extract, native, support
from matrix.check import check_release
from matrix.releases import RELEASES_FILE, release_versions

PYPI_JSON = "https://pypi.org/pypi/transformer-engine/json"
TABLE_FILE = Path(__file__).resolve().parent.parent / "te_compat" / "table.py"
CUDA13_SINCE = Version("2.9")  # first release with a -cu13 core wheel


def pypi_releases() -> list[str]:
    with urllib.request.urlopen(PYPI_JSON, timeout=30) as response:
        data = json.load(response)
    out = []
    for raw, files in data["releases"].items():
        try:
            version = Version(raw)
        except InvalidVersion:
            continue
        if files and version > Version("0.0.0") and not version.is_prerelease:
            out.append(raw)
    return sorted(out, key=Version)


def add_releases(new: list[str], path: Path = RELEASES_FILE) -> None:
    text = path.read_text().rstrip("\n") + "\n"
    for v in new:
        text += f'\n[[release]]\nversion = "{v}"\nlive_cuda = {13 if Version(v) >= CUDA13_SINCE else 12}\n'
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.refresh", description=__doc__.split("\n")[0])
    parser.add_argument("--releases", nargs="*", help="add these instead of asking PyPI")
    args = parser.parse_args(argv)
    known = set(release_versions())
    new = [v for v in (args.releases or pypi_releases()) if v not in known]
    if new:
        add_releases(new)
        extract.main(new)
        native.main(new)
        print(f"added {', '.join(new)}")
    else:
        print("the matrix already lists every release on PyPI")
    failed = {v: check_release(v) for v in release_versions()}
    failed = {v: p for v, p in failed.items() if p}
    for v, problems in failed.items():
        print(f"TE {v}: " + "\n  ".join(problems))
    support.main(["--write"])
    if failed:
        print("fix te_compat/table.py for the releases above, then run this again")
        return 1
    newest = release_versions()[-1]
    text = TABLE_FILE.read_text()
    TABLE_FILE.write_text(re.sub(r'CHECKED_THROUGH = "[^"]+"', f'CHECKED_THROUGH = "{newest}"', text))
    print(f"every release agrees with the table; CHECKED_THROUGH is now {newest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
