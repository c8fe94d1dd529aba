"""Quantise a high-precision tensor into MXFP8 with TE's own quantizer, into buffers the caller owns.

Deprecated as an API (one more release): the quantise API of this library is
``mok.quantize_mxfp8`` (mok's kernel, on any CUDA device, the torch reference elsewhere, TE's
bytes; its self-test checks it against TE's quantizer). What stays here are TE's facts: the rows
of how each release quantises (:data:`QUANTIZE_ROWS`, checked by the matrix and read by the
``mxfp8_quantization`` capability) and where TE's kernels write (:func:`support`).

TE offers no call that quantises into arbitrary memory, but every 2.x release can wrap given
buffers in an ``MXFP8Tensor`` and re-quantise into that tensor in place
(``MXFP8Quantizer.update_quantized(src, dst)``, which runs ``tex.quantize(src, quantizer, dst)``).
:data:`QUANTIZE_ROWS` says, per release range, which classes and keywords that takes; from TE
2.12 a quantizer with ``optimize_for_gemm`` writes the scales in the GEMM ("swizzled") layout
(te_compat.gemm_layout's row). ``python -m matrix.check`` checks every row against the classes,
parameters and attributes each real release defines (``matrix/records/``).

Devices. TE's MXFP8 cast kernels do their work only where ``__CUDA_ARCH__ >= 1000``: the body of
``cast_mxfp8_2D_kernel`` (common/util/cast_kernels.cuh) and of ``quantize_mxfp8_kernel``
(common/cast/mxfp8/quantize_mxfp8.cuh, TE PR 2248) is inside ``#if (defined __CUDA_ARCH__) &&
(__CUDA_ARCH__ >= 1000)``. Before PR 2248 the host dispatch refused compute capability < 10.0
(``fp8_quantize_arch_l_100``: "Not implemented scaling mode ... on GPU with compute capability <
10.0"); after it the kernel is launched there and writes nothing (seen with TE 2.20.2 on an H200,
sm_90). TE's own MXFP8 check (``check_mxfp8_support``, pytorch/fp8.py, 2.9+ quantization.py)
refuses 12.0 and newer from TE 2.6 ("not supported on 12.0+ architectures yet"; TE PR 3195's
support matrix: "limited to compute capability 10.0 through 10.x"). So TE quantises MXFP8 on
compute capability 10.x and nothing else: :data:`MXFP8_QUANTIZE_CC`.

Nothing here imports TE or torch until :func:`mxfp8_quantize_into` is called.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from te_compat.errors import MissingFeatureError
from te_compat.errors import describe as describe_value
from te_compat.gemm_layout import QUANTIZER_ROWS, QuantizerRow
from te_compat.geometry import MXFP8
from te_compat.source_facts import Classes, KeywordCall, keyword_call
from te_compat.table import TE, ReleaseRange
from te_compat.version import release_of, te_import_status

if TYPE_CHECKING:
    import torch

# [from, below): the compute capabilities TE's MXFP8 cast kernels write on (module docstring)
MXFP8_QUANTIZE_CC: tuple[tuple[int, int], tuple[int, int]] = ((10, 0), (12, 0))
E4M3 = "kFloat8E4M3"  # the member of transformer_engine_torch.DType every 2.x quantizer takes


@dataclass(frozen=True)
class QuantizeRow(ReleaseRange):
    """How one TE release range quantises into an MXFP8 tensor built around given buffers."""

    since: str
    until: str | None  # first release it no longer describes (None: still current)
    quantizer: str  # "module.Class" of the quantizer
    quantizer_keywords: tuple[str, ...]  # what its constructor is called with
    into: str  # the quantizer method that quantises into an existing tensor
    into_positional: tuple[str, ...]  # its leading positional parameters, as passed
    tensor: str  # "module.Class" of the tensor wrapping the buffers
    tensor_keywords: tuple[str, ...]  # what its constructor is called with
    swizzled_keyword: str | None  # the tensor keyword saying its scales are in GEMM layout
    introduced_by: str


_QUANTIZER = f"{TE}.tensor.mxfp8_tensor.MXFP8Quantizer"
_TENSOR = f"{TE}.tensor.mxfp8_tensor.MXFP8Tensor"
_QUANTIZER_KEYWORDS = ("fp8_dtype", "rowwise", "columnwise")
_TENSOR_KEYWORDS = (
    "shape",
    "dtype",
    "rowwise_data",
    "rowwise_scale_inv",
    "columnwise_data",
    "columnwise_scale_inv",
    "fp8_dtype",
    "quantizer",
)

QUANTIZE_ROWS: tuple[QuantizeRow, ...] = (
    QuantizeRow(
        "2.0",
        "2.12",
        _QUANTIZER,
        _QUANTIZER_KEYWORDS,
        "update_quantized",
        ("src", "dst"),
        _TENSOR,
        _TENSOR_KEYWORDS,
        None,
        introduced_by=(
            "TE 2.0 (on PyPI from 2.1.0): MXFP8Quantizer(fp8_dtype, *, rowwise, columnwise) and "
            "update_quantized(src, dst), which runs tex.quantize into dst's buffers (tensor/mxfp8_tensor.py); "
            "compact scales only"
        ),
    ),
    QuantizeRow(
        "2.12",
        None,
        _QUANTIZER,
        _QUANTIZER_KEYWORDS,
        "update_quantized",
        ("src", "dst"),
        _TENSOR,
        (*_TENSOR_KEYWORDS, "with_gemm_swizzled_scales"),
        "with_gemm_swizzled_scales",
        introduced_by=(
            "TE 2.12 (PR 2486): MXFP8Tensor requires with_gemm_swizzled_scales, and a quantizer with "
            "optimize_for_gemm writes GEMM-layout scales (te_compat.gemm_layout's MXFP8Quantizer row)"
        ),
    ),
)


def quantize_row(release: Version) -> QuantizeRow | None:
    """The row for ``release`` (a TE newer than the table gets the newest), or None (1.x)."""
    return next((r for r in QUANTIZE_ROWS if r.covers(release)), None)


def gemm_layout_row(row: QuantizeRow, release: Version) -> QuantizerRow | None:
    """te_compat.gemm_layout's row of ``row.quantizer`` at ``release``: the attribute asking TE
    for GEMM-layout scales (None: the release writes compact scales only)."""
    return next((g for g in QUANTIZER_ROWS if g.quantizer == row.quantizer and g.covers(release)), None)


def describe(row: QuantizeRow, release: Version) -> str:
    """One line for the report: the call, and how GEMM-layout scales are asked for."""
    name = row.quantizer.rsplit(".", 1)[1]
    gemm = gemm_layout_row(row, release)
    layout = f"GEMM-layout scales via {name}.{gemm.attribute}" if gemm else "compact scales only"
    return f"{name}.{row.into} into a {row.tensor.rsplit('.', 1)[1]} of given buffers; {layout}"


def device_quantizes(cc: tuple[int, int] | None) -> bool:
    """Whether TE's MXFP8 cast kernels write on a device of compute capability ``cc``."""
    low, below = MXFP8_QUANTIZE_CC
    return cc is not None and low <= cc < below


