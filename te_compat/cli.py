"""``te-compat report``, ``te-compat verify`` and ``te-compat releases``.

The report is what this process can do (TE, torch, the GPU), plus sections other installed
packages contribute; verify checks the installed TE's own source against the release table;
releases prints that table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from te_compat import table
from te_compat.capabilities import FEATURES, Capabilities, capabilities
from te_compat.errors import MissingFeatureError, TENotFoundError, TEVersionError
from te_compat.verify import Verification, verify_installed

# Entry points of this group add a section to the report: a zero-argument callable returning
# a dict of rows (name -> value), e.g. mok's kernel backend choice.
REPORT_SECTIONS = "te_compat.report"

DESCRIPTION = """\
te-compat report: what this process can do (TE, torch, the GPU), plus sections that other
  installed packages contribute.
te-compat verify: check the installed TE's own source against the release table.
te-compat releases: the release table.
"""
REPORT_EXIT_CODES = """\
exit codes:
  0  the report was printed; with --require, every FEATURE is available
  1  --require: a FEATURE is not available (the reasons go to stderr)
  2  usage error (an unknown FEATURE name: the known ones are listed), or the
     capabilities could not be read at all
"""
VERIFY_EXIT_CODES = """\
exit codes:
  0  the TE source agrees with the release table
  1  disagreements found (each is printed, naming class, module, attribute and row)
  2  no TE to verify: not installed, or its version or source cannot be read
"""


def _fmt(value: object) -> str:
    if value is None or value == ():
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


def _error_row(what: str, exc: BaseException) -> dict[str, object]:
    return {"error": f"{what} raised {type(exc).__name__}: {exc}"}


def _one_section(load: Callable[[], object], value: str) -> dict[str, object]:
    """The rows of one entry point, or one row naming why there are none; never raises."""
    try:
        provider = load()
    except Exception as exc:  # a broken plug-in must not take the report down
        return _error_row(f"loading {value}", exc)
    if not callable(provider):
        return {"error": f"{value} is {type(provider).__name__}; expected a callable returning a dict"}
    try:
        rows = provider()
    except Exception as exc:
        return _error_row(f"{value}()", exc)
    if not isinstance(rows, dict):
        return {"error": f"{value}() returned {type(rows).__name__}; expected a dict of rows"}
    return {str(k): v for k, v in rows.items()}


def report_sections() -> dict[str, dict[str, object]]:
    """Section name -> rows, from every ``te_compat.report`` entry point installed."""
    try:
        found = sorted(entry_points(group=REPORT_SECTIONS), key=lambda ep: (ep.name, ep.value))
    except Exception as exc:
        return {REPORT_SECTIONS: _error_row("importlib.metadata.entry_points", exc)}
    sections: dict[str, dict[str, object]] = {}
    for ep in found:
        name = ep.name if ep.name not in sections else f"{ep.name} ({ep.value})"
        sections[name] = _one_section(ep.load, ep.value)
    return sections


def _print_report(caps: Capabilities, sections: dict[str, dict[str, object]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({**caps.as_dict(), "sections": sections}, indent=2, sort_keys=True, default=str))
        return
    rows = [(k.replace("_", " "), _fmt(v)) for k, v in caps.as_dict().items()]
    print("te-compat report")
    print(_table(rows, ("capability", "value")))
    for name, section in sections.items():
        print(f"\n{name}")
        print(_table([(k.replace("_", " "), _fmt(v)) for k, v in section.items()], ("item", "value")))


def report(args: argparse.Namespace) -> int:
    unknown = [f for f in args.require or () if f not in FEATURES]
    if unknown:
        names = ", ".join(repr(f) for f in unknown)
        print(f"te-compat report: unknown feature {names}; known features: {', '.join(FEATURES)}", file=sys.stderr)
        return 2
    try:
        caps = capabilities(import_te=not args.no_import)
    except Exception as exc:  # capabilities() promises not to raise; if it does, say so plainly
        print(f"te-compat report: could not read the capabilities: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    _print_report(caps, report_sections(), args.json)
    if args.require:
        try:
            caps.require(*args.require)
        except MissingFeatureError as exc:
            print(f"te-compat: {exc}", file=sys.stderr)
            return 1
    return 0


def _print_verification(result: Verification, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    print(result.verdict)
    print(f"rows used: {', '.join(result.rows)}")
    for line in result.problems:
        print(f"  - {line}")
    if result.uncovered:
        print(f"not covered by the table (read as other_quantized): {', '.join(result.uncovered)}")
    print(f"{result.files} files read in {result.elapsed_s * 1000:.0f} ms")


def verify(args: argparse.Namespace) -> int:
    try:
        result = verify_installed(source_dir=args.source, release=args.release)
    except (TENotFoundError, TEVersionError) as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}, indent=2))
        print(f"te-compat verify: {exc}", file=sys.stderr)
        return 2
    _print_verification(result, args.json)
    return 0 if result.ok else 1


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


def _subparser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="te-compat",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"report {REPORT_EXIT_CODES}\nverify {VERIFY_EXIT_CODES}",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rep = _subparser(sub, "report", help="what TE, torch and the GPU offer this process", epilog=REPORT_EXIT_CODES)
    rep.add_argument("--json", action="store_true", help="print JSON (other packages' sections under 'sections')")
    rep.add_argument("--no-import", action="store_true", help="do not import TE (metadata only)")
    rep.add_argument(
        "--require",
        nargs="+",
        metavar="FEATURE",
        help=f"exit 1 unless every FEATURE is available ({', '.join(FEATURES)})",
    )
    rep.set_defaults(func=report)
    ver = _subparser(
        sub, "verify", help="check the installed TE's source against the release table", epilog=VERIFY_EXIT_CODES
    )
    ver.add_argument("--json", action="store_true", help="print JSON")
    ver.add_argument("--source", metavar="DIR", help="read this TE source tree instead of the installed one")
    ver.add_argument("--release", metavar="VERSION", help="verify against this TE version (default: the installed)")
    ver.set_defaults(func=verify)
    rel = _subparser(sub, "releases", help="the per-release storage table")
    rel.add_argument("--json", action="store_true", help="print JSON")
    rel.set_defaults(func=releases)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
