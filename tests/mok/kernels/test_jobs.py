"""The CUDA backend's parts that need no GPU: the source compiles through NVRTC (cuda.core, the
path users take) and through nvcc without spills, and calls are planned into the right jobs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import mok
from mok.kernels import launch
from mok.kernels.abi import FLAG_INDIRECT, FLAG_PARTS, FLAG_SLAB, MODE_COLS, MODE_COPY, MODE_GATHER, MODE_ROWS
from mok.kernels.config import KernelConfig, LaunchShapes
from mok.kernels.jobs import DescriptorTable, Job, JobGroup, config_for, convert_job, copy_job, describe, jobs_of
from mok.plan.work import ScaleWork, run_work
from tests import te_objects as T
from tests.spec_oracle import spec_layout

SOURCE = Path(launch.__file__).with_name("mxfp8_swizzle.cu")
CONFIGS = [LaunchShapes().other, LaunchShapes().rowwise]  # both shapes a launch takes
SLAB_CONFIG = LaunchShapes().rowwise


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90", "sm_100"])
def test_kernel_compiles_with_nvrtc(arch: str, config: KernelConfig) -> None:
    """The source compiles with both kernels: conversions and copies, and the inverse."""
    pytest.importorskip("cuda.core", reason="cuda.core is the 'cuda' extra (pip install te-compat[cuda])")
    cubin = bytes(launch.compile_kernel(arch, config).code)
    assert len(cubin) > 1000
    for name in (launch.KERNEL_NAME, launch.INVERSE_KERNEL_NAME):
        assert b"\0" + name.encode() + b"\0" in cubin, f"{name} is not in the {arch} cubin"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_kernel_compiles_with_nvcc_without_spills(tmp_path: Path, config: KernelConfig) -> None:
    defines = [f"-D{k}={v}" for k, v in config.macros()]
    done = subprocess.run(
        ["nvcc", "-arch=sm_90", "-c", "-Xptxas", "-v", *defines, str(SOURCE), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        check=True,
    )
    report = done.stderr
    for name in (launch.KERNEL_NAME, launch.INVERSE_KERNEL_NAME):  # each kernel, none of its functions spilling
        assert f"Compiling entry function '{name}'" in report, report
    assert re.findall(r"(\d+) bytes spill stores", report) and not re.findall(r"[1-9]\d* bytes spill", report), report
    assert not re.findall(r"[1-9]\d* bytes stack frame", report), report
    blocks = 1280 // config.threads  # __launch_bounds__(THREADS, MIN_BLOCKS)
    used = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert used and max(used) * config.threads * blocks <= 65536, report  # that many blocks an SM


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_emulated_kernel_matches_the_reference(config: KernelConfig) -> None:
    """The CPU emulator (tests/emulator; its full run covers more cases and grids)."""
    from tests.emulator import emulate

    cases = dict(emulate.CASES)
    names = (
        "rowwise padded E=2 544x7200",
        "rowwise 4-byte rows, partial last words",
        "rowwise 4-byte rows at offsets 4, 0 and 12 modulo 16",
        "mixed layer, odd unit counts",
    )
    for name in names:
        for grid in (0, 3):
            emulate.check(name, cases[name], config, grid)


def _ptr_tensor(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> torch.Tensor:
    base = torch.zeros(4096 * 16, dtype=torch.uint8)
    return base.as_strided(shape, strides, offset)


def test_jobs_rowwise_transposed_and_gather() -> None:
    out = torch.empty(mok.layout_shape(256, 8, 2), dtype=torch.uint8)
    rows = convert_job(_ptr_tensor((2, 256, 8), (4096, 16, 1)), out)
    assert (rows.mode, rows.vec, rows.experts, rows.es) == (MODE_ROWS, 16, 2, 4096)
    cols = convert_job(_ptr_tensor((2, 256, 8), (4096, 1, 256)), out)
    assert (cols.mode, cols.vec) == (MODE_COLS, 16)
    odd = convert_job(_ptr_tensor((1, 256, 8), (4096, 12, 1), offset=4), out[:2])
    assert (odd.mode, odd.vec, odd.es) == (MODE_ROWS, 4, 0)
    assert convert_job(_ptr_tensor((1, 256, 8), (4096, 3, 5)), out[:2]).mode == MODE_GATHER
    one_column = convert_job(_ptr_tensor((1, 256, 1), (4096, 1, 256)), out[:2])
    assert one_column.mode == MODE_ROWS  # a single column reads the same bytes either way


@pytest.mark.parametrize(
    ("shape", "strides"), [((1, 256, 8), (4096, 16, 1)), ((1, 256, 8), (4096, 1, 256)), ((1, 256, 8), (4096, 3, 5))]
)
def test_jobs_of_a_view_equal_a_job_per_item(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """jobs_of shares one geometry across a view's experts; every job is still convert_job's,
    addresses and alignment (vec) included, whatever the offsets."""
    outs = torch.empty(mok.layout_shape(256, 8, 8), dtype=torch.uint8).split(mok.layout_shape(256, 8)[0])
    offsets = [0, 16, 4, 1, 32, 12, 0, 3]
    pairs = zip(offsets, outs, strict=True)
    work = [mok.plan.work.ScaleWork(_ptr_tensor(shape, strides, offset=o), out) for o, out in pairs]
    work.append(mok.plan.work.ScaleWork(outs[0].flatten(), outs[1].flatten(), copy=True))
    want = [convert_job(w.src, w.dst) for w in work[:-1]] + [copy_job(work[-1].src, work[-1].dst)]
    got = jobs_of(work)
    expanded = [j for g in got for j in (g.expand() if isinstance(g, JobGroup) else [g])]
    assert sorted(expanded) == sorted(want)
    config = KernelConfig()
    assert _table_pairs(describe(got, config)) == _table_pairs(describe(want, config))  # the same table
    if strides != (4096, 3, 5):  # rows and columns: the offsets give different alignments
        assert len({j.vec for j in want[:-1]}) > 1


@pytest.mark.parametrize("case", ["aligned", "one at offset 4", "a copy too", "equal geometries", "one expert"])
def test_jobs_of_a_split_view_in_one_pass_equal_those_item_by_item(case: str) -> None:
    """A split view's work (one geometry, every address 16-byte aligned) becomes one JobGroup in
    C-level passes; whatever differs goes item by item. Either way the jobs are convert_job's."""
    experts, geometry = 6, ((1, 256, 8), (4096, 16, 1))
    outs = torch.empty(mok.layout_shape(256, 8, experts), dtype=torch.uint8).split(mok.layout_shape(256, 8)[0])
    offsets = [0, 4096, 8192, 4 if case == "one at offset 4" else 12288, 16384, 20480][:experts]
    srcs = [torch.zeros(4096 * 8, dtype=torch.uint8)[o:] for o in offsets]
    same = [geometry if case != "equal geometries" else ((1, 256, 8), (4096, 16, 1)) for _ in range(experts)]
    work = [ScaleWork(src, out, geometry=g) for src, out, g in zip(srcs, outs, same, strict=True)]
    work = work[:1] if case == "one expert" else work
    if case == "a copy too":
        work.append(ScaleWork(outs[0].flatten(), outs[1].flatten(), copy=True))
    got = jobs_of(work)
    assert got == mok.kernels.jobs._jobs_one_by_one(work)
    want = [convert_job(mok.layout.logical_view(w.src, geometry), w.dst) for w in work if not w.copy]
    want += [copy_job(w.src, w.dst) for w in work if w.copy]
    expanded = [j for g in got for j in (g.expand() if isinstance(g, JobGroup) else [g])]
    assert sorted(expanded) == sorted(want)
    assert len(got) == (2 if case in ("one at offset 4", "a copy too") else 1) and isinstance(got[0], JobGroup)
    assert (mok.kernels.jobs._one_group(work) is not None) == (case in ("aligned", "equal geometries"))


