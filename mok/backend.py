"""Which backend converts scales: mok's CUDA kernel or the torch reference, and why.

The choice is mok's; it rests on mok's own fact (cuda.core present: :func:`has_cuda_core`) and
the CUDA device te_compat reports.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from enum import Enum
from functools import cache

from mok.checks import describe
from mok.errors import LayoutError
from mok.kernels.config import environment_report
from te_compat import MissingFeatureError, cuda_device, on_refresh

BACKEND_ENV = "TE_COMPAT_KERNEL_BACKEND"
BACKENDS = ("auto", "cuda", "torch")


@cache
def has_cuda_core() -> bool:
    """cuda.core (the NVRTC compiler and launcher of mok's kernel) is importable; cached
    (te_compat.refresh() clears it). Successor of the deprecated te_compat.has_cuda_core."""
    try:
        return importlib.util.find_spec("cuda.core") is not None
    except (ImportError, ValueError):
        return False


on_refresh(has_cuda_core.cache_clear)


class Backend(str, Enum):
    """What converts a view's scales: mok's CUDA kernel or the torch reference. A view resolves
    it once, when it is built (:func:`backend_for`); its refreshes keep it."""

    CUDA = "cuda"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value


_BY_NAME = {backend.value: backend for backend in Backend}  # a dict: an Enum call costs a Python frame


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "cuda" or "torch"
    reason: str


def backend_argument(backend: object) -> str | None:
    """A ``backend=`` argument, checked: one of :data:`BACKENDS` (any case) or None."""
    if backend is not None and (not isinstance(backend, str) or backend.lower() not in BACKENDS):
        expected = f"one of {', '.join(map(repr, BACKENDS))} or None"
        raise ValueError(f"backend: expected {expected}; found {describe(backend)}")
    return backend


def preference(backend: object) -> str:
    """The asked-for backend: the ``backend`` argument, else the environment variable, else auto."""
    if backend_argument(backend) is not None:
        return str(backend).lower()
    raw = os.environ.get(BACKEND_ENV)
    if raw is None or raw == "":
        return "auto"
    if raw.lower() not in BACKENDS:
        raise ValueError(
            f"environment variable {BACKEND_ENV}: expected one of {', '.join(BACKENDS)} (or unset); found {raw!r}"
        )
    return raw.lower()


def backend_for(device: object, backend: str | None) -> Backend:
    """The backend for tensors on ``device`` (a torch.device) under the requested backend (the
    argument, else TE_COMPAT_KERNEL_BACKEND, else auto).

    The request is validated on every device; CPU tensors always take the torch reference.
    """
    pref = preference(backend)
    if getattr(device, "type", None) != "cuda":
        if pref == "cuda":
            raise LayoutError(f"backend 'cuda' needs CUDA tensors; found scales on {device}")
        return Backend.TORCH
    return _BY_NAME[kernel_backend(pref).name]


def kernel_backend(backend: str | None = None) -> BackendChoice:
    """The backend for CUDA tensors: "cuda" (the NVRTC kernel) or "torch" (the reference).

    ``backend`` (default: environment variable TE_COMPAT_KERNEL_BACKEND, else "auto"): "cuda"
    demands the kernel, "torch" the reference, "auto" takes the kernel when cuda.core and a CUDA
    device are present. An invalid value raises ValueError naming the argument or the variable.
    """
    pref = preference(backend)
    if pref == "torch":
        return BackendChoice("torch", "asked for the torch reference")
    device, _, why_not = cuda_device()
    if has_cuda_core() and device is not None:
        return BackendChoice("cuda", f"cuda.core and {device} present")
    missing = why_not if device is None else "cuda.core is not installed (pip install te-compat[cuda])"
    if pref == "cuda":
        raise MissingFeatureError(f"kernel backend 'cuda' was asked for, but {missing}")
    return BackendChoice("torch", f"fallback: {missing}")


def report() -> dict[str, object]:
    """mok's rows of ``te-compat report`` (entry point ``te_compat.report``): the backend and the
    kernel's environment variables, each invalid one with why; never raises."""
    try:
        choice = kernel_backend()
        rows: dict[str, object] = {"kernel backend": choice.name, "kernel backend reason": choice.reason}
    except Exception as exc:  # an invalid variable or a demanded, missing kernel: report it
        rows = {"kernel backend": "unavailable", "kernel backend reason": str(exc)}
    return rows | {"cuda core": has_cuda_core(), "memory reader": memory_reader()} | environment_report()


def memory_reader() -> str:
    """How a checked refresh reads the memory facts of the tensors it guards (mok.read.fingerprint):
    "compiled", or "python" with why."""
    from mok.read import fingerprint

    if fingerprint.compiled() is not None:
        return "compiled (mok.read._fingerprint through torch's C shim)"
    if os.environ.get(fingerprint.ENV, "").strip().lower() == "python":
        return f"python ({fingerprint.ENV}=python)"
    try:
        from mok.read import _fingerprint  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return "python (mok.read._fingerprint is not built: it needs a C compiler at install)"
    return "python (this torch lacks a function of the C shim the compiled reader uses)"
