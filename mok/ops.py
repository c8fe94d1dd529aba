"""mok's conversions as torch library ops (namespace ``mok``), so torch sees what they do.

``torch.ops.mok.swizzle_mxfp8_scales`` (one matrix ``[R, C]`` or a batch ``[E, R, C]``, the
experts of a grouped weight), ``swizzle_mxfp8_scales_many`` (separate per-expert matrices) and
``unswizzle_mxfp8_scales`` (the exact inverse) each write their ``out`` argument, declared in the
schema (``Tensor(a!)``): ``torch.compile`` traces them without a graph break, ``FakeTensorMode``
and meta tensors run their fake implementation (nothing is launched), and
``torch.library.opcheck`` can check them. The CPU and CUDA implementations run mok's work items:
the torch reference on the CPU, the kernel on CUDA (or the reference, per ``backend``);
``swizzle_mxfp8_scales_many`` called with two empty lists has no tensor to dispatch on and runs a
CompositeExplicitAutograd kernel that refuses them. The ops are the one place that checks their
arguments: shapes, dtypes and devices in every implementation, the fake one included, and memory
overlap where there is memory (real tensors). The public functions (mok.swizzle) check only what
they need before allocating.

What is checked where, for a caller of ``torch.ops.mok.*`` itself:

- argument types are torch's: its schema parser refuses a value that is not a Tensor, a list of
  Tensors or an optional str with its own ``RuntimeError`` ("Expected a value of type 'Tensor'
  for argument 'out'...", printing the value, a whole list of tensors included);
- everything else is the op's, with mok's named errors: shapes, dtypes, devices, contiguity and
  overlap (``LayoutError``), the backend's name (``ValueError``, when the op runs);
- under ``torch.compile`` the fake implementation's ``LayoutError`` reaches the caller wrapped in
  ``torch._dynamo.exc.TorchRuntimeError``, mok's message in its text.

The public functions check types too, with mok's errors. Traced by ``torch.compile``, a check of
theirs that fails is an exception Dynamo cannot compile: with ``fullgraph=True`` the caller gets
``torch._dynamo.exc.Unsupported`` ("Observed exception", mok's message in its text), without it
Dynamo runs the function eagerly and mok's own error is raised.

The ops are defined with ``torch.library.Library`` rather than ``torch.library.custom_op``: its
dispatch costs about a microsecond per call, custom_op's about ten, and an eager refresh pays it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from mok.checks import describe
from mok.errors import LayoutError
from mok.kernels.quantize import DTYPES, QuantizeOutputs, check_outputs, check_source, output_shapes
from mok.layout import as_batch, check_layout_of, check_out, check_writable
from mok.overlap import check_no_overlap, self_overlapping
from mok.plan.work import QuantizeWork, ScaleWork, run_work
from mok.quantize_reference import check_input

_LIB = torch.library.Library("mok", "DEF")  # type: ignore[no-untyped-call]
_SCHEMAS = (
    "swizzle_mxfp8_scales(Tensor scales, Tensor(a!) out, str? backend=None) -> ()",
    "swizzle_mxfp8_scales_many(Tensor[] scales, Tensor(a!)[] outs, str? backend=None) -> ()",
    "unswizzle_mxfp8_scales(Tensor layout, Tensor(a!) out, str? backend=None) -> ()",
    "quantize_mxfp8(Tensor src, Tensor(a!) row_data, Tensor(b!) row_scales, Tensor(c!) col_data, "
    "Tensor(d!) col_scales, str? backend=None) -> ()",
)
for _schema in _SCHEMAS:
    _LIB.define(_schema)  # type: ignore[no-untyped-call]


def check_logical_out(out: object, want: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """``out`` must hold logical scales ``want`` (``[E, R, C]``, uint8) on ``device``: any strides,
    but no two elements in one byte (the inverse writes every element), and writable here."""
    if not isinstance(out, torch.Tensor):
        raise LayoutError(f"out: expected a torch.Tensor; found {describe(out)}")
    found = (tuple(out.shape), out.dtype, out.device)
    if found != (want, torch.uint8, device):
        raise LayoutError(
            f"out cannot hold the logical scales: expected shape {want}, dtype torch.uint8, device {device}; "
            f"found shape {found[0]}, dtype {found[1]}, device {found[2]}"
        )
    if self_overlapping(out):
        raise LayoutError(
            f"out: expected a view whose elements each have a byte of their own; found strides {out.stride()} "
            f"for shape {tuple(out.shape)} (an expanded view, or strides that fold back)"
        )
    check_writable(out, "out")
    return out


def _swizzle_args(scales: torch.Tensor, out: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Shape, dtype and device checks (fake tensors have these too); the batch to convert."""
    batch = as_batch(scales)
    check_out(out, batch)
    return batch


def check_some_scales(scales: Sequence[object]) -> None:
    """``swizzle_mxfp8_scales_many`` converts at least one matrix (its public function and its op
    refuse an empty list alike)."""
    if len(scales) == 0:
        raise LayoutError("swizzle_mxfp8_scales_many: expected at least one scale matrix; found none")


def _swizzle_many_args(
    scales: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], backend: str | None = None
) -> list[torch.Tensor]:
    check_some_scales(scales)
    batches = [as_batch(s, f"scales[{i}]") for i, s in enumerate(scales)]
    if len(outs) != len(batches):
        raise LayoutError(f"expected {len(batches)} output buffers, one per scale matrix; found {len(outs)}")
    for i, (b, o) in enumerate(zip(batches, outs, strict=True)):
        check_out(o, b, f"outs[{i}]")
    return batches


