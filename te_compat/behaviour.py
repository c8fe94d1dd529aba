"""What the installed TE release does, from te_compat's behaviour rows (te_compat/table.py).

Three facts, each read from TE's source per release and checked against every release of the
matrix: the reciprocal TE's MXFP8 kernels multiply a block by (``exp2f_rcp``: the rule a quantiser
must follow to give TE's bytes), what ``post_all_gather_processing`` does with an MXFP8 weight, and
which quantizer flags change what a tensor holds (MXFP8 2-D block scaling, TE 2.19+).

Nothing here imports TE or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from te_compat import table
from te_compat.errors import describe
from te_compat.source_facts import Classes, keyword_call, lineage
from te_compat.table import NEWEST_RULE, RECIPROCAL_ROWS, ReciprocalRow, Rule
from te_compat.version import parse_te_version, release_of, te_status

_NEWEST = next(r for r in RECIPROCAL_ROWS if r.until is None)


def _release(release: object) -> Version:
    """``release`` (a version string as TE reports it, or a packaging Version) as a plain release."""
    if isinstance(release, Version):
        return release_of(release)
    if isinstance(release, str):
        return release_of(parse_te_version(release))
    raise TypeError(
        f"release: expected a TE version string such as '2.13.0', a packaging Version, or None; "
        f"found {describe(release)}"
    )


def _newest(why: str) -> tuple[Rule, str]:
    return NEWEST_RULE, f"{why}: the newest rule, exp2f_rcp of TE {_NEWEST.since} and later ({_NEWEST.where})"


def _from_row(row: ReciprocalRow, release: Version) -> tuple[Rule, str]:
    note = f"; {row.note}" if row.note else ""
    return row.rule, f"TE {release}: exp2f_rcp of {row.where}, TE {row.span} ({row.introduced_by}){note}"


def reciprocal_rule_source(release: object = None) -> tuple[Rule, str]:
    """(:func:`mxfp8_reciprocal_rule`, the fact it rests on: release, file and PR)."""
    if release is not None:
        found = _release(release)
        row = table.reciprocal_row(found)
        if row is None:
            first = RECIPROCAL_ROWS[0].since
            raise ValueError(f"release: TE {found} has no MXFP8, so no MXFP8 reciprocal rule; expected TE >= {first}")
        return _from_row(row, found)
    status = te_status()
    if status.version is None:
        why = "no Transformer Engine" if not status.present else f"TE version {status.raw_version!r} unreadable"
        return _newest(why)
    installed = release_of(status.version)
    row = table.reciprocal_row(installed)
    if row is None:
        return _newest(f"TE {installed} has no MXFP8")
    if installed > table.checked_through() and row.until is None:
        rule, why = _from_row(row, installed)
        return rule, f"{why}; TE {installed} is newer than the table (checked through {table.CHECKED_THROUGH})"
    return _from_row(row, installed)


def mxfp8_reciprocal_rule(release: object = None) -> Rule:
    """The rule by which TE's MXFP8 kernels turn a scale code into the factor a block's values are
    multiplied by (``exp2f_rcp``): ``"shift"`` (TE 2.0 to 2.12: code 0 gives 1, the other codes their
    bits shifted) or ``"exact"`` (TE 2.13+, PR 2647: ``2^(127 - code)``, NaN for 255), the names of
    ``mok.quantize_reference.ReciprocalRule``.

    ``release`` (a version string or a packaging Version) asks about that release; a release
    without MXFP8 (1.x) raises ValueError, an unreadable version string TEVersionError. By default
    the installed TE's rule (TE is not imported), and the newest rule where TE is absent, has no
    MXFP8, or states no readable version; a TE newer than the table gets the newest row's rule.
    TE 2.0 to 2.5 compute ``exp2f(127 - code)``, which is the shift rule for every block without an
    infinity: the table's row says how the two differ.
    """
    return reciprocal_rule_source(release)[0]


def post_all_gather_support(release: Version | None, usable: bool) -> tuple[bool, str]:
    """(whether ``post_all_gather_processing`` takes MXFP8 weights in this process, why): TE usable
    and a release whose function does nothing with them."""
    if release is None:
        return False, "needs Transformer Engine >= 2.11; found no TE"
    row = table.post_all_gather_row(release)
    if row is None or row.mxfp8 == "absent":
        first = next(r.since for r in table.POST_ALL_GATHER_ROWS if r.mxfp8 != "absent")
        return False, f"TE {release} has no {table.POST_ALL_GATHER_FUNCTION} (TE >= {first})"
    if row.mxfp8 == "raises":
        return False, f"TE {release}: raises ValueError for MXFP8 weights ({row.introduced_by})"
    if not usable:
        return False, f"TE {release} offers it, but TE is not usable here"
    return True, f"TE {release}: a no-op for MXFP8 weights ({row.introduced_by})"


# torch FSDP2 (``fully_shard``) over TE's quantized Parameters: TE's tensor classes take part in its
# all-gather through ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, first in TE 2.10 for
# Float8Tensor and MXFP8Tensor (the matrix records of the 2.10.0 wheel list them; 2.9.0's do not;
# tests/te_compat/test_behaviour.py reads every record). ``fully_shard`` also calls ``param.view(-1)`` on each
# Parameter, which TE answers by dequantizing: TE refuses MXFP8 dequantization below compute
# capability 10.0 ("MXFP8 Dequantization is NOT supported by architectures < 10.0", TE 2.20.2 and
# 2.12.0 on an H100), so MXFP8 Parameters shard only on sm_100 and later; Float8 dequantizes anywhere.
FSDP2_HOOKS_SINCE = "2.10"
FSDP2_DEQUANTIZE_CC = {"float8": None, "mxfp8": (10, 0)}


def fsdp2_support(kind: str, release: Version | None, cc: tuple[int, int] | None) -> tuple[bool, str]:
    """(whether torch FSDP2 can shard TE's ``kind`` Parameters ("float8", "mxfp8") in this process,
    why): a release with TE's FSDP2 hooks for the kind, and a CUDA device on which TE dequantizes
    it (``fully_shard`` asks for a dequantizing ``view``)."""
    if kind not in FSDP2_DEQUANTIZE_CC:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, FSDP2_DEQUANTIZE_CC))}; found {kind!r}")
    if release is None or release < Version(FSDP2_HOOKS_SINCE):
        return False, f"needs TE >= {FSDP2_HOOKS_SINCE} (its FSDP2 all-gather hooks); found {release or 'no TE'}"
    if cc is None:
        return False, "needs a CUDA device; found none visible to torch"
    least = FSDP2_DEQUANTIZE_CC[kind]
    if least is not None and cc < least:
        return False, (
            f"fully_shard dequantizes each Parameter, and TE dequantizes {kind.upper()} only on compute capability "
            f">= {least[0]}.{least[1]}; found {cc[0]}.{cc[1]}"
        )
    return True, f"TE {release}: {kind.upper()} Parameters take part in FSDP2's all-gather"


def two_d_quantization(release: Version | None) -> tuple[bool, str]:
    """(whether the release's MXFP8Quantizer takes ``with_2d_quantization``, the row's fact)."""
    rows = [r for r in table.QUANTIZER_FLAG_ROWS if r.storage == "quantized_2d"]
    found = [r for r in rows if release is not None and r.covers(release)]
    if found:
        return True, found[0].introduced_by
    first = rows[0].since
    return False, f"needs TE >= {first}; found {release or 'no TE'}"


# --- the matrix check ---------------------------------------------------------------------------


def mxfp8_post_all_gather(classes: Classes, functions: Mapping[str, Any]) -> str:
    """What one release's ``post_all_gather_processing`` does with an MXFP8 weight, from its
    recorded facts: "absent", or the outcome of the first ``isinstance`` branch an MXFP8Tensor
    takes (it or a TE base of it), "no-op" where none does."""
    facts = functions.get(table.POST_ALL_GATHER_FUNCTION)
    if facts is None:
        return "absent"
    bases = set(lineage(classes, table.MXFP8_TENSOR)) or {table.MXFP8_TENSOR}
    for tested, outcome in facts["dispatch"]:
        if bases & set(tested):
            return "raises" if str(outcome).startswith("raises") else str(outcome)
    return "no-op"


def check_post_all_gather_rows(release: str, classes: Classes, functions: Mapping[str, Any]) -> list[str]:
    """Every disagreement between the post_all_gather_processing rows and one release's record."""
    version = Version(release)
    covering = [r for r in table.POST_ALL_GATHER_ROWS if r.covers(version)]
    found = mxfp8_post_all_gather(classes, functions)
    if len(covering) != 1:
        spans = ", ".join(r.span for r in covering) or "none"
        return [f"TE {release}: {len(covering)} post_all_gather_processing rows cover it ({spans}); expected one"]
    row = covering[0]
    if found == row.mxfp8:
        return []
    line = functions.get(table.POST_ALL_GATHER_FUNCTION, {}).get("line")
    where = f" (pytorch/tensor/utils.py:{line})" if line else ""
    return [
        f"TE {release}: post_all_gather_processing row {row.span} says {row.mxfp8!r} for MXFP8 weights; the "
        f"release's source{where}: {found!r}"
    ]


