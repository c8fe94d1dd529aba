"""Ask TE to write GEMM-layout ("swizzled") scales at its next quantisation of a parameter.

From TE 2.12 every quantizer carries ``optimize_for_gemm``; a block-scaled quantizer with it set
marks what it quantizes with ``_with_gemm_swizzled_scales`` and writes the scales in the layout
cuBLAS reads, so a reader of the parameter has nothing to convert. This module is the table of
which quantizer, from which release, honours which attribute under which conditions, and the one
call that sets it: :func:`request_gemm_layout_scales`. It sets a flag on TE's quantizer objects
and nothing else: no bytes are converted here, and TE is never imported.

Limits TE itself documents (TE 2.18+, PR 3093, module/base.py ``_enable_weight_preswizzle``):
TE does not pre-swizzle primary FP8 weights, because its dequantisation and FSDP2 all-gather
expect compact scales (2.20.2 mxfp8_tensor.py raises NotImplementedError for FSDP2 on swizzled
scales), and ``cast_master_weights_to_fp8``'s MXFP8 partial cast writes compact scales without
reading the flag (2.20.2 tensor/utils.py). Use this for weights re-quantised by TE's own
``quantize_``/``update_quantized``; not with FSDP2 or the partial-cast path.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from packaging.version import Version

from te_compat import table
from te_compat.errors import TENotFoundError, UnsupportedTensorError, describe
from te_compat.probe import (
    class_path,
    find_in_lineage,
    storage_field,
    tensor_kind,
    tensor_kind_or_none,
)
from te_compat.source_facts import lineage
from te_compat.table import TE, ReleaseRange, TensorKind
from te_compat.version import release_of, te_status


@dataclass(frozen=True)
class LayoutCondition:
    """One quantisation path on which TE writes GEMM-layout scales, and the shapes it takes.

    The path applies when every quantizer flag has the value given; the 2-D view of the tensor
    (rows = product of the leading dims, columns = the last) must divide by the multiples.
    """

    flags: dict[str, bool]
    row_multiple: int
    column_multiple: int
    source: str  # where TE decides this


@dataclass(frozen=True)
class QuantizerRow(ReleaseRange):
    """Which attribute of one quantizer class asks for GEMM-layout scales, over a release range."""

    quantizer: str  # "module.Class" of the quantizer
    since: str  # first TE release where setting the attribute makes TE write GEMM-layout scales
    until: str | None  # first release it no longer describes (None: still current)
    attribute: str  # assigned by the quantizer's constructor (or a TE base's)
    value: bool
    kinds: frozenset[TensorKind]  # tensor kinds whose quantizer this can be
    conditions: tuple[LayoutCondition, ...]  # at least one must hold
    introduced_by: str
    min_compute_capability: tuple[int, int] | None = None
    # the fact of matrix/native.py's records that holds in exactly the releases this quantizer's
    # rows cover: what makes TE write GEMM-layout scales lives in its C++, not in the wheel
    native: str | None = None

    @property
    def reads(self) -> frozenset[str]:
        """Every quantizer attribute the row sets or reads."""
        return frozenset({self.attribute, *(f for c in self.conditions for f in c.flags)})


@dataclass(frozen=True)
class ModuleResetRow(ReleaseRange):
    """A TE module that rewrites the attribute on its own weight quantizers at every forward.

    A parameter whose quantizer *is* one of the module's (not a copy, as a GroupedTensor's is)
    gets the module's decision back, which is False for primary FP8 weights.
    """

    since: str
    until: str | None
    decision_method: str  # the module method that decides (its presence marks the behaviour)
    primary_flag: str  # module attribute: parameters are TE quantized tensors
    quantizers: tuple[str, str]  # module attribute and key holding the forward quantizers
    introduced_by: str


_MXFP8_QUANTIZER = f"{TE}.tensor.mxfp8_tensor.MXFP8Quantizer"
_NVFP4_QUANTIZER = f"{TE}.tensor.nvfp4_tensor.NVFP4Quantizer"

QUANTIZER_ROWS: tuple[QuantizerRow, ...] = (
    QuantizerRow(
        _MXFP8_QUANTIZER,
        "2.12",
        None,
        attribute="optimize_for_gemm",
        value=True,
        kinds=frozenset({TensorKind.MXFP8, TensorKind.GROUPED}),
        conditions=(LayoutCondition({}, 32, 32, "MXFP8Quantizer.is_quantizable: both dims divisible by 32"),),
        introduced_by=(
            "TE 2.12 (PR 2486, issue 2446): Quantizer.optimize_for_gemm (quantized_tensor.py:216); "
            "MXFP8Quantizer.make_empty passes it as with_gemm_swizzled_scales (mxfp8_tensor.py:160), and so "
            "does MXFP8Quantizer::create_tensor (csrc/quantizer.cpp:865); 2.13+ GroupedTensor members take it "
            "from the grouped quantizer"
        ),
        native="mxfp8_create_swizzled",
    ),
    QuantizerRow(
        _NVFP4_QUANTIZER,
        "2.17",
        None,
        attribute="optimize_for_gemm",
        value=True,
        kinds=frozenset({TensorKind.NVFP4, TensorKind.GROUPED}),
        conditions=(
            LayoutCondition(
                {},
                16,
                16,
                "NVFP4Quantizer::create_tensor: both dims divisible by 16 (csrc/quantizer.cpp); every NVFP4 path "
                "then swizzles (csrc/extensions/cast.cpp quantize)",
            ),
        ),
        introduced_by=(
            "TE 2.17 (PR 3076): tex.quantize swizzles the scales after quantising when the quantizer has "
            "optimize_for_gemm and its kernel wrote them compact (2.17.0 csrc/extensions/cast.cpp:79-81, "
            "inplace_swizzle_scale_for_gemm), and the RHT cast fusion writes them swizzled itself (2.17.0 "
            "csrc/quantizer.cpp:1812); 2.12-2.16 NVFP4Quantizer::create_tensor and convert_and_update_tensor "
            "hard-code with_gemm_swizzled_scales = false (2.16.1 csrc/quantizer.cpp:1770, 2055)"
        ),
        min_compute_capability=(10, 0),
        native="quantize_post_swizzle",
    ),
)

MODULE_RESET_ROWS: tuple[ModuleResetRow, ...] = (
    ModuleResetRow(
        "2.18",
        None,
        decision_method="_enable_weight_preswizzle",
        primary_flag="primary_weights_in_fp8",
        quantizers=("quantizers", "scaling_fwd"),
        introduced_by=(
            "TE 2.18 (PR 3093): GroupedLinear.forward sets optimize_for_gemm on its weight "
            "quantizers to _enable_weight_preswizzle(), False for primary FP8 weights "
            "(2.20.2 grouped_linear.py:2253, base.py:1277)"
        ),
    ),
)


class GemmLayoutStatus(str, Enum):
    """What :func:`request_gemm_layout_scales` did for one parameter."""

    ENABLED = "enabled"
    ALREADY_ON = "already on"
    UNSUPPORTED = "unsupported"
    NOT_QUANTIZED = "not quantized"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GemmLayoutEntry:
    name: str
    kind: TensorKind
    status: GemmLayoutStatus
    reason: str


@dataclass(frozen=True)
class GemmLayoutReport:
    """Per parameter: enabled now, already on, unsupported (with the reason), or not quantized."""

    release: Version | None
    entries: tuple[GemmLayoutEntry, ...] = field(default_factory=tuple)

    def named(self, status: GemmLayoutStatus) -> tuple[str, ...]:
        """The names of the parameters with ``status``."""
        return tuple(e.name for e in self.entries if e.status is status)

    enabled = property(lambda self: self.named(GemmLayoutStatus.ENABLED), doc="Parameters now set to GEMM layout.")
    already_on = property(lambda self: self.named(GemmLayoutStatus.ALREADY_ON), doc="Parameters already set.")
    unsupported = property(lambda self: self.named(GemmLayoutStatus.UNSUPPORTED), doc="Parameters TE cannot set.")
    not_quantized = property(lambda self: self.named(GemmLayoutStatus.NOT_QUANTIZED), doc="Unquantized parameters.")

    def __str__(self) -> str:
        head = ("parameter", "kind", "status", "reason")
        rows = [head] + [(e.name, str(e.kind), str(e.status), e.reason) for e in self.entries]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        te = f"TE {self.release}" if self.release else "no TE version"
        lines = [
            f"GEMM-layout scales ({te}): {len(self.enabled)} enabled, {len(self.already_on)} already on, "
            f"{len(self.unsupported)} unsupported, {len(self.not_quantized)} not quantized"
        ]
        lines += ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        return "\n".join(line.rstrip() for line in lines)


# --- the matrix check -------------------------------------------------------------------------


def check_quantizer_rows(
    release: str, classes: dict[str, Any], rows: tuple[QuantizerRow, ...] = QUANTIZER_ROWS
) -> list[str]:
    """Every disagreement between ``rows`` and one release's record (``record["classes"]``)."""
    version = Version(release)
    problems: list[str] = []
    for row in rows:
        if not row.covers(version):
            continue
        span = f"{row.since}+" if row.until is None else f"{row.since}..{row.until}"
        if row.quantizer not in classes:
            problems.append(
                f"TE {release}: quantizer row {span} names {row.quantizer}, which this release does not define"
            )
            continue
        chain = lineage(classes, row.quantizer)
        assigned = {a for c in chain for a in classes[c]["assigns"]} | {
            p for c in chain for p in classes[c]["properties"]
        }
        for attr in sorted(row.reads - assigned):
            problems.append(
                f"TE {release}: quantizer row {span} sets or reads {attr!r} on {row.quantizer}, but it "
                f"(and its TE bases {', '.join(chain[1:]) or 'none'}) never assign it (a rename?)"
            )
    return problems


