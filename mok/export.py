"""export_mxfp8: TE's MXFP8 expert weights copied, never dequantised, into the layouts
inference engines load (reinforcement-learning refit).

The weights are read through mok's door: a view (split or grouped) that the export keeps and
refreshes with ``cached=`` at every later export into the same buffers, so a buffer TE moved,
freed or reassigned is followed or refused by name, never exported stale. The layouts are
converted from the view's tensors (zero-copy payloads, scales in the 128x4 layout, whatever
TE's own buffers were: padded, compact, or already swizzled) into the output alone:

- ``"compact"``: payload ``[E, N, K]`` float8_e4m3fn and E8M0 scales ``[E, N, K/32]``
  unpadded, rowwise; columnwise payload ``[E, N, K]`` and scales ``[E, N/32, K]`` in TE's
  orientation (one scale per 32 rows, not transposed). What checkpoints and the vLLM / SGLang
  MXFP8 loaders take.
- ``"deepgemm"``: payload ``[E, N, K]`` and DeepGEMM's MN-major, TMA-aligned, packed UE8M0
  int32 scales (mok.export_ops names the definition).
- ``"flashinfer"``: Megatron-Core's ``prepare_routed_mxfp8_weights``
  (``megatron/core/inference/moe/flashinfer_mxfp8.py``) result for FlashInfer's TRT-LLM
  routed MoE: shuffled payload ``[E, roundup(N,128), roundup(K,128)]`` and Major-K scales.

DeepGEMM and FlashInfer read the forward (rowwise) operand only; "compact" exports both
directions TE keeps.

On a GPU an export is ONE launch of mok's export kernel (mok/kernels/mxfp8_export.cu: every
expert, payload and scales, both directions), prepared at the first export into a set of buffers
and kept with the export: a re-export into ``out=`` refreshes the view, checks ``out`` and
launches, nothing more. A split view's per-expert addresses are read from the view's own device
pointer tables, which a refresh rewrites in place. Without the kernel (CPU tensors, cuda.core
missing, ``TE_COMPAT_KERNEL_BACKEND=torch``) the torch reference converts
(``torch.ops.mok.mxfp8_export``, mok.export_ops).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mok import door
from mok.backend import kernel_backend
from mok.checks import describe
from mok.errors import ExpertWeightError, LayoutError
from mok.export_ops import COMPACT_SCALE_DTYPES as _SCALE_DTYPES
from mok.export_ops import EXPORT_FIELDS as _FIELDS
from mok.export_ops import LAYOUTS as LAYOUTS  # re-exported: mok.export.LAYOUTS
from mok.export_ops import export_op, export_shapes
from mok.formats import Format
from mok.views import ExpertWeights, GroupedExpertWeights, ViewDirection

_FP8 = torch.float8_e4m3fn


class _Prepared:
    """An export's launch, kept with its buffers: whether the kernel exports them (decided at the
    first export, as a view decides its backend once), and the prepared launch with the key of
    the addresses it was prepared for (a split view's pointer tables, a grouped view's tensors,
    the buffers)."""

    __slots__ = ("key", "launch", "use_kernel")

    def __init__(self) -> None:
        self.use_kernel: bool | None = None
        self.key: tuple[Any, ...] | None = None
        self.launch: Any = None


@dataclass(frozen=True, eq=False, repr=False)
class MXFP8Export:
    """One layer weight's export: the buffers an engine loads, and the view they were read from.

    ``data``/``scales`` are the forward (rowwise) operand in ``layout``'s shapes (see
    :func:`export_mxfp8`); ``columnwise_data``/``columnwise_scales`` the columnwise direction
    ("compact" only; None otherwise or where TE keeps none). Pass the export back as ``out=``:
    the next export refreshes ``view`` and rewrites these very buffers (same addresses).
    """

    layout: str
    num_experts: int
    rows: int
    columns: int
    data: torch.Tensor
    scales: torch.Tensor
    columnwise_data: torch.Tensor | None = None
    columnwise_scales: torch.Tensor | None = None
    view: ExpertWeights | None = field(default=None, repr=False)
    _prepared: _Prepared = field(default_factory=_Prepared, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        parts = [f"layout={self.layout!r}", f"num_experts={self.num_experts}", f"rows={self.rows}"]
        parts.append(f"columns={self.columns}")
        for name in _FIELDS:
            t = getattr(self, name)
            parts.append(f"{name}=" + ("None" if t is None else f"{t.dtype}{list(t.shape)} {t.device}"))
        return f"MXFP8Export({', '.join(parts)})"

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The exported buffers by field name (those present)."""
        return {n: t for n in _FIELDS if (t := getattr(self, n)) is not None}


