"""The CUDA backend: the swizzle kernel (mxfp8_swizzle.cu), what a compiled kernel is and which one
a launch takes (config), its work as jobs and their descriptor table (jobs), and the NVRTC
compilation at first use and the launch (launch); the BF16-to-MXFP8 kernel (mxfp8_quantize.cu)
and its launch (quantize); the MXFP8 export kernel (mxfp8_export.cu), its jobs (export_jobs) and
launch (export_launch); the headers they include (async_copy.cuh)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib import resources
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

_compile_lock = threading.Lock()


def include_path() -> str:
    """The folder of the kernels' shared headers (async_copy.cuh), NVRTC's include path."""
    return str(resources.files(__name__))


def compiled_once(cache: dict[K, V], key: K, index: int, build: Callable[[str], V]) -> V:
    """``cache[key]``, made the first time by ``build(arch)`` ("sm_90") for device ``index``, made
    current first (cuda.core compiles and loads for the current device). Thread-safe: two threads
    asking at once compile once. Later calls are one dict lookup."""
    hit = cache.get(key)
    if hit is None:
        with _compile_lock:
            hit = cache.get(key)
            if hit is None:
                import torch
                from cuda.core import Device

                Device(index).set_current()
                major, minor = torch.cuda.get_device_capability(index)
                hit = cache[key] = build(f"sm_{major}{minor}")
    return hit
