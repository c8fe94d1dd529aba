"""``te-compat report``, ``te-compat verify``, ``te-compat releases`` and ``te-compat selftest``.

The report is what this process can do (TE, torch, the GPU), plus sections other packages
contribute (installed, or on sys.path beside a declaration file: :mod:`te_compat.providers`);
verify checks the installed TE's own source against the release table; releases prints that
table; selftest runs the checks of :mod:`te_compat.selfcheck`.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from te_compat import providers, table
from te_compat.capabilities import FEATURES, TE_FEATURES, Capabilities, capabilities, describe_missing
from te_compat.errors import TECompatError
from te_compat.providers import Provider
from te_compat.selfcheck import SelftestResult, selftest
from te_compat.verify import CLI_HINTS, Verification, verify_installed

# Providers of this group add a section to the report: a zero-argument callable returning a dict
# of rows (name -> value), e.g. mok's kernel backend choice (te_compat.providers finds them).
REPORT_SECTIONS = "te_compat.report"

DESCRIPTION = """\
te-compat report: what this process can do (TE, torch, the GPU), plus sections that other
  packages contribute. te-compat alone (or python -m te_compat) prints the report.
te-compat verify: check the installed TE's own source against the release table.
te-compat releases: the release table.
te-compat selftest: checks of behaviour on this machine (te_compat's own and those other
  packages contribute), each passed, failed or skipped with why.
Other packages contribute as entry points of their installed distribution (groups
  te_compat.report and te_compat.selftest) or, run from a path, in a te_compat_entry_points.txt
  beside their code.
"""
# Every command: an error is one line on stderr, never a traceback.
COMMON_EXIT_CODES = """\
  3  the output could not be written (stdout closed: >&-; a pipe whose reader
     left first, as in | true; a full disk)
  4  an unexpected error inside te-compat (a bug: please report the line printed)
"""
REPORT_EXIT_CODES = f"""\
exit codes:
  0  the report was printed; with --require, every FEATURE is available
  1  --require: a FEATURE is not available (the reasons go to stderr; selftest:
     the checks that failed, or that none passed)
  2  usage error (an unknown FEATURE name: the known ones are listed), or the
     capabilities could not be read at all
{COMMON_EXIT_CODES}"""
VERIFY_EXIT_CODES = f"""\
exit codes:
  0  the TE source agrees with the release table
  1  disagreements found (each is printed, naming class, module, attribute and row)
  2  no TE to verify: not installed, or its version or source cannot be read (a
     file that is not UTF-8 or not Python, a tree that does not say its release);
     or a usage error
{COMMON_EXIT_CODES}"""
SELFTEST_EXIT_CODES = f"""\
exit codes:
  0  no check failed and at least one passed (skipped ones say why)
  1  a check failed (stderr names each, and what differed; a provider that could
     not be loaded fails a check named after it), or no check passed (stderr
     says what was found and what was expected)
  2  usage error
{COMMON_EXIT_CODES}"""
RELEASES_EXIT_CODES = f"""\
exit codes:
  0  the table was printed
  2  usage error
{COMMON_EXIT_CODES}"""
OUTPUT_FAILED = 3
INTERNAL_ERROR = 4


@dataclass(frozen=True)
class Outcome:
    """What a command has to say: its exit code, its output and at most one line for stderr."""

    code: int
    out: str = ""
    err: str = ""


def _one_line(text: str) -> str:
    """``text`` on one line, whatever an exception's message held."""
    return " ".join(text.split())


def _failed(args: argparse.Namespace, code: int, line: str) -> Outcome:
    """A command that could not run: the line on stderr and, with --json, as JSON on stdout."""
    line = _one_line(line)
    out = json.dumps({"ok": False, "error": line}, indent=2) + "\n" if args.json else ""
    return Outcome(code, out, line)


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


def _one_section(provider: Provider) -> dict[str, object]:
    """The rows of one provider, or the rows naming why there are none and where the provider
    was declared; never raises."""
    value = provider.value
    try:
        loaded = provider.load()
    except Exception as exc:  # a broken plug-in must not take the report down
        rows = _error_row(f"loading {value}", exc)
    else:
        if not callable(loaded):
            rows = {"error": f"{value} is {type(loaded).__name__}; expected a callable returning a dict"}
        else:
            try:
                found = loaded()
            except Exception as exc:
                rows = _error_row(f"{value}()", exc)
            else:
                if isinstance(found, dict):
                    return {str(k): v for k, v in found.items()}
                rows = {"error": f"{value}() returned {type(found).__name__}; expected a dict of rows"}
    return rows | {"declared by": provider.origin}


def report_sections() -> dict[str, dict[str, object]]:
    """Section name -> rows, from every provider of ``te_compat.report``, installed or on sys.path."""
    sections: dict[str, dict[str, object]] = {}
    for provider in providers.find(REPORT_SECTIONS):
        name = provider.name if provider.name not in sections else f"{provider.name} ({provider.value})"
        sections[name] = _one_section(provider)
    return sections


