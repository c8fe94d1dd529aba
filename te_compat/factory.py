"""Real Transformer Engine objects of the installed release, made through TE's own constructors:
quantizers, quantized Parameters of a given shape, a GroupedLinear's per-expert weights, a
GroupedTensor, and TE's own scale swizzles. For self-tests and live tests that compare a reader
of TE's buffers with TE itself (mok's among them), so that no package but te_compat imports TE.

Every object comes from a quantizer's ``make_empty`` or a module's constructor: no cast kernel
runs (TE's MXFP8 and NVFP4 cast kernels do nothing, or raise, below compute capability 10.0), so
the buffers hold whatever the allocation held; fill them before comparing anything. Where a
release moved or renamed what is called, each branch names the release that forced it.

Importing this module imports neither TE nor torch; each function imports what it needs.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from te_compat.errors import MissingFeatureError, describe
from te_compat.table import TE, TensorKind

if TYPE_CHECKING:
    import torch

E4M3 = "kFloat8E4M3"  # the member of transformer_engine_torch.DType every 2.x quantizer takes
# the quantizer of each kind: (module under transformer_engine.pytorch.tensor, class, first release)
_QUANTIZERS = {
    TensorKind.MXFP8: ("mxfp8_tensor", "MXFP8Quantizer", "2.0"),
    TensorKind.NVFP4: ("nvfp4_tensor", "NVFP4Quantizer", "2.8"),
    TensorKind.FLOAT8_BLOCKWISE: ("float8_blockwise_tensor", "Float8BlockQuantizer", "2.3"),
}


def _load(module: str, name: str, since: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise MissingFeatureError(
            f"expected {module}.{name} (TE {since}+) in the installed Transformer Engine; "
            f"importing it raised {type(exc).__name__}: {exc}"
        ) from None


def _e4m3() -> object:
    return getattr(importlib.import_module("transformer_engine_torch").DType, E4M3)


def quantizer(kind: TensorKind, **flags: bool) -> Any:
    """TE's quantizer of ``kind`` (MXFP8, NVFP4, Float8 blockwise), both directions. ``flags``
    go to its constructor: ``with_2d_quantization=True`` asks TE 2.19+ (PR 2634) for 32x32
    MXFP8 blocks."""
    found = _QUANTIZERS.get(kind) if isinstance(kind, TensorKind) else None
    if found is None:
        known = ", ".join(k.value for k in _QUANTIZERS)
        raise ValueError(f"kind: expected one of {known}; found {describe(kind)}")
    module, name, since = found
    cls = _load(f"{TE}.tensor.{module}", name, since)
    if kind is TensorKind.NVFP4:  # NVFP4Quantizer's defaults are both directions, E2M1 (TE 2.8+)
        return cls(**flags)
    return cls(_e4m3(), rowwise=True, columnwise=True, **flags)


def hybrid_quantizer(rowwise: TensorKind, columnwise: TensorKind) -> Any:
    """TE 2.19+'s HybridQuantizer (PR 2817): ``rowwise``'s quantizer for the rowwise direction,
    ``columnwise``'s for the columnwise one."""
    cls = _load(f"{TE}.tensor.hybrid_tensor", "HybridQuantizer", "2.19")
    return cls(rowwise_quantizer=quantizer(rowwise), columnwise_quantizer=quantizer(columnwise))


def parameter(made: object) -> torch.nn.Parameter:
    """``made`` (a TE tensor) as a Parameter without grad, as TE's modules hold their weights:
    an instance of TE's class itself (TE 2.x keeps the flag ``_is_param``)."""
    import torch

    return torch.nn.Parameter(made, requires_grad=False)  # type: ignore[arg-type]


