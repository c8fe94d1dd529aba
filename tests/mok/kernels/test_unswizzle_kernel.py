"""The inverse kernel's parts that need no GPU: its jobs and their table rows, the refusal of a
launch that mixes both kernels' jobs, and its CPU emulation (tests/emulator), planted bugs
included. Its NVRTC and nvcc compiles are test_kernel_cpu.py's (one source, both kernels)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import mok
from mok.kernels.abi import (
    FLAG_INDIRECT,
    FLAG_INVERSE,
    FLAG_JOIN_LAST,
    FLAG_PARTS,
    FLAG_SLAB,
    MODE_COLS,
    MODE_GATHER,
    MODE_ROWS,
)
from mok.kernels.config import KernelConfig, LaunchShapes
from mok.kernels.jobs import Job, JobGroup, config_for, convert_job, describe, inverse_jobs, jobs_of, unswizzle_job
from mok.plan.work import ScaleWork

CONFIGS = [LaunchShapes().other, LaunchShapes().rowwise]  # both shapes a launch takes
SOURCE = Path(mok.kernels.__file__).with_name("mxfp8_swizzle.cu")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def _layout(rows: int, cols: int, experts: int = 1) -> torch.Tensor:
    return torch.zeros(mok.layout_shape(rows, cols, experts), dtype=torch.uint8)


def _view(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> torch.Tensor:
    return torch.zeros(1 << 20, dtype=torch.uint8).as_strided(shape, strides, offset)


@pytest.mark.parametrize(
    ("shape", "strides", "offset", "mode", "vec"),
    [
        ((2, 2080, 225), (2080 * 228, 228, 1), 0, MODE_ROWS, 4),  # TE's padded rows
        ((2, 256, 32), (256 * 32, 32, 1), 0, MODE_ROWS, 16),
        ((2, 544, 65), (65 * 640, 1, 640), 0, MODE_COLS, 16),  # TE's columnwise buffer, transposed
        ((1, 200, 30), (0, 1, 204), 0, MODE_COLS, 4),
        ((2, 200, 13), (200 * 13, 13, 1), 1, MODE_ROWS, 1),
        ((2, 45, 20), (5400, 120, 3), 0, MODE_GATHER, 1),
    ],
)
def test_inverse_job_reads_its_output_as_a_conversion_reads_its_input(
    shape: tuple[int, ...], strides: tuple[int, ...], offset: int, mode: int, vec: int
) -> None:
    """An inverse job is the conversion job of the same logical matrices and layout with the
    inverse flag: src the logical side (its mode and widest access), dst the layout. Its row has
    FLAG_INVERSE and none of the forward's unit decisions, in both launch shapes."""
    out, layout = _view(shape, strides, offset), _layout(*shape[1:], shape[0])
    job = unswizzle_job(layout, out)
    assert job == convert_job(out, layout)._replace(inverse=True)
    assert (job.src, job.dst, job.mode, job.vec, job.inverse) == (out.data_ptr(), layout.data_ptr(), mode, vec, True)
    for config in CONFIGS:
        flags = job.row(0, config)[8]
        assert flags == mode | vec << 8 | FLAG_INVERSE
        assert not flags & (FLAG_PARTS | FLAG_SLAB | FLAG_JOIN_LAST | FLAG_INDIRECT)
        assert not convert_job(out, layout).row(0, config)[8] & FLAG_INVERSE


# (R, C, E) -> inverse units at 16 x 128 and at 32 x 256, by hand: a unit is 128 rows x the
# shape's 16 or 32 tiles of one expert; Rp/128 slabs of ceil(Cp/4 / tiles) units each.
@pytest.mark.parametrize(
    ("rows", "cols", "experts", "units_16", "units_32"),
    [
        (2080, 225, 2, 2 * 17 * 4, 2 * 17 * 2),  # 57 tiles: 16+16+16+9, or 32+25
        (544, 65, 2, 2 * 5 * 2, 2 * 5 * 1),  # 17 tiles: no joined last chunk (a forward columnwise rule)
        (128, 64, 1, 1, 1),  # 16 tiles: by parts in a forward launch, half a 32-tile unit here
        (1, 1, 3, 3, 3),
    ],
)
def test_inverse_units_are_whole_block_units(rows: int, cols: int, experts: int, units_16: int, units_32: int) -> None:
    job = Job(0, 0, cols, 1, rows * cols, rows, cols, experts, MODE_ROWS, 4, inverse=True)
    assert [job.units(c) for c in CONFIGS] == [units_16, units_32]
    columns = job._replace(rs=1, cs=rows, mode=MODE_COLS)
    assert [columns.units(c) for c in CONFIGS] == [units_16, units_32]


