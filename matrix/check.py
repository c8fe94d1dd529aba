"""Check te_compat's release table against what each real TE release defines.

For every release in the matrix and every tensor kind the table covers there:
- every class the row names exists at that module path in that release;
- every attribute the row would probe is assigned (or is a property) under that name by the
  row's classes or their TE base classes;
- every attribute those classes assign is known to the row (probed or listed as known), so a
  rename in a future release fails here instead of being silently missed;
- a release that defines a covered class the table has no row for fails.

    python -m matrix.check              # every committed record
    python -m matrix.check 2.14.1       # one release
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from packaging.version import Version

from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from te_compat import table
from te_compat.table import StorageRow, TensorKind


def lineage(classes: dict[str, Any], path: str) -> list[str]:
    """``path`` and every TE base class of it that the release defines, depth first."""
    seen: list[str] = []
    stack = [path]
    while stack:
        current = stack.pop()
        if current in seen or current not in classes:
            continue
        seen.append(current)
        stack.extend(reversed(classes[current]["bases"]))
    return seen


def _assigned(classes: dict[str, Any], paths: Iterable[str]) -> tuple[set[str], set[str]]:
    """(attributes assigned, properties defined) over the classes and their TE bases."""
    assigns: set[str] = set()
    props: set[str] = set()
    for path in paths:
        for cls in lineage(classes, path):
            assigns |= set(classes[cls]["assigns"])
            props |= set(classes[cls]["properties"])
    return assigns, props


def check_record(record: dict[str, Any], rows: tuple[StorageRow, ...] = table.ROWS) -> list[str]:
    """Every disagreement between ``rows`` and one release's record, as readable lines."""
    release = Version(record["release"])
    classes: dict[str, Any] = record["classes"]
    problems: list[str] = []
    for kind in TensorKind:
        kind_rows = [r for r in rows if r.kind is kind]
        if not kind_rows:
            continue
        covering = [r for r in kind_rows if r.covers(release)]
        known_paths = {p for r in kind_rows for p in r.classes}
        present = sorted(p for p in known_paths if p in classes)
        if not covering:
            if present:
                problems.append(
                    f"TE {release}: defines {', '.join(present)} ({kind}) but no {kind} row of "
                    f"the table covers {release}"
                )
            continue
        if len(covering) > 1:
            problems.append(
                f"TE {release}: {len(covering)} {kind} rows cover it "
                f"({', '.join(r.span for r in covering)}); expected exactly one"
            )
        row = covering[0]
        missing_classes = [p for p in row.classes if p not in classes]
        for path in missing_classes:
            problems.append(
                f"TE {release}: {kind} row {row.span} looks for class {path}, which this release does not define"
            )
        # A class of this kind that the release defines but the covering row does not name.
        for path in present:
            if path not in row.classes:
                problems.append(f"TE {release}: defines {path} ({kind}), which {kind} row {row.span} does not name")
        assigns, props = _assigned(classes, [p for p in row.classes if p in classes])
        for logical, attr in row.storage.items():
            if attr not in assigns and attr not in props:
                owner = row.classes[-1]
                problems.append(
                    f"TE {release}: {kind} row {row.span} probes {logical!r} as attribute "
                    f"{attr!r}, but {owner} (and its TE bases) never assign it"
                )
        unknown = sorted(assigns - set(row.storage.values()) - row.known)
        for attr in unknown:
            problems.append(
                f"TE {release}: {row.classes[-1]} assigns {attr!r}, unknown to the {kind} row "
                f"{row.span} (a new storage attribute, or a rename?)"
            )
    for path, since, until in table.QUANTIZED_BASES:
        if table.in_range(release, since, until) and path not in classes:
            problems.append(f"TE {release}: quantized base class {path} ({since}..{until}) missing")
    return problems


def uncovered_quantized(record: dict[str, Any]) -> list[str]:
    """Quantized tensor classes of a release that no row covers (informational)."""
    classes = record["classes"]
    bases = {p for p, _, _ in table.QUANTIZED_BASES}
    covered = set(table.class_index())
    out = []
    for path in classes:
        chain = lineage(classes, path)
        if path not in covered and path not in bases and any(b in bases for b in chain[1:]):
            if not any(c in covered for c in chain):
                out.append(path)
    return out


def check_release(version: str, record: dict[str, Any] | None = None) -> list[str]:
    """Check one matrix release (its own record, or its source release's record)."""
    if record is None:
        record = load_record(matrix_release(version).source_from)
    return check_record({**record, "release": version})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.check", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="TE releases (default: the whole matrix)")
    args = parser.parse_args(argv)
    failed = 0
    for version in args.releases or release_versions():
        problems = check_release(version)
        source = matrix_release(version).source_from
        via = f" (source from {source})" if source != version else ""
        if problems:
            failed += 1
            print(f"TE {version}{via}: {len(problems)} disagreement(s) with te_compat's table")
            for line in problems:
                print(f"  - {line}")
        else:
            extra = uncovered_quantized(load_record(source))
            note = f"; not covered: {', '.join(p.rsplit('.', 1)[1] for p in extra)}" if extra else ""
            print(f"TE {version}{via}: table agrees with the release source{note}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
