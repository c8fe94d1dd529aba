"""The facts about TE's classes that the release table relies on, read from TE's Python source.

One set of rules for two readers: ``matrix/`` reads each PyPI release's wheel with them and
commits the result (``matrix/records/<release>.json``), and :func:`te_compat.verify.verify_installed`
reads the installed TE's files with them, so the table is checked the same way on every release
and on the very TE a process will run. The source is parsed with :mod:`ast`; nothing of TE is
imported or executed.

For each class of TE's PyTorch tensor modules: its module path, its bases (resolved through the
module's imports), the attributes its constructors assign, its properties, its methods, and the
parameters of the few methods te_compat calls (``SIGNED_METHODS``). The check
(:func:`check_classes`) compares those facts with the table's rows.
"""

from __future__ import annotations

import ast
import io
import itertools
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from packaging.version import Version

from te_compat import table
from te_compat.table import StorageRow, TensorKind

PACKAGE = "transformer_engine"
# Files of a release that hold its tensor and storage classes (1.x kept Float8Tensor at the
# top of pytorch/; QuantizedTensor moved from tensor/ to pytorch/ in 2.10).
SOURCE_PREFIXES = (f"{PACKAGE}/pytorch/tensor/",)
SOURCE_FILES = (
    f"{PACKAGE}/pytorch/float8_tensor.py",
    f"{PACKAGE}/pytorch/quantized_tensor.py",
)
# Methods that set up an instance: what they assign is what the class "assigns".
CONSTRUCTOR_NAMES = ("__new__", "__init__", "_initialize_storage_fields")
# Methods whose parameters are recorded: the constructors and quantisation entry points that
# te_compat.quantize calls with keywords, so the matrix checks every keyword it passes.
SIGNED_METHODS = ("__init__", "__new__", "make_empty", "quantize", "quantize_", "quantize_impl", "update_quantized")


class ClassFacts(TypedDict):
    """What one TE class is, as read from its source (the records' per-class JSON object)."""

    module: str
    name: str
    bases: list[str]
    assigns: list[str]
    properties: list[str]
    methods: list[str]
    signatures: dict[str, str]  # SIGNED_METHODS defined here -> parameters, ", "-joined (see signature())


# "module.Class" -> facts, for every class of one release's tensor modules.
Classes = Mapping[str, ClassFacts]

# Module-level functions whose behaviour the table records (te_compat.table's behaviour rows).
FUNCTIONS = (table.POST_ALL_GATHER_FUNCTION,)


class FunctionFacts(TypedDict):
    """What one recorded function does, as read from its source: where it starts, and its
    ``isinstance`` dispatch, branch by branch: the classes a branch tests for (resolved through the
    module's imports) and what its body does: "no-op" (only ``pass``), "raises NAME", or "acts"."""

    line: int
    dispatch: list[tuple[list[str], str]]


def is_source_file(name: str) -> bool:
    """True for a file (``transformer_engine/...``, "/"-separated) whose classes are read."""
    return name.endswith(".py") and (name.startswith(SOURCE_PREFIXES) or name in SOURCE_FILES)


def module_name(path: str) -> str:
    """``transformer_engine/pytorch/tensor/__init__.py`` -> ``transformer_engine.pytorch.tensor``."""
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


def _instance_names(func: ast.FunctionDef) -> set[str]:
    """Names that stand for the instance a constructor builds."""
    args = func.args.posonlyargs + func.args.args
    owners = {args[0].arg} if args and func.name != "__new__" else set()
    if func.name in ("__new__", "_initialize_storage_fields"):
        # __new__ builds ``instance = super().__new__(cls, ...)``; the storage initialiser of
        # 2.14+ takes the instance as a parameter.
        owners |= {a.arg for a in args if a.arg != "cls"}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                owners |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return owners


def _assigned_attrs(func: ast.FunctionDef) -> set[str]:
    """Attributes a constructor assigns on the instance it builds (``self.x = ...``)."""
    owners = _instance_names(func)
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


