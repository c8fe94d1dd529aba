"""Which code a live record ran (matrix/provenance.py), against git itself in a scratch repository."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from matrix import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def _write(repo: Path, path: str, text: str) -> None:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)


def _commit(repo: Path, subject: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", subject)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _write(repo, ".gitignore", "__pycache__/\n*.egg-info/\n/matrix/.cache/\n")
    _write(repo, "mok/__init__.py", "x = 1\n")
    _write(repo, "mok/kernels/k.cu", "// kernel\n")
    _write(repo, "te_compat/table.py", "ROWS = ()\n")
    _write(repo, "tests/test_a.py", "def test_a(): pass\n")
    _commit(repo, "first")
    return repo


def test_blob_ids_are_gits() -> None:
    data = b"some bytes\n\x00\xff"
    done = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
    assert provenance.blob_id(data) == done.stdout.decode().strip()


def test_disk_digest_of_a_clean_tree_is_its_commits(repo: Path) -> None:
    _write(repo, "mok/__pycache__/x.cpython-312.pyc", "cache")  # ignored by git, so by the digest too
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.disk_digests(repo) == provenance.git_digests(repo, head)
    _write(repo, "mok/__init__.py", "x = 2\n")
    changed = provenance.disk_digests(repo)
    at_head = provenance.git_digests(repo, head)
    assert at_head is not None
    assert [f for f in provenance.DIGESTED if changed[f] != at_head[f]] == ["mok"]
    assert provenance.git_digests(repo, "0" * 40) is None


def test_this_checkout_digests_as_git_does_where_clean() -> None:
    root = provenance.ROOT
    if provenance.git(root, "rev-parse", "HEAD") is None:
        pytest.skip("not a git checkout")
    if provenance.git(root, "status", "--porcelain", "--untracked-files=all", "--", *provenance.DIGESTED):
        pytest.skip("mok/, te_compat/ or tests/ have uncommitted changes here")
    assert provenance.disk_digests(root) == provenance.git_digests(root, "HEAD")


def test_a_record_goes_stale_when_mok_or_te_compat_change(repo: Path) -> None:
    ran = _git(repo, "rev-parse", "HEAD")
    record = {"commit": ran, "code": provenance.disk_digests(repo)}
    assert provenance.freshness(record, repo).state == "current"

    _write(repo, "tests/test_b.py", "def test_b(): pass\n")
    _commit(repo, "a test only")
    assert provenance.freshness(record, repo).state == "current"  # tests are not the code under test

    _write(repo, "te_compat/table.py", "ROWS = (1,)\n")
    _commit(repo, "table: a row")
    stale = provenance.freshness(record, repo)
    assert stale.state == "stale" and stale.why == "te_compat changed since"
    assert [line.split(" ", 1)[1] for line in stale.commits_since] == ["table: a row"]
    assert stale.short == "stale: te_compat changed since"

    _write(repo, "mok/__init__.py", "x = 3\n")  # uncommitted: stale all the same
    assert provenance.freshness(record, repo).why == "mok, te_compat changed since"


def test_records_without_code_digests(repo: Path) -> None:
    assert provenance.freshness({"date": "2026-12-02"}, repo) == provenance.Freshness("stale", "no commit recorded")
    unknown = provenance.freshness({"commit": "1234567890" * 4}, repo)
    assert unknown.state == "unknown" and "1234567890 unknown to git" in unknown.why
    ran = _git(repo, "rev-parse", "HEAD")
    assert provenance.freshness({"commit": ran}, repo).state == "current"
    _write(repo, "mok/__init__.py", "x = 4\n")
    _commit(repo, "mok: x")
    by_git = provenance.freshness({"commit": ran}, repo)
    assert by_git.state == "stale" and by_git.commits_since[0].endswith("mok: x")


def test_a_run_of_uncommitted_changes_is_named(repo: Path) -> None:
    ran = _git(repo, "rev-parse", "HEAD")
    _write(repo, "tests/test_a.py", "def test_a(): assert 1\n")
    record = {"commit": ran, "code": provenance.disk_digests(repo)}
    assert provenance.ran_its_commit(record, repo) == f"the run's tests differ from commit {ran[:10]}"
    assert provenance.ran_its_commit({**record, "code": provenance.git_digests(repo, ran)}, repo) is None
    assert "unknown to this repository" in str(provenance.ran_its_commit({**record, "commit": "f" * 40}, repo))


def test_the_commit_comes_from_the_environment_or_from_this_checkout_only(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert provenance.head_commit(repo) == _git(repo, "rev-parse", "HEAD")
    inner = repo / "copy"  # a tree without .git inside another checkout: not that checkout's commit
    inner.mkdir()
    assert provenance.head_commit(inner) is None
    monkeypatch.setenv(provenance.COMMIT_ENV, "abc123")
    assert provenance.head_commit(inner) == "abc123"


def test_report_warns_and_counts_what_is_not_current(repo: Path) -> None:
    live = repo / "matrix" / "live"
    live.mkdir(parents=True)
    ran = _git(repo, "rev-parse", "HEAD")
    (live / "2.20.2.json").write_text(json.dumps({"commit": ran, "code": provenance.disk_digests(repo), "date": "d"}))
    (live / "2.12.0.json").write_text(json.dumps({"date": "2026-12-02"}))
    (live / "2.20.2.no-seed.json").write_text("{}")  # a demonstration, not a record to keep current
    _commit(repo, "records")
    lines, behind = provenance.report(provenance.live_records(live), repo)
    assert behind == 1
    assert lines[0] == "WARNING: live record 2.12.0 (no commit, 2026-12-02) is stale: no commit recorded"
    assert lines[1].strip().startswith("0 commit(s) changed mok or te_compat after")
    assert lines[2] == f"2.20.2: current ({ran[:10]}, d)"