def check_quantizer_flag_rows(release: str, classes: Classes) -> list[str]:
    """Every disagreement between the quantizer flag rows and one release's classes: a covered
    release's quantizer assigns the attribute and its constructor takes it as a keyword; a release
    before the row whose quantizer class exists does not assign it."""
    version = Version(release)
    problems = []
    for row in table.QUANTIZER_FLAG_ROWS:
        chain = lineage(classes, row.quantizer)
        assigns = {a for c in chain for a in classes[c]["assigns"]}
        if not row.covers(version):
            if row.attribute in assigns:
                problems.append(
                    f"TE {release}: {row.quantizer} assigns {row.attribute!r}, but the quantizer flag row "
                    f"{row.span} does not cover this release"
                )
            continue
        if not chain:
            problems.append(
                f"TE {release}: quantizer flag row {row.span} names {row.quantizer}, which it does not define"
            )
            continue
        call = keyword_call(classes, row.quantizer, "__init__")
        if row.attribute not in assigns:
            problems.append(f"TE {release}: {row.quantizer} never assigns {row.attribute!r} (row {row.span})")
        if call is None or (row.attribute not in call.accepted and not call.open_ended):
            problems.append(f"TE {release}: {row.quantizer}.__init__ takes no {row.attribute!r} (row {row.span})")
    return problems


def check_reciprocal_rows(release: str, native: Mapping[str, Any]) -> list[str]:
    """Every disagreement between the reciprocal rows and one release's native record
    (matrix/native.py): the covering row's form and file are the source's, and a release whose
    source defines no exp2f_rcp has no row."""
    version = Version(release)
    fact = native.get("exp2f_rcp", {})
    form = fact.get("form", "absent")
    where = f"{fact.get('file')}:{fact.get('line')}" if form != "absent" else ""
    row = table.reciprocal_row(version)
    if row is None:
        return (
            []
            if form == "absent"
            else [f"TE {release}: defines exp2f_rcp ({form}, {where}), but no reciprocal row covers it"]
        )
    problems = []
    if form != row.form:
        shown = f"{form} ({where})" + (f": {fact['body']}" if form == "unknown" else "")
        problems.append(f"TE {release}: reciprocal row {row.span} says exp2f_rcp is {row.form!r}; the source: {shown}")
    elif fact.get("file") != row.where:
        problems.append(f"TE {release}: reciprocal row {row.span} cites {row.where}; exp2f_rcp is in {where}")
    return problems
