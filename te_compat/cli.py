"""``te-compat report`` and ``te-compat releases``: the capabilities and the release table."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from te_compat import table
from te_compat.capabilities import FEATURES, capabilities
from te_compat.errors import MissingFeatureError


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        if all(isinstance(v, int) for v in value):
            return ".".join(map(str, value))
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def report(args: argparse.Namespace) -> int:
    caps = capabilities(import_te=not args.no_import)
    if args.json:
        print(json.dumps(caps.as_dict(), indent=2, sort_keys=True))
    else:
        rows = [(k.replace("_", " "), _fmt(v)) for k, v in caps.as_dict().items()]
        print("te-compat report")
        print(_table(rows, ("capability", "value")))
    if args.require:
        try:
            caps.require(*args.require)
        except (MissingFeatureError, ValueError) as exc:
            print(f"te-compat: {exc}", file=sys.stderr)
            return 1
    return 0


def releases(args: argparse.Namespace) -> int:
    if args.json:
        data = [
            {
                "kind": r.kind.value,
                "since": r.since,
                "until": r.until,
                "classes": list(r.classes),
                "storage": r.storage,
                "introduced_by": r.introduced_by,
            }
            for r in table.ROWS
        ]
        print(json.dumps(data, indent=2))
        return 0
    rows = []
    for r in table.ROWS:
        attrs = " ".join(sorted(set(r.storage.values())))
        rows.append((r.kind.value, r.span, r.classes[-1].rsplit(".", 1)[1], r.introduced_by, attrs))
    print(_table(rows, ("kind", "TE", "storage class", "introduced by", "attributes probed")))
    print(f"\nchecked against real release sources through TE {table.CHECKED_THROUGH}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="te-compat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="what TE, torch and the GPU offer this process")
    rep.add_argument("--json", action="store_true", help="print JSON")
    rep.add_argument("--no-import", action="store_true", help="do not import TE (metadata only)")
    rep.add_argument(
        "--require",
        nargs="+",
        metavar="FEATURE",
        help=f"exit 1 unless every FEATURE is available ({', '.join(FEATURES)})",
    )
    rep.set_defaults(func=report)
    rel = sub.add_parser("releases", help="the per-release storage table")
    rel.add_argument("--json", action="store_true", help="print JSON")
    rel.set_defaults(func=releases)
    args = parser.parse_args(argv)
    return int(args.func(args))
