"""Shared experts run in BF16 next to FP8 routed experts."""

from __future__ import annotations

import copy
import dataclasses
import sys
import warnings
from typing import Any, TypeVar, cast

from mok.checks import check_bool, describe

T = TypeVar("T")
_warned = False  # the BF16 warning was emitted in this process (see bf16_warning_emitted)


def bf16_warning_emitted() -> bool:
    """Whether :func:`prepare_shared_expert_config` has warned in this process (it warns once)."""
    return _warned


def _is_rank_zero() -> bool:
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return True
    return int(dist.get_rank()) == 0


def bf16_copy(config: Any) -> Any:
    """A copy of ``config`` with ``fp8 = None`` and ``fp8_param = False``; ``config`` is untouched.

    Frozen dataclasses go through ``dataclasses.replace`` and namedtuples through ``_replace``
    (neither can be assigned to); anything else is shallow-copied and assigned, so a mutable
    dataclass such as Megatron's TransformerConfig does not rerun its ``__post_init__``.
    """
    changes: dict[str, Any] = {"fp8": None, "fp8_param": False}
    params = getattr(type(config), "__dataclass_params__", None)
    if params is not None and params.frozen:
        return dataclasses.replace(config, **changes)
    if isinstance(config, tuple) and hasattr(config, "_replace"):
        return config._replace(**changes)
    shared = copy.copy(config)
    if shared is config:
        raise TypeError(
            f"prepare_shared_expert_config: copy.copy of a {type(config).__name__} returned the same object; "
            f"expected a copy that can be changed without changing the caller's config"
        )
    try:
        for name, value in changes.items():
            setattr(shared, name, value)
    except (AttributeError, TypeError) as exc:
        raise TypeError(
            f"prepare_shared_expert_config: cannot set fp8 and fp8_param on a copy of {type(config).__name__} "
            f"({exc}); expected a mutable object, a frozen dataclass or a namedtuple"
        ) from exc
    return shared


def bf16_config(config: T) -> T:
    """``config`` itself if it has no FP8 parameters, else its BF16 copy (:func:`bf16_copy`)."""
    missing = [name for name in ("fp8", "fp8_param") if not hasattr(config, name)]
    if missing:
        raise TypeError(
            f"prepare_shared_expert_config: expected a config with attributes fp8 and fp8_param; "
            f"found {describe(config)}, which lacks {', '.join(missing)}"
        )
    source: Any = config  # any object with the two attributes
    if not check_bool(f"{type(config).__name__}.fp8_param", source.fp8_param):
        return config
    return cast(T, bf16_copy(config))


SHARED_EXPERTS_BF16 = (  # Megatron's words (its mok/weights.py), which its callers may match
    "MOK currently computes shared experts in BF16. Shared-expert modules will therefore be constructed with FP8 "
    "execution and FP8 parameters disabled while routed experts retain the model's MXFP8 parameter configuration."
)


def warn_shared_experts_bf16(stacklevel: int) -> bool:
    """Say (on rank 0 only) that shared experts run in BF16; whether it was said."""
    if not _is_rank_zero():
        return False
    warnings.warn(SHARED_EXPERTS_BF16, UserWarning, stacklevel=stacklevel)
    return True


def prepare_shared_expert_config(config: T) -> T:
    """For a config with FP8 parameters, a copy with FP8 execution and FP8 parameters off
    (``fp8 = None``, ``fp8_param = False``), so shared experts run in BF16.

    Any object with ``fp8`` and ``fp8_param`` attributes works (Megatron's TransformerConfig, a
    dataclass, frozen or not, a namedtuple, a namespace); ``fp8_param`` must be a real bool (the
    string "False" is truthy). ``config`` is never changed. A config without FP8 parameters is
    returned as it is. Warns once per process, and only on rank 0 when torch.distributed is
    initialised.
    """
    global _warned
    shared = bf16_config(config)
    if shared is not config and not _warned:
        _warned = warn_shared_experts_bf16(stacklevel=3)
    return shared
