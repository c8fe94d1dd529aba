"""Run the kernels on the CPU and compare them byte for byte with the torch reference.

    python -m tests.emulator.emulate [--shapes 16x128 32x256] [--grids 1 0] [--cases inverse]
    python -m tests.emulator.emulate --kernel-dir /tmp/planted     # a changed copy of the source

Builds mok/kernels/mxfp8_swizzle.cu with emulator.h (g++ -std=c++20; one std::thread per CUDA thread,
cp.async modelled with its alignment and completion rules; every access checked for alignment,
every read of a source tensor (loads, cp.async) for staying inside the launch's source tensors,
every write of the inverse kernel for staying inside its output tensors; the descriptor tables
are not checked) under a configuration's macros and runs the same job tables a launch uploads
(mok.kernels.jobs): rowwise 16/4/1-byte rows, padded slabs, wide rows, columnwise views, gather,
copies, per-expert pointer tables (conversions and copies) and mixed layers; and the inverse
(INVERSE_CASES) into outputs whose whole buffers are compared, so that a byte left unwritten, or
written between the rows or past the end, shows. It checks the planning, addressing and staging
logic without a GPU; it says nothing about speed, and a hardware rule the model lacks can still
fail on the device (tests/gpu is the judge). Grid 0 is one block per unit (a launch's grid). A
test tool: it lives beside the tests, not in the package.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

import mok.kernels
from mok.kernels.config import KernelConfig
from mok.kernels.jobs import describe, jobs_of
from mok.kernels.launch import upload
from mok.layout import layout_shape, swizzle_reference, unswizzle_reference
from mok.plan.work import ScaleWork

HERE = Path(__file__).parent
KERNEL_DIR = Path(mok.kernels.__file__).parent  # emulator_main.cpp includes mxfp8_swizzle.cu from here
# both launch shapes a launch takes (config.LaunchShapes), then another valid block size
CONFIGS = [KernelConfig(16, 128), KernelConfig(32, 256), KernelConfig(16, 64)]
Case = tuple[str, Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]]
Pairs = list[tuple[torch.Tensor, torch.Tensor]]  # (layout, logical output) of each inverse item
InverseCase = tuple[str, Callable[[torch.Generator], Pairs]]
MARK = 0xAB  # what every output holds before a launch


@functools.cache
def build(config: KernelConfig, kernel_dir: Path = KERNEL_DIR) -> ctypes.CDLL:
    """Compile the emulator for one kernel configuration (cached per process), from the
    mxfp8_swizzle.cu in ``kernel_dir`` (mok's own, or a changed copy)."""
    out = Path(tempfile.mkdtemp(prefix="mok-emu-")) / f"emu-{config}.so"
    macros = [f"-D{k}={v}" for k, v in config.macros()]
    # alignment checks compiled in, their runtime left out: emulator_main.cpp handles them
    obj = out.with_suffix(".o")
    compile_ = ["g++", "-std=c++20", "-O1", "-fPIC", "-fsanitize=alignment", f"-I{kernel_dir}", *macros, "-c"]
    subprocess.run([*compile_, str(HERE / "emulator_main.cpp"), "-o", str(obj)], check=True)
    subprocess.run(["g++", "-shared", str(obj), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.mok_emulate.restype = ctypes.c_int
    lib.mok_emulate.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_longlong,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return lib


def run(work: list[ScaleWork], config: KernelConfig, grid: int, kernel_dir: Path = KERNEL_DIR) -> None:
    """Run ``work`` (on the CPU) in one emulated launch of ``grid`` blocks (at most one a unit; 0:
    one a unit), on the inverse kernel where the items are inverse ones."""
    jobs = jobs_of(work)  # what mok.plan.work launches
    table = describe(jobs, config)
    words = upload(table, torch.device("cpu"))
    grid = table.units if grid == 0 else min(grid, table.units)
    readable = torch.tensor([a for item in work for a in _span(item.src)], dtype=torch.int64)
    writable = torch.tensor([a for item in work for a in _span(item.dst)], dtype=torch.int64)
    inverse = any(item.inverse for item in work)
    errors = build(config, kernel_dir).mok_emulate(
        words.data_ptr(),
        len(table.rows),
        table.units,
        max(1, grid),
        readable.data_ptr(),
        len(work),
        writable.data_ptr(),
        len(work),
        inverse,
    )
    if errors:
        raise AssertionError(f"{errors} violations of the emulated hardware's rules (see stderr)")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of a uint8 tensor's elements: all a kernel may read of it."""
    return t.data_ptr(), t.data_ptr() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1


def _padded(g: torch.Generator, e: int, r: int, c: int, pr: int, pc: int) -> torch.Tensor:
    buf = torch.full((e, pr, pc), 0xFF, dtype=torch.uint8)
    buf[:, :r, :c] = torch.randint(0, 256, (e, r, c), dtype=torch.uint8, generator=g)
    return buf


def _ru(v: int, m: int) -> int:
    return -(-v // m) * m


def _convert(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    return (
        batch,
        torch.full(layout_shape(batch.shape[1], batch.shape[2], batch.shape[0]), 0xAB, dtype=torch.uint8),
        False,
    )


def _rowwise(e: int, m: int, k: int) -> Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]:
    return lambda g: [_convert(_padded(g, e, m, k // 32, _ru(m, 128), _ru(k // 32, 4))[:, :m, : k // 32])]


def _colwise(e: int, m: int, k: int) -> Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]:
    return lambda g: [
        _convert(_padded(g, e, m // 32, k, _ru(m // 32, 4), _ru(k, 128))[:, : m // 32, :k].transpose(1, 2))
    ]


def _per_expert(e: int, m: int, k: int) -> Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]:
    def make(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        bufs = [_padded(g, 1, m, k // 32, _ru(m, 128), _ru(k // 32, 4))[:, :m, : k // 32] for _ in range(e)]
        cols = [
            _padded(g, 1, m // 32, k, _ru(m // 32, 4), _ru(k, 128))[:, : m // 32, :k].transpose(1, 2) for _ in range(e)
        ]
        return [_convert(b) for b in bufs + cols]

    return make


def _odd(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    base = torch.randint(0, 256, (3 * 200 * 13 + 1,), dtype=torch.uint8, generator=g)
    wide = torch.randint(0, 256, (2, 300, 1040), dtype=torch.uint8, generator=g)  # rows too wide for a slab
    wide_pad = torch.randint(0, 256, (1, 130, 1000), dtype=torch.uint8, generator=g)  # 1000 % 16 != 0, too wide
    src = torch.randint(0, 256, (3 * 16384 + 37,), dtype=torch.uint8, generator=g)
    return [
        _convert(torch.randint(0, 256, (3, 160, 7), dtype=torch.uint8, generator=g)),  # 1-byte rows, slab
        _convert(torch.randint(0, 256, (2, 200, 12), dtype=torch.uint8, generator=g)),  # 4-byte rows
        _convert(base[1:].view(3, 200, 13)[:, :, :12]),  # misaligned start
        _convert(torch.randint(0, 256, (1, 90, 60), dtype=torch.uint8, generator=g)[:, ::3, ::2]),  # gather
        _convert(torch.randint(0, 256, (2, 40, 520), dtype=torch.uint8, generator=g)[:, :33, :500].transpose(1, 2)),
        _convert(torch.randint(0, 256, (2, 9, 300), dtype=torch.uint8, generator=g).transpose(1, 2)),  # 3 slabs
        _convert(wide[:, :, :1000]),
        _convert(wide_pad),
        _convert(torch.randint(0, 256, (1, 1, 5), dtype=torch.uint8, generator=g)),
        (src, torch.zeros_like(src), True),
        (src[1:], torch.zeros(src.numel() - 1, dtype=torch.uint8), True),
    ]


def _partial_words(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """4-byte aligned rows whose last word is partial (1-3 bytes), in short and long units, and
    16-byte aligned ones (a 112-byte stride)."""
    buf = torch.randint(0, 256, (2, 140, 76), dtype=torch.uint8, generator=g)
    wide = torch.randint(0, 256, (2, 140, 112), dtype=torch.uint8, generator=g)
    return [_convert(buf[:, :, :c]) for c in (6, 7, 33, 34, 71)] + [_convert(wide[:, :, :c]) for c in (101, 110)]


def _offsets(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """4-byte aligned rows whose slabs start at several addresses modulo 16 (a short head before
    the first 16-byte word), a last slab of 3 rows, a partial last word, and a single row."""
    buf = torch.randint(0, 256, (3 * 131 * 84 + 16,), dtype=torch.uint8, generator=g)
    return [_convert(buf[4 : 4 + 3 * 131 * 84].view(3, 131, 84)[:, :, :82]), _convert(buf[4:104].view(1, 1, 100))]


def _mixed(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """Jobs of odd unit counts, so a block's grid-stride loop mixes rows, columns, copies and experts."""
    cols = torch.randint(0, 256, (1, 7, 200), dtype=torch.uint8, generator=g).transpose(1, 2)  # 2 units
    src = torch.randint(0, 256, (2 * 16384 + 5,), dtype=torch.uint8, generator=g)  # 3 copy units
    experts = [torch.randint(0, 256, (1, 130, 70), dtype=torch.uint8, generator=g) for _ in range(3)]  # 4 units each
    return [
        _convert(torch.randint(0, 256, (3, 100, 8), dtype=torch.uint8, generator=g)),  # 3 units
        _convert(cols),
        (src, torch.zeros_like(src), True),
        *[_convert(e) for e in experts],
        _convert(torch.randint(0, 256, (1, 90, 60), dtype=torch.uint8, generator=g)[:, ::3, ::2]),  # gather
    ]


def _expert_copies(
    misaligned: bool, device: str = "cpu"
) -> Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]:
    """Already-swizzled per-expert buffers of one size (one pointer-table copy job), 16-byte
    aligned, or with one source one byte off (the job copies bytewise); on ``device`` (tests/gpu
    runs the same case)."""

    def make(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        size = 2 * 16384 + 1000  # three chunks an expert, the last partial
        srcs = [torch.randint(0, 256, (size + 16,), dtype=torch.uint8, generator=g).to(device) for _ in range(4)]
        starts = [0, 0, 0, 1 if misaligned else 0]
        return [
            (s[i : i + size], torch.zeros(size, dtype=torch.uint8, device=device), True)
            for s, i in zip(srcs, starts, strict=True)
        ]

    return make


CASES: list[Case] = [
    ("rowwise aligned E=3 640x7168", _rowwise(3, 640, 7168)),
    ("rowwise padded E=2 544x7200", _rowwise(2, 544, 7200)),
    ("rowwise E=2 300x2048", _rowwise(2, 300, 2048)),
    ("columnwise E=2 544x7200", _colwise(2, 544, 7200)),
    ("columnwise E=1 4096x1024", _colwise(1, 4096, 1024)),
    ("columnwise E=2 96x640", _colwise(2, 96, 640)),
    ("per-expert tables E=9 288x2080", _per_expert(9, 288, 2080)),
    ("columnwise 65 columns E=2 2080x256", _colwise(2, 2080, 256)),  # 17 tiles: a 16-tile unit and one more
    ("columnwise 66 columns E=1 2112x200", _colwise(1, 2112, 200)),
    ("per-expert tables, 65 columns, E=3 2080x384", _per_expert(3, 2080, 384)),
    ("odd strides, gather, wide rows, copies", _odd),
    ("rowwise 4-byte rows, partial last words", _partial_words),
    ("rowwise 4-byte rows at offsets 4, 0 and 12 modulo 16", _offsets),
    ("mixed layer, odd unit counts", _mixed),
    ("per-expert copies of one size", _expert_copies(False)),
    ("per-expert copies, one misaligned", _expert_copies(True)),
]


def check(
    name: str,
    make: Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]],
    config: KernelConfig,
    grid: int,
    kernel_dir: Path = KERNEL_DIR,
) -> None:
    g = torch.Generator().manual_seed(len(name) * 7919 + config.threads + grid)
    work = make(g)
    run([ScaleWork(src, dst, copy) for src, dst, copy in work], config, grid, kernel_dir)
    for i, (src, dst, copy) in enumerate(work):
        want = src.clone() if copy else swizzle_reference(src, torch.empty_like(dst))
        if not torch.equal(dst, want):
            bad = (dst != want).nonzero()[:5].tolist()
            raise AssertionError(
                f"{name}: work item {i} differs from the reference at {bad} (shape {config}, grid {grid})"
            )


def marked(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0, device: str = "cpu") -> torch.Tensor:
    """A uint8 view ``shape``/``strides`` ``offset`` bytes into a buffer of its own holding MARK,
    with 64 bytes of it past the view's last element: an inverse output whose whole buffer is
    compared, so that a write outside the view shows."""
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))
    return torch.full((offset + span + 64,), MARK, dtype=torch.uint8, device=device).as_strided(shape, strides, offset)


def _layout(g: torch.Generator, e: int, r: int, c: int, device: str = "cpu") -> torch.Tensor:
    """A layout buffer of random bytes, its padding too (the inverse drops it)."""
    return torch.randint(0, 256, layout_shape(r, c, e), dtype=torch.uint8, generator=g).to(device)


def inverse_rows(
    e: int, r: int, c: int, stride: int, offset: int = 0, device: str = "cpu"
) -> Callable[[torch.Generator], Pairs]:
    """A rows-contiguous output [E, R, C] whose rows are ``stride`` bytes apart (more than C: other
    data between them), ``offset`` bytes into its buffer."""
    return lambda g: [(_layout(g, e, r, c, device), marked((e, r, c), (r * stride, stride, 1), offset, device))]


def inverse_columns(e: int, r: int, c: int, stride: int, device: str = "cpu") -> Callable[[torch.Generator], Pairs]:
    """A columns-contiguous output [E, R, C]: TE's columnwise [C, R] buffer, columns ``stride``
    bytes apart, seen as its transpose."""
    return lambda g: [(_layout(g, e, r, c, device), marked((e, r, c), (c * stride, 1, stride), 0, device))]


def inverse_per_expert(
    e: int, r: int, c: int, misaligned: bool = False, device: str = "cpu"
) -> Callable[[torch.Generator], Pairs]:
    """``e`` separate outputs of one geometry, rows- and columns-contiguous with padded strides
    (TE's per-expert buffers), each with a layout of its own: two pointer-table jobs. With
    ``misaligned``, the last of each one byte off (the job then stores byte by byte)."""
    row_stride, col_stride = -(-c // 4) * 4, -(-r // 128) * 128

    def make(g: torch.Generator) -> Pairs:
        def one(strides: tuple[int, int, int], i: int) -> tuple[torch.Tensor, torch.Tensor]:
            offset = int(misaligned and i == e - 1)
            return _layout(g, 1, r, c, device), marked((1, r, c), strides, offset, device)

        return [one((0, row_stride, 1), i) for i in range(e)] + [one((0, 1, col_stride), i) for i in range(e)]

    return make


def inverse_odd(device: str = "cpu") -> Callable[[torch.Generator], Pairs]:
    """A gather (every other row, every third column), one row, one column, and 1-byte rows."""

    def make(g: torch.Generator) -> Pairs:
        gather = marked((2, 90, 60), (90 * 60, 60, 1), 0, device)[:, ::2, ::3]
        return [
            (_layout(g, 2, 45, 20, device), gather),
            (_layout(g, 1, 1, 5, device), marked((1, 1, 5), (5, 5, 1), 0, device)),
            (_layout(g, 1, 130, 1, device), marked((1, 130, 1), (130, 1, 1), 3, device)),
            (_layout(g, 3, 160, 7, device), marked((3, 160, 7), (160 * 7, 7, 1), 1, device)),
        ]

    return make


def inverse_cases(device: str = "cpu") -> list[InverseCase]:
    """The inverse cases with their tensors on ``device`` (tests/gpu runs them on the GPU)."""
    return [
        ("inverse rows aligned E=3 256x32", inverse_rows(3, 256, 32, 32, 0, device)),
        ("inverse rows padded E=2 300x57, stride 60", inverse_rows(2, 300, 57, 60, 0, device)),
        ("inverse rows TE-padded E=2 200x225, stride 228", inverse_rows(2, 200, 225, 228, 0, device)),
        ("inverse rows 16-byte stride E=2 130x101, stride 112", inverse_rows(2, 130, 101, 112, 0, device)),
        ("inverse rows wide E=1 130x300, stride 304", inverse_rows(1, 130, 300, 304, 0, device)),
        ("inverse rows 1-byte E=2 200x13, offset 1", inverse_rows(2, 200, 13, 13, 1, device)),
        ("inverse columns TE-padded E=2 544x65, stride 640", inverse_columns(2, 544, 65, 640, device)),
        ("inverse columns E=1 200x30, stride 204", inverse_columns(1, 200, 30, 204, device)),
        ("inverse columns E=2 130x9, stride 131", inverse_columns(2, 130, 9, 131, device)),
        ("inverse many experts E=9 130x20", inverse_rows(9, 130, 20, 20, 0, device)),
        ("inverse per-expert tables E=5 300x57", inverse_per_expert(5, 300, 57, False, device)),
        ("inverse per-expert tables, one misaligned, E=3 130x9", inverse_per_expert(3, 130, 9, True, device)),
        ("inverse gather, one row, one column, 1-byte rows", inverse_odd(device)),
    ]


INVERSE_CASES = inverse_cases()


def inverse_reference(pairs: Pairs) -> list[torch.Tensor]:
    """Each output's whole buffer as it must be after the inverse of ``pairs``: the reference's
    bytes in the view, the buffer's own (MARK) elsewhere. Each output has a buffer of its own."""
    wants = []
    for layout, out in pairs:
        want = _buffer(out).clone()
        unswizzle_reference(layout, want.as_strided(out.shape, out.stride(), out.storage_offset()))
        wants.append(want)
    return wants


def compare_buffers(pairs: Pairs, wants: list[torch.Tensor], what: str) -> None:
    """Raise AssertionError naming the first bytes where an output's buffer differs from its want."""
    for i, ((_, out), want) in enumerate(zip(pairs, wants, strict=True)):
        got = _buffer(out)
        if not torch.equal(got, want):
            bad = (got != want).nonzero().flatten()[:5].tolist()
            raise AssertionError(
                f"{what}: item {i} differs from the reference at buffer bytes {bad}, the view starting at byte "
                f"{out.storage_offset()}"
            )


def check_inverse(
    name: str, make: Callable[[torch.Generator], Pairs], config: KernelConfig, grid: int, kernel_dir: Path = KERNEL_DIR
) -> None:
    """One emulated inverse launch of ``make``'s items; each output's whole buffer (MARK outside
    the view) against the reference's."""
    g = torch.Generator().manual_seed(len(name) * 7919 + config.threads + grid)
    pairs = make(g)
    wants = inverse_reference(pairs)
    run([ScaleWork(layout, out, inverse=True) for layout, out in pairs], config, grid, kernel_dir)
    compare_buffers(pairs, wants, f"{name} (shape {config}, grid {grid})")


def _buffer(t: torch.Tensor) -> torch.Tensor:
    """The whole buffer ``t`` is a view of, as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=[str(c) for c in CONFIGS], help="TILESxTHREADS each")
    parser.add_argument("--grids", type=int, nargs="*", default=[1, 3, 7, 0], help="0: one block per unit")
    parser.add_argument("--cases", choices=["all", "forward", "inverse"], default="all")
    parser.add_argument("--kernel-dir", type=Path, default=KERNEL_DIR, help="the folder of the mxfp8_swizzle.cu to run")
    args = parser.parse_args()
    for config in (KernelConfig.parse(shape, "x") for shape in args.shapes):
        for grid in args.grids:
            label = "per-unit" if grid == 0 else grid
            for name, make in CASES if args.cases != "inverse" else []:
                check(name, make, config, grid, args.kernel_dir)
                print(f"ok  {config} grid={label}  {name}", flush=True)
            for name, make_pairs in INVERSE_CASES if args.cases != "forward" else []:
                check_inverse(name, make_pairs, config, grid, args.kernel_dir)
                print(f"ok  {config} grid={label}  {name}", flush=True)
    print(f"emulation of {' '.join(args.shapes)}: every result equals the torch reference")


if __name__ == "__main__":
    main()
