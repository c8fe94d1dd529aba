"""nox sessions of te-compat. `nox -l` lists them; `nox` runs tests, lint, typecheck and release.

Every session runs in the current environment (venv_backend "none"): the set-up command of the
README installs torch once, and the 30 release sessions need no torch at all (te_compat imports
without it). Measured on a machine of CI's kind (2 cores), 2026-12-02: one release session took
0.5 s this way and 86 s when nox built a venv and installed the project (torch included) for it,
so 30 releases take seconds instead of 40 minutes. `nox --force-venv-backend venv` still gives
isolated environments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))
from matrix.releases import release_versions

nox.options.sessions = ["tests", "lint", "typecheck", "release", "live_status"]
nox.options.default_venv_backend = "none"


def install_project(session: nox.Session, extras: str = "test") -> None:
    """Only when nox was told to build venvs (--force-venv-backend venv): the project itself."""
    if session.venv_backend != "none":
        session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """CPU unit tests (GPU and live tests skip, saying why)."""
    install_project(session, "test,cuda")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the packages."""
    session.run("mypy")


@nox.session
@nox.parametrize("te", release_versions())
def release(session: nox.Session, te: str) -> None:
    """One TE release: download its wheel and its torch extension's source archive (cached),
    re-extract their records, check the table."""
    install_project(session)
    session.run("python", "-m", "matrix.extract", te, "--check")
    session.run("python", "-m", "matrix.native", te, "--check")
    session.run("python", "-m", "matrix.check", te)
    session.run("python", "-m", "matrix.provenance", te)  # a warning line when its live record is stale


@nox.session
def live_status(session: nox.Session) -> None:
    """Each live record in matrix/live/ against the code here: current, or stale with the commits
    since (warnings; `nox -s live_status -- --strict` fails on a record that is not current)."""
    session.run("python", "-m", "matrix.provenance", *session.posargs)


@nox.session
def live(session: nox.Session) -> None:
    """GPU and live-TE tests in this environment; records the run in matrix/live/.

    Skips (with the reason) without a CUDA device or a usable TE; pass --no-record to keep
    matrix/live/ as it is. The live tests write what each comparison ran on beside the junit XML
    (live.evidence.json), and the record folds it in; with TE_COMPAT_LIVE_NO_SEED=1 set the record
    is <release>.no-seed.json. On the offline GPU machine use matrix/gpu_live.sh (docs/live-matrix.md)."""
    record = "--no-record" not in session.posargs
    args = [a for a in session.posargs if a != "--no-record"]
    junit = Path(session.create_tmp()) / "live.xml"
    try:
        session.run("python", "-m", "pytest", "tests/gpu", "tests/live", f"--junitxml={junit}", *args)
    finally:  # a failing run is recorded too, then fails the session
        if record and junit.exists():
            session.run("python", "-m", "matrix.live_record", str(junit))


@nox.session
def bench(session: nox.Session) -> None:
    """The scale-layout benchmark (needs a CUDA device); extra arguments go to the script."""
    try:
        import torch
    except ImportError:
        session.skip("torch is not installed")
    if not torch.cuda.is_available():
        session.skip("the benchmark needs a CUDA device")
    session.run("python", "benchmarks/bench_swizzle.py", *session.posargs)


@nox.session
def refresh(session: nox.Session) -> None:
    """Add TE releases published since the matrix was last refreshed, and check them."""
    session.run("python", "-m", "matrix.refresh", *session.posargs)