def check_native_quantizer_rows(
    release: str, native: Mapping[str, Any], rows: tuple[QuantizerRow, ...] = QUANTIZER_ROWS
) -> list[str]:
    """Every disagreement between the rows' ``native`` facts and one release's native record
    (matrix/native.py): each fact holds exactly in the releases its quantizer's rows cover."""
    version = Version(release)
    problems = []
    for fact in sorted({r.native for r in rows if r.native is not None}):
        own = [r for r in rows if r.native == fact]
        covered = [r for r in own if r.covers(version)]
        found = native.get(fact, {})
        holds = bool(found.get("present"))
        where = f"{found.get('file')}:{found.get('line')}" if holds else str(found.get("file", "its source"))
        name = own[0].quantizer.rsplit(".", 1)[1]
        if holds and not covered:
            first = min(own, key=lambda r: Version(r.since))
            problems.append(
                f"TE {release}: {fact} holds ({where}), but no {name} GEMM-layout row covers it (the first starts "
                f"at {first.since})"
            )
        if covered and not holds:
            problems.append(
                f"TE {release}: {name} GEMM-layout row {covered[0].since}+ covers it, but {fact} does not hold "
                f"in {where}"
            )
    return problems


# --- the request ------------------------------------------------------------------------------


def _rows_for_quantizer(quantizer: object) -> tuple[QuantizerRow, ...]:
    """Rows of the quantizer's class or its nearest TE base, by module path, else by class name."""
    found = find_in_lineage(type(quantizer), _quantizer_rows_by_path())
    return found[0] if found is not None else ()


