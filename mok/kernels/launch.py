"""Compile (NVRTC through cuda.core, once per device and configuration) and launch the kernels.

A :class:`Launch` is prepared once for a list of jobs (mok.kernels.jobs): its compiled kernel (the
conversion kernel, or the inverse one for inverse jobs: one source, compiled once for both) and
its descriptor table, uploaded the first time a set of buffers is seen and reused after. Calling
it launches ONE kernel on the current torch stream: later calls (a refresh, a CUDA-graph capture
and its replays) allocate nothing and never synchronise with the host.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib import resources
from typing import Any

import torch

from mok.errors import LayoutError
from mok.kernels import include_path
from mok.kernels.config import KernelConfig, launch_shapes
from mok.kernels.jobs import DescriptorTable, Job, JobGroup, config_for, describe, inverse_jobs
from mok.kernels.streams import CurrentStream

KERNEL_NAME = "mxfp8_swizzle_jobs"  # conversions and copies
INVERSE_KERNEL_NAME = "mxfp8_unswizzle_jobs"  # inverse jobs
MAX_GRID = 2**31 - 1  # one block per unit (the kernel loops if there are ever more units)
_TABLE_CACHE_SIZE = 256

_lock = threading.Lock()
_programs: dict[tuple[int, KernelConfig], Any] = {}  # compiled source (ObjectCode)
_kernels: dict[tuple[int, KernelConfig, str], Any] = {}
_tables: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, int, int]] = OrderedDict()
# tables a CUDA graph was captured with: a graph holds their address, not the tensor, so they are
# never evicted (evicting one would leave the graph's replays reading freed memory)
_captured: dict[tuple[Any, ...], tuple[torch.Tensor, int, int]] = {}


def kernel_source() -> str:
    return resources.files("mok.kernels").joinpath("mxfp8_swizzle.cu").read_text()


def compile_kernel(arch: str, config: KernelConfig) -> Any:
    """Compile the kernel for ``arch`` (e.g. "sm_90") with NVRTC; returns cuda.core ObjectCode.

    Needs no GPU: CI uses this to check the source through the same path users take.
    """
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(
        std="c++17", arch=arch, name="mok_mxfp8_swizzle", define_macro=config.macros(), include_path=include_path()
    )
    return Program(kernel_source(), code_type="c++", options=options).compile("cubin")


def _kernel(index: int, config: KernelConfig, name: str = KERNEL_NAME) -> Any:
    """The kernel ``name`` compiled for device ``index`` under ``config``: the source compiled
    once per device and configuration (both kernels), thread-safe."""
    key = (index, config, name)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            from cuda.core import Device

            Device(index).set_current()
            program = _programs.get(key[:2])
            if program is None:
                major, minor = torch.cuda.get_device_capability(index)
                program = _programs[key[:2]] = compile_kernel(f"sm_{major}{minor}", config)
            hit = _kernels[key] = program.get_kernel(name)
    return hit


def upload(table: DescriptorTable, device: torch.device) -> torch.Tensor:
    """``table`` as int64 words in a new tensor on ``device`` (its indirect rows point into it)."""
    words = torch.empty(table.words, dtype=torch.int64, device=device)
    words.copy_(torch.tensor(table.values(words.data_ptr()), dtype=torch.int64))
    return words


def _table(device: torch.device, jobs: Sequence[Job | JobGroup], config: KernelConfig) -> tuple[torch.Tensor, int, int]:
    """The device descriptor table of ``jobs`` (uploaded once, then reused): (table, rows, units).
    Its key is the device, the configuration and the jobs (named tuples: hashed in C). The cache
    keeps the last tables used; a table used while a CUDA graph is captured is kept for good."""
    key = (device.index or 0, config, tuple(jobs))
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    with _lock:
        hit = _tables.get(key) or _captured.get(key)
        if hit is not None:
            if capturing:
                _captured[key] = hit
            elif key in _tables:
                _tables.move_to_end(key)
            return hit
    if capturing:
        raise LayoutError(
            "these scale buffers were never converted outside CUDA-graph capture: call once before "
            "capturing (the first call uploads their descriptor table; later calls only launch)"
        )
    table = describe(jobs, config)
    result = (upload(table, device), len(table.rows), table.units)
    with _lock:
        _tables[key] = result
        while len(_tables) > _TABLE_CACHE_SIZE:
            _tables.popitem(last=False)
    return result


class Launch:
    """One prepared launch of ``jobs`` on ``device``: compiled kernel (the inverse one for inverse
    jobs; a mix is refused), uploaded descriptor table, grid, launch arguments. ``config`` fixes the
    kernel configuration; by default the launch takes the one the environment gives jobs of its
    kinds (config.launch_shapes). Calling it launches on the current torch stream: no allocation,
    no host synchronisation, no import (CUDA-graph safe); its host cost is one stream lookup and
    cuda.core's launch."""

    def __init__(
        self, jobs: Sequence[Job | JobGroup], device: torch.device, config: KernelConfig | None = None
    ) -> None:
        import numpy as np
        from cuda.core import LaunchConfig, launch

        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self.config = config or config_for(jobs, launch_shapes())
        self.kernel = _kernel(self._index, self.config, INVERSE_KERNEL_NAME if inverse_jobs(jobs) else KERNEL_NAME)
        self.table, self.njobs, self.total = _table(device, jobs, self.config)
        self.grid = max(1, min(self.total, MAX_GRID))
        self._launch = launch
        self._launch_config = LaunchConfig(grid=self.grid, block=self.config.threads)
        self._args = (np.uint64(self.table.data_ptr()), np.int32(self.njobs), np.int64(self.total))
        self._stream = CurrentStream(self._index).current

    def __call__(self) -> None:
        self._launch(self._stream(), self._launch_config, self.kernel, *self._args)
