"""The kernel's work as jobs, and the descriptor table a launch of them uploads: pure planning
(addresses, strides and sizes in, integers out; no device, no environment).

A job converts ``experts`` logical scale matrices into the layout, or copies a buffer already in
it, or (an inverse job) brings a layout back into logical matrices. :func:`jobs_of` makes the jobs
of mok.plan.work's items; :func:`describe` turns jobs into the table rows mxfp8_swizzle.cu reads
(its ``struct Job``), under one :class:`KernelConfig`. A launch runs one of the source's two
kernels: conversions and copies (``mxfp8_swizzle_jobs``) or inverse jobs
(``mxfp8_unswizzle_jobs``), never both.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import and_, attrgetter, methodcaller, or_
from typing import TYPE_CHECKING, Any, NamedTuple

from mok.errors import LayoutError
from mok.kernels.abi import (
    COPY_CHUNK,
    FLAG_INDIRECT,
    FLAG_INVERSE,
    FLAG_JOIN_LAST,
    FLAG_PARTS,
    FLAG_SLAB,
    MODE_COLS,
    MODE_COPY,
    MODE_GATHER,
    MODE_ROWS,
)
from mok.kernels.config import KernelConfig, LaunchShapes
from mok.layout import padded_shape

if TYPE_CHECKING:
    import torch

MIXED_DIRECTIONS = (
    "a launch runs conversions and copies (mxfp8_swizzle_jobs) or inverse jobs (mxfp8_unswizzle_jobs), "
    "not both: run the inverse items in a call of their own"
)


class Job(NamedTuple):
    """One entry of the kernel's descriptor table, in bytes: ``experts`` matrices ``[rows, cols]``
    (expert e read at ``src + e*es`` with strides ``rs``/``cs``, written at ``dst + e*Rp*Cp``), or
    a copy of ``rows`` bytes. An ``inverse`` job has the same fields, read the other way: ``src``
    (with ``rs``, ``cs``, ``es``, ``mode`` and ``vec``) is the logical side, written, and ``dst``
    the layout, read; one row format lets both kernels find their units alike. A named tuple:
    made, hashed and compared in C (hundreds per view)."""

    src: int
    dst: int
    rs: int
    cs: int
    es: int
    rows: int  # R, or the byte count of a copy
    cols: int  # C (0 for a copy)
    experts: int
    mode: int
    vec: int  # the widest access along the logical side: loads, or an inverse job's stores
    inverse: bool = False

    @property
    def tiles(self) -> int:
        """4-column tiles of a row of the layout: Cp / 4."""
        return -(-self.cols // 4)

    def units(self, config: KernelConfig) -> int:
        """The blocks' units of work this job takes under ``config``."""
        if self.mode == MODE_COPY:
            return self.experts * -(-self.rows // COPY_CHUNK)
        unit, parts = self._width(config)
        rp = padded_shape(self.rows, self.cols)[0]
        slab_units = self.experts * (rp // 128) * (-(-self.tiles // unit) - self._joins_last(config))
        return -(-slab_units // parts)

    def _width(self, config: KernelConfig) -> tuple[int, int]:
        """(tiles of a unit's slab, slabs a block converts at once). Columnwise jobs go by parts;
        a rowwise job too where its rows fit one part (TE's 64 columns: half a 32-tile unit).
        Decided here only; the kernel reads FLAG_PARTS. Inverse jobs take whole-block units."""
        if self.inverse:
            return config.tiles_per_unit, 1
        if self._slab(config):
            return self.tiles, 1
        if config.parts > 1 and (self.mode == MODE_COLS or self.tiles <= config.part_tiles):
            return config.part_tiles, config.parts
        return config.tiles_per_unit, 1

    def _slab(self, config: KernelConfig) -> bool:
        """Whether the kernel converts this job a whole 128-row slab a unit: rows aligned to at
        least 4 bytes and wider than a part, in a build with slab units, the slab's bytes (at any
        address modulo 16, read to a 16-byte boundary) within its shared memory. A slab is one
        contiguous range, staged without registers, which keeps padded and per-expert rows near
        a copy's speed (docs/kernel-notes.md). Decided here only (FLAG_SLAB)."""
        staged = 15 + 127 * self.rs + 16 * -(-self.cols // 16)
        wide = self.tiles > config.part_tiles  # narrower rows go by parts (the width measured that way)
        aligned = self.mode == MODE_ROWS and self.vec >= 4 and not self.inverse
        return aligned and wide and 0 < staged <= config.slab_bytes

    def _joins_last(self, config: KernelConfig) -> bool:
        """Whether the kernel gives this columnwise job's last chunk, when it is one tile (TE's 65
        columns), to the chunk before: one unit (of a part) of part_tiles + 1 tiles instead of a
        block for 512 bytes. Decided here only; the kernel reads FLAG_JOIN_LAST."""
        unit = config.part_tiles
        return self.mode == MODE_COLS and not self.inverse and self.tiles > unit and self.tiles % unit == 1

    def row(self, unit_begin: int, config: KernelConfig) -> tuple[int, ...]:
        """This job's descriptor row (``struct Job``) under ``config``, its units from ``unit_begin``."""
        flags = self.mode | self.vec << 8
        if self._joins_last(config):
            flags |= FLAG_JOIN_LAST
        if self.mode != MODE_COPY and self._width(config)[1] > 1:
            flags |= FLAG_PARTS
        if self._slab(config):
            flags |= FLAG_SLAB
        if self.inverse:
            flags |= FLAG_INVERSE
        return (self.src, self.dst, self.rs, self.cs, self.es, self.rows, self.cols, self.experts, flags, unit_begin)


class JobGroup(NamedTuple):
    """Single-matrix jobs that differ only in their addresses (one per expert of a view): the
    jobs ``template._replace(src=s, dst=d)`` for each pair of ``srcs`` and ``dsts``, kept as
    address lists because the descriptor table stores them so (:func:`describe`)."""

    template: Job
    srcs: tuple[int, ...]
    dsts: tuple[int, ...]

    def expand(self) -> list[Job]:
        return [self.template._replace(src=s, dst=d) for s, d in zip(self.srcs, self.dsts, strict=True)]


def _vec(a: int, b: int, c: int) -> int:
    """The widest load (16, 4 or 1 bytes) that address ``a`` and strides ``b``, ``c`` allow."""
    bits = a | b | c
    return 16 if bits % 16 == 0 else 4 if bits % 4 == 0 else 1


def convert_job(batch: torch.Tensor, out: torch.Tensor) -> Job:
    """The job converting ``[E, R, C]`` uint8 (any strides) into the layout buffer ``out``."""
    return _convert_job(batch.data_ptr(), tuple(batch.shape), batch.stride(), out.data_ptr())


def unswizzle_job(layout: torch.Tensor, out: torch.Tensor) -> Job:
    """The inverse job bringing the layout buffer ``layout`` back into ``[E, R, C]`` uint8 ``out``
    (any strides), the padding dropped."""
    return _convert_job(out.data_ptr(), tuple(out.shape), out.stride(), layout.data_ptr(), inverse=True)


def _convert_job(src: int, shape: Sequence[int], strides: Sequence[int], dst: int, inverse: bool = False) -> Job:
    """convert_job of the ``[E, R, C]`` matrices ``shape``/``strides`` at address ``src``, or with
    ``inverse`` the job writing them from the layout at ``dst``."""
    experts, rows, cols = shape
    es, rs, cs = strides
    if dst % 16:
        role = "input" if inverse else "output"
        raise LayoutError(f"layout {role} must be 16-byte aligned; found address {hex(dst)}")
    if cols == 1:  # a single column: any column stride reads the same bytes
        cs = 1
    if rows == 1:
        rs = 1 if cs != 1 else 0
    if experts == 1:
        es = 0
    mode = MODE_ROWS if cs == 1 else MODE_COLS if rs == 1 else MODE_GATHER
    return Job(src, dst, rs, cs, es, rows, cols, experts, mode, _job_vec(mode, src, rs, cs, es), inverse)


def _job_vec(mode: int, src: int, rs: int, cs: int, es: int) -> int:
    """The widest load (an inverse job's store) a job can use: along rows (MODE_ROWS) or columns
    (MODE_COLS), else bytes."""
    if mode == MODE_ROWS:
        return _vec(src, rs, es)
    return _vec(src, cs, es) if mode == MODE_COLS else 1


def _same_alignment(template: Job, src: int, dst: int) -> bool:
    """Whether a job of ``template``'s geometry at ``src``/``dst`` loads as wide as it does."""
    if template.vec == 16:  # the strides allow 16 bytes, so an aligned address does too
        return not (src | dst) & 15
    return not dst & 15 and _job_vec(template.mode, src, template.rs, template.cs, template.es) == template.vec


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


def jobs_of(work: Sequence[Any]) -> list[Job | JobGroup]:
    """The jobs of ``work`` items (mok.plan.work.ScaleWork: ``src``, ``dst``, ``copy``,
    ``geometry``, ``inverse``): a ``convert_job``, ``copy_job`` or ``unswizzle_job`` each, with the
    single-matrix ones of one logical geometry (every expert of a view) as one :class:`JobGroup`
    of their addresses, which needs no Job per expert (``geometry``, where given, is the logical
    side's: an inverse item's ``dst``). An address whose alignment differs starts a group of its
    own (the table then merges the groups of one geometry into one pointer-table row at the
    narrowest load width).
    Inverse items and the others are refused together (one kernel a launch)."""
    one = _one_group(work)
    return one if one is not None else _jobs_one_by_one(work)


_copy, _geometry, _inverse = attrgetter("copy"), attrgetter("geometry"), attrgetter("inverse")
_src, _dst, _data_ptr = attrgetter("src"), attrgetter("dst"), methodcaller("data_ptr")


def _one_group(work: Sequence[Any]) -> list[Job | JobGroup] | None:
    """:func:`jobs_of` the usual work in C-level passes: conversions of single matrices of one
    geometry (every expert of a split view), every address allowing the widest loads, as one
    :class:`JobGroup`. None for anything else, which is looked at item by item."""
    if len(work) < 2 or any(map(_copy, work)) or set(map(_inverse, work)) != {False}:
        return None
    geometries = list(map(_geometry, work))
    if geometries[0] is None or geometries.count(geometries[0]) != len(geometries):  # one geometry
        return None
    try:
        srcs, dsts = list(map(_data_ptr, map(_src, work))), list(map(_data_ptr, map(_dst, work)))
    except (AttributeError, TypeError):  # not tensors: the loop names the first
        return None
    shape, strides = geometries[0]
    job = _convert_job(srcs[0], shape, strides, dsts[0])  # checks the first item as the loop does
    if job.experts != 1 or job.vec != 16 or any(map(and_, map(or_, srcs, dsts), repeat(15))):
        return None
    return [JobGroup(job, tuple(srcs), tuple(dsts))]


def _jobs_one_by_one(work: Sequence[Any]) -> list[Job | JobGroup]:
    """:func:`jobs_of`, item by item."""
    jobs: list[Any] = []
    groups: dict[tuple[Any, ...], tuple[Job, list[int], list[int]]] = {}
    first: dict[bool, int] = {}  # each direction's first item
    for i, (src, dst, copy, geometry, inverse) in enumerate(work):
        if copy and inverse:
            raise LayoutError(f"scale work item {i} is both a copy and an inverse; expected one of them")
        first.setdefault(inverse, i)
        if len(first) > 1:
            raise LayoutError(
                f"scale work item {first[True]} is an inverse and item {first[False]} a conversion or copy; "
                f"{MIXED_DIRECTIONS}"
            )
        if copy:
            jobs.append(copy_job(src, dst))
            continue
        logical, layout = (dst, src) if inverse else (src, dst)
        shape, strides = geometry if geometry is not None else (tuple(logical.shape), logical.stride())
        s, d = logical.data_ptr(), layout.data_ptr()
        group = groups.get((shape, strides))
        if group is None:
            job = _convert_job(s, shape, strides, d, inverse)
            if job.experts == 1:
                groups[(shape, strides)] = group = (job, [s], [d])
                jobs.append(group)
            else:
                jobs.append(job)
        elif _same_alignment(group[0], s, d):
            group[1].append(s)
            group[2].append(d)
        else:  # another alignment: decided (and checked) afresh
            jobs.append(_convert_job(s, shape, strides, d, inverse))
    return [JobGroup(j[0], tuple(j[1]), tuple(j[2])) if isinstance(j[0], Job) else j for j in jobs]


def inverse_jobs(jobs: Sequence[Job | JobGroup]) -> bool:
    """Whether ``jobs`` run on the inverse kernel (mxfp8_unswizzle_jobs) rather than the
    conversion kernel; a mix of both is refused."""
    found = {(j.template if isinstance(j, JobGroup) else j).inverse for j in jobs}
    if len(found) > 1:
        raise LayoutError(f"jobs of both kernels in one launch: {MIXED_DIRECTIONS}")
    return found == {True}


def config_for(jobs: Sequence[Job | JobGroup], shapes: LaunchShapes) -> KernelConfig:
    """The configuration a launch of ``jobs`` takes: ``shapes.rowwise`` where a job is rowwise or
    a gather, else ``shapes.other`` (columnwise jobs and copies alone, and inverse jobs, whose
    units are whole blocks of any shape: the simplest choice, not a measured one)."""
    if inverse_jobs(jobs):
        return shapes.other
    modes = {(j.template if isinstance(j, JobGroup) else j).mode for j in jobs}
    return shapes.other if modes <= {MODE_COLS, MODE_COPY} else shapes.rowwise


class DescriptorTable(NamedTuple):
    """The kernel's job table: ``rows`` (``struct Job`` each; an indirect row's src/dst filled in
    by :meth:`values`), each indirect row's address arrays ([srcs, dsts]) and the units in all."""

    rows: list[tuple[int, ...]]
    arrays: list[list[int]]
    units: int

    @property
    def words(self) -> int:
        """int64 words of the table: its rows, then the address arrays."""
        return len(self.rows) * len(self.rows[0]) + sum(len(a) for a in self.arrays)

    def values(self, base: int) -> list[int]:
        """The table's int64 words at device address ``base`` (indirect rows point into it)."""
        offset, k = len(self.rows) * len(self.rows[0]), 0
        values: list[int] = []
        for row in self.rows:
            if row[8] & FLAG_INDIRECT:
                n = row[7]
                row = (base + 8 * offset, base + 8 * (offset + n), *row[2:])
                offset += len(self.arrays[k])
                k += 1
            values.extend(row)
        for array in self.arrays:
            values.extend(array)
        return values


def _in_table_order(jobs: Sequence[Job | JobGroup]) -> list[Job | list[JobGroup]]:
    """``jobs`` in table order, single matrices of one shape and stride (a JobGroup's too)
    gathered where the first of them stands; jobs of several experts stay as they are."""
    groups: dict[tuple[int, ...], list[JobGroup]] = {}
    order: list[Job | list[JobGroup]] = []
    for item in jobs:
        if isinstance(item, Job) and item.experts != 1:
            order.append(item)
            continue
        group = item if isinstance(item, JobGroup) else JobGroup(item, (item.src,), (item.dst,))
        job = group.template
        key = (job.rows, job.cols, job.rs, job.cs, job.mode, job.inverse)
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(group)
    return order


def _merged(groups: list[JobGroup]) -> tuple[Job, list[int] | None]:
    """The job of single matrices of one shape and stride: the one matrix's own, or one job over
    all of them that reads their addresses ([srcs, dsts], returned beside it) from the table."""
    srcs = [s for g in groups for s in g.srcs]
    if len(srcs) == 1:
        return groups[0].expand()[0], None
    first = groups[0].template
    vec = min(g.template.vec for g in groups)
    job = Job(-1, -1, first.rs, first.cs, 0, first.rows, first.cols, len(srcs), first.mode, vec, first.inverse)
    return job, srcs + [d for g in groups for d in g.dsts]


def describe(jobs: Sequence[Job | JobGroup], config: KernelConfig) -> DescriptorTable:
    """The descriptor table of ``jobs`` under ``config``: single matrices of one shape and stride
    (copies of one size too) merge into one indirect row, their experts' addresses in pointer
    arrays, so a block of a per-expert launch finds its job without searching a long table."""
    rows: list[tuple[int, ...]] = []
    arrays: list[list[int]] = []
    total = 0
    for entry in _in_table_order(jobs):
        job, addresses = (entry, None) if isinstance(entry, Job) else _merged(entry)
        row = job.row(total, config)
        if addresses is not None:
            row = (*row[:8], row[8] | FLAG_INDIRECT, row[9])
            arrays.append(addresses)
        rows.append(row)
        total += job.units(config)
    return DescriptorTable(rows, arrays, total)
