"""Which code a live record ran, and whether the repository still holds that code.

A record names the commit it ran (when the machine knew it) and a digest of each source folder as
it was on disk there. The digest is built from git's own blob ids, so it can be computed without
git (the GPU machine gets a copy of the working tree without .git) and compared with any commit's
tree (``git ls-tree``). A record is stale when mok/ or te_compat/ differ from what it ran.

    python -m matrix.provenance [--strict] [RELEASE...]

prints each record's state (current, stale with the commits since, or unknown) and exits 1 only
with --strict when a record is not current.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LIVE_DIR = ROOT / "matrix" / "live"
CODE = ("mok", "te_compat")  # a change in these makes a record stale
DIGESTED = (*CODE, "tests")  # recorded, so a check can say which of them a run differed in
COMMIT_ENV = "TE_COMPAT_COMMIT"  # the commit a copy of the tree without .git holds (matrix/gpu_live.sh)


def blob_id(data: bytes) -> str:
    """git's id of a file's content (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_digest(blobs: dict[str, str]) -> str:
    """One digest of a folder from its files' paths and blob ids (independent of file order)."""
    text = "".join(f"{path} {blob}\n" for path, blob in sorted(blobs.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ignore_patterns(root: Path) -> list[str]:
    """The unanchored patterns of the root .gitignore (build and cache folders, like __pycache__)."""
    path = root / ".gitignore"
    if not path.exists():
        return ["__pycache__", "*.pyc"]
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith(("#", "/", "!"))]


def disk_blobs(root: Path, folder: str, patterns: Iterable[str]) -> dict[str, str]:
    """Blob id of every file under ``root/folder`` that git would not ignore, by repository path."""
    patterns = list(patterns)
    found = {}
    for base, dirs, files in os.walk(root / folder):
        dirs[:] = sorted(d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in patterns))
        for name in files:
            if not any(fnmatch.fnmatch(name, p) for p in patterns):
                path = Path(base, name)
                found[path.relative_to(root).as_posix()] = blob_id(path.read_bytes())
    return found


def disk_digests(root: Path = ROOT, folders: Iterable[str] = DIGESTED) -> dict[str, str]:
    """Digest of each folder as it is on disk now."""
    patterns = ignore_patterns(root)
    return {folder: tree_digest(disk_blobs(root, folder, patterns)) for folder in folders}


def git(root: Path, *args: str) -> str | None:
    """git's output, or None where git is missing, ``root`` is no repository, or git refused."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def git_digests(root: Path, commit: str, folders: Iterable[str] = DIGESTED) -> dict[str, str] | None:
    """Digest of each folder at ``commit`` (None when git does not know the commit)."""
    folders = list(folders)
    listing = git(root, "ls-tree", "-r", "--full-tree", commit, "--", *folders)
    if listing is None:
        return None
    blobs: dict[str, dict[str, str]] = {folder: {} for folder in folders}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        _mode, kind, blob = meta.split()
        if kind == "blob":
            blobs[path.split("/", 1)[0]][path] = blob
    return {folder: tree_digest(files) for folder, files in blobs.items()}


def head_commit(root: Path = ROOT) -> str | None:
    """The commit the tree at ``root`` was checked out from: $TE_COMPAT_COMMIT, else git's HEAD."""
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        return named
    top = git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():  # not a checkout of its own
        return None
    out = git(root, "rev-parse", "HEAD")
    return out.strip() if out else None


@dataclass(frozen=True)
class Freshness:
    """A record against the code here now: ``state`` is current, stale or unknown."""

    state: str
    why: str
    commits_since: tuple[str, ...] = ()

    @property
    def short(self) -> str:
        """The code column of the support table (docs/support.md)."""
        return self.state if self.state == "current" else f"{self.state}: {self.why}"


def _since(root: Path, commit: str) -> tuple[str, ...]:
    out = git(root, "log", "--format=%h %s", f"{commit}..HEAD", "--", *CODE)
    return tuple(out.splitlines()) if out else ()


def freshness(record: dict[str, Any], root: Path = ROOT, now: dict[str, str] | None = None) -> Freshness:
    """Whether mok/ and te_compat/ are still the code ``record`` ran (``now``: digests here)."""
    commit = record.get("commit")
    ran = record.get("code")
    if ran:
        now = now if now is not None else disk_digests(root, CODE)
        changed = [folder for folder in CODE if ran.get(folder) != now.get(folder)]
        if not changed:
            return Freshness("current", "mok and te_compat as the run had them")
        since = _since(root, commit) if commit else ()
        return Freshness("stale", f"{', '.join(changed)} changed since", since)
    if not commit:  # recorded before records named their code: nothing shows it current
        return Freshness("stale", "no commit recorded")
    if git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return Freshness("unknown", f"commit {commit[:10]} unknown to git here")
    if git(root, "diff", "--quiet", commit, "--", *CODE) is not None:
        return Freshness("current", f"{' and '.join(CODE)} are as at {commit[:10]}")
    return Freshness("stale", f"{', '.join(CODE)} changed since {commit[:10]}", _since(root, commit))


def committed_after(path: Path, root: Path = ROOT) -> str | None:
    """For a record naming no commit: how many changes to the code came after it was committed."""
    last = git(root, "log", "-1", "--format=%H", "--", str(path.relative_to(root)))
    if not last:
        return None
    since = _since(root, last.strip())
    return f"{len(since)} commit(s) changed {' or '.join(CODE)} after {last.strip()[:10]} committed this record"


def ran_its_commit(record: dict[str, Any], root: Path = ROOT) -> str | None:
    """A warning when the record's digests are not its commit's (it ran uncommitted changes)."""
    commit, ran = record.get("commit"), record.get("code")
    if not commit or not ran:
        return None
    at_commit = git_digests(root, commit, list(ran))
    if at_commit is None:
        return f"commit {commit[:10]} is unknown to this repository: cannot check what the run held"
    differ = [folder for folder in ran if ran[folder] != at_commit[folder]]
    return f"the run's {', '.join(differ)} differ from commit {commit[:10]}" if differ else None


def live_records(live_dir: Path = LIVE_DIR) -> dict[str, Path]:
    """Each release's record file (not the no-seed demonstrations), by release."""
    return {
        path.name.removesuffix(".json"): path
        for path in sorted(live_dir.glob("*.json"))
        if not path.name.endswith(".no-seed.json")
    }


def report(records: dict[str, Path], root: Path = ROOT) -> tuple[list[str], int]:
    """Lines to print, and how many records are not current."""
    lines, behind = [], 0
    now = disk_digests(root, CODE)
    for release, path in records.items():
        rec = json.loads(path.read_text())
        fresh = freshness(rec, root, now)
        commit = (rec.get("commit") or "no commit")[:10]
        if fresh.state == "current":
            lines.append(f"{release}: current ({commit}, {rec.get('date')})")
        else:
            behind += 1
            lines.append(f"WARNING: live record {release} ({commit}, {rec.get('date')}) is {fresh.short}")
            lines.extend(f"    {c}" for c in fresh.commits_since[:10])
            if len(fresh.commits_since) > 10:
                lines.append(f"    ... {len(fresh.commits_since) - 10} more")
            if not rec.get("commit"):
                lines.append(f"    {committed_after(path, root) or 'git cannot say when it was committed'}")
        mismatch = ran_its_commit(rec, root)
        if mismatch:
            lines.append(f"note: live record {release}: {mismatch}")
    return lines, behind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.provenance", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="releases to check (default: every record in matrix/live/)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a record is stale or unknown")
    args = parser.parse_args(argv)
    records = live_records()
    if args.releases:
        records = {r: records[r] for r in args.releases if r in records}
    lines, behind = report(records)
    print(
        "\n".join(lines) if lines else f"no live record of {', '.join(args.releases) or 'any release'} in matrix/live/"
    )
    if behind:
        print(f"{behind} live record(s) are not current: rerun them with matrix/gpu_live.sh (docs/live-matrix.md)")
    return 1 if args.strict and behind else 0


if __name__ == "__main__":
    sys.exit(main())
