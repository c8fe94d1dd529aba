"""The tables of docs/benchmark-results.md and of docs/benchmarks.md, made from result files.

    python benchmarks/results_tables.py            # check: every marked table matches its files
    python benchmarks/results_tables.py --write    # rewrite every marked table from its files

A document marks a generated table with a line ``<!-- table KIND FILE... -->`` before it and
``<!-- end table -->`` after it; the FILEs are relative to the document's folder. What is made
between the two is a line naming the run (machine, date, versions, command, files), then the
table. After a new benchmark run, put the new file names in the markers and run ``--write``.
Kinds and their files:

  device          a bench_swizzle.py JSON: every case against a same-run copy, grouped and per-expert
  shape           the same JSON: the first variant against the second (an A/B of the launch shape)
  te              the same JSON: the rowwise cases against TE's discrete-weights swizzle (graph replays)
  layer-parts     a .txt holding probe_layer_parts.py's output: a layer's four job kinds at both shapes
  host            bench_host.py JSONs (--source te): first views and refreshes; a second file adds
                  its E=256 column (another process)
  host-te         a bench_host.py JSON: eager rowwise calls against TE's swizzles, same run
  summary-device  a bench_swizzle.py JSON: docs/benchmarks.md's few device rows
  summary-host    a bench_host.py JSON: docs/benchmarks.md's few host rows
  quantize        a bench_quantize.py JSON: every column against the same run's copy of the same bytes
  vs-host         vs_baseline.py JSONs (--only host): this tree over the baseline's, per round, the
                  median of every file's rounds pooled, [each file's median]

Needs no GPU and no torch (tests/test_docs.py runs the check).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "docs" / "benchmark-results.md", ROOT / "docs" / "benchmarks.md"]
BEGIN = re.compile(r"^<!-- table (\S+)((?: \S+)+) -->$")
END = "<!-- end table -->"
# issue 15's targets: device time over a same-run copy of the same bytes
TARGETS = {"rowwise": 1.10, "columnwise": 1.15, "layer": 1.10}
HOST_ROWS = [  # (label, case suffix, key)
    ("first view, rowwise + columnwise", "row+col", "split first view"),
    ("first view, rowwise", "row", "split first view"),
    ("checked refresh (`cached=`), rowwise + columnwise", "row+col", "split refresh"),
    ("checked refresh, rowwise", "row", "split refresh"),
    ("layer refresh (`mok.LayerRefresh`, fc1 + fc2), rowwise + columnwise", "row+col", "layer refresh"),
    ("refresh of scales TE wrote in the GEMM layout (the check alone), rowwise", "row", "split refresh, TE-swizzled"),
    ("one grouped weight: first view, rowwise + columnwise", "row+col", "grouped first view"),
    ("one grouped weight: refresh, rowwise + columnwise", "row+col", "grouped refresh"),
]


def _meta(path: Path) -> dict[str, Any]:
    """A result file's run: a JSON's ``meta``, or a bench_swizzle.py text's ``key=value`` line."""
    if path.suffix == ".json":
        meta: dict[str, Any] = json.loads(path.read_text())["meta"]
        return meta
    line = next(x for x in path.read_text().splitlines() if x.startswith("date="))
    return dict(re.findall(r"([\w.]+)=(.*?)(?= [\w.]+=|$)", line))


def _device_run(meta: dict[str, Any]) -> str:
    te = meta.get("te")
    return (
        f"{meta['gpu']} ({meta['sms']} SMs), {meta['date'][:16].replace('T', ' ')} UTC, torch {meta['torch']}, "
        f"CUDA {meta['cuda']}, cuda.core {meta['cuda.core']}, "
        + ("TE not installed" if te in (None, "None") else f"TE {te}")
    )


