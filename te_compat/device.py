"""The facts of the device mok's kernel needs: cuda.core present, the current CUDA device.

Cached (te_compat.refresh() clears them); torch is imported only when the device is asked for.
"""

from __future__ import annotations

import importlib.util
from functools import cache

from te_compat.caches import on_refresh


@cache
def has_cuda_core() -> bool:
    """cuda.core (the NVRTC compiler and launcher mok's kernel uses) is importable."""
    try:
        return importlib.util.find_spec("cuda.core") is not None
    except (ImportError, ValueError):
        return False


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


on_refresh(has_cuda_core.cache_clear)
on_refresh(cuda_device.cache_clear)
