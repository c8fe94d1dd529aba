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
from typing import Any, NamedTuple

import torch

from mok.errors import LayoutError
from mok.layout import padded_shape

KERNEL_NAME = "mxfp8_swizzle_jobs"
THREADS = 128
TILES_PER_UNIT = 16  # 64 scale columns per unit: fastest of the H200 sweep (benchmarks/results)
# A launch with a rowwise (or gather) job, unless a shape is configured: 32-tile units in
# 256-thread blocks, 0.01-0.06 faster than 16 x 128 on every large rowwise case of the H200
# benchmark (session 7), and with slab units a whole layer too (per-expert 1.11 -> 1.09, session
# 9), while launches of columnwise jobs alone are 0.00-0.04 slower at that shape
# (benchmarks/KERNEL_NOTES.md).
ROWWISE_SHAPE = (32, 256)
SHAPE_ENV = "MOK_KERNEL_SHAPE"  # "TILES,THREADS" fixes one shape for every launch (benchmarks, tests)
VARIANT_ENV = "MOK_KERNEL_VARIANT"  # one of VARIANTS
VARIANTS = ("default",)
# Default kernel, 256-thread builds (ROWWISE_SHAPE): shared bytes a slab unit stages (Job._slab):
# a slab fits where 15 + 127 * row stride + C rounded up to 16 <= 30720 (TE's unpadded rows: up to
# 236 bytes, K <= 7552), and still 5 blocks an SM, as many as the registers allow.
SLAB_BYTES = 30720
COPY_CHUNK = 16384
MODE_ROWS, MODE_COLS, MODE_GATHER, MODE_COPY = 0, 1, 2, 3
FLAG_INDIRECT = 1 << 16  # src/dst of the job are device arrays of per-expert addresses
FLAG_JOIN_LAST = 1 << 17  # default kernel: the job's one-tile last chunk joins the chunk before
FLAG_PARTS = 1 << 18  # default kernel: a job converted by parts (Job._width)
FLAG_SLAB = 1 << 19  # default kernel: a rowwise job converted a whole slab a unit (Job._slab)
MAX_GRID = 2**31 - 1  # one block per unit (the kernel loops if there are ever more units)
_TABLE_CACHE_SIZE = 256