def _quantizer_rows_by_path() -> dict[str, tuple[QuantizerRow, ...]]:
    by_path: dict[str, tuple[QuantizerRow, ...]] = {}
    for row in QUANTIZER_ROWS:
        by_path[row.quantizer] = (*by_path.get(row.quantizer, ()), row)
    return by_path


def _shapes(param: object, kind: TensorKind) -> list[tuple[int, ...]]:
    if kind is TensorKind.GROUPED:
        shapes = storage_field(param, "tensor_shapes") or []
        return [tuple(int(d) for d in s) for s in shapes]
    return [tuple(int(d) for d in param.shape)]  # type: ignore[attr-defined]


def _condition_refusal(row: QuantizerRow, quantizer: object, shapes: list[tuple[int, ...]]) -> str | None:
    """Why TE would not write GEMM-layout scales for these shapes, or None when it would."""
    name = type(quantizer).__name__
    found = {f: getattr(quantizer, f, None) for c in row.conditions for f in c.flags}
    odd = ", ".join(f"{f}={describe(v)}" for f, v in found.items() if not isinstance(v, (bool, type(None))))
    if odd:  # TE's quantizers store True or False: which path TE would take is not guessed
        return f"{name}: expected bool flags (TE stores True or False); found {odd}"
    flags = {f: v is True for f, v in found.items()}  # None: not set, as in a release without it
    paths = [c for c in row.conditions if all(flags[f] is v for f, v in c.flags.items())]
    if not paths:
        wanted = "; or ".join(", ".join(f"{f}={v}" for f, v in c.flags.items()) for c in row.conditions)
        have = ", ".join(f"{f}={v}" for f, v in found.items())
        return f"{name} is on no path where TE writes GEMM-layout scales (needs {wanted}; found {have})"
    cond = paths[0]
    for shape in shapes:
        rows, cols = math.prod(shape[:-1]), shape[-1] if shape else 0
        if rows % cond.row_multiple or cols % cond.column_multiple:
            return (
                f"TE refuses shape {shape} (rows {rows}, columns {cols}): {cond.source} needs rows divisible "
                f"by {cond.row_multiple} and columns by {cond.column_multiple}"
            )
    return None