def _report_text(
    caps: Capabilities, sections: dict[str, dict[str, object]], as_json: bool, tested: SelftestResult | None = None
) -> str:
    if as_json:
        extra = {} if tested is None else {"selftest": tested.as_dict()}
        return (
            json.dumps({**caps.as_dict(), "sections": sections, **extra}, indent=2, sort_keys=True, default=str) + "\n"
        )
    rows = [(k.replace("_", " "), _fmt(v)) for k, v in caps.as_dict().items()]
    lines = ["te-compat report", _table(rows, ("capability", "value"))]
    for name, section in sections.items():
        lines += ["", name, _table([(k.replace("_", " "), _fmt(v)) for k, v in section.items()], ("item", "value"))]
    if tested is not None:
        lines += ["", _selftest_table(tested)]
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace) -> Outcome:
    unknown = [f for f in args.require or () if f not in FEATURES]
    if unknown:
        names = ", ".join(repr(f) for f in unknown)
        return _failed(args, 2, f"te-compat report: unknown feature {names}; known features: {', '.join(FEATURES)}")
    if args.no_import and "selftest" in (args.require or ()):
        return _failed(args, 2, "te-compat report: --require selftest imports TE to run its checks; drop --no-import")
    try:
        caps = capabilities(import_te=not args.no_import)
    except Exception as exc:  # capabilities() promises not to raise; if it does, say so plainly
        return _failed(args, 2, f"te-compat report: could not read the capabilities: {type(exc).__name__}: {exc}")
    required = args.require or ()
    tested = selftest() if "selftest" in required else None
    text = _report_text(caps, report_sections(), args.json, tested)
    missing = caps.missing(*required)
    if missing:
        return Outcome(1, text, f"te-compat: {describe_missing(missing)}")
    return Outcome(0, text)


def _verification_text(result: Verification, as_json: bool) -> str:
    if as_json:
        return json.dumps(result.as_dict(), indent=2) + "\n"
    lines = [result.verdict, f"rows used: {', '.join(result.rows)}"]
    lines += [f"  - {line}" for line in (*result.problems, *result.metadata_problems)]
    if result.uncovered:
        lines.append(f"not covered by the table (read as other_quantized): {', '.join(result.uncovered)}")
    lines.append(f"{result.files} files read in {result.elapsed_s * 1000:.0f} ms")
    return "\n".join(lines) + "\n"


def verify(args: argparse.Namespace) -> Outcome:
    try:
        result = verify_installed(source_dir=args.source, release=args.release, hints=CLI_HINTS)
    except TECompatError as exc:  # no TE, an unreadable version, source file or tree
        return _failed(args, 2, f"te-compat verify: {exc}")
    return Outcome(0 if result.ok else 1, _verification_text(result, args.json))


def releases_data() -> dict[str, Any]:
    """The release table as JSON data: storage rows and TE's behaviour per release range."""
    return {
        "storage": [
            {
                "kind": r.kind.value,
                "since": r.since,
                "until": r.until,
                "classes": list(r.classes),
                "storage": r.storage,
                "introduced_by": r.introduced_by,
            }
            for r in table.ROWS
        ],
        "reciprocal": [dataclasses.asdict(r) for r in table.RECIPROCAL_ROWS],
        "post_all_gather_processing": [dataclasses.asdict(r) for r in table.POST_ALL_GATHER_ROWS],
        "quantizer_flags": [
            {**dataclasses.asdict(r), "kinds": sorted(k.value for k in r.kinds)} for r in table.QUANTIZER_FLAG_ROWS
        ],
        "checked_through": table.CHECKED_THROUGH,
    }


def releases(args: argparse.Namespace) -> Outcome:
    if args.json:
        return Outcome(0, json.dumps(releases_data(), indent=2) + "\n")
    rows = []
    for r in table.ROWS:
        attrs = " ".join(sorted(set(r.storage.values())))
        rows.append((r.kind.value, r.span, r.classes[-1].rsplit(".", 1)[1], r.introduced_by, attrs))
    parts = [_table(rows, ("kind", "TE", "storage class", "introduced by", "attributes probed"))]
    reciprocal = [(r.span, r.rule, r.introduced_by + (f"; {r.note}" if r.note else "")) for r in table.RECIPROCAL_ROWS]
    parts += ["MXFP8 reciprocal of a scale code (exp2f_rcp)", _table(reciprocal, ("TE", "rule", "source"))]
    gather = [(r.span, r.mxfp8, r.introduced_by) for r in table.POST_ALL_GATHER_ROWS]
    parts += [f"{table.POST_ALL_GATHER_FUNCTION} with MXFP8 weights", _table(gather, ("TE", "mxfp8", "source"))]
    flags = [
        (r.span, f"{r.quantizer.rsplit('.', 1)[1]}.{r.attribute}", r.storage, r.introduced_by)
        for r in table.QUANTIZER_FLAG_ROWS
    ]
    parts += ["quantizer flags", _table(flags, ("TE", "flag", "snapshot field", "source"))]
    checked = f"checked against real release sources through TE {table.CHECKED_THROUGH}"
    return Outcome(0, "\n\n".join(parts) + f"\n\n{checked}\n")


