"""Every code block of README.md: each says what it is (python, sh or text), and every python
block runs as it stands, here on a CPU without TE, each in a namespace of its own."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import te_compat

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
LANGUAGES = {"python", "sh", "text"}


def blocks() -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block of README.md."""
    readme = (ROOT / "README.md").read_text()
    return [(readme.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in FENCE.finditer(readme)]


def section_block(heading: str) -> str:
    """The python block of the README section ``heading``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = FENCE.search(section)
    assert found and found["lang"] == "python", f"README section {heading!r} has no python block"
    return found["body"]


def python_blocks() -> list[tuple[int, str]]:
    return [(line, body) for line, lang, body in blocks() if lang == "python"]


def test_every_block_is_found_and_says_what_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    fences = len(re.findall(r"^```", readme, flags=re.MULTILINE))
    found = blocks()
    assert fences == 2 * len(found), "an unclosed fence, or one inside a block"
    unmarked = [(line, lang) for line, lang, _ in found if lang not in LANGUAGES]
    assert not unmarked, f"README blocks must be python, sh or text: {unmarked}"
    assert len(python_blocks()) >= 3


@pytest.mark.parametrize(("line", "code"), python_blocks(), ids=[f"line {n}" for n, _ in python_blocks()])
def test_every_python_block_runs(line: int, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = te_compat.te_status()
    namespace: dict[str, object] = {"__name__": f"README.md line {line}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # prepare_shared_expert_config says what it did
        exec(compile(code, f"README.md, the block at line {line}", "exec"), namespace)
    assert te_compat.te_status() == before  # a block that pretends a release ends its pretence
    assert len(namespace) > 1  # it defined something


def test_the_tour_reads_its_stand_ins(capsys: pytest.CaptureFixture[str]) -> None:
    tour = section_block("A short tour")
    namespace: dict[str, object] = {"__name__": "tour"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        exec(compile(tour, "README.md (A short tour)", "exec"), namespace)
    assert "fc1        mxfp8  enabled" in capsys.readouterr().out  # the report printed, the fake's flag set
    outs, list_of_scales = namespace["outs"], namespace["list_of_scales"]
    assert isinstance(outs, list) and isinstance(list_of_scales, list) and len(outs) == len(list_of_scales) == 4