def caption(kind: str, files: list[str], paths: list[Path]) -> str:
    """The line above a table: the run (machine, date, versions), the command and the files."""
    label = ("Files: " if len(files) > 1 else "File: ") + " and ".join(f"`{f}`" for f in files) + "."
    if kind == "vs-host":
        return _vs_caption(paths, label)
    meta = _meta(paths[0])
    if kind.startswith("host") or kind == "summary-host":
        run = f"host of the {meta['gpu']} machine, {meta['date']}, torch {meta['torch']}, Python {meta['python']}"
        twice = ", run twice (two processes)" if len(files) > 1 else ""
        return f"Run: {run}, TE {meta['te']}. Command: `bench_host.py --source {meta['source']}`{twice}. {label}"
    if kind == "layer-parts":
        text = paths[0].read_text()
        runs = re.search(r"of (\d+) runs", text)
        header = next(x for x in text.splitlines() if x.startswith("part "))
        variants = ",".join(dict.fromkeys(c.split("@")[1] for c in header.split()[3:]))
        flags = f"--runs {runs.group(1) if runs else '?'} --variants {variants}"
        return f"Run: {_device_run(meta)}. Command: `probe_layer_parts.py {flags}`. {label}"
    if kind == "quantize":
        return f"Run: {_device_run(meta)}. Command: `bench_quantize.py {_quantize_flags(paths[0], meta)}`. {label}"
    option = "--shapes" if "shapes" in meta else "--variants"  # bench_swizzle.py's option since one kernel
    flags = f"--runs {meta['runs']} --repeats {meta['repeats']} {option} {meta.get('shapes', meta.get('variants'))}"
    flags += " --no-te" if meta.get("te") in (None, "None") else ""
    return f"Run: {_device_run(meta)}. Command: `bench_swizzle.py {flags}`. {label}"


def _rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"]
    return rows


def _variants(path: Path) -> list[str]:
    """The launch shapes (older runs: kernel variants) a run's columns are suffixed with."""
    meta = json.loads(path.read_text())["meta"]
    variants: list[str] = meta.get("shapes", meta.get("variants", "")).split(",")
    return variants


def _ratio(row: dict[str, Any], key: str, spread: bool = False) -> str:
    value = row["median"].get(key)
    if value is None:
        return "-"
    if not spread:
        return f"{value:.2f}"
    low, high = row["spread"][key]
    return f"{value:.2f} [{low:.2f}-{high:.2f}]"


def _us(value: float | None) -> str:
    if value is None or isinstance(value, str):
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def _label(case: str) -> str:
    """A bench_swizzle case name as the tables show it."""
    if case.startswith("layer"):
        return case.replace(" row+col", ", rowwise + columnwise, one launch")
    m, k = (int(v) for v in case.split()[-1].split("x"))
    return f"{case} (TE-padded)" if m % 128 or k % 128 else case


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def device(path: Path) -> list[str]:
    d = _variants(path)[0]
    body = []
    for r in _rows(path):
        kind, e_text = next((w, x) for w, x in pairwise(r["case"].split()) if x.startswith("E="))
        e = int(e_text.removeprefix("E="))
        inverse = r["case"].startswith("inverse")  # no target: issue 15 set none for the inverse
        target = TARGETS.get(kind) if (kind != "rowwise" or e >= 32) and not inverse else None
        body.append(
            [
                _label(r["case"]),
                "-" if target is None else f"{target:.2f}",
                _us(r["median"]["g:copy"]),
                _ratio(r, f"g:kernel@{d}/copy", True),
                _ratio(r, f"g:exp@{d}/copy", True),
                _ratio(r, "g:kcopy/copy"),
                _ratio(r, "g:exp-kcopy/copy"),
                "yes" if all(r["equal"].values()) else "NO",
            ]
        )
    header = ["case", "target", "copy (us)", "grouped", "per-expert", "kernel's copy, grouped"]
    return _table([*header, "kernel's copy, per-expert", "byte-identical"], body)


def shape(path: Path) -> list[str]:
    first, second = _variants(path)[:2]
    body = []
    for r in _rows(path):
        taken = "16 x 128" if r["case"].startswith(("columnwise", "inverse")) else "32 x 256"
        cells = [_ratio(r, f"g:{w}@{v}/copy", True) for w in ("kernel", "exp") for v in (first, second)]
        body.append([_label(r["case"]), taken, *cells])
    header = ["case", f"shape under `{first}`", f"grouped, `{first}`", f"grouped, `{second}`"]
    return _table([*header, f"per-expert, `{first}`", f"per-expert, `{second}`"], body)