@dataclass(frozen=True)
class KernelConfig:
    """What one compiled kernel is: variant, block size and unit width."""

    variant: str = "default"
    tiles_per_unit: int = 16
    threads: int = 128

    @property
    def parts(self) -> int:
        """Default kernel: units a block converts side by side when it converts by parts (one
        slab each, 128 threads a part; columnwise jobs, and rowwise ones of at most part_tiles
        tiles)."""
        return max(1, self.threads // 128)

    @property
    def part_tiles(self) -> int:
        """Default kernel: 4-column tiles of a part's unit."""
        return self.tiles_per_unit // self.parts

    @property
    def slab_bytes(self) -> int:
        """Default kernel: shared bytes a slab unit may stage (0: no slab units in this build).
        Only 256-thread builds have them: at 30 KB a block, ten 128-thread blocks would not fit
        an SM's shared memory."""
        return SLAB_BYTES if self.parts > 1 else 0

    def macros(self) -> list[tuple[str, str]]:
        found = [("TILES_PER_UNIT", str(self.tiles_per_unit)), ("THREADS", str(self.threads))]
        if self.slab_bytes:
            found.append(("SLAB_BYTES", str(self.slab_bytes)))
        return found


def make_config(
    variant: str = "default", tiles_per_unit: int | None = None, threads: int | None = None
) -> KernelConfig:
    """A checked :class:`KernelConfig`; None picks the variant's default."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    threads = threads or 128
    # the kernel's parts are 128 threads, at most two a block
    if threads % 32 or not (64 <= threads <= 128 or threads == 256):
        raise ValueError(f"unsupported kernel block size: threads={threads} (64, 96, 128 or 256)")
    tiles = tiles_per_unit or max(16, threads // 8)
    if (128 * tiles // 4) % (threads * 4):
        raise ValueError(
            f"unsupported kernel shape: tiles_per_unit={tiles}, threads={threads} (128*tiles/4 must be a "
            "multiple of 4*threads)"
        )
    return KernelConfig(variant, tiles, threads)


def _env_shape() -> tuple[int | None, int | None]:
    """(tiles, threads) from MOK_KERNEL_SHAPE, or (None, None) when it is unset."""
    value = os.environ.get(SHAPE_ENV)
    if not value:
        return None, None
    try:
        tiles, threads = (int(v) for v in value.split(","))
    except ValueError:
        raise ValueError(f"{SHAPE_ENV} must be TILES,THREADS (two integers, e.g. 16,128); found {value!r}") from None
    return tiles, threads


def _configs(variant: str, tiles: int | None, threads: int | None) -> tuple[KernelConfig, KernelConfig | None]:
    """(the configuration of launches of columnwise jobs and copies alone, and of the others where
    they differ: the default variant with no shape given)."""
    config = make_config(variant, tiles, threads)
    fixed = tiles is not None or threads is not None
    return config, None if fixed else make_config(variant, *ROWWISE_SHAPE)


_lock = threading.Lock()
_shapes = _configs(os.environ.get(VARIANT_ENV) or "default", *_env_shape())
_config = _shapes[0]
TILES_PER_UNIT, THREADS = _config.tiles_per_unit, _config.threads
_kernels: dict[tuple[int, KernelConfig], Any] = {}
_tables: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, int, int]] = OrderedDict()
_streams: dict[int, Any] = {}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # CUDA builds of torch have it


def kernel_source() -> str:
    return resources.files("mok.kernels").joinpath("mxfp8_swizzle.cu").read_text()


def configure(*, tiles_per_unit: int | None = None, threads: int | None = None, variant: str | None = None) -> None:
    """Choose the kernel variant (one of :data:`VARIANTS`), block size and (default variant)
    unit width for launches prepared from now on; None picks the defaults (MOK_KERNEL_SHAPE's
    block size and unit width where it is set, else per launch the fastest of
    benchmarks/bench_swizzle.py on an H200: see :func:`config_for`). Prepared launches keep the
    kernel they were built with. Each configuration compiles once per device."""
    global _shapes, _config, TILES_PER_UNIT, THREADS
    if tiles_per_unit is None and threads is None:
        tiles_per_unit, threads = _env_shape()
    shapes = _configs(variant or "default", tiles_per_unit, threads)
    with _lock:
        _shapes, _config = shapes, shapes[0]
        TILES_PER_UNIT, THREADS = _config.tiles_per_unit, _config.threads


def config_for(jobs: Sequence[Job | JobGroup]) -> KernelConfig:
    """The kernel configuration a launch of ``jobs`` is prepared with: the configured one, or with
    no shape configured (default variant), :data:`ROWWISE_SHAPE` where a job is rowwise or a
    gather, columnwise jobs beside it included (a whole layer: its rowwise jobs get slab units).
    Columnwise jobs and copies alone keep 16 x 128: in two H200 runs the kernel's copies were
    0.02-0.06 faster there in 5 of 7 large cases (whole layers 1.06 / 1.07 of a copy against
    1.11 / 1.13 at 32 x 256), columnwise conversions up to 0.03 (benchmarks/RESULTS.md, sessions
    8 and 9)."""
    config, rowwise = _shapes  # one read: configure may replace both
    modes = {(j.template if isinstance(j, JobGroup) else j).mode for j in jobs}
    if rowwise is None or modes <= {MODE_COLS, MODE_COPY}:
        return config
    return rowwise


def compile_kernel(arch: str, config: KernelConfig | None = None) -> Any:
    """Compile the kernel for ``arch`` (e.g. "sm_90") with NVRTC; returns cuda.core ObjectCode.

    Needs no GPU: CI uses this to check the source through the same path users take.
    """
    from cuda.core import Program, ProgramOptions

    config = config or _config
    options = ProgramOptions(std="c++17", arch=arch, name="mok_mxfp8_swizzle", define_macro=config.macros())
    return Program(kernel_source(), code_type="c++", options=options).compile("cubin")


def _kernel(device: torch.device, config: KernelConfig | None = None) -> Any:
    """The compiled kernel for ``device`` under ``config`` (the current configuration by
    default); compiled once per device and configuration, thread-safe."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, config or _config)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            from cuda.core import Device

            major, minor = torch.cuda.get_device_capability(index)
            Device(index).set_current()
            hit = _kernels[key] = compile_kernel(f"sm_{major}{minor}", key[1]).get_kernel(KERNEL_NAME)
    return hit


class Job(NamedTuple):
    """One entry of the kernel's descriptor table, in bytes: ``experts`` matrices ``[rows, cols]``
    (expert e read at ``src + e*es`` with strides ``rs``/``cs``, written at ``dst + e*Rp*Cp``), or
    a copy of ``rows`` bytes. A named tuple: made, hashed and compared in C (hundreds per view)."""

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

    @property
    def tiles(self) -> int:
        """4-column tiles of a row of the layout: Cp / 4."""
        return -(-self.cols // 4)

    def units(self, config: KernelConfig | None = None) -> int:
        if self.mode == MODE_COPY:
            return self.experts * -(-self.rows // COPY_CHUNK)
        config = config or _config
        unit, parts = self._width(config)
        rp = padded_shape(self.rows, self.cols)[0]
        slab_units = self.experts * (rp // 128) * (-(-self.tiles // unit) - self._joins_last(config))
        return -(-slab_units // parts)

    def _width(self, config: KernelConfig) -> tuple[int, int]:
        """(tiles of a unit's slab, slabs a block converts at once). Columnwise jobs
        go by parts; a rowwise job too where its rows fit one part (TE's 64 columns: half a 32-tile
        unit; the one rowwise width measured by parts). Decided here only; the kernel reads
        FLAG_PARTS."""
        if self._slab(config):
            return self.tiles, 1
        if config.parts > 1 and (self.mode == MODE_COLS or self.tiles <= config.part_tiles):
            return config.part_tiles, config.parts
        return config.tiles_per_unit, 1

    def _slab(self, config: KernelConfig) -> bool:
        """Whether the kernel converts this job a whole 128-row slab a unit: rows aligned
        to at least 4 bytes and wider than a part, in a build with slab units, the slab's bytes
        (at any address modulo 16, read to a 16-byte boundary) within its shared memory. H200,
        against a copy: TE's padded rows (225 bytes at a 228-byte stride) 1.18 / 1.21 -> 1.11 /
        1.10, grouped / per-expert; then 16-byte aligned rows too: per-expert E=256 1.12 -> 1.06,
        E=32 1.15 / 1.16 -> 1.11 / 1.09; every other case within the noise
        (benchmarks/KERNEL_NOTES.md, session 8). Decided here only (FLAG_SLAB)."""
        staged = 15 + 127 * self.rs + 16 * -(-self.cols // 16)
        wide = self.tiles > config.part_tiles  # narrower rows go by parts (the width measured that way)
        return self.mode == MODE_ROWS and self.vec >= 4 and wide and 0 < staged <= config.slab_bytes

    def _joins_last(self, config: KernelConfig) -> bool:
        """Whether the kernel gives this columnwise job's last chunk, when it is one tile
        (TE's 65 columns), to the chunk before: one unit (of a part) of part_tiles + 1 tiles
        instead of a block for 512 bytes. Decided here only; the kernel reads FLAG_JOIN_LAST."""
        unit = config.part_tiles
        return self.mode == MODE_COLS and self.tiles > unit and self.tiles % unit == 1

    def row(self, unit_begin: int, config: KernelConfig | None = None) -> tuple[int, ...]:
        flags = self.mode | self.vec << 8
        config = config or _config
        if self._joins_last(config):
            flags |= FLAG_JOIN_LAST
        if self.mode != MODE_COPY and self._width(config)[1] > 1:
            flags |= FLAG_PARTS
        if self._slab(config):
            flags |= FLAG_SLAB
        return (self.src, self.dst, self.rs, self.cs, self.es, self.rows, self.cols, self.experts, flags, unit_begin)


def _vec(a: int, b: int, c: int) -> int:
    """The widest load (16, 4 or 1 bytes) that address ``a`` and strides ``b``, ``c`` allow."""
    bits = a | b | c
    return 16 if bits % 16 == 0 else 4 if bits % 4 == 0 else 1


def convert_job(batch: torch.Tensor, out: torch.Tensor) -> Job:
    """The job converting ``[E, R, C]`` uint8 (any strides) into the layout buffer ``out``."""
    return _convert_job(batch.data_ptr(), tuple(batch.shape), batch.stride(), out.data_ptr())


def _convert_job(src: int, shape: Sequence[int], strides: Sequence[int], dst: int) -> Job:
    """convert_job of the ``[E, R, C]`` matrices ``shape``/``strides`` at address ``src``."""
    experts, rows, cols = shape
    es, rs, cs = strides
    if dst % 16:
        raise LayoutError(f"layout output must be 16-byte aligned; found address {hex(dst)}")
    if cols == 1:  # a single column: any column stride reads the same bytes
        cs = 1
    if rows == 1:
        rs = 1 if cs != 1 else 0
    if experts == 1:
        es = 0
    mode = MODE_ROWS if cs == 1 else MODE_COLS if rs == 1 else MODE_GATHER
    return Job(src, dst, rs, cs, es, rows, cols, experts, mode, _job_vec(mode, src, rs, cs, es))


def _job_vec(mode: int, src: int, rs: int, cs: int, es: int) -> int:
    """The widest load a job can use: along rows (MODE_ROWS) or columns (MODE_COLS), else bytes."""
    if mode == MODE_ROWS:
        return _vec(src, rs, es)
    return _vec(src, cs, es) if mode == MODE_COLS else 1


def _same_alignment(template: Job, src: int, dst: int) -> bool:
    """Whether a job of ``template``'s geometry at ``src``/``dst`` loads as wide as it does."""
    if template.vec == 16:  # the strides allow 16 bytes, so an aligned address does too
        return not (src | dst) & 15
    return not dst & 15 and _job_vec(template.mode, src, template.rs, template.cs, template.es) == template.vec


class JobGroup(NamedTuple):
    """Single-matrix jobs that differ only in their addresses (one per expert of a view): the
    jobs ``template._replace(src=s, dst=d)`` for each pair of ``srcs`` and ``dsts``, kept as
    address lists because the descriptor table stores them so (:func:`_merge`)."""

    template: Job
    srcs: tuple[int, ...]
    dsts: tuple[int, ...]

    def expand(self) -> list[Job]:
        return [self.template._replace(src=s, dst=d) for s, d in zip(self.srcs, self.dsts, strict=True)]


def jobs_of(work: Sequence[Any]) -> list[Job | JobGroup]:
    """The jobs of ``work`` items (mok.swizzle.ScaleWork: ``src``, ``dst``, ``copy``,
    ``geometry``): a ``convert_job`` or ``copy_job`` each, with the single-matrix conversions of
    one source geometry (every expert of a view) as one :class:`JobGroup` of their addresses,
    which needs no Job per expert. An address whose alignment differs gets a job of its own."""
    jobs: list[Any] = []
    groups: dict[tuple[Any, ...], tuple[Job, list[int], list[int]]] = {}
    for src, dst, copy, geometry in work:
        if copy:
            jobs.append(copy_job(src, dst))
            continue
        shape, strides = geometry if geometry is not None else (tuple(src.shape), src.stride())
        s, d = src.data_ptr(), dst.data_ptr()
        group = groups.get((shape, strides))
        if group is None:
            job = _convert_job(s, shape, strides, d)
            if job.experts == 1:
                groups[(shape, strides)] = group = (job, [s], [d])
                jobs.append(group)
            else:
                jobs.append(job)
        elif _same_alignment(group[0], s, d):
            group[1].append(s)
            group[2].append(d)
        else:  # another alignment: decided (and checked) afresh
            jobs.append(_convert_job(s, shape, strides, d))
    return [JobGroup(j[0], tuple(j[1]), tuple(j[2])) if isinstance(j[0], Job) else j for j in jobs]


def copy_job(src: torch.Tensor, dst: torch.Tensor) -> Job:
    """A job copying already-swizzled bytes ``src`` (contiguous) into ``dst`` (same size)."""
    if src.numel() != dst.numel() or not (src.is_contiguous() and dst.is_contiguous()):
        raise LayoutError(
            f"copy of swizzled scales needs two contiguous buffers of one size; found {tuple(src.shape)} "
            f"and {tuple(dst.shape)}"
        )
    return Job(
        src.data_ptr(), dst.data_ptr(), 0, 0, 0, src.numel(), 0, 1, MODE_COPY, _vec(src.data_ptr(), dst.data_ptr(), 0)
    )


def _merge(
    jobs: Sequence[Job | JobGroup], config: KernelConfig | None = None
) -> tuple[list[tuple[int, ...]], list[list[int]], int]:
    """Descriptor rows for ``jobs``, with single matrices of one shape and stride merged into one
    indirect job (its experts' addresses in pointer arrays), so a block of a per-expert launch
    finds its job without searching a long table; copies of one size
    (each expert's already-swizzled scales) merge the same way. Returns (rows without addresses,
    pointer arrays as [srcs, dsts] per indirect row, total units). A JobGroup merges as its jobs
    would."""
    config = config or _config
    groups: dict[tuple[int, ...], list[JobGroup]] = {}
    order: list[tuple[int, ...] | Job] = []
    for item in jobs:
        if isinstance(item, JobGroup):
            group = item
        elif item.experts != 1:
            order.append(item)
            continue
        else:
            group = JobGroup(item, (item.src,), (item.dst,))
        job = group.template
        key = (job.rows, job.cols, job.rs, job.cs, job.mode)
        members = groups.get(key)
        if members is None:
            groups[key] = members = []
            order.append(key)
        members.append(group)
    rows: list[tuple[int, ...]] = []
    arrays: list[list[int]] = []
    total = 0
    for entry in order:
        if isinstance(entry, Job):
            rows.append(entry.row(total, config))
            total += entry.units(config)
            continue
        members = groups[entry]
        srcs = [s for m in members for s in m.srcs]
        first = members[0].template
        if len(srcs) == 1:
            rows.append(first.row(total, config))
            total += first.units(config)
            continue
        vec = min(m.template.vec for m in members)
        merged = Job(-1, -1, first.rs, first.cs, 0, first.rows, first.cols, len(srcs), first.mode, vec)
        row = merged.row(total, config)
        rows.append((*row[:8], row[8] | FLAG_INDIRECT, row[9]))
        arrays.append(srcs + [d for m in members for d in m.dsts])
        total += merged.units(config)
    return rows, arrays, total


def _table_values(rows: list[tuple[int, ...]], arrays: list[list[int]], base: int) -> list[int]:
    """The int64 words of a descriptor table at device address ``base``: the rows, then each
    indirect row's address arrays (its src/dst fields point at them)."""
    offset, k = len(rows) * len(rows[0]), 0
    values: list[int] = []
    for row in rows:
        if row[8] & FLAG_INDIRECT:
            n = row[7]
            row = (base + 8 * offset, base + 8 * (offset + n), *row[2:])
            offset += len(arrays[k])
            k += 1
        values.extend(row)
    for array in arrays:
        values.extend(array)
    return values


def _table_key(device_index: int, jobs: Sequence[Job | JobGroup], config: KernelConfig) -> tuple[Any, ...]:
    """What a descriptor table depends on: the device, the kernel configuration and the jobs
    (dataclass fields compared as tuples; hashing them is C code)."""
    return (device_index, config, tuple(jobs))


def _table(
    device: torch.device, jobs: Sequence[Job | JobGroup], config: KernelConfig | None = None
) -> tuple[torch.Tensor, int, int]:
    """The device descriptor table of ``jobs`` (uploaded once, then reused): (table, rows, units)."""
    config = config or _config
    key = _table_key(device.index or 0, jobs, config)
    with _lock:
        hit = _tables.get(key)
        if hit is not None:
            _tables.move_to_end(key)
            return hit
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise LayoutError(
            "these scale buffers were never converted outside CUDA-graph capture: call once before "
            "capturing (the first call uploads their descriptor table; later calls only launch)"
        )
    rows, arrays, total = _merge(jobs, config)
    size = len(rows) * len(rows[0]) + sum(len(a) for a in arrays)
    table = torch.empty(size, dtype=torch.int64, device=device)
    table.copy_(torch.tensor(_table_values(rows, arrays, table.data_ptr()), dtype=torch.int64))
    result = (table, len(rows), total)
    with _lock:
        _tables[key] = result
        while len(_tables) > _TABLE_CACHE_SIZE:
            _tables.popitem(last=False)
    return result


def _current_stream_handle(index: int) -> int:
    """The raw handle of torch's current stream on device ``index`` (cheap on CUDA builds)."""
    if _raw_stream is not None:
        return int(_raw_stream(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


def _stream(handle: int) -> Any:
    """cuda.core's Stream for a raw handle (made once per handle; graph capture uses the capturing
    stream, which is why the handle is looked up at each call)."""
    stream = _streams.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = _streams[handle] = Stream.from_handle(handle)
    return stream


class Launch:
    """One prepared launch: compiled kernel, uploaded descriptor table, grid, launch arguments.
    Calling it launches on the current torch stream: no allocation, no host synchronisation, no
    import (CUDA-graph safe); its host cost is one stream lookup and cuda.core's launch."""

    def __init__(self, jobs: Sequence[Job | JobGroup], device: torch.device) -> None:
        import numpy as np
        from cuda.core import LaunchConfig, launch

        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self.config = config_for(jobs)
        self.kernel = _kernel(device, self.config)
        self.table, self.njobs, self.total = _table(device, jobs, self.config)
        self.grid = max(1, min(self.total, MAX_GRID))
        self._launch = launch
        self._launch_config = LaunchConfig(grid=self.grid, block=self.config.threads)
        self._args = (np.uint64(self.table.data_ptr()), np.int32(self.njobs), np.int64(self.total))
        self._stream_handle = -1
        self._stream: Any = None

    def __call__(self) -> None:
        handle = _current_stream_handle(self._index)
        if handle != self._stream_handle:
            self._stream, self._stream_handle = _stream(handle), handle
        self._launch(self._stream, self._launch_config, self.kernel, *self._args)


def launch_jobs(jobs: Sequence[Job], device: torch.device) -> None:
    """Run ``jobs`` in one launch on the current torch stream of ``device``."""
    if jobs:
        Launch(jobs, device)()