def support(release: Version | None, usable: bool, cc: tuple[int, int] | None) -> tuple[bool, str]:
    """(whether TE can quantise MXFP8 in this process, why not): TE present and importable, a
    release with a row, and a device whose compute capability TE's MXFP8 kernels write on."""
    low, below = MXFP8_QUANTIZE_CC
    span = f"{low[0]}.{low[1]} <= compute capability < {below[0]}.{below[1]}"
    if release is None or not usable:
        return False, "needs a usable Transformer Engine; found none usable"
    if quantize_row(release) is None:
        return False, f"needs TE >= {QUANTIZE_ROWS[0].since} (MXFP8Quantizer); found TE {release}"
    if not device_quantizes(cc):
        found = "no CUDA device" if cc is None else f"compute capability {cc[0]}.{cc[1]}"
        return False, (
            f"TE's MXFP8 cast kernels write only on {span} (on 9.x they raise or write nothing); found {found}"
        )
    return True, ""


# --- the matrix check -------------------------------------------------------------------------


def _keyword_problems(where: str, call: KeywordCall | None, passed: Sequence[str]) -> list[str]:
    if call is None:
        return [f"{where} is not defined by the class or its TE bases"]
    problems = []
    unknown = sorted(set(passed) - call.accepted)
    if unknown and not call.open_ended:
        problems.append(f"{where} does not accept {', '.join(unknown)} (a rename?)")
    missing = sorted(call.required - set(passed))
    if missing:
        problems.append(f"{where} requires {', '.join(missing)}, which the row does not pass")
    return problems