def te(path: Path) -> list[str]:
    d = _variants(path)[0]
    body = []
    for r in _rows(path):
        m = r["median"]
        if "g:TE discrete" not in m:
            continue
        body.append(
            [
                _label(r["case"]),
                _us(m["g:copy"]),
                _us(m[f"g:kernel@{d}"]),
                _us(m[f"g:exp@{d}"]),
                _us(m["g:TE discrete"]),
                f"{m['g:TE discrete'] / m[f'g:exp@{d}']:.2f}",
            ]
        )
    header = ["case (rowwise)", "copy (us)", "mok, grouped (us)", "mok, per-expert (us)", "TE discrete (us)"]
    return _table([*header, "TE discrete / mok per-expert"], body)


def layer_parts(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("part "))
    columns = lines[start].split()[3:]  # after "part", "copy", "us"
    shapes = sorted({c.split("@")[1] for c in columns}, key=lambda s: int(s.split(":")[1].split("x")[0]))
    body = []
    for line in lines[start + 1 :]:
        found = re.match(r"^(\w+(?: \w+)?)\s+([\d.]+)\s+(.*)$", line)
        if not found:
            break
        medians = dict(zip(columns, re.findall(r"([\d.]+) \[", found.group(3)), strict=True))
        cells = [f"{float(medians[f'{w}@{s}']):.2f}" for w in ("g", "exp", "exp-kcopy") for s in shapes]
        body.append([found.group(1), found.group(2), *cells])
    names = [s.split(":")[1].replace("x", " x ") for s in shapes]
    header = ["part", "copy (us)", *(f"{w}, {n}" for w in ("grouped", "per-expert") for n in names)]
    return _table([*header, *(f"kernel's per-expert copy, {n}" for n in names)], body)


def _host_results(path: Path) -> dict[str, dict[str, Any]]:
    return {r["case"]: r for r in json.loads(path.read_text())["results"]}


def host(path: Path, second: Path | None = None) -> list[str]:
    results = _host_results(path)
    experts = sorted({int(c.split()[0].removeprefix("E=")) for c in results})
    shape_ = next(iter(results)).split()[1]
    other = _host_results(second) if second else None
    body = []
    for label, suffix, key in HOST_ROWS:
        cells = [_us(results[f"E={e} {shape_} {suffix}"].get(key)) for e in experts]
        if other is not None:
            cells.append(_us(other[f"E={experts[-1]} {shape_} {suffix}"].get(key)))
        body.append([label, *cells])
    header = [f"per-expert weights of {shape_}, host us", *(f"E={e}" for e in experts)]
    return _table(header + ([f"E={experts[-1]}, second process"] if other else []), body)


VS_HOST_COLUMNS = [  # header, then the (case suffix, bench_host key) of each value in its cells
    ("checked refresh, row+col (split)", [("row+col", "split refresh")]),
    ("grouped refresh", [("row+col", "grouped refresh")]),
    (
        "mok.weights split / grouped refresh",
        [("row+col", "split refresh, mok.weights"), ("row+col", "grouped refresh, mok.weights")],
    ),
    ("layer refresh", [("row+col", "layer refresh")]),
    ("first view, split row+col / row", [("row+col", "split first view"), ("row", "split first view")]),
    ("first view, grouped row+col / row", [("row+col", "grouped first view"), ("row", "grouped first view")]),
    ("TE discrete / TE multi", [("row", "TE discrete"), ("row", "TE multi")]),
]


def _vs_runs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """A vs_baseline.py file's bench_host runs: "this" and "baseline", round by round."""
    runs = json.loads(path.read_text())["runs"]
    return {tree: runs[tree]["host"] for tree in ("this", "baseline")}


def _round_ratios(path: Path) -> dict[tuple[str, str], list[float]]:
    """(case, key) -> this tree's value over the baseline's, one ratio a round."""
    found: dict[tuple[str, str], list[float]] = {}
    runs = _vs_runs(path)
    for this, base in zip(runs["this"], runs["baseline"], strict=True):
        old = {r["case"]: r for r in base["results"]}
        for row in this["results"]:
            for key, value in row.items():
                was = old.get(row["case"], {}).get(key)
                if isinstance(value, (int, float)) and isinstance(was, (int, float)) and was:
                    found.setdefault((row["case"], key), []).append(value / was)
    return found


