"""Check the installed TE's own source against the release table, without importing TE.

The matrix checks the table against every PyPI release's wheel; a container or git build
(``2.21.0.dev0+5fdd7bb``) is none of those. Its Python source is on disk, though, so the same
facts are read from it with the same rules (:mod:`te_compat.source_facts`) and checked the same
way: the table is confirmed, or refused with the exact difference, on the very TE that will run.
For a TE newer than the last checked release the newest rows are tried first; where one fails,
the newest older row of that kind that verifies is used, and the result says so.

TE is located with ``importlib.util.find_spec("transformer_engine")``, which reads no TE code
(a top-level package has no parent whose ``__init__`` would run), so this works where TE's
import fails. Parsed files are cached on (path, mtime, size).
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import distributions
from pathlib import Path
from typing import Any, NamedTuple

from packaging.version import Version

from te_compat import table
from te_compat.errors import TECompatError, TENotFoundError, TEVersionError, describe
from te_compat.metadata import check_metadata
from te_compat.source_facts import (
    PACKAGE,
    SOURCE_FILES,
    SOURCE_PREFIXES,
    CheckResult,
    ClassFacts,
    check_bases,
    check_classes,
    check_kind,
    check_row,
    file_classes,
    uncovered_quantized,
)
from te_compat.table import StorageRow, TensorKind
from te_compat.version import DISTRIBUTIONS, parse_te_version, release_of, te_status

# path -> ((mtime_ns, size), facts of its classes): a file is parsed again only when it changed.
_FILE_FACTS: dict[str, tuple[tuple[int, int], dict[str, ClassFacts]]] = {}


@dataclass(frozen=True)
class Verification:
    """The verdict on one TE source tree: does the release table hold for it, and where not."""

    ok: bool
    release: str  # the TE version verified against, as te_compat reads it (dev and local kept)
    source_dir: str  # the transformer_engine package directory that was read
    checked: int  # facts checked: classes looked up, attributes probed, attributes assigned
    problems: tuple[str, ...]  # each names the class, its module, the attribute and the table row
    rows: tuple[str, ...]  # the table rows used, "kind since .. until"
    beyond_table: bool  # the release is newer than table.CHECKED_THROUGH
    newest_rows_verified: bool | None  # beyond the table: did the newest rows hold (else None)
    files: int = 0  # source files read
    uncovered: tuple[str, ...] = ()  # quantized classes no row covers (te_compat sees other_quantized)
    # get_metadata keys of the storage classes against te_compat.metadata (not part of the matrix's table check)
    metadata_problems: tuple[str, ...] = ()
    elapsed_s: float = field(default=0.0, compare=False)

    @property
    def verdict(self) -> str:
        """One line for a person: verified or not, against which rows, and for a newer TE which."""
        where = f"the source at {self.source_dir}"
        if not self.ok:
            count = len(self.problems) + len(self.metadata_problems)
            return f"TE {self.release}: {count} disagreement(s) between {where} and the release table"
        head = f"TE {self.release}: {where} agrees with the release table ({self.checked} facts checked)"
        if not self.beyond_table:
            return head
        newer = f"; newer than the last checked release {table.CHECKED_THROUGH}"
        if self.newest_rows_verified:
            return f"{head}{newer}, the newest rows verified"
        return f"{head}{newer}, the newest rows did not all verify; used: {', '.join(self.rows)}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def find_te_source() -> Path | None:
    """The installed ``transformer_engine`` package directory, found without running its code."""
    try:
        spec = importlib.util.find_spec(PACKAGE)  # top level: no parent __init__ runs
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without __spec__
        return None
    if spec is None:
        return None
    locations = [Path(p) for p in (spec.submodule_search_locations or ())]
    for location in locations:
        if (location / "pytorch").is_dir():
            return location
    return locations[0] if locations else None


def package_dir(source_dir: str | os.PathLike[str]) -> Path:
    """``source_dir`` itself or its ``transformer_engine/`` subfolder: the one holding ``pytorch/``."""
    given = Path(source_dir)
    for candidate in (given, given / PACKAGE):
        if (candidate / "pytorch").is_dir():
            return candidate
    raise TENotFoundError(
        f"expected a {PACKAGE} package directory (one holding pytorch/), or a folder holding "
        f"{PACKAGE}/; found no pytorch/ folder in {given} or {given / PACKAGE}"
    )


def source_files(pkg: Path) -> list[tuple[str, Path]]:
    """(name as in a wheel, file) for every file of ``pkg`` whose classes the table checks."""
    out = [(name, pkg.parent / name) for name in SOURCE_FILES if (pkg.parent / name).is_file()]
    for prefix in SOURCE_PREFIXES:
        top = pkg / prefix.removeprefix(f"{PACKAGE}/")
        for folder, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = Path(folder).relative_to(pkg).as_posix()
            out += [(f"{PACKAGE}/{rel}/{n}", Path(folder, n)) for n in names if n.endswith(".py")]
    return sorted(out)


def _facts(name: str, path: Path) -> dict[str, ClassFacts]:
    try:
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        cached = _FILE_FACTS.get(str(path))
        if cached is not None and cached[0] == key:
            return cached[1]
        facts = file_classes(path.read_bytes(), name)
    except (OSError, SyntaxError, ValueError) as exc:  # unreadable or not Python: a verdict, not a crash
        raise TECompatError(
            f"cannot read Transformer Engine source {path}: expected a readable Python file; found "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    _FILE_FACTS[str(path)] = (key, facts)
    return facts


def read_source_dir(source_dir: str | os.PathLike[str]) -> tuple[dict[str, ClassFacts], int]:
    """(``module.Class`` -> facts, files read) of a TE source tree; the matrix records' ``classes``."""
    files = source_files(package_dir(source_dir))
    classes: dict[str, ClassFacts] = {}
    for name, path in files:
        classes.update(_facts(name, path))
    return dict(sorted(classes.items())), len(files)