def _row_problems(release: Version, classes: Classes, row: QuantizeRow) -> list[str]:
    missing = [c for c in (row.quantizer, row.tensor) if c not in classes]
    if missing:
        return [f"names {c}, which this release does not define" for c in missing]
    problems = _keyword_problems(
        f"{row.quantizer}.__init__", keyword_call(classes, row.quantizer, "__init__"), row.quantizer_keywords
    )
    problems += _keyword_problems(
        f"{row.tensor}.__new__", keyword_call(classes, row.tensor, "__new__"), row.tensor_keywords
    )
    into = keyword_call(classes, row.quantizer, row.into)
    if into is None:
        problems.append(f"{row.quantizer}.{row.into} is not defined by the class or its TE bases")
    else:
        n = len(row.into_positional)
        if into.positional[:n] != row.into_positional:
            problems.append(
                f"{row.quantizer}.{row.into} takes {', '.join(into.positional) or 'nothing'} positionally; "
                f"the row passes {', '.join(row.into_positional)}"
            )
        more = sorted(into.required - set(into.positional[:n]))
        if more:
            problems.append(f"{row.quantizer}.{row.into} also requires {', '.join(more)}")
    gemm = gemm_layout_row(row, release)
    if gemm is not None and row.swizzled_keyword is None:
        problems.append(
            f"TE offers GEMM-layout scales here ({gemm.attribute}), but the row passes no tensor keyword for them"
        )
    if gemm is None and row.swizzled_keyword is not None:
        problems.append(
            f"the row passes {row.swizzled_keyword}, but te_compat.gemm_layout has no GEMM-layout row for this release"
        )
    return problems


def check_quantize_rows(release: str, classes: Classes, rows: tuple[QuantizeRow, ...] = QUANTIZE_ROWS) -> list[str]:
    """Every disagreement between ``rows`` and one release's record (``record["classes"]``): one
    row covers each release that defines a quantizer the rows name, and its classes, methods and
    keywords are the release's own (every keyword accepted, every required one passed)."""
    version = Version(release)
    covering = [r for r in rows if r.covers(version)]
    if not covering:
        present = sorted(({_QUANTIZER} | {r.quantizer for r in rows}) & set(classes))
        return [f"TE {release}: defines {', '.join(present)} but no quantize row covers it"] if present else []
    problems = []
    if len(covering) > 1:
        problems.append(f"TE {release}: {len(covering)} quantize rows cover it ({', '.join(r.span for r in covering)})")
    row = covering[0]
    return problems + [f"TE {release}: quantize row {row.span}: {p}" for p in _row_problems(version, classes, row)]


# --- the call ---------------------------------------------------------------------------------


def padded_scale_shape(rows: int, columns: int, *, columnwise: bool) -> tuple[int, int]:
    """The 2-D scale buffer TE allocates for a ``rows x columns`` view (te_compat.geometry)."""
    return (MXFP8.columnwise if columnwise else MXFP8.rowwise).scale_buffer(rows, columns)


