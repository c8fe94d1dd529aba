"""Every code block of README.md and of docs/*.md: each says what it is (python, sh or text), and
every python block runs as it stands, here on a CPU without TE, each in a namespace of its own,
its test named by its file and line. A python block on the line after NEEDS_TE shows TE's own
weights: it is compiled everywhere and run only where TE and a CUDA device are, skipped elsewhere
saying why. The blocks that show a whole API are also checked for what they print and define."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import te_compat

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
LANGUAGES = {"python", "sh", "text"}
NEEDS_TE = "<!-- doc-blocks: needs TE and a GPU -->"  # the line before a block that runs only there
PAGES = [
    "te_compat.md",
    "views-and-refresh.md",
    "kernels.md",
    "bf16-on-the-fly.md",
    "weights.md",
    "export.md",
    "matrix.md",
    "benchmarks.md",
    "benchmark-results.md",
    "kernel-notes.md",
    "live-matrix.md",
    "support.md",
    "architecture.md",
]


def documents() -> list[str]:
    """README.md and every page of docs/, as paths relative to the repository."""
    return ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def blocks(document: str) -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block of ``document``."""
    text = (ROOT / document).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in FENCE.finditer(text)]


def python_blocks() -> list[tuple[str, int, str]]:
    """(document, line, text) of every python block of every document."""
    return [(d, line, body) for d in documents() for line, lang, body in blocks(d) if lang == "python"]


def needs_te(document: str, line: int) -> bool:
    """Whether the block at ``line`` (1-based, its opening fence) of ``document`` follows NEEDS_TE."""
    lines = (ROOT / document).read_text().splitlines()
    return line >= 2 and lines[line - 2].strip() == NEEDS_TE


def why_no_te() -> str | None:
    """Why a NEEDS_TE block cannot run here (None: TE and a CUDA device are here)."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA device"
    caps = te_compat.capabilities()
    return None if caps.te_usable else f"needs a usable Transformer Engine: {caps.te_reason}"


def section_block(document: str, heading: str) -> str:
    """The first python block of the section ``## heading`` of ``document`` (of the text before
    the first section for ``heading=""``)."""
    text = (ROOT / document).read_text()
    section = text.split(f"\n## {heading}\n", 1)[1] if heading else text
    found = FENCE.search(section.split("\n## ", 1)[0])
    assert found and found["lang"] == "python", f"{document}: section {heading!r} has no python block"
    return found["body"]


def run(code: str, name: str) -> dict[str, object]:
    """``code`` run as a block of the documents is: in its own namespace, ``name`` its file name
    in tracebacks, the UserWarning of prepare_shared_expert_config silenced; the namespace."""
    namespace: dict[str, object] = {"__name__": name}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # prepare_shared_expert_config says what it did
        exec(compile(code, name, "exec"), namespace)
    return namespace


def test_the_readme_leads_to_every_page() -> None:
    found = documents()[1:]
    assert {f"docs/{p}" for p in PAGES} <= set(found), "a page of docs/ is gone"
    readme = (ROOT / "README.md").read_text()
    unlinked = [p for p in PAGES if f"](docs/{p})" not in readme]
    assert not unlinked, f"README.md links no {unlinked}"
    unnamed = [p for p in found if p not in readme]
    assert not unnamed, f"README.md does not name {unnamed}"
    assert len(readme.splitlines()) <= 250, "README.md is the front hall: at most 250 lines; the reference is in docs/"


def test_every_relative_link_leads_to_a_file() -> None:
    broken = []
    for document in documents():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / document).read_text()):
            if "://" not in target and not (ROOT / document).parent.joinpath(target).exists():
                broken.append(f"{document}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


@pytest.mark.parametrize("document", documents())
def test_every_block_is_found_and_says_what_it_is(document: str) -> None:
    text = (ROOT / document).read_text()
    fences = len(re.findall(r"^```", text, flags=re.MULTILINE))
    found = blocks(document)
    assert fences == 2 * len(found), f"{document}: an unclosed fence, or one inside a block"
    unmarked = [(line, lang) for line, lang, _ in found if lang not in LANGUAGES]
    assert not unmarked, f"{document}: blocks must be python, sh or text: {unmarked}"


def test_the_python_blocks_are_found() -> None:
    per_document = {d: sum(1 for doc, _, _ in python_blocks() if doc == d) for d in documents()}
    assert per_document["README.md"] == 2, "README.md has two python blocks: TE's weights, then the fakes"
    for page in ("te_compat.md", "views-and-refresh.md", "kernels.md", "bf16-on-the-fly.md", "weights.md"):
        assert per_document[f"docs/{page}"] >= 1, f"docs/{page} shows its API in a python block"
    assert sum(per_document.values()) >= 8


@pytest.mark.parametrize(
    ("document", "line", "code"), python_blocks(), ids=[f"{d} line {n}" for d, n, _ in python_blocks()]
)
def test_every_python_block_runs(document: str, line: int, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"{document}, the block at line {line}"
    compile(code, name, "exec")
    if needs_te(document, line) and (why := why_no_te()):
        pytest.skip(f"{name} shows TE's own weights: {why}")
    before = te_compat.te_status()
    namespace = run(code, name)
    assert te_compat.te_status() == before  # a block that pretends a release ends its pretence
    assert len(namespace) > 1  # it defined something


def test_the_readme_starts_with_te_own_weights() -> None:
    """The README's first python block, within its first 30 lines, views and refreshes a real TE
    model's expert weights; it is the only block marked NEEDS_TE there, and the fakes follow."""
    (first, _, code), (second, _, _) = [b for b in blocks("README.md") if b[1] == "python"]
    assert needs_te("README.md", first) and not needs_te("README.md", second)
    assert first + code.count("\n") <= 30, "the first call on TE's weights ends within the README's first 30 lines"
    assert "import transformer_engine.pytorch as te" in code and "te.GroupedLinear(" in code
    assert code.count("mok.split_weight_view(experts,") == 2 and "cached=view)" in code


