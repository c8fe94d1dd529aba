"""The documents and the benchmark result files agree: benchmarks/results/ holds only files a
current document cites, each listed in its index with the documents that cite it; every result
file a current document names exists; the generated tables match their files; the current
documents describe the present (no numbered work sessions) and point at no history folder: the git
history keeps earlier runs."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from tests.benchmark_scripts import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
DOCS = ROOT / "docs"
RESULTS = BENCH / "results"
INDEX = RESULTS / "README.md"
# a result file as documents name it: results/NAME, benchmarks/results/NAME or (a page of docs/)
# ../benchmarks/results/NAME; NAME may hold {a,b} alternatives or a * pattern
CITATION = re.compile(r"(?<![\w/.-])(?:\.\./)?(?:benchmarks/)?results/((?:[\w.+-]|\{[^}\s]*\}|\*)+)")
# a path into a history folder of benchmarks/ (work logs, older results), as a document would name it
HISTORY = re.compile(r"(?<![\w.-])(?:benchmarks/|\.\./)?history/")


def documents() -> list[Path]:
    """Every Markdown document of the repository."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [s for s in subfolders if not s.startswith(".") and s != "__pycache__"]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def expand(name: str) -> list[str]:
    """``a{b,c}d`` -> ``[abd, acd]``, every brace in turn."""
    found = re.search(r"\{([^}]*)\}", name)
    if not found:
        return [name]
    head, tail = name[: found.start()], name[found.end() :]
    return [n for option in found.group(1).split(",") for n in expand(head + option + tail)]


def citations(document: Path) -> list[str]:
    """The file name or pattern of every result file ``document`` names."""
    return [name for match in CITATION.finditer(document.read_text()) for name in expand(match.group(1).rstrip("."))]


def cited_by() -> dict[str, set[str]]:
    """File in benchmarks/results/ -> the current documents (but the index) that name it."""
    found: dict[str, set[str]] = {}
    for document in documents():
        if document == INDEX:
            continue
        for pattern in citations(document):
            for name in fnmatch.filter(os.listdir(RESULTS), pattern):
                found.setdefault(name, set()).add(document.relative_to(ROOT).as_posix())
    return found


def index() -> dict[str, set[str]]:
    """The index's rows: file -> the documents its last column names."""
    rows = {}
    for line in INDEX.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[3]))
    return rows


def test_the_current_documents_are_found() -> None:
    names = {d.relative_to(ROOT).as_posix() for d in documents()}
    assert {"README.md", "docs/benchmark-results.md", "docs/kernel-notes.md", "benchmarks/results/README.md"} <= names
    assert {"docs/te_compat.md", "docs/views-and-refresh.md", "docs/kernels.md", "docs/benchmarks.md"} <= names
    assert not any(n.startswith("benchmarks/history/") for n in names), "benchmarks/history/ is in git's history only"


def test_every_result_file_is_indexed_and_cited() -> None:
    files = {f for f in os.listdir(RESULTS) if f != "README.md"}
    rows, cited = index(), cited_by()
    assert files - rows.keys() == set(), "files in benchmarks/results/ missing from its README.md index"
    assert rows.keys() - files == set(), "the index names files that are not in benchmarks/results/"
    uncited = sorted(files - cited.keys())
    assert not uncited, f"cited by no current document (delete them: git keeps them): {uncited}"
    wrong = {f: (rows[f], cited[f]) for f in files if rows[f] != cited[f]}
    assert not wrong, f"the index's 'cited by' column (first) differs from the documents that cite (second): {wrong}"


def test_every_cited_result_file_exists() -> None:
    missing = []
    for document in documents():
        for pattern in citations(document):
            if not fnmatch.filter(os.listdir(RESULTS), pattern):
                missing.append(f"{document.relative_to(ROOT)}: benchmarks/results/{pattern}")
    assert not missing, f"documents cite result files that do not exist: {missing}"


def test_generated_tables_match_their_result_files() -> None:
    tables = benchmark_script("results_tables")
    marked = 0
    for document in tables.DOCUMENTS:
        _, differ = tables.regenerate(document)
        assert not differ, f"{differ}: run python benchmarks/results_tables.py --write"
        marked += document.read_text().count("<!-- table ")
    assert marked >= 6


def test_benchmark_documents_describe_the_present() -> None:
    for document in (DOCS / "benchmark-results.md", DOCS / "kernel-notes.md", INDEX, DOCS / "benchmarks.md"):
        sessions = re.findall(r"\bsessions? \d+", document.read_text(), flags=re.IGNORECASE)
        assert not sessions, f"{document.relative_to(ROOT)} names work sessions {sessions}: git's history keeps those"


def test_no_document_points_at_a_history_folder() -> None:
    """Earlier runs and work logs are in git's history, not in a folder a document could link to."""
    for document in documents():
        found = HISTORY.findall(document.read_text())
        assert not found, f"{document.relative_to(ROOT)} points at {found}: cite git's history instead"


def test_the_readme_says_how_many_wheels_the_tests_download() -> None:
    from matrix.releases import matrix_release, release_versions

    wheels = {matrix_release(r).source_from for r in release_versions()}
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"({len(wheels)} wheels, about" in readme and "`matrix/.cache/`" in readme and "PIP_NO_INDEX=1" in readme
