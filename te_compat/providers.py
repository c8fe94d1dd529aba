"""The packages that add checks to ``te-compat selftest`` and sections to ``te-compat report``,
found without importing any of them, installed or run from a path.

A package declares what it provides in either or both of two ways, and te_compat reads both:

- entry points of its installed distribution, in the groups ``te_compat.selftest`` and
  ``te_compat.report`` (all a third party's package needs, installed);
- a declaration file, :data:`DECLARATION`, in the package's own folder, in the format of a
  distribution's ``entry_points.txt``: read where the package runs with no install metadata
  (a checkout on PYTHONPATH, vendored code), since install metadata is all entry points are.

mok ships both (the file is package data; pyproject.toml declares the same entry points, and a
test keeps the two equal). A provider found both ways is read once. Where a declaration file
and an installed distribution name one provider (group and name) of the same package with
different values, the file wins: it lies beside the code that ``import`` finds first on
sys.path, while the metadata may be an older install's.

The search reads, for each folder on sys.path, its listing and one file name in each folder
whose name is a Python identifier, and only the first folder of each name along sys.path, the one
``import`` finds. Only the self-test and the report search; importing te_compat does not.
Nothing here imports a provider: :attr:`Provider.load` does, when the self-test or the report
calls it, and reports what it raised.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from te_compat.errors import TECompatError

DECLARATION = "te_compat_entry_points.txt"
# "module:attribute" as importlib.metadata reads an entry point's value (the extras part excluded)
_VALUE = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class _Declaration(configparser.ConfigParser):
    """entry_points.txt as importlib.metadata reads it: ``name = value`` lines, names kept as written."""

    def __init__(self) -> None:
        super().__init__(delimiters=("=",), interpolation=None, default_section="\0")

    def optionxform(self, optionstr: str) -> str:
        return optionstr


class DeclarationError(TECompatError):
    """A declaration file that cannot be read, or that declares something other than providers
    of its own package as ``name = module:attribute``."""


@dataclass(frozen=True)
class Provider:
    """One provider of a group: ``value`` ("module:attribute") names the callable, ``origin``
    where it was declared (a declaration file's path, or the installed distribution)."""

    group: str
    name: str
    value: str
    origin: str
    load: Callable[[], object] = field(compare=False, repr=False)


def search_path() -> list[str]:
    """The folders searched for declaration files: sys.path, in its order ("" is the current folder)."""
    return list(sys.path)


def declaration_files(path: Iterable[str]) -> list[tuple[str, str]]:
    """(package, file) of each package folder on ``path`` holding :data:`DECLARATION`; of the
    folders of one name, only the first along ``path``, the one ``import`` finds."""
    seen: set[str] = set()
    found: list[tuple[str, str]] = []
    for folder in path:
        if not isinstance(folder, str):
            continue
        try:
            listing = os.scandir(os.path.abspath(folder or os.curdir))
        except OSError:  # a zip file, a folder that is gone: no package folders to read
            continue
        with listing:
            for entry in listing:
                try:
                    if entry.name in seen or not entry.name.isidentifier() or not entry.is_dir():
                        continue
                except OSError:
                    continue
                seen.add(entry.name)
                file = os.path.join(entry.path, DECLARATION)
                if os.path.isfile(file):
                    found.append((entry.name, file))
    return found


def _failing(error: Exception) -> Callable[[], object]:
    def load() -> object:
        raise error

    return load


def _from_value(group: str, name: str, value: str, origin: str) -> Provider:
    point = EntryPoint(name, value, group)
    return Provider(group, name, value, origin, point.load)


def read_declaration(package: str, file: str) -> list[Provider]:
    """Every provider ``file`` declares, of any group; raises :class:`DeclarationError` saying
    what was expected and what was found."""
    parser = _Declaration()
    try:
        with open(file, encoding="utf-8") as handle:
            parser.read_file(handle, source=file)
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        why = " ".join(str(exc).split())
        raise DeclarationError(
            f"{file}: expected [group] sections of name = module:attribute lines (the format of entry_points.txt); "
            f"reading it raised {type(exc).__name__}: {why}"
        ) from None
    found = []
    for group in parser.sections():
        for name, value in parser.items(group):
            match = _VALUE.fullmatch(value.strip())
            if match is None:
                raise DeclarationError(f"{file}: [{group}] {name}: expected module:attribute; found {value!r}")
            module = match["module"]
            if module.split(".")[0] != package:
                raise DeclarationError(
                    f"{file}: [{group}] {name}: expected a module of package {package!r}, beside which the file "
                    f"lies; found {module!r}"
                )
            found.append(_from_value(group, name, value.strip(), file))
    return found


def on_path(group: str, path: Iterable[str] | None = None) -> list[Provider]:
    """The providers of ``group`` declared by files on ``path`` (default: :func:`search_path`).
    A file that cannot be read becomes one provider, named after its package, whose load raises
    the :class:`DeclarationError`."""
    found: list[Provider] = []
    for package, file in declaration_files(search_path() if path is None else path):
        try:
            declared = read_declaration(package, file)
        except DeclarationError as exc:
            found.append(Provider(group, package, DECLARATION, file, _failing(exc)))
            continue
        found += [p for p in declared if p.group == group]
    return found


def installed(group: str) -> list[Provider]:
    """The providers of ``group`` that installed distributions declare as entry points. Metadata
    that cannot be read becomes one provider, named after the group, whose load raises why."""
    try:
        points = list(entry_points(group=group))
    except Exception as exc:  # broken metadata must not take the self-test or the report down
        return [Provider(group, group, "importlib.metadata.entry_points", "install metadata", _failing(exc))]
    found = []
    for point in points:
        dist = getattr(point, "dist", None)
        origin = f"the installed distribution {dist.name} {dist.version}" if dist is not None else "install metadata"
        found.append(Provider(group, point.name, point.value, origin, point.load))
    return found


def _package(value: str) -> str:
    return value.split(":")[0].split(".")[0]


def find(group: str) -> list[Provider]:
    """Every provider of ``group``, declared by a file on sys.path or by an installed
    distribution, each once, sorted by name and value (the order the self-test runs them)."""
    beside_code = on_path(group)
    declared_here = {(p.name, _package(p.value)) for p in beside_code}
    found: list[Provider] = []
    seen: set[tuple[str, str]] = set()
    for provider in beside_code:
        if (provider.name, provider.value) not in seen:
            seen.add((provider.name, provider.value))
            found.append(provider)
    for provider in installed(group):
        if (provider.name, provider.value) in seen or (provider.name, _package(provider.value)) in declared_here:
            continue
        seen.add((provider.name, provider.value))
        found.append(provider)
    return sorted(found, key=lambda p: (p.name, p.value))


def where_declared(group: str) -> str:
    """Where :func:`find` looks for providers of ``group``, for a message that found none."""
    return f"entry points of group {group} of installed distributions, or {DECLARATION} in a package folder on sys.path"