def _current_compute_capability() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)


@dataclass
class _Context:
    release: Version
    compute_capability: tuple[int, int] | None
    shared_quantizers: dict[int, str]  # id(quantizer) -> why TE resets it at every forward


def _quantizers_of(param: object, kind: TensorKind) -> list[object]:
    """The quantizer TE quantizes ``param`` with, then (grouped) each member's own copy."""
    main = storage_field(param, "quantizer")
    if main is None:
        return []
    found = [main]
    if kind is TensorKind.GROUPED:
        for member in storage_field(param, "quantized_tensors") or []:
            q = storage_field(member, "quantizer")
            if q is not None and all(q is not f for f in found):
                found.append(q)
    return found


def _judge(name: str, param: object, ctx: _Context) -> GemmLayoutEntry:
    kind = tensor_kind(param)
    if kind is TensorKind.PLAIN:
        return GemmLayoutEntry(name, kind, GemmLayoutStatus.NOT_QUANTIZED, "a plain tensor: no TE quantizer")
    unsupported = GemmLayoutStatus.UNSUPPORTED
    if kind is TensorKind.OTHER_QUANTIZED:
        return GemmLayoutEntry(name, kind, unsupported, f"{class_path(type(param))} is a TE class no table row covers")
    if table.row_for(kind, ctx.release) is None and ctx.release <= table.checked_through():
        return GemmLayoutEntry(name, kind, unsupported, f"TE {ctx.release} has no {kind} storage row")
    quantizers = _quantizers_of(param, kind)
    if not quantizers:
        return GemmLayoutEntry(name, kind, unsupported, "no quantizer: TE has nothing to re-quantise it with")
    main = quantizers[0]
    qname = type(main).__name__
    rows = _rows_for_quantizer(main)
    if not rows or not any(kind in r.kinds for r in rows):
        return GemmLayoutEntry(
            name, kind, unsupported, f"no GEMM-layout row covers {kind} tensors quantized by {qname}"
        )
    row = next((r for r in rows if r.covers(ctx.release) and kind in r.kinds), None)
    if row is None:
        first = min(rows, key=lambda r: Version(r.since))
        return GemmLayoutEntry(
            name, kind, unsupported, f"needs TE >= {first.since} ({first.introduced_by}); installed: TE {ctx.release}"
        )
    return _apply(name, kind, param, quantizers, row, ctx)


def _apply(
    name: str, kind: TensorKind, param: object, quantizers: list[object], row: QuantizerRow, ctx: _Context
) -> GemmLayoutEntry:
    main = quantizers[0]
    qname = type(main).__name__
    unsupported = GemmLayoutStatus.UNSUPPORTED
    reset = ctx.shared_quantizers.get(id(main))
    if reset is not None:
        return GemmLayoutEntry(name, kind, unsupported, reset)
    cc = ctx.compute_capability
    need = row.min_compute_capability
    if need is not None and (cc is None or cc < need):
        return GemmLayoutEntry(
            name,
            kind,
            unsupported,
            f"{qname}: TE writes GEMM-layout scales on compute capability >= "
            f"{need[0]}.{need[1]} only; found {f'{cc[0]}.{cc[1]}' if cc else 'no CUDA device'}",
        )
    refusal = _condition_refusal(row, main, _shapes(param, kind))
    if refusal is not None:
        return GemmLayoutEntry(name, kind, unsupported, refusal)
    pending = [q for q in quantizers if getattr(q, row.attribute, None) != row.value]
    if not pending:
        return GemmLayoutEntry(
            name, kind, GemmLayoutStatus.ALREADY_ON, f"{qname}.{row.attribute} is already {row.value}"
        )
    for q in pending:
        setattr(q, row.attribute, row.value)
    now = (
        "already in GEMM layout" if storage_field(param, "scales_swizzled") is True else "compact until TE re-quantises"
    )
    where = f" on {len(pending)} quantizers (grouped and members)" if len(pending) > 1 else ""
    return GemmLayoutEntry(
        name, kind, GemmLayoutStatus.ENABLED, f"{qname}.{row.attribute} = {row.value}{where}; scales now: {now}"
    )


def _is_module(obj: object) -> bool:
    return callable(getattr(obj, "named_parameters", None)) and callable(getattr(obj, "named_modules", None))


def _is_single(obj: object) -> bool:
    """A tensor, a Parameter, or a TE object (2.13's GroupedTensor is no torch.Tensor)."""
    return tensor_kind_or_none(obj) is not None