def test_the_quickstart_views_the_fakes(capsys: pytest.CaptureFixture[str]) -> None:
    namespace = run(section_block("README.md", "Without TE: fakes for tests"), "README.md (Without TE)")
    assert capsys.readouterr().out.strip() == "torch.Size([8, 4, 32, 16])"  # the grouped layout printed
    view, grouped, experts = namespace["view"], namespace["grouped"], namespace["experts"]
    assert isinstance(experts, list) and len(experts) == namespace["E"] == 4
    import mok

    assert isinstance(view, mok.SplitExpertWeights) and isinstance(grouped, mok.GroupedExpertWeights)
    assert view.refresh_plan.plans == 1  # the refresh reran the prepared launch: nothing planned again


def test_the_te_compat_tour_reads_its_stand_ins(capsys: pytest.CaptureFixture[str]) -> None:
    run(section_block("docs/te_compat.md", ""), "docs/te_compat.md (its first block)")
    assert "fc1        mxfp8  enabled" in capsys.readouterr().out  # the report printed, the fake's flag set


def test_the_kernels_tour_converts_separate_tensors() -> None:
    namespace = run(section_block("docs/kernels.md", ""), "docs/kernels.md (its first block)")
    outs, list_of_scales = namespace["outs"], namespace["list_of_scales"]
    assert isinstance(outs, list) and isinstance(list_of_scales, list) and len(outs) == len(list_of_scales) == 4


def test_the_bf16_page_counts_where_te_and_ocp_differ(capsys: pytest.CaptureFixture[str]) -> None:
    page = (ROOT / "docs" / "bf16-on-the-fly.md").read_text()
    flat = " ".join(page.split())
    assert "rows of contiguous columns" in flat and "a 16-byte aligned start" in flat
    assert "for 23.5% of finite BF16 `amax` values: 7657 of the 32640" in flat
    namespace = run(section_block("docs/bf16-on-the-fly.md", "Not the OCP MX rule"), "docs/bf16-on-the-fly.md (OCP)")
    assert round(100 * int(namespace["differ"].sum()) / namespace["amax"].numel(), 1) == 23.5  # type: ignore[attr-defined]
