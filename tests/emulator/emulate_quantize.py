"""Run the MXFP8 quantisation kernel on the CPU and compare it byte for byte with the torch reference.

    python -m tests.emulator.emulate_quantize [--grids 1 5 0]

Builds mok/kernels/mxfp8_quantize.cu with emulator.h (g++ -std=c++20, the ABI macros of
mok.kernels.quantize.QuantizeConfig; see quantize_main.cpp) and runs it on CPU tensors with the
same arguments a QuantizeLaunch passes: grouped and per-expert (pointer table) sources, scales in
the 128x4 layout or logical, both reciprocal rules and both product rules. Every output buffer is filled with 0xFF (a
byte no output ever holds: NaN payloads are 0x7F, scales never 255 for NaN-free maxima) before the
run and compared whole with mok.kernels.quantize.run_reference, so a byte left unwritten shows.
It checks the kernel's logic and its software E4M3 conversion; the hardware ``cvt`` it uses on
sm_89+ is judged by tests/gpu/test_quantize_gpu.py.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import mok.kernels
from mok.kernels.quantize import (
    QuantizeConfig,
    QuantizeOutputs,
    address_table,
    check_outputs,
    check_source,
    empty_outputs,
    flags_for,
    kernel_arguments,
    run_reference,
)
from mok.quantize_reference import ProductRule, ReciprocalRule

HERE = Path(__file__).parent
CONFIG = QuantizeConfig()
KERNEL_DIR = Path(mok.kernels.__file__).parent
POISON = 0xFF
Source = torch.Tensor | Sequence[torch.Tensor]


@functools.cache
def build(config: QuantizeConfig = CONFIG, kernel_dir: Path = KERNEL_DIR) -> ctypes.CDLL:
    """Compile the emulator (cached per process) from the mxfp8_quantize.cu in ``kernel_dir``."""
    out = Path(tempfile.mkdtemp(prefix="mok-emu-quantize-")) / "emu.so"
    macros = [f"-D{k}={v}" for k, v in config.macros()]
    obj = out.with_suffix(".o")
    compile_ = ["g++", "-std=c++20", "-O1", "-fPIC", "-fsanitize=alignment", f"-I{kernel_dir}", f"-I{HERE}", *macros]
    subprocess.run([*compile_, "-c", str(HERE / "quantize_main.cpp"), "-o", str(obj)], check=True)
    subprocess.run(["g++", "-shared", str(obj), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.mok_emulate_quantize.restype = ctypes.c_int
    lib.mok_emulate_quantize.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.mok_emulate_quantize.argtypes += [ctypes.c_void_p, ctypes.c_int]
    return lib


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of ``t``'s elements."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def run(
    src: Source,
    out: QuantizeOutputs,
    *,
    rule: ReciprocalRule = ReciprocalRule.EXACT,
    product: ProductRule = ProductRule.MUL,
    swizzled: bool = True,
    grid: int = 0,
    kernel_dir: Path = KERNEL_DIR,
) -> None:
    """One emulated launch of ``grid`` blocks (0: one a unit) with a QuantizeLaunch's arguments."""
    config = CONFIG
    source = check_source(src)
    out = check_outputs(out, source, swizzled=swizzled)
    pointers = source.grouped is None
    table = address_table(source, torch.device("cpu")) if pointers else None
    flags = flags_for(rule=rule, swizzled=swizzled, pointers=pointers, product=product)
    args = kernel_arguments(source, out, flags, table, config)
    units = config.units(*source.dims)
    readable = torch.tensor([a for x in source.experts for a in _span(x)], dtype=torch.int64)
    writable = torch.tensor([a for t in out for a in _span(t)], dtype=torch.int64)
    words = torch.tensor(args, dtype=torch.int64)
    lib = build(config, kernel_dir)
    blocks = units if grid == 0 else min(grid, units)
    errors = lib.mok_emulate_quantize(
        words.data_ptr(), blocks, readable.data_ptr(), len(source.experts), writable.data_ptr(), len(out)
    )
    if errors:
        raise AssertionError(f"{errors} violations of the emulated hardware's rules (see stderr)")


def poisoned(experts: int, rows: int, cols: int, *, swizzled: bool, device: str = "cpu") -> QuantizeOutputs:
    """Output buffers holding POISON in every byte."""
    out = empty_outputs(experts, rows, cols, device, swizzled=swizzled)
    for t in out:
        t.view(torch.uint8).fill_(POISON)
    return out


def compare(got: QuantizeOutputs, want: QuantizeOutputs, what: str) -> None:
    """Raise AssertionError naming the first differing bytes of each output that differs."""
    for name, g, w in zip(QuantizeOutputs._fields, got, want, strict=True):
        gb, wb = g.view(torch.uint8), w.view(torch.uint8)
        if not torch.equal(gb, wb):
            bad = (gb != wb).nonzero()[:5]
            pairs = [f"{gb[tuple(i)].item():#04x} for {wb[tuple(i)].item():#04x}" for i in bad]
            raise AssertionError(
                f"{what}: {name} differs at {bad.tolist()} (found {', '.join(pairs)}; "
                f"{(gb != wb).sum().item()} bytes differ)"
            )


