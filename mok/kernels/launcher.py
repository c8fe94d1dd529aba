"""Compile (NVRTC through cuda.core, once per architecture) and launch the layout kernel.

Every call turns its work into jobs (one per logical scale matrix, or one copy of an already
swizzled buffer), looks up or uploads the jobs' descriptor table, and launches ONE kernel on the
current torch stream. A table is uploaded the first time a set of buffers is seen and reused
after: later calls (a refresh, a CUDA-graph capture and its replays) allocate nothing and never
synchronise with the host.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from mok.errors import LayoutError
from mok.layout import padded_shape

KERNEL_NAME = "mxfp8_swizzle_jobs"
THREADS = 128
TILES_PER_UNIT = 16  # 64 scale columns per unit: fastest of the H200 sweep (benchmarks/results)
SHAPE_ENV = "MOK_KERNEL_SHAPE"  # "TILES,THREADS" overrides the two above (benchmarks, tests)
COPY_CHUNK = 16384
MODE_ROWS, MODE_COLS, MODE_GATHER, MODE_COPY = 0, 1, 2, 3
FLAG_INDIRECT = 1 << 16  # src/dst of the job are device arrays of per-expert addresses
MAX_GRID = 2**31 - 1  # one block per unit (the kernel loops if there are ever more units)
_TABLE_CACHE_SIZE = 256

_lock = threading.Lock()
_kernels: dict[int, tuple[Any, int]] = {}
_tables: OrderedDict[tuple[int, tuple[tuple[int, ...], ...]], tuple[torch.Tensor, int, int]] = OrderedDict()
_streams: dict[int, Any] = {}


if os.environ.get(SHAPE_ENV):
    TILES_PER_UNIT, THREADS = (int(v) for v in os.environ[SHAPE_ENV].split(","))


def kernel_source() -> str:
    return resources.files("mok.kernels").joinpath("mxfp8_swizzle.cu").read_text()


def configure(*, tiles_per_unit: int = 16, threads: int = 128) -> None:
    """Choose the unit width (4-column tiles) and block size; recompiles at the next launch.

    The defaults are the fastest of benchmarks/bench_swizzle.py --sweep on an H200."""
    global TILES_PER_UNIT, THREADS
    if (128 * tiles_per_unit // 4) % (threads * 4) or threads % 32:
        raise ValueError(f"unsupported kernel shape: tiles_per_unit={tiles_per_unit}, threads={threads}")
    with _lock:
        TILES_PER_UNIT, THREADS = tiles_per_unit, threads
        _kernels.clear()
        _tables.clear()


def compile_kernel(arch: str) -> Any:
    """Compile the kernel for ``arch`` (e.g. "sm_90") with NVRTC; returns cuda.core ObjectCode.

    Needs no GPU: CI uses this to check the source through the same path users take.
    """
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(
        std="c++17",
        arch=arch,
        name="mok_mxfp8_swizzle",
        define_macro=[("TILES_PER_UNIT", str(TILES_PER_UNIT)), ("THREADS", str(THREADS))],
    )
    return Program(kernel_source(), code_type="c++", options=options).compile("cubin")


def _kernel(device: torch.device) -> tuple[Any, int]:
    """(compiled kernel, grid size) for ``device``; compiled once per device, thread-safe."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    hit = _kernels.get(index)
    if hit is not None:
        return hit
    with _lock:
        hit = _kernels.get(index)
        if hit is None:
            from cuda.core import Device

            major, minor = torch.cuda.get_device_capability(index)
            Device(index).set_current()
            kernel = compile_kernel(f"sm_{major}{minor}").get_kernel(KERNEL_NAME)
            hit = _kernels[index] = (kernel, MAX_GRID)
    return hit


