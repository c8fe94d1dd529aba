"""`import te_compat` stays cheap: no TE, no torch, nothing that initialises CUDA."""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _modules_after(code: str) -> set[str]:
    script = f"import sys, json; {code}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(json.loads(out.stdout))


def test_import_te_compat_imports_neither_te_nor_torch() -> None:
    mods = _modules_after("import te_compat")
    assert not {m for m in mods if m.split(".")[0] in ("transformer_engine", "torch", "cuda")}


def test_version_queries_import_nothing_heavy() -> None:
    mods = _modules_after("import te_compat; te_compat.te_version(); te_compat.te_min_version('2.1')")
    assert not {m for m in mods if m.split(".")[0] in ("transformer_engine", "torch", "cuda")}


def test_tensor_kind_does_not_import_te() -> None:
    mods = _modules_after("import torch, te_compat; te_compat.tensor_kind(torch.zeros(1))")
    assert not {m for m in mods if m.split(".")[0] == "transformer_engine"}


def test_nothing_initialises_cuda() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, te_compat, mok; te_compat.tensor_kind(torch.zeros(1)); print(torch.cuda.is_initialized())",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert out.stdout.strip() == "False"


def _imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in its body (functions too)."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return deps


def _import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports."""
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / package).rglob("*.py")
    }
    return {name: (_imported(path) & set(paths)) - {name, package} for name, path in paths.items()}


@pytest.mark.parametrize("package", ["te_compat", "mok"])
def test_no_import_circle_inside_the_package(package: str) -> None:
    graph = _import_graph(package)
    assert len(graph) > 5  # the walk found the modules
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle


def _layers(graph: dict[str, set[str]]) -> int:
    """The longest chain of imports in ``graph`` (a module importing nothing of it is layer 1)."""
    depth: dict[str, int] = {}
    for module in graphlib.TopologicalSorter(graph).static_order():  # each after what it imports
        depth[module] = 1 + max((depth[d] for d in graph[module]), default=0)
    return max(depth.values())


def test_mok_is_at_most_nine_layers_deep() -> None:
    """docs/architecture.md: mok's imports form at most 9 layers, so a module's place in the house
    is found by following a few arrows down."""
    assert _layers(_import_graph("mok")) <= 9


def test_the_layer_count_can_fail() -> None:
    assert _layers({"a": {"b"}, "b": {"c"}, "c": set()}) == 3


def test_the_circle_check_can_fail() -> None:
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).prepare()


def test_te_compat_never_imports_mok_or_matrix() -> None:
    for path in (ROOT / "te_compat").rglob("*.py"):
        assert not {d for d in _imported(path) if d.split(".")[0] in ("mok", "matrix")}, path


# a module path or entry point value naming mok: "mok", "mok.selftest", "mok.selftest:checks"
MOK_NAME = re.compile(r"mok(\.\w+)*(:[\w.]+)?")


def _named_modules(path: Path) -> set[str]:
    """Every string constant of ``path`` that could name a module to import (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_te_compat_names_no_mok_module_to_import_by_string() -> None:
    """importlib.import_module("mok...") or an entry point built in te_compat would import mok by
    name as surely as an import statement: mok declares its providers, te_compat only reads them."""
    assert MOK_NAME.fullmatch("mok.selftest:checks") and not MOK_NAME.fullmatch("mok's kernel")
    for path in (ROOT / "te_compat").rglob("*.py"):
        assert not {s for s in _named_modules(path) if MOK_NAME.fullmatch(s.strip())}, path


def test_finding_the_providers_imports_none_of_them() -> None:
    code = (
        "import sys, json, te_compat.providers as p; "
        "found = [x.name for g in ('te_compat.selftest', 'te_compat.report') for x in p.find(g)]; "
        "print(json.dumps([found, sorted(m for m in sys.modules if m.split('.')[0] == 'mok')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    found, imported = json.loads(out.stdout)
    assert "mok" in found and imported == []


def test_import_te_compat_does_not_search_for_providers() -> None:
    mods = _modules_after("import te_compat")
    assert not {"te_compat.providers", "te_compat.cli", "configparser"} & mods


# a module path naming TE: "transformer_engine", "transformer_engine.pytorch.tensor", "transformer_engine_torch"
TE_NAME = re.compile(r"transformer_engine(_torch)?(\.\w+)*(:[\w.]+)?")


def _te_imports(path: Path) -> set[str]:
    """What ``path`` imports of TE: import statements anywhere in its body, and strings that name
    a TE module (``importlib.import_module("transformer_engine.pytorch")`` imports it as surely)."""
    named = {d for d in _imported(path) if d.split(".")[0] in ("transformer_engine", "transformer_engine_torch")}
    return named | {s for s in _named_modules(path) if TE_NAME.fullmatch(s.strip())}


def test_no_mok_module_imports_transformer_engine(tmp_path: Path) -> None:
    """mok reads and makes TE's objects only through te_compat (te_compat.factory for real ones)."""
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "import importlib\n"
        "def f():\n"
        "    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer\n"
        "    return importlib.import_module('transformer_engine_torch')\n"
    )
    assert _te_imports(leaky) == {
        "transformer_engine.pytorch.tensor.mxfp8_tensor",
        "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Quantizer",
        "transformer_engine_torch",
    }
    paths = sorted((ROOT / "mok").rglob("*.py"))
    assert len(paths) > 20
    assert {str(p.relative_to(ROOT)): _te_imports(p) for p in paths if _te_imports(p)} == {}


def test_mok_s_te_checks_import_te_only_through_te_compat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The self-test's TE checks, run against the stand-in TE, ask te_compat for every TE module."""
    import importlib

    from mok import selftest
    from te_compat import selfcheck
    from tests.fake_te import fake_te

    callers: set[str] = set()
    real = importlib.import_module

    def recording(name: str, package: str | None = None) -> object:
        if name.split(".")[0] in ("transformer_engine", "transformer_engine_torch"):
            callers.add(sys._getframe(1).f_globals["__name__"])
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", recording)
    with fake_te(monkeypatch, "2.20.2"):
        for name, check in selftest.checks().items():
            if name.startswith("mok.te."):
                assert selfcheck.run_check(name, check).status in ("passed", "skipped"), name
    assert callers and all(c.startswith("te_compat.") for c in callers), callers