def _device_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of ``device`` (None: not a CUDA device)."""
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def _source(src: object) -> tuple[int, int]:
    """``src`` checked: a 2-D+ float tensor whose 2-D view has both dims multiples of 32."""
    import torch

    if not isinstance(src, torch.Tensor):
        raise TypeError(f"mxfp8_quantize_into: src: expected a torch.Tensor; found {describe_value(src)}")
    if src.dtype not in (torch.bfloat16, torch.float16, torch.float32) or src.dim() < 2:
        raise ValueError(
            "mxfp8_quantize_into: src: expected a bfloat16, float16 or float32 tensor of 2 or more dims; "
            f"found {src.dtype} of shape {tuple(src.shape)}"
        )
    rows, columns = math.prod(src.shape[:-1]), src.shape[-1]
    if rows <= 0 or columns <= 0 or rows % MXFP8.block or columns % MXFP8.block:
        raise ValueError(
            f"mxfp8_quantize_into: src: expected rows (product of the leading dims) and columns to be positive "
            f"multiples of {MXFP8.block}; found {rows} x {columns} (shape {tuple(src.shape)})"
        )
    return rows, columns


def _buffer(name: str, value: object, src: torch.Tensor, shape: tuple[int, ...], payload: bool) -> torch.Tensor:
    """``value`` as the uint8 tensor of ``shape`` TE writes (a view: same memory), or an error."""
    import torch

    kinds = (torch.uint8, torch.float8_e4m3fn) if payload else (torch.uint8,)
    expected = f"a contiguous {' or '.join(map(str, kinds))} tensor on {src.device}"
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"mxfp8_quantize_into: {name}: expected {expected}; found {describe_value(value)}")
    if value.dtype not in kinds or value.device != src.device or not value.is_contiguous():
        found = f"{describe_value(value)} on {value.device}{'' if value.is_contiguous() else ', not contiguous'}"
        raise ValueError(f"mxfp8_quantize_into: {name}: expected {expected}; found {found}")
    if (tuple(value.shape) if payload else value.numel()) != (shape if payload else math.prod(shape)):
        want = f"shape {shape}" if payload else f"{math.prod(shape)} bytes (TE's padded {shape})"
        raise ValueError(f"mxfp8_quantize_into: {name}: expected {want}; found shape {tuple(value.shape)}")
    return value.view(torch.uint8).view(shape)


def _pair(name: str, data: object, scales: object) -> bool:
    """Whether direction ``name`` is asked for: its data and scales come together."""
    if (data is None) != (scales is None):
        given = f"{name}_data" if scales is None else f"{name}_scale_inv"
        raise ValueError(
            f"mxfp8_quantize_into: expected both {name}_data and {name}_scale_inv, or neither; found only {given}"
        )
    return data is not None


def _buffers(src: torch.Tensor, given: dict[str, object], rows: int, columns: int) -> dict[str, torch.Tensor | None]:
    """The four storage keywords of TE's MXFP8Tensor: each given buffer checked and viewed as TE
    allocates it, None for a direction not asked for."""
    shapes = {
        "rowwise_data": tuple(src.shape),
        "rowwise_scale_inv": padded_scale_shape(rows, columns, columnwise=False),
        "columnwise_data": tuple(src.shape),
        "columnwise_scale_inv": padded_scale_shape(rows, columns, columnwise=True),
    }
    return {
        name: None if given[name] is None else _buffer(name, given[name], src, shape, name.endswith("_data"))
        for name, shape in shapes.items()
    }


def _usable_row(gemm_layout: bool) -> tuple[QuantizeRow, Version]:
    status = te_import_status()
    release = release_of(status.version) if status.version is not None else None
    if release is None or not status.usable:
        raise MissingFeatureError(f"mxfp8_quantize_into needs a usable Transformer Engine; found: {status.reason}")
    row = quantize_row(release)
    if row is None:
        raise MissingFeatureError(f"mxfp8_quantize_into needs TE >= {QUANTIZE_ROWS[0].since}; found TE {release}")
    if gemm_layout and gemm_layout_row(row, release) is None:
        first = min(g.since for g in QUANTIZER_ROWS if g.quantizer == row.quantizer)
        raise MissingFeatureError(
            f"mxfp8_quantize_into(gemm_layout=True) needs TE >= {first} (optimize_for_gemm); found TE {release}"
        )
    return row, release


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def mxfp8_quantize_into(
    src: torch.Tensor,
    *,
    rowwise_data: torch.Tensor | None = None,
    rowwise_scale_inv: torch.Tensor | None = None,
    columnwise_data: torch.Tensor | None = None,
    columnwise_scale_inv: torch.Tensor | None = None,
    gemm_layout: bool = False,
) -> object:
    """Quantise ``src`` to MXFP8 (E4M3 payloads, E8M0 scales) with TE's own quantizer, writing
    into the given buffers; returns TE's MXFP8Tensor over them.

    Payloads: ``src.shape``, uint8 or float8_e4m3fn. Scales: uint8, contiguous, as many bytes as
    TE's padded 2-D buffer (:func:`padded_scale_shape` of the 2-D view ``rows x columns``; any
    shape of that size, e.g. mok's layout shape). Give a direction's data and scales together;
    at least one direction. ``gemm_layout`` (TE 2.12+): TE writes the scales in the GEMM layout
    instead of compact. Refuses (MissingFeatureError) without a usable TE or on a device TE's
    MXFP8 kernels do not write on, rather than return buffers TE left untouched.

    Deprecated: use ``mok.quantize_mxfp8``, the one quantise API (payloads and GEMM-layout scales
    TE's quantizer would write, on any device; ``out=`` writes in place).
    """
    warnings.warn(
        "te_compat.mxfp8_quantize_into is deprecated; use mok.quantize_mxfp8, the one quantise API (TE's bytes, "
        "scales in the GEMM layout, on any device)",
        DeprecationWarning,
        stacklevel=2,
    )
    if not isinstance(gemm_layout, bool):
        raise TypeError(f"mxfp8_quantize_into: gemm_layout: expected a bool; found {describe_value(gemm_layout)}")
    rows, columns = _source(src)
    given: dict[str, object] = {
        "rowwise_data": rowwise_data,
        "rowwise_scale_inv": rowwise_scale_inv,
        "columnwise_data": columnwise_data,
        "columnwise_scale_inv": columnwise_scale_inv,
    }
    rowwise = _pair("rowwise", rowwise_data, rowwise_scale_inv)
    columnwise = _pair("columnwise", columnwise_data, columnwise_scale_inv)
    if not (rowwise or columnwise):
        raise ValueError("mxfp8_quantize_into: expected the rowwise buffers, the columnwise ones, or both; found none")
    buffers = _buffers(src, given, rows, columns)  # the arguments first: they are wrong on any machine
    row, release = _usable_row(gemm_layout)
    ok, why = support(release, True, _device_capability(src.device))
    if not ok:
        raise MissingFeatureError(f"mxfp8_quantize_into: {why}")
    values: dict[str, Any] = {"shape": tuple(src.shape), "dtype": src.dtype, **buffers}
    values["fp8_dtype"] = getattr(importlib.import_module("transformer_engine_torch").DType, E4M3)
    values |= {"rowwise": rowwise, "columnwise": columnwise}
    # the row's keywords, exactly: the matrix checked those against the release's signatures
    quantizer = _load(row.quantizer)(**{k: values[k] for k in row.quantizer_keywords})
    gemm = gemm_layout_row(row, release)
    if gemm is not None:  # set either way: a quantizer's default may change
        setattr(quantizer, gemm.attribute, gemm.value if gemm_layout else not gemm.value)
    values["quantizer"] = quantizer
    if row.swizzled_keyword is not None:
        values[row.swizzled_keyword] = gemm_layout
    with _on(src.device):  # without device= (2.10+ only) TE puts the tensor on the current device
        dst = _load(row.tensor)(**{k: values[k] for k in row.tensor_keywords})
        getattr(quantizer, row.into)(src, dst)
    return dst


def _on(device: torch.device) -> AbstractContextManager[object]:
    """``device`` made current while TE builds and fills the tensor (a CUDA device only)."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
