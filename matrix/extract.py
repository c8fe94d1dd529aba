"""Extract the facts te_compat relies on from one TE release's real Python source.

Reads the pure-Python ``transformer-engine`` wheel of a release with :mod:`ast` (no import of
TE, no GPU) and writes ``matrix/records/<release>.json``: for every class defined in TE's
PyTorch tensor modules, its module path, bases (resolved through the module's imports), the
attributes it assigns in its constructors, its properties and its methods.

    python -m matrix.extract 2.14.1            # download (cached) and write the record
    python -m matrix.extract --all             # every release in matrix/releases.toml
    python -m matrix.extract 2.14.1 --check    # fail if the committed record differs
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

MATRIX_DIR = Path(__file__).resolve().parent
RECORDS_DIR = MATRIX_DIR / "records"
WHEEL_CACHE = MATRIX_DIR / ".cache"

# Files of a release that hold its tensor and storage classes (1.x kept Float8Tensor at the
# top of pytorch/; QuantizedTensor moved from tensor/ to pytorch/ in 2.10).
SOURCE_PREFIXES = ("transformer_engine/pytorch/tensor/",)
SOURCE_FILES = (
    "transformer_engine/pytorch/float8_tensor.py",
    "transformer_engine/pytorch/quantized_tensor.py",
)
# Methods that set up an instance: what they assign is what the class "assigns".
CONSTRUCTOR_NAMES = ("__new__", "__init__", "_initialize_storage_fields")


def wheel_path(release: str, cache: Path = WHEEL_CACHE) -> Path:
    """Return the cached wheel of ``transformer-engine==release``, downloading it if needed."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"transformer_engine-{release}-py3-none-any.whl"))
    if found:
        return found[0]
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


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _resolve_relative(module: str, level: int, name: str | None, is_package: bool) -> str:
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _import_map(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> dotted path, for the module-level imports of one file."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, node.level, node.module, is_package) if node.level else (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    if isinstance(node, ast.Subscript):  # Generic[T] and the like
        return _dotted(node.value)
    return None


def _resolve_base(expr: ast.expr, imports: dict[str, str], module: str, local: set[str]) -> str:
    dotted = _dotted(expr) or ast.unparse(expr)
    head, _, rest = dotted.partition(".")
    if head in local and not rest:
        return f"{module}.{head}"
    if head in imports:
        return imports[head] + (f".{rest}" if rest else "")
    return dotted


def _assigned_attrs(func: ast.FunctionDef) -> set[str]:
    """Attributes a constructor assigns on the instance it builds (``self.x = ...``)."""
    args = func.args.posonlyargs + func.args.args
    owners = {args[0].arg} if args and func.name != "__new__" else set()
    if func.name == "__new__" or func.name == "_initialize_storage_fields":
        # __new__ builds ``instance = super().__new__(cls, ...)``; the storage initialiser of
        # 2.14+ takes the instance as a parameter.
        owners |= {a.arg for a in args if a.arg not in ("cls",)}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        owners.add(target.id)
    found: set[str] = set()
    for node in ast.walk(func):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in owners:
                    found.add(sub.attr)
    return found


def _class_facts(cls: ast.ClassDef, imports: dict[str, str], module: str, local: set[str]) -> dict[str, Any]:
    assigns: set[str] = set()
    properties: list[str] = []
    methods: list[str] = []
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = {_dotted(d) or "" for d in node.decorator_list}
            if "property" in decorators:
                properties.append(node.name)
            elif any(d.endswith((".setter", ".deleter")) for d in decorators):
                continue
            else:
                methods.append(node.name)
            if node.name in CONSTRUCTOR_NAMES and isinstance(node, ast.FunctionDef):
                assigns |= _assigned_attrs(node)
        elif isinstance(node, ast.Assign):
            # ``_scale_inv = property(**_make_fp8_attr_property_funcs("scale_inv"))`` (1.x) and
            # ``data = property(_get_data, _set_data)``
            for target in node.targets:
                if (
                    isinstance(target, ast.Name)
                    and isinstance(node.value, ast.Call)
                    and (_dotted(node.value.func) == "property")
                ):
                    properties.append(target.id)
    return {
        "module": module,
        "name": cls.name,
        "bases": [_resolve_base(b, imports, module, local) for b in cls.bases],
        "assigns": sorted(assigns),
        "properties": sorted(set(properties)),
        "methods": sorted(set(methods)),
    }


def extract_wheel(wheel: Path) -> dict[str, Any]:
    """The record of one release: every class of its PyTorch tensor modules."""
    release = wheel.name.split("-")[1]
    classes: dict[str, dict[str, Any]] = {}
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(
            n for n in archive.namelist() if n.endswith(".py") and (n.startswith(SOURCE_PREFIXES) or n in SOURCE_FILES)
        )
        for name in names:
            tree = ast.parse(archive.read(name), filename=name)
            module = _module_name(name)
            imports = _import_map(tree, module, name.endswith("__init__.py"))
            local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    facts = _class_facts(node, imports, module, local)
                    classes[f"{module}.{node.name}"] = facts
    return {"release": release, "source": wheel.name, "classes": dict(sorted(classes.items()))}


def record_path(release: str) -> Path:
    return RECORDS_DIR / f"{release}.json"


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=False) + "\n"


def load_record(release: str) -> dict[str, Any]:
    path = record_path(release)
    if not path.exists():
        raise FileNotFoundError(f"no record for TE {release} at {path}; run `python -m matrix.extract {release}`")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    from matrix.releases import release_versions

    parser = argparse.ArgumentParser(prog="python -m matrix.extract", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="TE releases, e.g. 2.14.1")
    parser.add_argument("--all", action="store_true", help="every release in matrix/releases.toml")
    parser.add_argument("--check", action="store_true", help="compare with the committed record")
    parser.add_argument("--cache", type=Path, default=WHEEL_CACHE, help="wheel cache folder")
    args = parser.parse_args(argv)
    releases = release_versions() if args.all else args.releases
    if not releases:
        parser.error("name at least one release, or --all")
    failed = 0
    for release in releases:
        fresh = dumps(extract_wheel(wheel_path(release, args.cache)))
        if args.check:
            committed = record_path(release).read_text() if record_path(release).exists() else ""
            if fresh != committed:
                failed += 1
                diff = difflib.unified_diff(
                    committed.splitlines(), fresh.splitlines(), "committed", "from wheel", lineterm=""
                )
                print(f"TE {release}: the committed record differs from the release source:")
                print("\n".join(list(diff)[:60]))
            else:
                print(f"TE {release}: record matches the release source")
        else:
            RECORDS_DIR.mkdir(parents=True, exist_ok=True)
            record_path(release).write_text(fresh)
            print(f"TE {release}: wrote {record_path(release).relative_to(MATRIX_DIR.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