def _unswizzle_args(layout: torch.Tensor, out: torch.Tensor, backend: str | None = None) -> None:
    logical = tuple(out.shape)
    if len(logical) != 3:
        raise LayoutError(f"out: expected logical scales [E, R, C]; found shape {logical}")
    check_layout_of(layout, logical)
    check_logical_out(out, logical, layout.device)


def _swizzle(scales: torch.Tensor, out: torch.Tensor, backend: str | None = None) -> None:
    batch = _swizzle_args(scales, out)
    check_no_overlap([out], [batch], "swizzle_mxfp8_scales", out_label="out", input_label="scales")
    run_work([ScaleWork(batch, out)], backend)


def _swizzle_many(scales: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], backend: str | None = None) -> None:
    batches = _swizzle_many_args(scales, outs)
    check_no_overlap(outs, batches, "swizzle_mxfp8_scales_many", input_label="scales")
    run_work([ScaleWork(b, o) for b, o in zip(batches, outs, strict=True)], backend)


def _swizzle_many_without_kernel(
    scales: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], backend: str | None = None
) -> None:
    """What the dispatcher runs where no kernel of the op's device is registered: two empty lists
    (no tensor, so no device: refused as every implementation refuses them), or tensors on a
    device mok has no implementation for."""
    batches = _swizzle_many_args(scales, outs)
    raise LayoutError(f"swizzle_mxfp8_scales_many: expected CPU or CUDA tensors; found scales on {batches[0].device}")


def _unswizzle(layout: torch.Tensor, out: torch.Tensor, backend: str | None = None) -> None:
    _unswizzle_args(layout, out)
    check_no_overlap([out], [layout], "unswizzle_mxfp8_scales", out_label="out", input_label="layout")
    run_work([ScaleWork(layout, out, inverse=True)], backend)


class _QuantizeArgs(NamedTuple):
    """The arguments of ``quantize_mxfp8``, in the schema's order: named once, for the op and its
    fake implementation."""

    src: torch.Tensor
    row_data: torch.Tensor
    row_scales: torch.Tensor
    col_data: torch.Tensor
    col_scales: torch.Tensor
    backend: str | None = None

    @property
    def outputs(self) -> QuantizeOutputs:
        return QuantizeOutputs(self.row_data, self.row_scales, self.col_data, self.col_scales)


def _quantize_shapes(*args: Any, **kwargs: Any) -> None:
    """What fake tensors can be checked for: every output's shape and dtype, for the source's."""
    a = _QuantizeArgs(*args, **kwargs)
    experts, rows, cols = check_input(a.src, "src").shape
    wants = output_shapes(experts, rows, cols)
    for name, t, shape, dtype in zip(QuantizeOutputs._fields, a.outputs, wants, DTYPES, strict=True):
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise LayoutError(f"{name}: expected {dtype} {tuple(shape)}; found {t.dtype} {tuple(t.shape)}")


def _quantize(*args: Any, **kwargs: Any) -> None:
    a = _QuantizeArgs(*args, **kwargs)
    out = check_outputs(a.outputs, check_source(a.src), swizzled=True)
    run_work([QuantizeWork(a.src, out)], a.backend)


def _sizes_known(args: Sequence[object]) -> bool:
    """Whether every tensor argument has concrete sizes (not a dynamic-shape trace's symbols)."""
    tensors = [t for a in args for t in (a if isinstance(a, list | tuple) else [a]) if isinstance(t, torch.Tensor)]
    return all(type(n) is int for t in tensors for n in t.shape)


def _checks_only(check: Callable[..., object]) -> Callable[..., None]:
    """A fake (meta) implementation: ``check``'s argument checks where sizes are known (with
    symbolic sizes the real implementation checks them when it runs), nothing written, nothing
    returned (as the schema says)."""

    def fake(*args: object) -> None:
        if _sizes_known(args):
            check(*args)

    return fake


for _name, _impl, _check in (
    ("swizzle_mxfp8_scales", _swizzle, _swizzle_args),
    ("swizzle_mxfp8_scales_many", _swizzle_many, _swizzle_many_args),
    ("unswizzle_mxfp8_scales", _unswizzle, _unswizzle_args),
    ("quantize_mxfp8", _quantize, _quantize_shapes),
):
    for _key in ("CPU", "CUDA"):  # mok.plan.work.run_work: the reference on the CPU, the kernel on CUDA
        _LIB.impl(_name, _impl, _key)  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"mok::{_name}", _checks_only(_check), lib=_LIB)
# Two empty lists are no tensor argument, hence no dispatch key: the dispatcher then runs the
# op's CompositeExplicitAutograd kernel (without one it raises NotImplementedError). A device's
# own kernel (CPU, CUDA, Meta) takes precedence over it.
_LIB.impl(  # type: ignore[no-untyped-call]
    "swizzle_mxfp8_scales_many", _swizzle_many_without_kernel, "CompositeExplicitAutograd"
)

swizzle_op = torch.ops.mok.swizzle_mxfp8_scales.default
swizzle_many_op = torch.ops.mok.swizzle_mxfp8_scales_many.default
unswizzle_op = torch.ops.mok.unswizzle_mxfp8_scales.default
quantize_op = torch.ops.mok.quantize_mxfp8.default