def _selftest_table(result: SelftestResult) -> str:
    rows = [(c.name, c.status, f"{c.seconds:.3f}", c.why or "-") for c in result.checks]
    lines = [f"te-compat selftest: {result.verdict()}: {result.summary()}"]
    if result.sources():
        lines.append(f"checks from {result.sources()}")
    if rows:
        lines.append(_table(rows, ("check", "status", "seconds", "why")))
    return "\n".join(lines)


def run_selftest_command(args: argparse.Namespace) -> Outcome:
    result = selftest()
    out = json.dumps(result.as_dict(), indent=2) + "\n" if args.json else _selftest_table(result) + "\n"
    if result.ok:
        return Outcome(0, out)
    return Outcome(1, out, f"te-compat selftest: {result.failures()}")


class _HelpAsked(Exception):
    """-h/--help was given: ``text`` is the command's output."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _HelpAction(argparse.Action):
    """-h/--help, whose text is written as every command's output is (:func:`_emit`): argparse's
    own help action ignores a write that fails and exits 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        raise _HelpAsked(parser.format_help())


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands' too) whose -h/--help is :class:`_HelpAction`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs, add_help=False)
        self.add_argument("-h", "--help", action=_HelpAction, help="show this help message and exit")


def _subparser(sub: argparse._SubParsersAction[_Parser], name: str, help: str, epilog: str) -> _Parser:
    return sub.add_parser(name, help=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="te-compat",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"report {REPORT_EXIT_CODES}\nverify {VERIFY_EXIT_CODES}\nreleases {RELEASES_EXIT_CODES}\n"
        f"selftest {SELFTEST_EXIT_CODES}",
    )
    sub = parser.add_subparsers(dest="command")
    rep = _subparser(sub, "report", help="what TE, torch and the GPU offer this process", epilog=REPORT_EXIT_CODES)
    rep.add_argument("--json", action="store_true", help="print JSON (other packages' sections under 'sections')")
    rep.add_argument("--no-import", action="store_true", help="do not import TE (metadata only)")
    rep.add_argument(
        "--require",
        nargs="+",
        action="extend",
        metavar="FEATURE",
        help=f"exit 1 unless every FEATURE is available; may be repeated ({', '.join(FEATURES)}). "
        f"With TE present but not usable, each of {', '.join(TE_FEATURES)} is missing",
    )
    rep.set_defaults(func=report)
    ver = _subparser(
        sub, "verify", help="check the installed TE's source against the release table", epilog=VERIFY_EXIT_CODES
    )
    ver.add_argument("--json", action="store_true", help="print JSON")
    ver.add_argument(
        "--source",
        metavar="DIR",
        help="read this TE source tree instead of the installed one (its release from build_tools/VERSION.txt "
        "or the transformer_engine dist-info beside the package, unless --release is given)",
    )
    ver.add_argument("--release", metavar="VERSION", help="verify against this TE version (default: the installed)")
    ver.set_defaults(func=verify)
    rel = _subparser(sub, "releases", help="the per-release storage table", epilog=RELEASES_EXIT_CODES)
    rel.add_argument("--json", action="store_true", help="print JSON")
    rel.set_defaults(func=releases)
    tst = _subparser(
        sub, "selftest", help="checks of behaviour on this machine (TE, the GPU, mok)", epilog=SELFTEST_EXIT_CODES
    )
    tst.add_argument(
        "--json",
        action="store_true",
        help="print JSON: ok, failures, checks (name, status, why, seconds), providers (name, value, origin, "
        "checks, error), ...",
    )
    tst.set_defaults(func=run_selftest_command)
    return parser


def _drop_stdout() -> None:
    """Point stdout's file at /dev/null: what it still buffers would fail again when Python
    flushes it at exit (the recipe of Python's signal docs, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's capture): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _say(line: str) -> None:
    """``line`` on stderr, where there is one: with stderr closed too, the exit code must do."""
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def _emit(outcome: Outcome) -> int:
    """Write the outcome; an output that cannot be written is one line on stderr and exit 3."""
    try:
        if outcome.out and sys.stdout is None:  # started with stdout closed (te-compat releases >&-)
            raise OSError(errno.EBADF, "standard output is closed")
        if outcome.out:
            sys.stdout.write(outcome.out)
            sys.stdout.flush()
    except OSError as exc:  # BrokenPipeError (te-compat releases | true), ENOSPC (> /dev/full)
        _drop_stdout()
        _say(f"te-compat: the output could not be written: {exc.strerror or exc}")
        return OUTPUT_FAILED
    if outcome.err:
        _say(outcome.err)
    return outcome.code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _HelpAsked as asked:
        return _emit(Outcome(0, asked.text))
    if args.command is None:  # te-compat alone, or python -m te_compat: the report
        args = parser.parse_args(["report"])
    try:
        outcome = args.func(args)
    except Exception as exc:  # a bug of ours: one line and its own code, never a traceback
        line = f"te-compat {args.command}: internal error: {type(exc).__name__}: {exc}"
        outcome = Outcome(INTERNAL_ERROR, err=_one_line(line))
    return _emit(outcome)
