"""Check te_compat's release table against what each real TE release defines.

For every release in the matrix and every tensor kind the table covers there:
- every class the row names exists at that module path in that release;
- every attribute the row would probe is assigned (or is a property) under that name by the
  row's classes or their TE base classes;
- every attribute those classes assign is known to the row (probed or listed as known), so a
  rename in a future release fails here instead of being silently missed;
- a release that defines a covered class the table has no row for fails;
- the quantizer rows (te_compat.gemm_layout) and quantize rows (te_compat.quantize) name classes,
  methods, attributes and keyword parameters the release defines, and pass every required one;
- the behaviour rows (te_compat.table): what post_all_gather_processing does with MXFP8 weights
  (its isinstance dispatch, in the record's functions), the quantizer flags (assigned and taken
  by the constructor exactly in their range), and, from the release's C++ (matrix/native.py's
  records), the form of exp2f_rcp and the facts that start the GEMM-layout rows.

The check itself is ``te_compat.source_facts.check_classes``, shared with ``te-compat verify``.

    python -m matrix.check              # every committed record
    python -m matrix.check 2.14.1       # one release
"""

from __future__ import annotations

import argparse
from typing import Any

from packaging.version import Version

from matrix.extract import load_record
from matrix.native import load_native
from matrix.releases import matrix_release, release_versions
from te_compat import table
from te_compat.behaviour import check_post_all_gather_rows, check_quantizer_flag_rows, check_reciprocal_rows
from te_compat.gemm_layout import check_native_quantizer_rows, check_quantizer_rows
from te_compat.quantize import check_quantize_rows
from te_compat.source_facts import check_classes, lineage
from te_compat.source_facts import uncovered_quantized as _uncovered
from te_compat.table import StorageRow

__all__ = ["check_record", "check_release", "lineage", "main", "uncovered_quantized"]


def check_record(record: dict[str, Any], rows: tuple[StorageRow, ...] = table.ROWS) -> list[str]:
    """Every disagreement between ``rows`` and one release's record, as readable lines."""
    return list(check_classes(Version(record["release"]), record["classes"], rows).problems)


def uncovered_quantized(record: dict[str, Any]) -> list[str]:
    """Quantized tensor classes of a release that no row covers (informational)."""
    return _uncovered(record["classes"])


def check_native(version: str, native: dict[str, Any] | None) -> list[str]:
    """The rows whose facts live in TE's C++ (the reciprocal rows; the GEMM-layout rows' start)
    against one release's native record (matrix/native.py)."""
    if native is None:
        return [f"TE {version}: no native record (python -m matrix.native {version})"]
    return check_reciprocal_rows(version, native) + check_native_quantizer_rows(version, native)


def check_release(
    version: str, record: dict[str, Any] | None = None, native: dict[str, Any] | None = None
) -> list[str]:
    """Check one matrix release (its own record, or its source release's record; its native record)."""
    if record is None:
        record = load_record(matrix_release(version).source_from)
    if native is None:
        native = load_native(version)
    # the storage rows, the quantizer rows behind te_compat.request_gemm_layout_scales, the
    # quantize rows behind te_compat.mxfp8_quantize_into, and the behaviour rows
    classes = record["classes"]
    return (
        check_record({**record, "release": version})
        + check_quantizer_rows(version, classes)
        + check_quantize_rows(version, classes)
        + check_post_all_gather_rows(version, classes, record.get("functions", {}))
        + check_quantizer_flag_rows(version, classes)
        + check_native(version, native)
    )


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