def _newest_that_verifies(
    release: Version, classes: dict[str, ClassFacts], kind: TensorKind, rows: Sequence[StorageRow]
) -> CheckResult:
    """Beyond the table: the newest row of ``kind`` if it verifies, else the newest older one that does."""
    kind_rows = [r for r in rows if r.kind is kind]
    if not kind_rows or not kind_rows[-1].covers(release):  # a kind the table stopped covering
        return check_kind(release, classes, kind, kind_rows)
    newest = check_row(release, classes, kind_rows[-1], kind_rows)
    if newest.ok:
        return newest
    for row in reversed(kind_rows[:-1]):
        older = check_row(release, classes, row, kind_rows)
        if older.ok:
            return older
    return newest


def _check_beyond(
    release: Version, classes: dict[str, ClassFacts], rows: Sequence[StorageRow]
) -> tuple[CheckResult, bool]:
    """(the check with the rows used, whether every newest row verified) for a TE beyond the table."""
    result = CheckResult()
    for kind in TensorKind:
        result += _newest_that_verifies(release, classes, kind, rows)
    newest = [kind_rows[-1] for k in TensorKind if (kind_rows := [r for r in rows if r.kind is k])]
    newest_ok = result.ok and all(any(row is n for n in newest) for row in result.rows)
    return result + check_bases(release, classes), newest_ok


def source_release(pkg: Path) -> str | None:
    """The TE version a source tree states, or None where it states none.

    A TE git checkout keeps it in ``build_tools/VERSION.txt`` beside the package (the first line,
    as TE's own build reads it: build_tools/te_version.py); an installed or unpacked wheel in the
    metadata of its distribution beside the package (``transformer_engine-*.dist-info``).
    """
    version_file = pkg.parent / "build_tools" / "VERSION.txt"
    if version_file.is_file():
        try:
            first = version_file.read_text(encoding="utf-8").partition("\n")[0].strip()
        except (OSError, ValueError) as exc:
            raise TEVersionError(
                f"cannot read the TE version of the source at {pkg}: expected a readable UTF-8 {version_file}; "
                f"found {type(exc).__name__}: {exc}"
            ) from exc
        return first or None
    found = {_normalised(d.metadata["Name"] or ""): d.version for d in distributions(path=[str(pkg.parent)])}
    return next((found[name] for name in DISTRIBUTIONS if name in found), None)


def _normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them: transformer_engine_cu12 -> transformer-engine-cu12."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Hints(NamedTuple):
    """How the caller names a source tree and a release, in the errors that ask for one."""

    source: str
    release: str


PYTHON_HINTS = Hints("verify_installed(source_dir=...)", "verify_installed(release=...)")
CLI_HINTS = Hints("te-compat verify --source DIR", "te-compat verify --release VERSION")