def _table_pairs(table: DescriptorTable) -> tuple[object, ...]:
    """A descriptor table up to the order of the experts in an indirect row's address arrays."""
    pairs = [sorted(zip(a[: len(a) // 2], a[len(a) // 2 :], strict=True)) for a in table.arrays]
    return table.rows, pairs, table.units


# (rows R, scale columns C, experts E, tiles per unit) -> units, by hand from the spec: an expert
# has roundup(R,128)/128 slabs of roundup(C,4)/4 tiles, and a unit takes up to "tiles per unit"
# tiles of one slab. Padded rows and columns count: R=130 is 2 slabs, C=65 is 17 tiles.
# (Units of 8 tiles need 64-thread blocks, units of 16 take 128.)
UNIT_CASES = [
    (128, 4, 1, 16, 1),
    (130, 5, 1, 16, 2),  # 256 x 8 padded: 2 slabs of 2 tiles
    (100, 3, 1, 16, 1),  # fewer than 128 rows still make one slab
    (129, 4, 3, 16, 6),
    (200, 65, 2, 16, 8),  # 2 slabs of 17 tiles = 2 units each, 2 experts
    (200, 65, 2, 8, 12),  # 17 tiles in units of 8: 3 per slab
    (300, 130, 1, 16, 9),  # 3 slabs of 33 tiles = 3 units each
    (7168, 224, 3, 16, 672),  # 56 slabs of 56 tiles = 4 units each, 3 experts
    (1, 1, 1, 16, 1),
]


@pytest.mark.parametrize(("rows", "cols", "experts", "tiles", "units"), UNIT_CASES)
def test_units_count_the_padded_layout(rows: int, cols: int, experts: int, tiles: int, units: int) -> None:
    config = KernelConfig(tiles, min(128, 8 * tiles))
    job = Job(0, 0, cols, 1, rows * cols, rows, cols, experts, MODE_ROWS, 16)
    assert job.units(config) == units


@pytest.mark.parametrize(
    ("rows", "cols", "tiles", "units"),
    [
        (7200, 65, 16, 57),  # TE's 65 columns: one unit of 17 tiles a slab, not 16 + 1
        (200, 66, 16, 2),  # 17 tiles (two columns in the last)
        (200, 69, 16, 4),  # 18 tiles: 16 + 2
        (200, 64, 16, 2),  # 16 tiles: nothing to join
        (200, 65, 8, 4),  # units of 8: 17 = 8 + 9
        (200, 4, 16, 2),  # one tile in all: nothing to join it to
    ],
)
def test_columnwise_one_tile_last_chunk_joins_the_one_before(rows: int, cols: int, tiles: int, units: int) -> None:
    config = KernelConfig(tiles, min(128, 8 * tiles))
    job = Job(0, 0, 1, rows, rows * cols, rows, cols, 1, MODE_COLS, 16)
    assert job.units(config) == units


# (rows R, scale columns C, experts E) -> (columnwise units, rowwise units) of a 256-thread block
# with 32-tile units, by hand: columnwise, two slabs of 16 tiles a unit (parts); rowwise, one slab
# of 32 tiles, or two slabs (parts) where a row fits one part's 16 tiles.
PART_CASES = [
    (7168, 64, 1, 28, 28),  # 56 slabs of 16 tiles: two slabs a unit either way
    (7200, 65, 1, 29, 57),  # 17 tiles (columnwise: the one-tile chunk joins); the last unit one slab
    (7200, 65, 3, 86, 171),  # 171 slabs: a columnwise unit's two slabs may belong to two experts
    (2048, 224, 1, 32, 32),  # 56 tiles: columnwise 4 chunks a slab, two a unit; rowwise 32 + 24
    (200, 128, 1, 2, 2),  # 32 tiles: rowwise, one whole-block unit a slab
    (300, 40, 1, 2, 2),  # 10 tiles: 3 slabs, two a unit
    (300, 160, 1, 5, 6),  # 40 tiles: columnwise 3 chunks a slab, 9 in all; rowwise 32 + 8, one slab
    (100, 3, 1, 1, 1),  # one slab of one tile
]


@pytest.mark.parametrize(("rows", "cols", "experts", "col_units", "row_units"), PART_CASES)
def test_units_of_a_256_thread_block_by_parts(
    rows: int, cols: int, experts: int, col_units: int, row_units: int
) -> None:
    config = KernelConfig(32, 256)
    assert (config.parts, config.part_tiles) == (2, 16)
    job = Job(0, 0, 1, rows, rows * cols, rows, cols, experts, MODE_COLS, 16)
    assert job.units(config) == col_units
    assert job.row(0, config)[8] & FLAG_PARTS  # columnwise: always by parts
    rowwise = job._replace(rs=cols, cs=1, mode=MODE_ROWS, vec=1)  # byte loads: no slab units
    assert rowwise.units(config) == row_units
    by_parts = rowwise.row(0, config)[8] & FLAG_PARTS
    assert bool(by_parts) == (-(-cols // 4) <= 16), "rowwise by parts exactly where a row fits one part"
    assert not rowwise.row(0, KernelConfig(16, 128))[8] & FLAG_PARTS  # 128 threads: one part


@pytest.mark.parametrize(
    ("rows", "cols", "rs", "vec", "experts", "slab_units"),
    [
        (2080, 225, 228, 4, 256, 256 * 17),  # TE's padded rows: a unit a slab, 57 tiles
        (300, 65, 68, 4, 1, 3),  # 17 tiles, a short last slab
        (300, 64, 68, 4, 1, 0),  # rows that fit one part's 16 tiles go by parts
        (1, 100, 0, 4, 1, 1),  # one row
        (2048, 224, 224, 16, 1, 16),  # 16-byte aligned rows too
        (2048, 240, 240, 16, 1, 0),  # 15 + 127*240 + 240 bytes: more than a slab's shared memory
        (128, 236, 236, 4, 1, 1),  # 30,227 bytes: fits
        (128, 200, 240, 16, 1, 1),  # 15 + 127*240 + 208 = 30,703 bytes: fits (the stride counts, not C)
        (2048, 225, 228, 1, 1, 0),  # misaligned: byte loads
        (128, 241, 244, 4, 1, 0),  # 15 + 127*244 + 244 bytes: more than a slab's shared memory
    ],
)
def test_slab_units_are_aligned_rows_wider_than_a_part_whose_slab_fits(
    rows: int, cols: int, rs: int, vec: int, experts: int, slab_units: int
) -> None:
    job = Job(0, 0, rs, 1, rows * rs, rows, cols, experts, MODE_ROWS, vec)
    flags = job.row(0, SLAB_CONFIG)[8]
    assert bool(flags & FLAG_SLAB) == (slab_units > 0)
    if slab_units:
        assert job.units(SLAB_CONFIG) == slab_units
        assert not flags & FLAG_PARTS
    elif vec >= 4 and -(-cols // 4) <= SLAB_CONFIG.part_tiles:
        assert flags & FLAG_PARTS  # narrow rows go by parts instead
    assert not job.row(0, KernelConfig(16, 128))[8] & FLAG_SLAB  # 128 threads: no slab units


@pytest.mark.parametrize(("nbytes", "units"), [(1, 1), (16384, 1), (16385, 2), (16384 * 3 + 1, 4)])
def test_copy_units(nbytes: int, units: int) -> None:
    assert Job(0, 0, 0, 0, 0, nbytes, 0, 1, MODE_COPY, 16).units(KernelConfig()) == units


def test_same_shaped_experts_merge_into_one_indirect_job() -> None:
    # per-expert matrices of one shape become one job reading a pointer table; others stay apart
    experts = [Job(1000 * e, 5000 * e, 8, 1, 0, 130, 5, 1, MODE_ROWS, 4) for e in range(1, 4)]
    odd = Job(7, 9, 12, 1, 0, 100, 3, 1, MODE_ROWS, 4)
    copy = Job(64, 128, 0, 0, 0, 40000, 0, 1, MODE_COPY, 16)
    rows, arrays, total = describe([*experts[:2], odd, experts[2], copy], KernelConfig(16, 128))
    assert len(rows) == 3
    merged = rows[0]
    assert merged[7] == 3 and merged[8] & FLAG_INDIRECT and merged[9] == 0
    assert arrays == [[1000, 2000, 3000, 5000, 10000, 15000]]
    # by hand: R=130, C=5 pads to 2 slabs of 2 tiles = 2 units an expert, 6 for the three;
    # R=100, C=3 is 1 slab of 1 tile = 1 unit; 40000 bytes are 3 copy chunks of 16384
    assert rows[1][9] == 6  # the odd job's units follow the merged job's
    assert rows[2][9] == 7
    assert total == 10


def test_per_expert_copies_of_one_size_merge_into_one_indirect_job() -> None:
    # each expert's already-swizzled buffer: one pointer-table copy job, so a unit finds its copy
    # without searching the experts' jobs
    copies = [Job(64 * e, 128 * e, 0, 0, 0, 40000, 0, 1, MODE_COPY, 16) for e in range(1, 4)]
    other = Job(7, 9, 0, 0, 0, 100, 0, 1, MODE_COPY, 1)
    rows, arrays, total = describe([*copies, other], KernelConfig())
    assert len(rows) == 2 and rows[0][7] == 3 and rows[0][8] == MODE_COPY | 16 << 8 | FLAG_INDIRECT
    assert arrays == [[64, 128, 192, 128, 256, 384]]
    assert rows[1][9] == 9 and total == 10  # 40000 bytes are 3 chunks of 16384 an expert; 100 bytes 1


def test_table_values_point_indirect_rows_at_their_address_arrays() -> None:
    experts = [Job(1000 * e, 5000 * e, 8, 1, 0, 130, 5, 1, MODE_ROWS, 4) for e in range(1, 3)]
    odd = Job(7, 9, 12, 1, 0, 100, 3, 1, MODE_ROWS, 4)
    table = describe([*experts, odd], KernelConfig())
    values = table.values(base=4096)
    assert table.words == len(values) == 2 * 10 + 4
    # row 0 reads its srcs at the first word after the rows (4096 + 8 * 20), its dsts two words on
    assert values[:2] == [4096 + 8 * 20, 4096 + 8 * 22] and values[2:10] == list(table.rows[0][2:])
    assert values[10:20] == list(table.rows[1]) and values[20:] == [1000, 2000, 5000, 10000]


def test_launches_with_rowwise_jobs_take_the_rowwise_shape() -> None:
    """By default a launch's shape follows its jobs (the H200 benchmark's fastest for each); a
    fixed shape holds for every launch."""
    rows = Job(0, 0, 224, 1, 0, 2048, 224, 4, MODE_ROWS, 16)
    cols = rows._replace(rs=1, cs=2048, mode=MODE_COLS)
    gather = rows._replace(rs=448, cs=2, mode=MODE_GATHER, vec=1)
    copy = Job(0, 0, 0, 0, 0, 4096, 0, 1, MODE_COPY, 16)
    group = JobGroup(cols._replace(experts=1), (0, 16), (0, 16))
    row_group = JobGroup(rows._replace(experts=1), (0, 16), (0, 16))  # per-expert tensors

    def shape(jobs: list[Job | JobGroup], shapes: LaunchShapes | None = None) -> tuple[int, int]:
        config = config_for(jobs, shapes or LaunchShapes())
        return config.tiles_per_unit, config.threads

    assert shape([rows, copy]) == shape([rows, cols]) == shape([rows, group]) == (32, 256)
    assert shape([gather]) == shape([gather, cols]) == shape([row_group]) == shape([row_group, group]) == (32, 256)
    assert shape([cols, group, copy]) == shape([copy, copy]) == shape([group]) == (16, 128)  # no rowwise job
    assert shape([rows], LaunchShapes.fixed(KernelConfig(16, 128))) == (16, 128)
    assert shape([cols, copy], LaunchShapes.fixed(KernelConfig(32, 256))) == (32, 256)


def test_misaligned_output_is_refused() -> None:
    base = torch.zeros(2048 + 8, dtype=torch.uint8)
    with pytest.raises(mok.LayoutError, match="16-byte aligned"):
        convert_job(torch.zeros(1, 128, 4, dtype=torch.uint8), base[8:].view(4, 1, 32, 16)[:1])


def test_refresh_layer_on_the_torch_backend(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 256, 128, mxfp8=True)
    ps = [T.mxfp8_tensor("2.20.2", 128, 256, seed=e, param=True) for e in range(3)]
    gv = mok.grouped_weight_view(g, num_experts=2, rows=256, columns=128, format="mxfp8")
    sv = mok.split_weight_view(ps, rows=128, columns=256, format="mxfp8")
    g.scale_inv.random_(0, 255)
    for p in ps:
        p._columnwise_scale_inv.random_(0, 255)
    mok.refresh_layer([(g, gv), (ps, sv)], backend="torch")
    want = torch.stack([m._rowwise_scale_inv[:256, :4] for m in g.quantized_tensors])
    assert torch.equal(gv.rowwise.scales[0], spec_layout(want))
    for e, p in enumerate(ps):
        assert torch.equal(sv.columnwise.scales[e], spec_layout(p._columnwise_scale_inv[:4, :256].t()))


def test_refresh_layer_checks_every_entry_before_writing(installed_te) -> None:  # type: ignore[no-untyped-def]
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    gv = mok.grouped_weight_view(g, num_experts=2, rows=128, columns=128, format="mxfp8")
    sv = mok.split_weight_view(ps, rows=128, columns=128, format="mxfp8")
    before = gv.rowwise.scales[0].clone()
    g.scale_inv.random_(0, 255)
    moved = ps[0]._rowwise_data = ps[0]._rowwise_data.clone()  # a move the refresh would follow ...
    ps[1]._rowwise_data.untyped_storage().resize_(0)  # ... were it not for a payload freed after it
    with pytest.raises(
        mok.StorageFreedError, match="refresh_layer entry 1: expert 1 rowwise data: its storage holds 0"
    ):
        mok.refresh_layer([(g, gv), (ps, sv)], backend="torch")
    assert torch.equal(gv.rowwise.scales[0], before)  # entry 0 was not written either
    assert sv.rowwise.data[0].data_ptr() != moved.data_ptr()  # nor entry 1's tensors pointed anywhere new
    with pytest.raises(
        mok.RefreshError, match="entry 0: expected a (quantized )?GroupedExpertWeights or SplitExpertWeights"
    ):
        mok.refresh_layer([(g, object())])  # type: ignore[list-item]


def test_copy_work_on_cpu() -> None:
    src = torch.randint(0, 256, (2048,), dtype=torch.uint8)
    dst = torch.zeros(mok.layout_shape(128, 16), dtype=torch.uint8)
    run_work([ScaleWork(src.view(dst.shape), dst, copy=True)])
    assert torch.equal(dst.flatten(), src)
