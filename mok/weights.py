"""Drop-in for Megatron-Core's MOK weights module (``...moe.megakernel.mok.weights``).

The same names, signatures, results and exception types as that module's newest version, and
its composition: a view calls this module's ``_parameter_storage_attr``, ``_storage_view``,
``_single_grouped_mxfp8_scale_view`` and ``_swizzle_mxfp8_scale``, and, where
``megatron.core.fp8_utils`` is importable, its ``get_grouped_quantized_members``,
``is_mxfp8tensor`` and ``is_grouped_mxfp8tensor`` (te_compat's equivalents otherwise), each looked
up at the call, so a caller (or its test) that replaces one sees the calls Megatron makes. They go
into mok's one door (mok.door) as its seams (mok.seams adapts Megatron's checks and results);
this module holds the names.

While those functions are this module's own and the weights are TE's, mok's readers read them
(every expert and both directions in one launch, a refresh that reruns it while nothing changed);
otherwise the caller's functions do, into the same pipeline. BF16 weights asked for as MXFP8 are
quantised by mok. On top of Megatron's: padded shapes, scales
TE already swizzled never swizzled twice, TE attribute names of any release, CPU tensors (the
torch reference). Every refusal is a ``RuntimeError``, as Megatron's are; its message names the
parameter, expert and what was expected, and it is the project's own error (mok's RefreshError is
a RuntimeError) or has that error as its ``__cause__``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import torch

from mok import seams
from mok.checks import describe
from mok.errors import MokError
from mok.shared_expert import bf16_copy, warn_shared_experts_bf16
from te_compat import TECompatError

GroupedWeightTuple, SplitRoutedWeight = seams.GroupedWeightTuple, seams.SplitRoutedWeight  # Megatron's result types
P = ParamSpec("P")
R = TypeVar("R")

# Megatron's module global: prepare_shared_expert_config warns once, then sets it; a caller (or
# Megatron's tests) resets it by assigning the module attribute.
_SHARED_EXPERT_BF16_WARNING_EMITTED = False
_REFUSALS = (MokError, TECompatError, TypeError, ValueError)


def _upstream_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Every refusal of ``fn`` as a ``RuntimeError`` (Megatron's type), its own error the cause."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RuntimeError:
            raise
        except _REFUSALS as exc:
            raise RuntimeError(*exc.args) from exc

    return call


# ------------------------------------------------------------------------------ the replaceable steps


@_upstream_errors
def _parameter_storage_attr(param: torch.nn.Parameter, name: str) -> torch.Tensor | None:
    """The storage object ``name`` of ``param`` (on it or on its ``.data``), never materialised,
    or None (mok.seams.storage_attr: te_compat's names of any release on TE's tensors)."""
    found: torch.Tensor | None = seams.storage_attr(param, name)
    return found


@_upstream_errors
def _storage_view(storage: torch.Tensor, shape: tuple[int, ...], *, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Zero-copy dense view of ``storage`` as ``shape``/``dtype`` (mok.storage_view's checks)."""
    return seams.payload_view(storage, shape, dtype=dtype, name=name)


@_upstream_errors
def _single_grouped_mxfp8_scale_view(
    param: torch.nn.Parameter, member_attr: str, shape: tuple[int, ...], *, name: str
) -> torch.Tensor:
    """``[E, a, b]`` view of a grouped parameter's expert-major scale storage (no copy), its
    members from ``get_grouped_quantized_members`` (mok.seams.grouped_scales)."""
    if not isinstance(member_attr, str) or not isinstance(name, str):
        raise TypeError(f"member_attr and name: expected str; found {describe(member_attr)}, {describe(name)}")
    members = seams.megatron("get_grouped_quantized_members", _quantized_members)
    return seams.grouped_scale_view(param, member_attr, seams.check_scale_shape(shape), name, members)


def _quantized_members(param: object) -> Any:
    """A grouped parameter's per-expert quantized tensors where Megatron's fp8_utils is not there:
    its ``quantized_tensors`` (TE's GroupedTensor's through te_compat's table)."""
    return seams.storage_attr(param, "quantized_tensors")


@_upstream_errors
def _swizzle_mxfp8_scale(
    logical_scale: torch.Tensor, *, rows: int, columns: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """TE's logical scales ``[E, rows, columns/32]`` in the tcgen05 layout, into ``out`` when
    given (mok.seams.convert_scale)."""
    return seams.convert_scale(logical_scale, rows=rows, columns=columns, out=out)


# The module's own steps: where every one is (none replaced) and the weights are TE's, mok's readers read them.
_OWN: dict[str, object] = {
    f.__name__: f
    for f in (_parameter_storage_attr, _storage_view, _single_grouped_mxfp8_scale_view, _swizzle_mxfp8_scale)
}


# ------------------------------------------------------------------------------ one grouped parameter


@_upstream_errors
def _native_single_grouped_weight_view(
    weight: torch.nn.Parameter, *, num_experts: int, rows: int, columns: int, use_mxfp8: bool, cached_view: Any = None
) -> Any:
    """View over one grouped parameter ``(E, rows, columns)``: BF16, TE's ``rowwise_data`` (or
    the weight); MXFP8, ``(row_data, row_scales, column_data, column_scales, True)`` with the
    columnwise scales of the ``[columns, rows/32]`` transpose. ``cached_view`` (an earlier
    result) has items 1 and 3 refreshed in place. Threads: as mok.grouped_weight_view."""
    return seams.grouped_view(weight, num_experts, rows, columns, use_mxfp8, cached_view, globals())


# ------------------------------------------------------------------------------ one parameter per expert


@_upstream_errors
def _native_split_weight_view(
    params: Sequence[torch.nn.Parameter], *, rows: int, columns: int, use_mxfp8: bool, cached_view: Any = None
) -> Any:
    """A :class:`SplitRoutedWeight` over one ``(rows, columns)`` parameter per expert, every
    expert's scales in one launch. ``cached_view`` (any object with ``scale_tensors`` and
    ``transposed_scale_tensors``) is refreshed in place and returned. Threads: as
    mok.split_weight_view."""
    return seams.split_view(params, rows, columns, use_mxfp8, cached_view, globals())


# ------------------------------------------------------------------------------ shared experts


@_upstream_errors
def prepare_shared_expert_config(config: Any) -> Any:
    """Megatron's: ``config`` itself while ``config.fp8_param`` is falsy (None included), else a
    copy with FP8 execution and FP8 parameters off (``fp8 = None``, ``fp8_param = False``) for
    shared experts in BF16, warning once (rank 0) while ``_SHARED_EXPERT_BF16_WARNING_EMITTED``
    is falsy, then setting it."""
    global _SHARED_EXPERT_BF16_WARNING_EMITTED
    if not config.fp8_param:
        return config
    if not _SHARED_EXPERT_BF16_WARNING_EMITTED:
        _SHARED_EXPERT_BF16_WARNING_EMITTED = warn_shared_experts_bf16(stacklevel=4)
    return bf16_copy(config)