def _named(params_or_module: object) -> list[tuple[str, object]]:
    """(name, parameter) for each parameter given; every one checked to be a tensor."""
    if _is_module(params_or_module):
        named = list(params_or_module.named_parameters())  # type: ignore[attr-defined]
    elif isinstance(params_or_module, Mapping):
        named = [(name if isinstance(name, str) else describe(name), p) for name, p in params_or_module.items()]
    elif _is_single(params_or_module):
        named = [("<parameter>", params_or_module)]
    elif isinstance(params_or_module, (str, bytes)) or not isinstance(params_or_module, Iterable):
        raise UnsupportedTensorError(
            "request_gemm_layout_scales: params_or_module: expected a torch.nn.Module, a parameter, a mapping "
            f"of name -> parameter or an iterable of parameters; found {describe(params_or_module)}"
        )
    else:
        named = [(f"[{i}]", p) for i, p in enumerate(params_or_module)]
    for name, p in named:
        if not _is_single(p):
            raise UnsupportedTensorError(
                f"request_gemm_layout_scales: {name}: expected a torch.Tensor, a Parameter or a Transformer Engine "
                f"tensor; found {describe(p)}"
            )
    return named


def _checked_compute_capability(value: object) -> tuple[int, int] | None:
    """``value`` as (major, minor), or a TypeError/ValueError naming the parameter."""
    if value is None:
        return None
    expected = "a (major, minor) tuple of two ints >= 0 such as (10, 0), or None"
    found = describe(value)
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"request_gemm_layout_scales: compute_capability: expected {expected}; found {found}")
    if len(value) != 2 or min(value) < 0:
        raise ValueError(f"request_gemm_layout_scales: compute_capability: expected {expected}; found {found}")
    return value[0], value[1]


def _shared_quantizers(params_or_module: object, release: Version) -> dict[int, str]:
    """Quantizers TE's own modules rewrite at every forward (only visible from a module)."""
    rows = [r for r in MODULE_RESET_ROWS if r.covers(release)]
    if not rows or not _is_module(params_or_module):
        return {}
    out: dict[int, str] = {}
    for _, module in params_or_module.named_modules():  # type: ignore[attr-defined]
        for row in rows:
            if not callable(getattr(module, row.decision_method, None)) or not getattr(module, row.primary_flag, False):
                continue
            attr, key = row.quantizers
            owned = (getattr(module, attr, None) or {}).get(key) or []
            for q in owned:
                if q is not None:
                    out[id(q)] = (
                        f"its quantizer is {type(module).__name__}'s own, which TE {release} resets at every "
                        f"forward for primary FP8 weights ({row.introduced_by})"
                    )
    return out


def request_gemm_layout_scales(
    params_or_module: object, *, compute_capability: tuple[int, int] | None = None
) -> GemmLayoutReport:
    """Ask TE to write GEMM-layout scales at its next quantisation of each quantized parameter.

    ``params_or_module``: a torch.nn.Module (its named_parameters), a mapping of name ->
    parameter (``dict(model.named_parameters())``; the report uses its names), one parameter, or
    an iterable of parameters (named ``[i]``). Sets the attribute the installed release's table
    row names on each parameter's quantizer (and, for a GroupedTensor, on its members' copies);
    converts nothing. Plain tensors are reported as not quantized. ``compute_capability`` is
    (major, minor), by default the current CUDA device's (only NVFP4 depends on it). A wrong
    argument raises TypeError or ValueError (an element that is no tensor:
    UnsupportedTensorError) naming it.
    """
    cc = _checked_compute_capability(compute_capability)
    named = _named(params_or_module)
    status = te_status()
    release = release_of(status.version) if status.version is not None else None
    if release is None:
        quantized = [n for n, p in named if tensor_kind(p) is not TensorKind.PLAIN]
        if quantized:
            raise TENotFoundError(
                f"cannot ask TE for GEMM-layout scales of {', '.join(quantized)}: the table is keyed by TE "
                f"release, and no Transformer Engine version was found ({status.reason})"
            )
        entries = tuple(
            GemmLayoutEntry(n, TensorKind.PLAIN, GemmLayoutStatus.NOT_QUANTIZED, "a plain tensor: no TE quantizer")
            for n, _ in named
        )
        return GemmLayoutReport(None, entries)
    ctx = _Context(release, cc or _current_compute_capability(), _shared_quantizers(params_or_module, release))
    return GemmLayoutReport(release, tuple(_judge(n, p, ctx) for n, p in named))