@dataclass(frozen=True)
class Job:
    """One entry of the kernel's descriptor table, in bytes: ``experts`` matrices ``[rows, cols]``
    (expert e read at ``src + e*es`` with strides ``rs``/``cs``, written at ``dst + e*Rp*Cp``), or
    a copy of ``rows`` bytes."""

    src: int
    dst: int
    rs: int
    cs: int
    es: int
    rows: int  # R, or the byte count of a copy
    cols: int  # C (0 for a copy)
    experts: int
    mode: int
    vec: int

    def units(self) -> int:
        if self.mode == MODE_COPY:
            return -(-self.rows // COPY_CHUNK)
        rp, cp = padded_shape(self.rows, self.cols)
        return self.experts * (rp // 128) * (-(-(cp // 4) // TILES_PER_UNIT))

    def row(self, unit_begin: int) -> tuple[int, ...]:
        flags = self.mode | self.vec << 8
        return (self.src, self.dst, self.rs, self.cs, self.es, self.rows, self.cols, self.experts, flags, unit_begin)


def _vec(*values: int) -> int:
    for width in (16, 4):
        if all(v % width == 0 for v in values):
            return width
    return 1


def convert_job(batch: torch.Tensor, out: torch.Tensor) -> Job:
    """The job converting ``[E, R, C]`` uint8 (any strides) into the layout buffer ``out``."""
    experts, rows, cols = batch.shape
    es, rs, cs = batch.stride()
    if out.data_ptr() % 16:
        raise LayoutError(f"layout output must be 16-byte aligned; found address {hex(out.data_ptr())}")
    if cols == 1:  # a single column: any column stride reads the same bytes
        cs = 1
    if rows == 1:
        rs = 1 if cs != 1 else 0
    if experts == 1:
        es = 0
    src = batch.data_ptr()
    if cs == 1:
        mode, vec = MODE_ROWS, _vec(src, rs, es)
    elif rs == 1:
        mode, vec = MODE_COLS, _vec(src, cs, es)
    else:
        mode, vec = MODE_GATHER, 1
    return Job(src, out.data_ptr(), rs, cs, es, rows, cols, experts, mode, vec)


def copy_job(src: torch.Tensor, dst: torch.Tensor) -> Job:
    """A job copying already-swizzled bytes ``src`` (contiguous) into ``dst`` (same size)."""
    if src.numel() != dst.numel() or not (src.is_contiguous() and dst.is_contiguous()):
        raise LayoutError(
            f"copy of swizzled scales needs two contiguous buffers of one size; found {tuple(src.shape)} "
            f"and {tuple(dst.shape)}"
        )
    return Job(
        src.data_ptr(), dst.data_ptr(), 0, 0, 0, src.numel(), 0, 1, MODE_COPY, _vec(src.data_ptr(), dst.data_ptr())
    )


def _merge(jobs: Sequence[Job]) -> tuple[list[tuple[int, ...]], list[list[int]], int]:
    """Descriptor rows for ``jobs``, with single matrices of one shape and stride merged into one
    indirect job (its experts' addresses in pointer arrays), so a block of a per-expert launch
    finds its job without searching a long table. Returns (rows without addresses, pointer arrays
    as [srcs, dsts] per indirect row, total units)."""
    groups: dict[tuple[int, ...], list[Job]] = {}
    order: list[tuple[int, ...] | Job] = []
    for job in jobs:
        if job.mode == MODE_COPY or job.experts != 1:
            order.append(job)
            continue
        key = (job.rows, job.cols, job.rs, job.cs, job.mode)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(job)
    rows: list[tuple[int, ...]] = []
    arrays: list[list[int]] = []
    total = 0
    for item in order:
        if isinstance(item, Job):
            rows.append(item.row(total))
            total += item.units()
            continue
        members = groups[item]
        if len(members) == 1:
            rows.append(members[0].row(total))
            total += members[0].units()
            continue
        first = members[0]
        merged = Job(
            -1, -1, first.rs, first.cs, 0, first.rows, first.cols, len(members), first.mode, min(m.vec for m in members)
        )
        row = list(merged.row(total))
        row[8] |= FLAG_INDIRECT
        rows.append(tuple(row))
        arrays.append([m.src for m in members] + [m.dst for m in members])
        total += merged.units()
    return rows, arrays, total


def _table(device: torch.device, jobs: Sequence[Job]) -> tuple[torch.Tensor, int, int]:
    """The device descriptor table of ``jobs`` (uploaded once, then reused): (table, rows, units)."""
    key = (device.index or 0, tuple(job.row(0) for job in jobs))
    with _lock:
        hit = _tables.get(key)
        if hit is not None:
            _tables.move_to_end(key)
            return hit
    if torch.cuda.is_current_stream_capturing():
        raise LayoutError(
            "these scale buffers were never converted outside CUDA-graph capture: call once before "
            "capturing (the first call uploads their descriptor table; later calls only launch)"
        )
    rows, arrays, total = _merge(jobs)
    width = len(rows[0])
    size = len(rows) * width + sum(len(a) for a in arrays)
    table = torch.empty(size, dtype=torch.int64, device=device)
    base, offset, k = table.data_ptr(), len(rows) * width, 0
    values: list[int] = []
    for row in rows:
        if row[8] & FLAG_INDIRECT:  # point src/dst at this row's two address arrays
            n = row[7]
            row = (base + 8 * offset, base + 8 * (offset + n), *row[2:])
            offset += len(arrays[k])
            k += 1
        values.extend(row)
    for array in arrays:
        values.extend(array)
    table.copy_(torch.tensor(values, dtype=torch.int64))
    result = (table, len(rows), total)
    with _lock:
        _tables[key] = result
        while len(_tables) > _TABLE_CACHE_SIZE:
            _tables.popitem(last=False)
    return result


def _stream(device: torch.device) -> Any:
    handle = torch.cuda.current_stream(device).cuda_stream
    stream = _streams.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = _streams[handle] = Stream.from_handle(handle)
    return stream


class Launch:
    """One prepared launch: compiled kernel, uploaded descriptor table, grid. Calling it launches
    on the current torch stream: no allocation, no host synchronisation (CUDA-graph safe)."""

    def __init__(self, jobs: Sequence[Job], device: torch.device) -> None:
        self.device = device
        self.kernel, max_grid = _kernel(device)
        self.table, self.njobs, self.total = _table(device, jobs)
        self.grid = max(1, min(self.total, max_grid))

    def __call__(self) -> None:
        import numpy as np
        from cuda.core import LaunchConfig, launch

        config = LaunchConfig(grid=self.grid, block=THREADS)
        args = (np.uint64(self.table.data_ptr()), np.int32(self.njobs), np.int64(self.total))
        launch(_stream(self.device), config, self.kernel, *args)


def launch_jobs(jobs: Sequence[Job], device: torch.device) -> None:
    """Run ``jobs`` in one launch on the current torch stream of ``device``."""
    if jobs:
        Launch(jobs, device)()