def check(
    src: Source,
    *,
    rule: ReciprocalRule = ReciprocalRule.EXACT,
    product: ProductRule = ProductRule.MUL,
    swizzled: bool = True,
    grid: int = 0,
    what: str = "",
    kernel_dir: Path = KERNEL_DIR,
) -> None:
    """The emulated kernel and the reference, each into its own poisoned buffers, compared whole."""
    source = check_source(src)
    got = poisoned(*source.dims, swizzled=swizzled)
    want = poisoned(*source.dims, swizzled=swizzled)
    run(src, got, rule=rule, product=product, swizzled=swizzled, grid=grid, kernel_dir=kernel_dir)
    run_reference(src, want, rule=rule, product=product, swizzled=swizzled)
    scales = "layout" if swizzled else "logical"
    compare(got, want, f"{what} (rule {rule.value}, product {product.value}, {scales} scales, grid {grid})")


def special_values(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """BF16 values of every kind, block by block: normal random ones of many magnitudes, and blocks
    with zeros, +-0, NaN, +-inf, subnormals, tiny blocks (scale code 0), the largest BF16, and an
    amax on or next to a scale boundary (448 * 2^k and its BF16 neighbours, k from -127 to 119)."""
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    flat = x.view(-1, 32)
    n = flat.shape[0]
    kinds = torch.randint(0, 9, (n,), generator=g)
    picks = torch.randint(0, 32, (n, 3), generator=g)
    rows = torch.arange(n)
    flat[kinds == 1] = 0.0
    flat[rows[kinds == 2], picks[kinds == 2, 0]] = float("nan")
    flat[rows[kinds == 3], picks[kinds == 3, 1]] = float("inf")
    flat[rows[kinds == 3], picks[kinds == 3, 2]] = float("-inf")
    tiny = torch.randn(int((kinds == 4).sum()), 32, generator=g) * 2.0**-125  # around 448 * 2^-127
    flat[kinds == 4] = tiny
    flat[kinds == 5] = torch.randn(int((kinds == 5).sum()), 32, generator=g) * 2.0**-133  # BF16 subnormals
    flat[rows[kinds == 6], picks[kinds == 6, 0]] = 3.3895e38  # the largest BF16
    flat[kinds == 7] = -0.0
    edge = rows[kinds == 8]
    boundary = 448.0 * torch.exp2(torch.randint(-127, 120, (len(edge), 1), generator=g).float())
    flat[edge] = torch.rand(len(edge), 32, generator=g) * boundary / 2  # below the element set next
    x = x.to(torch.bfloat16)
    bits = boundary[:, 0].to(torch.bfloat16).view(torch.int16)
    nudged = (bits + torch.randint(-1, 2, (len(edge),), generator=g).to(torch.int16)).view(torch.bfloat16)
    x.view(-1, 32)[edge, picks[kinds == 8, 0]] = torch.where(picks[kinds == 8, 1] % 2 == 0, nudged, -nudged)
    return x


def cases(device: str = "cpu") -> list[tuple[str, Callable[[torch.Generator], Source]]]:
    """Sources covering the tile and padding rules; on ``device`` (tests/gpu runs them too)."""

    def grouped(e: int, r: int, c: int) -> Callable[[torch.Generator], Source]:
        return lambda g: special_values(g, (e, r, c)).to(device)

    def per_expert(e: int, r: int, c: int, stride: int) -> Callable[[torch.Generator], Source]:
        def make(g: torch.Generator) -> Source:
            return [special_values(g, (r, stride)).to(device)[:, :c] for _ in range(e)]

        return make

    def strided(e: int, r: int, c: int, stride: int) -> Callable[[torch.Generator], Source]:
        return lambda g: special_values(g, (e, r, stride)).to(device)[:, :, :c]

    return [
        ("grouped E=1 32x32", grouped(1, 32, 32)),
        ("grouped E=3 128x256", grouped(3, 128, 256)),
        ("grouped E=2 96x544 (rows and columns pad, partial tile)", grouped(2, 96, 544)),
        ("grouped E=2 160x288 (a 32-column last tile)", grouped(2, 160, 288)),
        ("grouped E=4 64x96", grouped(4, 64, 96)),
        ("per-expert E=5 64x160, rows 192 apart", per_expert(5, 64, 160, 192)),
        ("per-expert E=2 224x512", per_expert(2, 224, 512, 512)),
        ("grouped view E=2 32x96, rows 128 apart", strided(2, 32, 96, 128)),
        ("grouped E=3 288x160 (a last 128-row unit of 1 tile)", grouped(3, 288, 160)),
        ("per-expert E=2 320x288 (a last 128-row unit of 2 tiles)", per_expert(2, 320, 288, 288)),
        ("grouped E=2 352x96 (a last 128-row unit of 3 tiles)", grouped(2, 352, 96)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", type=int, nargs="*", default=[0, 1, 5], help="0: one block per tile")
    args = parser.parse_args()
    for name, make in cases():
        for grid in args.grids:
            for rule, product in zip(ReciprocalRule, ProductRule, strict=True):
                for swizzled in (True, False):
                    seeded = make(torch.Generator().manual_seed(len(name)))
                    check(seeded, rule=rule, product=product, swizzled=swizzled, grid=grid)
            print(f"ok  grid={grid or 'per-tile'}  {name}", flush=True)
    print("emulation of mxfp8_quantize: every output equals the torch reference")


if __name__ == "__main__":
    main()
