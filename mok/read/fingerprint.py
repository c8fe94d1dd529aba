"""The compiled reader of tensors' memory facts (mok/read/_fingerprint.c), where it is built and
the installed torch exports the C shim it reads through; else None, and mok.read.memory reads
the same facts in Python.

The extension is built at install time (a C compiler and Python's headers, no torch headers) and
is optional: an install without a compiler gets the Python reader, which a checked refresh
also uses where ``MOK_FINGERPRINT=python`` is set (tests run both).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

ENV = "MOK_FINGERPRINT"  # "python": read in Python even where the compiled reader is there

# torch's stable C shim (torch/csrc/inductor/aoti_torch/c/shim.h), in the order _fingerprint.init takes
SHIM = (
    "aoti_torch_get_data_ptr",
    "aoti_torch_get_storage_size",
    "aoti_torch_get_storage_offset",
    "aoti_torch_get_dtype",
    "aoti_torch_get_device_type",
    "aoti_torch_get_device_index",
    "aoti_torch_get_dim",
    "aoti_torch_get_sizes",
    "aoti_torch_get_strides",
    "aoti_torch_dtype_element_size",
)


class Compiled(NamedTuple):
    """``record(tensors)``: the facts of every tensor as bytes, or the index of the first whose
    storage does not hold every byte it spans; ``same(tensors, facts)``: they still are."""

    record: Callable[[Sequence[Any]], bytes | int]
    same: Callable[[Sequence[Any], bytes], bool]
    same_items: Callable[[tuple[tuple[list[Any], tuple[Any, ...]], ...]], bool]
    names_storages: bool  # a record holds each tensor's storage (StorageImpl), not only its size


def _libtorch() -> ctypes.CDLL | None:
    """The loaded libtorch that exports the shim (already loaded by ``import torch``)."""
    lib = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        if (lib / name).exists():
            try:
                return ctypes.CDLL(str(lib / name))
            except OSError:
                return None
    return None


@cache
def compiled() -> Compiled | None:
    """The compiled reader, ready; None where it is not built, torch lacks a shim function, or
    ``MOK_FINGERPRINT=python``."""
    if os.environ.get(ENV, "").strip().lower() == "python":
        return None
    try:
        from mok.read import _fingerprint  # type: ignore[attr-defined]
    except ImportError:
        return None
    lib = _libtorch()
    if lib is None:
        return None
    try:
        addresses = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in SHIM)
    except AttributeError:  # a torch older than one of these functions
        return None
    descriptor = torch._C.TensorBase.__dict__.get("_cdata")
    if descriptor is None or None in addresses:
        return None
    probes = [torch.empty(2, 3), torch.nn.Parameter(torch.empty(1)), torch.empty(4, dtype=torch.uint8)[1:]]
    storages = [p.untyped_storage()._cdata for p in probes]
    named = _fingerprint.init(addresses, descriptor, torch._C.TensorBase, probes, storages)
    return Compiled(_fingerprint.record, _fingerprint.same, _fingerprint.same_items, bool(named))