def signature(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A method's parameters after ``self``/``cls``, as written: names (``name=`` where it has a
    default), ``/`` after the positional-only ones, ``*`` before keyword-only ones (``*args`` in
    its place when there is one) and ``**kwargs`` last: ``["fp8_dtype", "*", "rowwise=",
    "columnwise="]`` (records join them with ", "; :func:`parameters` splits them again)."""
    a = func.args
    positional = a.posonlyargs + a.args
    defaulted = len(positional) - len(a.defaults)
    names = [p.arg + ("=" if i >= defaulted else "") for i, p in enumerate(positional)]
    if a.posonlyargs:
        names.insert(len(a.posonlyargs), "/")
    if a.vararg is not None:
        names.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        names.append("*")
    names += [p.arg + ("" if d is None else "=") for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg is not None:
        names.append(f"**{a.kwarg.arg}")
    decorators = {_dotted(d) for d in func.decorator_list}
    if positional and "staticmethod" not in decorators:
        names.pop(0)  # self, or cls of __new__ and classmethods
        if names[:1] == ["/"]:
            names.pop(0)
    return names


def parameters(facts: ClassFacts | Mapping[str, object], method: str) -> list[str] | None:
    """The recorded parameters of ``method`` of one class (None: the class does not define it, or
    its facts predate signatures)."""
    found = facts.get("signatures", {})
    text = found.get(method) if isinstance(found, Mapping) else None
    if not isinstance(text, str):
        return None
    return text.split(", ") if text else []


@dataclass(frozen=True)
class KeywordCall:
    """What a call of a method by keyword may and must pass, through the class's lineage.

    A method that ends in ``**kwargs`` passes the rest on (TE's constructors call
    ``super().__new__(cls, *args, **kwargs)``), so the next class of the lineage that defines it
    takes them: its parameters are accepted too, and its required ones are required unless an
    earlier definer names them itself (and so passes them on explicitly).
    """

    accepted: frozenset[str]  # names that may be passed by keyword
    required: frozenset[str]  # names without a default that nothing earlier supplies
    positional: tuple[str, ...]  # the first definer's positional parameters, in order
    open_ended: bool  # the last definer still takes **kwargs: other names may be accepted too


def keyword_call(classes: Classes, path: str, method: str) -> KeywordCall | None:
    """How ``path.method`` is called by keyword in one release (None: no class of the lineage
    records the method)."""
    accepted: set[str] = set()
    required: set[str] = set()
    positional: tuple[str, ...] | None = None
    forwards = True
    for cls in lineage(classes, path):
        params = parameters(classes[cls], method)
        if params is None or not forwards:
            continue
        only = params.index("/") if "/" in params else 0  # positional-only: not by keyword
        star = next((i for i, n in enumerate(params) if n.startswith("*")), len(params))  # *, *args or **kw
        if positional is None:
            positional = tuple(n.rstrip("=") for n in params[:star] if n != "/")
        named = [n for n in params[only:] if n not in ("/", "*") and not n.startswith("*")]
        required |= {n for n in named if not n.endswith("=")} - accepted
        accepted |= {n.rstrip("=") for n in named}
        forwards = any(n.startswith("**") for n in params)
    if positional is None:
        return None
    return KeywordCall(frozenset(accepted), frozenset(required), positional, forwards)


def class_facts(cls: ast.ClassDef, imports: dict[str, str], module: str, local: set[str]) -> ClassFacts:
    """The facts of one class definition of ``module``."""
    assigns: set[str] = set()
    properties: list[str] = []
    methods: list[str] = []
    signatures: dict[str, str] = {}
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
            if node.name in SIGNED_METHODS and not decorators & {"property", "overload", "typing.overload"}:
                signatures[node.name] = ", ".join(signature(node))
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
        "signatures": dict(sorted(signatures.items())),
    }


def _isinstance_classes(test: ast.expr, imports: dict[str, str], module: str, local: set[str]) -> list[str] | None:
    """The classes ``isinstance(x, C)`` or ``isinstance(x, (A, B))`` tests for; None for another test."""
    if not (isinstance(test, ast.Call) and _dotted(test.func) == "isinstance" and len(test.args) == 2):
        return None
    found = test.args[1]
    items = found.elts if isinstance(found, ast.Tuple) else [found]
    return [_resolve_base(item, imports, module, local) for item in items]


def _outcome(body: list[ast.stmt]) -> str:
    """What a branch does: "no-op" (only ``pass``, docstrings, ``...``), "raises NAME" (its first
    statement that is not one of those raises), or "acts"."""
    real = [
        s
        for s in body
        if not isinstance(s, ast.Pass) and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if not real:
        return "no-op"
    first = real[0]
    if isinstance(first, ast.Raise):
        raised = first.exc.func if isinstance(first.exc, ast.Call) else first.exc
        return f"raises {(_dotted(raised) or 'an exception') if raised is not None else 'again'}"
    return "acts"


def function_facts(func: ast.FunctionDef, imports: dict[str, str], module: str, local: set[str]) -> FunctionFacts:
    """The facts of one function: its first ``if isinstance(...)`` / ``elif`` chain, in order."""
    chained: set[int] = set()
    dispatch: list[tuple[list[str], str]] = []
    for node in ast.walk(func):
        if not isinstance(node, ast.If) or id(node) in chained:
            continue
        if _isinstance_classes(node.test, imports, module, local) is None or dispatch:
            continue
        branch: ast.If | None = node
        while branch is not None:
            classes = _isinstance_classes(branch.test, imports, module, local)
            if classes is None:
                break
            dispatch.append((classes, _outcome(branch.body)))
            nxt = branch.orelse[0] if len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If) else None
            if nxt is not None:
                chained.add(id(nxt))
            branch = nxt
    return {"line": func.lineno, "dispatch": dispatch}


def file_functions(source: bytes | str, name: str) -> dict[str, FunctionFacts]:
    """``module.function`` -> facts, for the functions of :data:`FUNCTIONS` one file defines."""
    module = module_name(name)
    wanted = {f.rsplit(".", 1)[1] for f in FUNCTIONS if f.rsplit(".", 1)[0] == module}
    if not wanted:
        return {}
    tree = ast.parse(decode_source(source) if isinstance(source, bytes) else source, filename=name)
    imports = _import_map(tree, module, name.endswith("__init__.py"))
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return {
        f"{module}.{node.name}": function_facts(node, imports, module, local)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in wanted
    }


def extract_functions(files: Iterable[tuple[str, bytes | str]]) -> dict[str, FunctionFacts]:
    """Facts of every function of :data:`FUNCTIONS` in ``files`` ((name, source) pairs)."""
    found: dict[str, FunctionFacts] = {}
    for name, source in sorted(files, key=lambda f: f[0]):
        if is_source_file(name):
            found.update(file_functions(source, name))
    return dict(sorted(found.items()))


def decode_source(source: bytes) -> str:
    """``source`` decoded as Python decodes a module's file (``importlib.util.decode_source``): by
    its BOM or PEP 263 coding cookie, else as UTF-8, strictly; SyntaxError where Python would refuse
    it. (``ast.parse`` of the bytes checks less: it lets a byte that is not UTF-8 through in a
    comment, and Python's import does not.)"""
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
    except SyntaxError:  # an unusable cookie, or one of the two lines it may be on not UTF-8
        _decoded(b"".join(itertools.islice(io.BytesIO(source), 2)), "utf-8")  # names such a byte
        raise
    return _decoded(source, encoding)


def _decoded(source: bytes, encoding: str) -> str:
    try:
        return source.decode(encoding)
    except UnicodeDecodeError as exc:
        line = source.count(b"\n", 0, exc.start) + 1
        raise SyntaxError(
            f"line {line}: byte {source[exc.start]:#04x} does not decode as {encoding}, the file's encoding "
            "(UTF-8 unless a PEP 263 coding cookie names another); Python refuses such a file"
        ) from exc


def file_classes(source: bytes | str, name: str) -> dict[str, ClassFacts]:
    """``module.Class`` -> facts for every top-level class of one file (``name`` as in a wheel;
    ``source`` its bytes, decoded as Python decodes them, or its text)."""
    tree = ast.parse(decode_source(source) if isinstance(source, bytes) else source, filename=name)
    module = module_name(name)
    imports = _import_map(tree, module, name.endswith("__init__.py"))
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return {
        f"{module}.{node.name}": class_facts(node, imports, module, local)
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def extract_sources(files: Iterable[tuple[str, bytes | str]]) -> dict[str, ClassFacts]:
    """Facts of every class in ``files`` ((name, source) pairs), sorted by ``module.Class``."""
    classes: dict[str, ClassFacts] = {}
    for name, source in sorted(files, key=lambda f: f[0]):
        if is_source_file(name):
            classes.update(file_classes(source, name))
    return dict(sorted(classes.items()))


# ---- the check: the table's rows against one release's facts ----


def lineage(classes: Classes, path: str) -> list[str]:
    """``path`` and every TE base class of it that the release defines, in Python's method
    resolution order (C3): the order attribute lookup on an instance follows, so the first class
    of it that assigns an attribute is the one an instance's value comes from. Bases the release
    does not define (torch.Tensor, abc.ABC) are left out; [] for a class it does not define."""
    return _linearised(classes, path, {}) if path in classes else []


def _linearised(classes: Classes, path: str, done: dict[str, list[str]]) -> list[str]:
    """C3 over the classes the release defines. A hierarchy C3 cannot order (one Python would
    refuse to define, or a class naming itself) takes the first candidate, so a check still runs."""
    if path in done:
        return done[path]
    done[path] = [path]  # a class that names itself as a base ends the walk there
    bases = [b for b in dict.fromkeys(classes[path]["bases"]) if b in classes and b != path]
    pending = [_linearised(classes, b, done) for b in bases] + [bases]
    order = [path]
    while pending := [rest for seq in pending if (rest := [c for c in seq if c not in order])]:
        heads = (seq[0] for seq in pending if not any(seq[0] in other[1:] for other in pending))
        order.append(next(heads, pending[0][0]))
    done[path] = order
    return order


def assigned(classes: Classes, paths: Iterable[str]) -> tuple[set[str], set[str]]:
    """(attributes assigned, properties defined) over the classes and their TE bases."""
    assigns: set[str] = set()
    props: set[str] = set()
    for path in paths:
        for cls in lineage(classes, path):
            assigns |= set(classes[cls]["assigns"])
            props |= set(classes[cls]["properties"])
    return assigns, props


def describe(path: str) -> str:
    """``a.b.C`` -> "class C of module a.b": problems name both."""
    module, _, name = path.rpartition(".")
    return f"class {name} of module {module}"


@dataclass(frozen=True)
class CheckResult:
    """Problems found, how many facts were checked, and the rows the check used."""

    problems: tuple[str, ...] = ()
    checked: int = 0
    rows: tuple[StorageRow, ...] = ()

    def __add__(self, other: CheckResult) -> CheckResult:
        return CheckResult(self.problems + other.problems, self.checked + other.checked, self.rows + other.rows)

    @property
    def ok(self) -> bool:
        return not self.problems


def _first_assigner(classes: Classes, paths: Sequence[str], attr: str) -> str:
    for path in paths:
        for cls in lineage(classes, path):
            if attr in classes[cls]["assigns"]:
                return cls
    return paths[-1]


def check_row(release: Version, classes: Classes, row: StorageRow, kind_rows: Sequence[StorageRow]) -> CheckResult:
    """``row`` against the release: its classes exist, its probes are assigned, nothing unknown."""
    kind, problems = row.kind, []
    for path in row.classes:
        if path not in classes:
            problems.append(
                f"TE {release}: {kind} row {row.span} looks for class {path}, which this release does not define"
            )
    # A class of this kind that the release defines but the row does not name.
    present = sorted({p for r in kind_rows for p in r.classes if p in classes})
    for path in present:
        if path not in row.classes:
            problems.append(f"TE {release}: defines {path} ({kind}), which {kind} row {row.span} does not name")
    found = [p for p in row.classes if p in classes]
    assigns, props = assigned(classes, found)
    for logical, attr in row.storage.items():
        if attr not in assigns and attr not in props:
            problems.append(
                f"TE {release}: {kind} row {row.span} probes {logical!r} as attribute {attr!r}, but "
                f"{describe(row.classes[-1])} (and its TE bases) never assigns it"
            )
    for attr in sorted(assigns - set(row.storage.values()) - row.known):
        problems.append(
            f"TE {release}: {describe(_first_assigner(classes, found, attr))} assigns {attr!r}, unknown to "
            f"the {kind} row {row.span} (a new storage attribute, or a rename?)"
        )
    checked = len(row.classes) + len(present) + len(row.storage) + len(assigns)
    return CheckResult(tuple(problems), checked, (row,))


def check_kind(release: Version, classes: Classes, kind: TensorKind, rows: Sequence[StorageRow]) -> CheckResult:
    """The one row of ``kind`` covering ``release`` against its facts (or: no row, no class)."""
    kind_rows = [r for r in rows if r.kind is kind]
    if not kind_rows:
        return CheckResult()
    covering = [r for r in kind_rows if r.covers(release)]
    if not covering:
        known_paths = {p for r in kind_rows for p in r.classes}
        present = sorted(p for p in known_paths if p in classes)
        if not present:
            return CheckResult(checked=len(known_paths))
        line = f"TE {release}: defines {', '.join(present)} ({kind}) but no {kind} row of the table covers {release}"
        return CheckResult((line,), len(known_paths))
    result = CheckResult()
    if len(covering) > 1:
        spans = ", ".join(r.span for r in covering)
        line = f"TE {release}: {len(covering)} {kind} rows cover it ({spans}); expected exactly one"
        result = CheckResult((line,))
    return result + check_row(release, classes, covering[0], kind_rows)


def check_bases(release: Version, classes: Classes) -> CheckResult:
    """Every quantized base class the table knows for ``release`` exists."""
    problems, checked = [], 0
    for path, since, until in table.QUANTIZED_BASES:
        if table.in_range(release, since, until):
            checked += 1
            if path not in classes:
                problems.append(f"TE {release}: quantized base class {path} ({since}..{until}) missing")
    return CheckResult(tuple(problems), checked)


def check_classes(release: Version, classes: Classes, rows: Sequence[StorageRow] = table.ROWS) -> CheckResult:
    """Every disagreement between ``rows`` and one release's class facts (matrix/check.py's check)."""
    result = CheckResult()
    for kind in TensorKind:
        result += check_kind(release, classes, kind, rows)
    return result + check_bases(release, classes)


def uncovered_quantized(classes: Classes, rows: Sequence[StorageRow] = table.ROWS) -> list[str]:
    """Quantized tensor classes of a release that no row covers (informational)."""
    bases = {p for p, _, _ in table.QUANTIZED_BASES}
    covered = {path for row in rows for path in row.classes}
    out = []
    for path in classes:
        chain = lineage(classes, path)
        if path not in covered and path not in bases and any(b in bases for b in chain[1:]):
            if not any(c in covered for c in chain):
                out.append(path)
    return out
