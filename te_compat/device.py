"""The CUDA device this process sees: te_compat's device-bound capabilities (MXFP8 hardware and
quantisation, FSDP2) and its self-test read its compute capability.

Cached (te_compat.refresh() clears it); torch is imported only when the device is asked for.
``has_cuda_core`` (cuda.core, which only mok's kernel needs) moved to mok.backend; the name here
is deprecated and answers for one more release.
"""

from __future__ import annotations

import importlib.util
import warnings
from functools import cache

from te_compat.caches import on_refresh


@cache
def cuda_core_present() -> bool:
    """cuda.core is importable: what the deprecated ``Capabilities.cuda_core`` and
    :func:`has_cuda_core` say until they go (mok.backend.has_cuda_core is its successor)."""
    try:
        return importlib.util.find_spec("cuda.core") is not None
    except (ImportError, ValueError):
        return False


def has_cuda_core() -> bool:
    """Deprecated: use ``mok.backend.has_cuda_core`` (cuda.core is a fact of mok's kernel)."""
    warnings.warn(
        "te_compat.has_cuda_core is deprecated; use mok.backend.has_cuda_core (cuda.core is a fact of mok's kernel, "
        "which te_compat does not use)",
        DeprecationWarning,
        stacklevel=2,
    )
    return cuda_core_present()


@cache
def cuda_device() -> tuple[str | None, tuple[int, int] | None, str]:
    """(name, compute capability, why none) of the current CUDA device; cached (refresh() clears)."""
    try:
        import torch  # already imported whenever a tensor was handed to us
    except ImportError:
        return None, None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, None, f"torch {torch.__version__} sees no CUDA device"
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (major, minor), ""


on_refresh(cuda_core_present.cache_clear)
on_refresh(cuda_device.cache_clear)