def _dtype(layout: str, name: str, scale_dtype: torch.dtype) -> torch.dtype:
    if name.endswith("data"):
        return _FP8
    return {"deepgemm": torch.int32, "flashinfer": torch.uint8}.get(layout, scale_dtype)


def _allocate(
    layout: str, view: ExpertWeights, columnwise: bool, scale_dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    out = {}
    for name, (shape, strides) in export_shapes(layout, view.num_experts, view.rows, view.columns).items():
        if name.startswith("columnwise") and not columnwise:
            continue
        dtype = _dtype(layout, name, scale_dtype)
        if strides is None:
            out[name] = torch.empty(shape, dtype=dtype, device=device)
        else:  # DeepGEMM's gap rows (R..roundup(R, 4)) are zero, as in its own reference
            storage = torch.zeros(shape[0] * strides[0], dtype=dtype, device=device)
            out[name] = storage.as_strided(shape, strides)
    return out


def _check_out(out: object, layout: str, view: ExpertWeights, columnwise: bool) -> dict[str, torch.Tensor]:
    """``out``'s buffers, each checked against what ``layout`` needs for ``view``'s weights."""
    if not isinstance(out, MXFP8Export):
        raise TypeError(f"out: expected an MXFP8Export from an earlier export_mxfp8; found {describe(out)}")
    found = (out.layout, out.num_experts, out.rows, out.columns)
    want = (layout, view.num_experts, view.rows, view.columns)
    if found != want:
        raise LayoutError(
            f"out: expected an export of (layout, experts, rows, columns) {want}; found {found} "
            "(export into new buffers)"
        )
    tensors = out.tensors
    for name, (shape, strides) in export_shapes(layout, *want[1:]).items():
        if name.startswith("columnwise") and not columnwise:
            continue
        t = tensors.get(name)
        if t is None:
            raise LayoutError(f"out.{name}: expected a tensor (this export writes {name}); found None")
        compact_scales = layout == "compact" and name.endswith("scales") and t.dtype in _SCALE_DTYPES
        dtype = t.dtype if compact_scales else _dtype(layout, name, torch.uint8)
        ok_strides = t.is_contiguous() if strides is None else t.stride() == strides
        if tuple(t.shape) != shape or t.dtype != dtype or not ok_strides or t.device != view.rowwise.data[0].device:
            where = "contiguous" if strides is None else f"strides {strides}"
            raise LayoutError(
                f"out.{name}: expected {dtype} {shape} ({where}) on {view.rowwise.data[0].device}; found {t.dtype} "
                f"{tuple(t.shape)} strides {t.stride()} on {t.device}"
            )
    return tensors


def _view(
    weights: object, rows: int, columns: int, num_experts: int | None, cached: ExpertWeights | None
) -> ExpertWeights:
    """The weights' view through mok's door (what split_weight_view and grouped_weight_view
    call): split for a list of per-expert Parameters, grouped for one grouped Parameter;
    ``cached`` refreshed in place (a view of the other kind is refused by the refresh)."""
    if isinstance(weights, list | tuple):
        if num_experts is not None and num_experts != len(weights):
            raise ExpertWeightError(
                f"num_experts: expected the number of per-expert weights ({len(weights)}) or None; found {num_experts}"
            )
        experts = None  # counted from the weights
    elif num_experts is None:
        raise ExpertWeightError(
            f"num_experts: required for one grouped weight ({type(weights).__name__}); "
            "pass a list for one weight per expert"
        )
    else:
        experts = num_experts
    grouped = experts is not None
    view: ExpertWeights = door.view(
        weights, grouped=grouped, format="mxfp8", rows=rows, columns=columns, experts=experts, cached=cached
    )
    return view


def _check_out_matches(out: MXFP8Export, weights: object, layout: str, rows: int, columns: int) -> None:
    """Before its view is refreshed: ``out`` must be an export of this layout and size, and of
    weights of the same kind (per expert or grouped), so that the error names ``out``."""
    found, want = (out.layout, out.rows, out.columns), (layout, rows, columns)
    if found != want:
        raise LayoutError(
            f"out: expected an export of (layout, rows, columns) {want}; found {found} (export into new buffers)"
        )
    split = isinstance(weights, list | tuple)
    if out.view is not None and isinstance(out.view, GroupedExpertWeights) == split:
        kinds = ("one grouped weight", "per-expert weights")
        raise LayoutError(f"out: expected an export of {kinds[split]}; found one of {kinds[not split]}")


def _check_view(view: ExpertWeights) -> None:
    """An export copies TE's MXFP8 bytes: weights mok would quantise are refused, not quantised."""
    if view.quantized_on_the_fly:
        raise ExpertWeightError(
            "export_mxfp8: expected TE MXFP8 weights; found BF16 weights (an export copies TE's quantized bytes, "
            "it never quantises: quantise with TE, or call mok.quantize_mxfp8 yourself)"
        )
    for d in view.directions:
        if d.format is not Format.MXFP8 or d.scales is None:
            raise ExpertWeightError(f"export_mxfp8: expected MXFP8 in every direction; found {d.format.value}")


def _directions(view: ExpertWeights, columnwise: bool) -> list[ViewDirection]:
    return [view.rowwise, view.columnwise] if columnwise and view.columnwise is not None else [view.rowwise]


Tensors = list[torch.Tensor]


def _op_inputs(directions: list[ViewDirection]) -> tuple[Tensors, Tensors, Tensors, Tensors]:
    """The op's inputs (mok::mxfp8_export): data, scales, columnwise data, columnwise scales."""
    row, *col = directions
    cw = col[0] if col else None
    return (
        list(row.data),
        list(row.scales or ()),
        [] if cw is None else list(cw.data),
        [] if cw is None else list(cw.scales or ()),
    )


def _key(directions: list[ViewDirection], outs: list[torch.Tensor]) -> tuple[int, ...]:
    """The addresses a prepared launch holds: each direction's pointer tables (split: their
    contents follow TE, their addresses stay) or its grouped tensors, and the buffers."""
    key: list[int] = []
    for d in directions:
        assert d.scales is not None
        key.append(d.data[0].data_ptr() if d.data_ptrs is None else d.data_ptrs.data_ptr())
        key.append(d.scales[0].data_ptr() if d.scale_ptrs is None else d.scale_ptrs.data_ptr())
    key += [t.data_ptr() for t in outs]
    return tuple(key)


def _prepare(layout: str, directions: list[ViewDirection], outs: list[torch.Tensor]) -> Any:
    """The launch exporting ``directions`` into ``outs``, their arguments checked once as the op
    checks them."""
    from mok.export_ops import _export_args
    from mok.kernels.export_launch import ExportLaunch, Operand, export_jobs
    from mok.layout import check_writable
    from mok.overlap import check_no_overlap

    inputs = _op_inputs(directions)
    args = _export_args(*inputs, outs, layout)
    for name, t in zip(_FIELDS, outs, strict=False):
        check_writable(t, f"out.{name}")
    check_no_overlap(outs, [t for ts in inputs for t in ts], "export_mxfp8", out_label="out", input_label="weights")
    operands = [Operand(d.data, d.scales or (), d.data_ptrs, d.scale_ptrs) for d in directions]
    jobs = export_jobs(layout, operands, outs, experts=args.experts, rows=args.rows, cols=args.cols)
    tables = [t for d in directions for t in (d.data_ptrs, d.scale_ptrs) if t is not None]
    return ExportLaunch(jobs, outs[0].device, keep=tables)


def _convert(
    layout: str, view: ExpertWeights, out: dict[str, torch.Tensor], columnwise: bool, prepared: _Prepared
) -> None:
    """The conversion into ``out``: the prepared launch on a GPU with mok's kernel, else the op
    (its torch reference)."""
    directions = _directions(view, columnwise)
    outs = [out[name] for name in _FIELDS[: 2 * len(directions)]]
    if prepared.use_kernel is None:
        prepared.use_kernel = outs[0].device.type == "cuda" and kernel_backend().name == "cuda"
    if not prepared.use_kernel:
        export_op(*_op_inputs(directions), outs, layout, "torch")
        return
    key = _key(directions, outs)
    if key != prepared.key:
        prepared.launch = _prepare(layout, directions, outs)
        prepared.key = key
    prepared.launch()


def export_mxfp8(
    weights: Sequence[object] | object,
    *,
    rows: int,
    columns: int,
    layout: str,
    num_experts: int | None = None,
    out: MXFP8Export | None = None,
    columnwise: bool | None = None,
    scale_dtype: torch.dtype = torch.uint8,
) -> MXFP8Export:
    """Export one layer weight's MXFP8 experts, ``[rows, columns]`` each (N output features, K
    input features), in ``layout`` ("compact", "deepgemm" or "flashinfer"; module doc).

    ``weights``: a list of TE MXFP8 Parameters, one per expert, or one grouped Parameter with
    ``num_experts``. ``out``: an earlier export of the same weight and layout, whose view is
    refreshed (``cached=``) and whose buffers are rewritten in place; a moved or reassigned TE
    buffer is followed, a freed one refused (mok.StorageFreedError). ``columnwise`` ("compact"
    only): export TE's columnwise direction too (default: where TE keeps it). ``scale_dtype``
    ("compact"): torch.uint8 or torch.float8_e8m0fnu. Returns the :class:`MXFP8Export`.

    Refused, by name: weights that are not TE MXFP8 (BF16 would need quantising), scales TE
    marks swizzled in a buffer that is not exactly the 128x4 layout, scale buffers smaller than
    the matrix, an ``out`` of another layout, size or dtype.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}; found {layout!r}")
    if scale_dtype not in _SCALE_DTYPES:
        names = ", ".join(map(str, _SCALE_DTYPES))
        raise TypeError(f"scale_dtype: expected one of {names}; found {describe(scale_dtype)}")
    if columnwise and layout != "compact":
        raise ValueError(f"columnwise=True: layout {layout!r} holds the forward (rowwise) operand only")
    if out is not None and not isinstance(out, MXFP8Export):
        raise TypeError(f"out: expected an MXFP8Export from an earlier export_mxfp8; found {describe(out)}")
    if out is not None:
        _check_out_matches(out, weights, layout, rows, columns)
    view = _view(weights, rows, columns, num_experts, None if out is None else out.view)
    _check_view(view)
    has_columnwise = view.columnwise is not None
    wanted = bool(columnwise) or (layout == "compact" and has_columnwise and columnwise is None)
    if out is not None and out.columnwise_data is not None:
        if columnwise is False:  # the export would hand back columnwise buffers left as they were
            raise ValueError("columnwise=False: out holds columnwise buffers, which this export would leave stale")
        wanted = True
    if wanted and not has_columnwise:
        raise ExpertWeightError("columnwise: expected weights with columnwise data to export; TE keeps none for these")
    if out is None:
        buffers = _allocate(layout, view, wanted, scale_dtype, view.rowwise.data[0].device)
        result = MXFP8Export(layout, view.num_experts, view.rows, view.columns, view=view, **buffers)
    else:
        buffers = _check_out(out, layout, view, wanted)
        result = out if out.view is view else dataclasses.replace(out, view=view)
    _convert(layout, view, buffers, wanted, result._prepared)
    return result
