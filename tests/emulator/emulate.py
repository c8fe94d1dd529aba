"""Run the kernel on the CPU and compare it byte for byte with the torch reference.

    python -m tests.emulator.emulate [--shapes 16x128 32x256] [--grids 1 0]

Builds mok/kernels/mxfp8_swizzle.cu with emulator.h (g++ -std=c++20; one std::thread per CUDA thread,
cp.async modelled with its alignment and completion rules; every access checked for alignment,
every read of a source tensor (loads, cp.async) for staying inside the launch's source tensors;
the descriptor tables are not checked) under a configuration's macros and runs the same job
tables a launch uploads (mok.kernels.jobs): rowwise 16/4/1-byte rows, padded slabs, wide rows, columnwise views,
gather, copies, per-expert pointer tables (conversions and copies) and mixed layers. It checks the
planning, addressing and staging logic without a GPU; it says nothing about speed, and a hardware
rule the model lacks can still fail on the device (tests/gpu is the judge). Grid 0 is one block
per unit (a launch's grid). A test tool: it lives beside the tests, not in the package.
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
from mok.layout import layout_shape, swizzle_reference

HERE = Path(__file__).parent
KERNEL_DIR = Path(mok.kernels.__file__).parent  # emulator_main.cpp includes mxfp8_swizzle.cu from here
# both launch shapes a launch takes (config.LaunchShapes), then another valid block size
CONFIGS = [KernelConfig(16, 128), KernelConfig(32, 256), KernelConfig(16, 64)]
Case = tuple[str, Callable[[torch.Generator], list[tuple[torch.Tensor, torch.Tensor, bool]]]]


@functools.cache
def build(config: KernelConfig) -> ctypes.CDLL:
    """Compile the emulator for one kernel configuration (cached per process)."""
    out = Path(tempfile.mkdtemp(prefix="mok-emu-")) / f"emu-{config}.so"
    macros = [f"-D{k}={v}" for k, v in config.macros()]
    # alignment checks compiled in, their runtime left out: emulator_main.cpp handles them
    obj = out.with_suffix(".o")
    compile_ = ["g++", "-std=c++20", "-O1", "-fPIC", "-fsanitize=alignment", f"-I{KERNEL_DIR}", *macros, "-c"]
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
    ]
    return lib


def run(work: list[tuple[torch.Tensor, torch.Tensor, bool]], config: KernelConfig, grid: int) -> None:
    """Run ``work`` ([src, dst, is_copy] on the CPU) in one emulated launch of ``grid`` blocks (at
    most one a unit; 0: one a unit)."""
    jobs = jobs_of([(s, d, copy, None) for s, d, copy in work])  # what mok.work launches
    table = describe(jobs, config)
    words = upload(table, torch.device("cpu"))
    grid = table.units if grid == 0 else min(grid, table.units)
    readable = torch.tensor([a for s, _, _ in work for a in _span(s)], dtype=torch.int64)
    errors = build(config).mok_emulate(
        words.data_ptr(), len(table.rows), table.units, max(1, grid), readable.data_ptr(), len(work)
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
) -> None:
    g = torch.Generator().manual_seed(len(name) * 7919 + config.threads + grid)
    work = make(g)
    run(work, config, grid)
    for i, (src, dst, copy) in enumerate(work):
        want = src.clone() if copy else swizzle_reference(src, torch.empty_like(dst))
        if not torch.equal(dst, want):
            bad = (dst != want).nonzero()[:5].tolist()
            raise AssertionError(
                f"{name}: work item {i} differs from the reference at {bad} (shape {config}, grid {grid})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=[str(c) for c in CONFIGS], help="TILESxTHREADS each")
    parser.add_argument("--grids", type=int, nargs="*", default=[1, 3, 7, 0], help="0: one block per unit")
    args = parser.parse_args()
    for config in (KernelConfig.parse(shape, "x") for shape in args.shapes):
        for grid in args.grids:
            for name, make in CASES:
                check(name, make, config, grid)
                label = "per-unit" if grid == 0 else grid
                print(f"ok  {config} grid={label}  {name}", flush=True)
    print(f"emulation of {' '.join(args.shapes)}: every result equals the torch reference")


if __name__ == "__main__":
    main()