def test_per_expert_inverse_items_merge_into_one_pointer_table_job() -> None:
    """A view's experts (separate outputs of one geometry, a layout each): one JobGroup, one
    indirect row whose address arrays are the outputs, then the layouts."""
    outs = [_view((1, 300, 57), (0, 60, 1), 4096 * i) for i in range(4)]
    layouts = [_layout(300, 57) for _ in outs]
    jobs = jobs_of([ScaleWork(layout, out, inverse=True) for layout, out in zip(layouts, outs, strict=True)])
    assert len(jobs) == 1 and isinstance(jobs[0], JobGroup) and jobs[0].template.inverse
    table = describe(jobs, LaunchShapes().other)
    assert len(table.rows) == 1 and table.rows[0][8] == MODE_ROWS | 4 << 8 | FLAG_INVERSE | FLAG_INDIRECT
    assert table.arrays == [[o.data_ptr() for o in outs] + [la.data_ptr() for la in layouts]]
    assert table.units == 4 * 3  # 3 slabs of 15 tiles an expert: one 16-tile unit each


def test_inverse_geometry_is_the_outputs() -> None:
    """A geometry given with an inverse item describes its logical output (dst), as a forward
    item's describes its logical source."""
    layout, buffer = _layout(130, 9), torch.zeros(4096, dtype=torch.uint8)
    geometry = ((1, 130, 9), (0, 1, 131))
    (job,) = jobs_of([ScaleWork(layout, buffer, geometry=geometry, inverse=True)])
    assert isinstance(job, JobGroup)
    assert job.expand() == [unswizzle_job(layout, buffer.as_strided(*geometry))]


def test_a_launch_of_both_kernels_is_refused() -> None:
    out, layout = _view((1, 128, 4), (512, 4, 1)), _layout(128, 4)
    forward, inverse = ScaleWork(out, layout), ScaleWork(layout, out, inverse=True)
    copy = ScaleWork(layout.flatten(), torch.zeros(512, dtype=torch.uint8), copy=True)
    for work, (i, j) in (([forward, inverse], (1, 0)), ([inverse, inverse, copy], (0, 2))):
        found = f"scale work item {i} is an inverse and item {j} a conversion or copy; a launch runs"
        with pytest.raises(mok.LayoutError, match=found):
            jobs_of(work)
    with pytest.raises(mok.LayoutError, match="both a copy and an inverse"):
        jobs_of([ScaleWork(layout, out, copy=True, inverse=True)])
    mixed = [convert_job(out, layout), unswizzle_job(layout, out)]
    with pytest.raises(mok.LayoutError, match="jobs of both kernels in one launch"):
        inverse_jobs(mixed)
    with pytest.raises(mok.LayoutError, match="jobs of both kernels in one launch"):
        config_for(mixed, LaunchShapes())


def test_inverse_launches_take_the_other_shape_unless_one_is_fixed() -> None:
    job = unswizzle_job(_layout(2048, 224), _view((1, 2048, 224), (0, 224, 1)))  # a rowwise output
    assert inverse_jobs([job]) and not inverse_jobs([job._replace(inverse=False)])
    assert config_for([job], LaunchShapes()) == KernelConfig(16, 128)
    assert config_for([JobGroup(job, (0,), (0,))], LaunchShapes()) == KernelConfig(16, 128)
    assert config_for([job], LaunchShapes.fixed(KernelConfig(32, 256))) == KernelConfig(32, 256)


def test_misaligned_layout_input_is_refused() -> None:
    base = torch.zeros(2048 + 8, dtype=torch.uint8)
    with pytest.raises(mok.LayoutError, match="layout input must be 16-byte aligned"):
        unswizzle_job(base[8:].view(4, 1, 32, 16)[:1], torch.zeros(1, 128, 4, dtype=torch.uint8))


@needs_gxx
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_emulated_inverse_kernel_matches_the_reference(config: KernelConfig) -> None:
    """Every inverse case of the emulator, one block a unit and 3 blocks looping over them."""
    from tests.emulator import emulate

    for name, make in emulate.INVERSE_CASES:
        for grid in (0, 3):
            emulate.check_inverse(name, make, config, grid)


# Bugs planted in a copy of the inverse kernel (old text, new text), each of which the emulator
# must catch: a wrong lane index, a missing bound check on R (rows) and on C (columns), and a
# dropped barrier.
PLANTED = {
    "wrong lane": ("line = i % 32,", "line = (i + 1) % 32,"),
    "no R bound": ("if (row >= U.rv || col >= U.cv) continue;", "if (col >= U.cv) continue;"),
    "no C bound": ("        if (c >= U.cv) break;\n", ""),
    "no barrier": ("  }\n  __syncthreads();\n  unsigned char* out", "  }\n  unsigned char* out"),
}


@needs_gxx
@pytest.mark.parametrize("bug", PLANTED)
def test_the_emulator_catches_planted_bugs(bug: str, tmp_path: Path) -> None:
    from tests.emulator import emulate

    source = SOURCE.read_text()
    start = source.index("// ---- The inverse:")  # the inverse kernel's own code
    old, new = PLANTED[bug]
    assert source[start:].count(old) == 1, f"the planted bug {bug!r} no longer matches the source"
    (tmp_path / SOURCE.name).write_text(source[:start] + source[start:].replace(old, new))
    cases = dict(emulate.INVERSE_CASES)
    names = ["inverse rows padded E=2 300x57, stride 60", "inverse columns E=1 200x30, stride 204"]
    with pytest.raises(AssertionError):
        for name in names:
            emulate.check_inverse(name, cases[name], KernelConfig(16, 128), 0, tmp_path)