def make_parameter(
    kind: TensorKind,
    shape: tuple[int, int],
    *,
    device: torch.device,
    hybrid: tuple[TensorKind, TensorKind] = (TensorKind.MXFP8, TensorKind.NVFP4),
    **flags: bool,
) -> torch.nn.Parameter:
    """A Parameter of TE's ``kind`` (MXFP8, NVFP4, Float8 blockwise, or HYBRID with the
    ``hybrid`` kinds, rowwise then columnwise) of ``shape``, both directions, from its
    quantizer's ``make_empty`` in BF16 on ``device``; ``flags`` as for :func:`quantizer`."""
    import torch

    if kind is TensorKind.HYBRID:
        if flags:
            raise ValueError(f"flags: expected none for a hybrid parameter; found {sorted(flags)}")
        made = hybrid_quantizer(*hybrid)
    else:
        made = quantizer(kind, **flags)
    return parameter(made.make_empty(shape, dtype=torch.bfloat16, device=device))


@contextlib.contextmanager
def mxfp8_model_init() -> Iterator[None]:
    """TE's model initialisation under the MXFP8 recipe: modules built inside hold MXFP8 weights.
    The context is ``quantized_model_init`` where the release has it (the name newer releases
    give it; the release that renamed it is not in this project's records) and
    ``fp8_model_init`` before (TE 2.0+ takes the MXFP8BlockScaling recipe there)."""
    te = importlib.import_module(TE)
    recipe = _load("transformer_engine.common.recipe", "MXFP8BlockScaling", "2.0")
    init = getattr(te, "quantized_model_init", None) or te.fp8_model_init
    with init(enabled=True, recipe=recipe()):
        yield


def grouped_linear_weights(
    experts: int, rows: int, columns: int, *, device: torch.device, mxfp8: bool
) -> list[torch.nn.Parameter]:
    """The per-expert weights ``weight0..`` (each ``[rows, columns]``) of a TE GroupedLinear of
    ``experts`` experts, bias-free, BF16 parameters: MXFP8 weights where ``mxfp8`` (built
    under :func:`mxfp8_model_init`), BF16 ones otherwise."""
    import torch

    te = importlib.import_module(TE)
    with mxfp8_model_init() if mxfp8 else contextlib.nullcontext():
        layer = te.GroupedLinear(experts, columns, rows, bias=False, params_dtype=torch.bfloat16, device=device)
    return [getattr(layer, f"weight{e}") for e in range(experts)]


def grouped_tensor_class() -> Any:
    """TE's GroupedTensor: TE 2.14+ ``tensor/grouped_tensor.py`` (a torch.Tensor), TE 2.13 the
    plain class of ``tensor/storage/grouped_tensor.py``."""
    try:
        return importlib.import_module(f"{TE}.tensor.grouped_tensor").GroupedTensor
    except ImportError:  # TE 2.13 keeps it in tensor/storage
        return _load(f"{TE}.tensor.storage.grouped_tensor", "GroupedTensor", "2.13")


def make_grouped_tensor(experts: int, shape: tuple[int, int], kind: TensorKind | None, *, device: torch.device) -> Any:
    """A GroupedTensor (TE 2.13+) of ``experts`` weights of ``shape``, quantized by ``kind``'s
    quantizer (None: BF16), from TE's own ``make_grouped_tensor_with_shapes``."""
    import torch

    q = None if kind is None else quantizer(kind)
    return grouped_tensor_class().make_grouped_tensor_with_shapes(
        experts, [shape] * experts, quantizer=q, device=device, dtype=torch.bfloat16
    )


def te_swizzle() -> Callable[[object], None] | None:
    """TE's in-place swizzle of one tensor's scales into the GEMM layout,
    ``transformer_engine_torch.swizzle_scales_for_gemm_`` (TE 2.12+), or None before it."""
    fn = getattr(importlib.import_module("transformer_engine_torch"), "swizzle_scales_for_gemm_", None)
    return fn if callable(fn) else None


def te_grouped_swizzle() -> Callable[..., None] | None:
    """TE's swizzle of a whole GroupedTensor into new buffers of the group's,
    ``transformer_engine_torch.grouped_swizzle_for_gemm(t, rowwise=, columnwise=)`` (TE 2.14+),
    or None before it."""
    fn = getattr(importlib.import_module("transformer_engine_torch"), "grouped_swizzle_for_gemm", None)
    return fn if callable(fn) else None