def _vs_caption(paths: list[Path], label: str) -> str:
    runs = [_vs_runs(p) for p in paths]
    meta = runs[0]["this"][0]["meta"]
    tes = " and ".join(dict.fromkeys(str(r["this"][0]["meta"]["te"]) for r in runs))
    rounds = " and ".join(str(len(r["this"])) for r in runs)
    if meta.get("source") == "standins":  # no TE and no GPU: stand-ins of TE's tensors, CPU tensors
        run = f"a {meta['machine']} without GPU ({meta['cpu']}), {meta['date']}, torch {meta['torch']}"
        run += f", Python {meta['python']}, stand-ins of TE {tes}'s tensors"
        flags = " --host-source standins"
    else:
        run = f"host of the {meta['gpu']} machine, {meta['date']}, torch {meta['torch']}, Python {meta['python']}"
        run += f", TE {tes}"
        flags = ""
    command = f"`vs_baseline.py --baseline DIR --only host --rounds N{flags}` (N = {rounds})"
    return f"Run: {run}. Command: {command}. {label}"


def vs_host(*paths: Path) -> list[str]:
    per_file = [_round_ratios(p) for p in paths]
    first = _vs_runs(paths[0])["this"][0]["results"]
    experts = sorted({int(r["case"].split()[0].removeprefix("E=")) for r in first})
    shape_ = first[0]["case"].split()[1]

    def cell(e: int, suffix: str, key: str) -> str:
        found = [r[(f"E={e} {shape_} {suffix}", key)] for r in per_file if (f"E={e} {shape_} {suffix}", key) in r]
        if not found:
            return "-"
        pooled = statistics.median([x for ratios in found for x in ratios])
        return f"{pooled:.2f} [" + ", ".join(f"{statistics.median(ratios):.2f}" for ratios in found) + "]"

    body = [[str(e), *(" / ".join(cell(e, *part) for part in parts) for _, parts in VS_HOST_COLUMNS)] for e in experts]
    return _table(["E", *(header for header, _ in VS_HOST_COLUMNS)], body)


QUANTIZE_COLUMNS = {  # bench_quantize.py column -> the table's header
    "g:fused": "fused, graph",
    "fused": "fused, eager",
    "g:fused/exp": "per-expert table",
    "g:mok 2": "two steps (mok)",
    "g:other": "`--other` kernel",
    "TE q": "TE quantizer",
    "TE q+swz": "TE quantizer + swizzle",
}


def _quantize_columns(path: Path) -> list[str]:
    """The columns some row of the run measured."""
    rows = _rows(path)
    return [c for c in QUANTIZE_COLUMNS if any(r["median_us"].get(c) is not None for r in rows)]


def _quantize_flags(path: Path, meta: dict[str, Any]) -> str:
    flags = f"--runs {meta['runs']} --repeats {meta['repeats']} --experts {' '.join(map(str, meta['experts']))}"
    columns = _quantize_columns(path)
    flags += "" if "TE q" in columns else " --no-te"
    return flags + (" --other OTHER.cu" if "g:other" in columns else "")


def quantize(path: Path) -> list[str]:
    columns = _quantize_columns(path)
    body = []
    for r in _rows(path):
        copy = f"{_us(r['median_us']['g:copy'])} ({r['copy_GBps'] / 1000:.2f} TB/s)"
        ratios = r["ratio_to_copy"]
        body.append([r["case"], copy, *(f"{ratios[c]:.2f}" if ratios.get(c) is not None else "-" for c in columns)])
    return _table(["case", "copy, us", *(QUANTIZE_COLUMNS[c] for c in columns)], body)


def host_te(path: Path) -> list[str]:
    results = _host_results(path)
    body = []
    for case, r in results.items():
        if "TE discrete" not in r:
            continue
        e = case.split()[0]
        for how, suffix in (("one call, then a synchronisation", ""), ("calls back to back", " pipelined")):
            checked, unchecked = r[f"kernel/exp{suffix}"], r[f"kernel/exp unchecked{suffix}"]
            discrete, multi = r.get(f"TE discrete{suffix}"), r.get(f"TE multi{suffix}")
            ratios = [
                f"{discrete / checked:.2f}" if discrete else "-",
                f"{discrete / unchecked:.2f}" if discrete else "-",
                f"{multi / checked:.1f}" if multi else "-",
            ]
            body.append([f"{e}, {how}", _us(checked), _us(unchecked), _us(discrete), _us(multi), *ratios])
    header = ["rowwise, eager, us per call", "mok checked", "mok `run_unchecked`", "TE discrete", "TE multi"]
    return _table([*header, "TE discrete / checked", "TE discrete / unchecked", "TE multi / checked"], body)


