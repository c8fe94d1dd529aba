"""Shared experts run in BF16 next to FP8 routed experts."""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any, TypeVar, cast

T = TypeVar("T")
_warned = False


def _is_rank_zero() -> bool:
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return True
    return int(dist.get_rank()) == 0


def prepare_shared_expert_config(config: T) -> T:
    """For a config with FP8 parameters, a shallow copy with FP8 execution and FP8 parameters
    off (``fp8 = None``, ``fp8_param = False``), so shared experts run in BF16.

    Any object with ``fp8`` and ``fp8_param`` attributes works (Megatron's TransformerConfig, a
    dataclass, a namespace). A config without FP8 parameters is returned as it is. Warns once per
    process, and only on rank 0 when torch.distributed is initialised.
    """
    global _warned
    missing = [name for name in ("fp8", "fp8_param") if not hasattr(config, name)]
    if missing:
        raise TypeError(
            f"prepare_shared_expert_config: expected a config with attributes fp8 and fp8_param; "
            f"{type(config).__name__} lacks {', '.join(missing)}"
        )
    source: Any = config  # any object with the two attributes
    if not source.fp8_param:
        return config
    shared: Any = copy.copy(config)
    shared.fp8 = None
    shared.fp8_param = False
    if not _warned and _is_rank_zero():
        _warned = True
        warnings.warn(
            f"shared experts run in BF16: FP8 execution (fp8={source.fp8!r}) and FP8 parameters are disabled for them",
            UserWarning,
            stacklevel=2,
        )
    return cast(T, shared)