def _version_to_verify(release: str | Version | None, pkg: Path | None, hints: Hints) -> Version:
    """``release``; else, for a source tree given, the release it states; else the installed TE's."""
    if isinstance(release, Version):
        return release
    if release is not None:
        return parse_te_version(release)
    if pkg is not None:
        stated = source_release(pkg)
        if stated is None:
            raise TEVersionError(
                f"cannot tell which TE release the source at {pkg} is: expected {pkg.parent / 'build_tools'}"
                f"/VERSION.txt (a TE checkout) or a transformer_engine dist-info in {pkg.parent}; found neither. "
                f"Name the release: {hints.release}"
            )
        return parse_te_version(stated)
    status = te_status()
    if status.version is not None:
        return status.version
    if not status.present and status.source is None:
        raise TENotFoundError(
            "Transformer Engine is not installed, so there is no source to verify; to verify a source "
            f"tree, name it: {hints.source}"
        )
    raise TEVersionError(f"cannot verify the installed Transformer Engine: {status.reason or 'its version is unknown'}")


def _installed_source() -> Path:
    found = find_te_source()
    if found is None:
        raise TENotFoundError(
            f"expected an installed {PACKAGE} package (importlib.util.find_spec({PACKAGE!r})); found none"
        )
    return package_dir(found)


def _check_arguments(source_dir: object, release: object, rows: object, hints: object) -> None:
    if source_dir is not None and not isinstance(source_dir, (str, os.PathLike)):
        raise TypeError(
            f"verify_installed: source_dir: expected a path (str or os.PathLike) or None; found {describe(source_dir)}"
        )
    if release is not None and not isinstance(release, (str, Version)):
        raise TypeError(
            f"verify_installed: release: expected a version string such as '2.14.1', a packaging Version "
            f"or None; found {describe(release)}"
        )
    if not isinstance(rows, (tuple, list)) or not all(isinstance(row, StorageRow) for row in rows):
        raise TypeError(
            f"verify_installed: rows: expected a sequence of te_compat.table.StorageRow (default: the table); "
            f"found {describe(rows)}"
        )
    if not isinstance(hints, Hints):
        raise TypeError(
            f"verify_installed: hints: expected a Hints (PYTHON_HINTS or CLI_HINTS); found {describe(hints)}"
        )


def verify_installed(
    source_dir: str | os.PathLike[str] | None = None,
    release: str | Version | None = None,
    *,
    rows: Sequence[StorageRow] = table.ROWS,
    hints: Hints = PYTHON_HINTS,
) -> Verification:
    """Check the release table against a TE's own source (default: the installed TE's).

    ``source_dir`` (default: where ``transformer_engine`` is installed) is read. ``release`` picks
    the rows; by default the release ``source_dir`` states (:func:`source_release`), or without
    ``source_dir`` the installed TE's version (:func:`te_compat.te_status`). Raises
    TENotFoundError when there is no TE to read, TEVersionError when its version is unreadable
    or unstated, TECompatError for a source file that is not UTF-8 Python, and TypeError naming
    the parameter for an argument of the wrong type.
    ``rows`` (default: the table) lets a maintainer try candidate rows on a TE checkout;
    ``hints`` is how those errors tell the caller to name a tree or a release (the command line
    passes its options, :data:`CLI_HINTS`).
    """
    _check_arguments(source_dir, release, rows, hints)
    start = time.perf_counter()
    given = package_dir(source_dir) if source_dir is not None else None
    version = _version_to_verify(release, given, hints)
    pkg = given or _installed_source()
    classes, files = read_source_dir(pkg)
    beyond = release_of(version) > table.checked_through()
    if beyond:
        result, newest_ok = _check_beyond(version, classes, rows)
    else:
        result, newest_ok = check_classes(version, classes, rows), False
    metadata_checked, metadata_problems = check_metadata(version, pkg)
    return Verification(
        ok=result.ok and not metadata_problems,
        release=str(version),
        source_dir=str(pkg),
        checked=result.checked + metadata_checked,
        problems=result.problems,
        rows=tuple(f"{row.kind} {row.span}" for row in result.rows),
        beyond_table=beyond,
        newest_rows_verified=newest_ok if beyond else None,
        files=files,
        uncovered=tuple(uncovered_quantized(classes, rows)),
        metadata_problems=metadata_problems,
        elapsed_s=time.perf_counter() - start,
    )