SUMMARY_CASES = {  # bench_swizzle case -> its label in docs/benchmarks.md
    "rowwise E=256 2048x7168": "rowwise, E=256 2048x7168",
    "rowwise E=256 2080x7200": "rowwise, E=256 2080x7200 (TE's padded rows)",
    "columnwise E=256 2048x7168": "columnwise, E=256 2048x7168",
    "columnwise E=256 2080x7200": "columnwise, E=256 2080x7200 (TE-padded)",
    "layer E=256 fc1+fc2 row+col": "a MoE layer's fc1 + fc2, rowwise + columnwise, E=256, one launch",
}


def summary_device(path: Path) -> list[str]:
    d = _variants(path)[0]
    rows = {r["case"]: r for r in _rows(path)}
    body = [
        [label, _ratio(rows[c], f"g:kernel@{d}/copy"), _ratio(rows[c], f"g:exp@{d}/copy")]
        for c, label in SUMMARY_CASES.items()
    ]
    m = rows["rowwise E=256 2048x7168"]["median"]
    te = f"TE 2.17+'s discrete-weights swizzle of the per-expert tensors: {_us(m.get('g:TE discrete'))} us"
    body.append([f"rowwise, E=256 2048x7168, microseconds ({te})", _us(m[f"g:kernel@{d}"]), _us(m[f"g:exp@{d}"])])
    return _table(["device time against a copy of the same bytes", "grouped", "per-expert"], body)


def summary_host(path: Path) -> list[str]:
    results = _host_results(path)
    both, row = results["E=256 2048x7168 row+col"], results["E=256 2048x7168 row"]
    body = [
        [
            "host time alone, rowwise + columnwise / rowwise",
            f"{_us(both['split refresh'])} / {_us(row['split refresh'])}",
            "-",
            "-",
        ],
        [
            "rowwise, one call then a synchronisation",
            _us(row["kernel/exp"]),
            _us(row["kernel/exp unchecked"]),
            _us(row.get("TE discrete")),
        ],
        [
            "rowwise, calls back to back",
            _us(row["kernel/exp pipelined"]),
            _us(row["kernel/exp unchecked pipelined"]),
            _us(row.get("TE discrete pipelined")),
        ],
    ]
    header = ["256 per-expert weights of 2048x7168, us", "mok checked refresh", "mok `run_unchecked`", "TE discrete"]
    return _table(header, body)


KINDS: dict[str, Callable[..., list[str]]] = {
    "device": device,
    "shape": shape,
    "te": te,
    "layer-parts": layer_parts,
    "host": host,
    "host-te": host_te,
    "summary-device": summary_device,
    "summary-host": summary_host,
    "vs-host": vs_host,
    "quantize": quantize,
}


def regenerate(document: Path) -> tuple[str, list[str]]:
    """(the document with every marked table made again from its files, the markers that differed)."""
    lines = document.read_text().splitlines()
    out: list[str] = []
    differ: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        begin = BEGIN.match(lines[i])
        i += 1
        if not begin:
            continue
        end = lines.index(END, i)
        kind, files = begin.group(1), begin.group(2).split()
        paths = [document.parent / f for f in files]
        made = [caption(kind, files, paths), "", *KINDS[kind](*paths), ""]
        if made != lines[i:end]:
            differ.append(f"{document.name}: {lines[i - 1]}")
        out.extend(made)
        i = end
    return "\n".join(out) + "\n", differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the marked tables")
    args = parser.parse_args()
    stale = []
    for document in DOCUMENTS:
        text, differ = regenerate(document)
        stale += differ
        if args.write and differ:
            document.write_text(text)
    for marker in stale:
        print(f"{'rewrote' if args.write else 'differs from its files'}: {marker}")
    sys.exit(1 if stale and not args.write else 0)


if __name__ == "__main__":
    main()
