"""What one compiled kernel is (:class:`KernelConfig`), which one each launch takes
(:class:`LaunchShapes`), and the one place the environment is read (:func:`launch_shapes`). The
macros of a configuration carry the kernel's ABI too (mok.kernels.abi).

Nothing here changes after it is made: a launch is prepared with a configuration and keeps it.
Tests and benchmarks that want another shape pass a :class:`KernelConfig` to the launch, or set
``MOK_KERNEL_SHAPE`` and call ``te_compat.refresh()``, which makes :func:`launch_shapes` read the
environment again.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from mok.kernels.abi import macros as abi_macros
from te_compat import on_refresh

SHAPE_ENV = "MOK_KERNEL_SHAPE"  # "TILES,THREADS": one shape for every launch (benchmarks, tests)
BLOCK_SIZES = (64, 96, 128, 256)  # a part of a block is 128 threads (or the whole block), at most two
MOST_TILES = 64  # widest unit accepted: 256 scale columns, beyond every shape measured
SHAPE_RULE = f"THREADS one of {', '.join(map(str, BLOCK_SIZES))} and TILES a multiple of THREADS/8 up to {MOST_TILES}"
# 256-thread builds: shared bytes a slab unit may stage (jobs.Job._slab). A slab fits where
# 15 + 127 * row stride + C rounded up to 16 <= 30720 (TE's unpadded rows: up to 236 bytes,
# K <= 7552), and a block of that size still leaves 5 blocks an SM, as many as the registers allow.
SLAB_BYTES = 30720


@dataclass(frozen=True)
class KernelConfig:
    """One compiled kernel: ``tiles_per_unit`` 4-column tiles a unit of work, ``threads`` a block
    (the macros TILES_PER_UNIT and THREADS of mxfp8_swizzle.cu). Checked when made."""

    tiles_per_unit: int = 16
    threads: int = 128

    def __post_init__(self) -> None:
        tiles, threads = self.tiles_per_unit, self.threads
        integers = type(tiles) is int and type(threads) is int
        if not integers or threads not in BLOCK_SIZES or not 0 < tiles <= MOST_TILES or (8 * tiles) % threads:
            raise ValueError(f"unsupported kernel shape: expected {SHAPE_RULE}; found {tiles},{threads}")

    @classmethod
    def parse(cls, text: str, separator: str = ",") -> KernelConfig:
        """The configuration written ``TILES<separator>THREADS`` (e.g. ``32,256``)."""
        expected = f"expected TILES{separator}THREADS with {SHAPE_RULE} (e.g. 16{separator}128 or 32{separator}256)"
        try:
            tiles, threads = (int(v) for v in text.split(separator))
            return cls(tiles, threads)
        except ValueError:
            raise ValueError(f"{expected}; found {text!r}") from None

    def __str__(self) -> str:
        return f"{self.tiles_per_unit}x{self.threads}"

    @property
    def parts(self) -> int:
        """Units a block converts side by side when it converts by parts (one slab each, 128
        threads a part; columnwise jobs, and rowwise ones of at most part_tiles tiles)."""
        return max(1, self.threads // 128)

    @property
    def part_tiles(self) -> int:
        """4-column tiles of a part's unit."""
        return self.tiles_per_unit // self.parts

    @property
    def slab_bytes(self) -> int:
        """Shared bytes a slab unit may stage (0: no slab units in this build). Only 256-thread
        builds have them: at 30 KB a block, ten 128-thread blocks would not fit an SM's shared
        memory."""
        return SLAB_BYTES if self.parts > 1 else 0

    def macros(self) -> list[tuple[str, str]]:
        """The preprocessor definitions this configuration compiles the kernel with: its shape,
        then the ABI (mok.kernels.abi)."""
        found = [("TILES_PER_UNIT", str(self.tiles_per_unit)), ("THREADS", str(self.threads))]
        if self.slab_bytes:
            found.append(("SLAB_BYTES", str(self.slab_bytes)))
        return found + abi_macros()


@dataclass(frozen=True)
class LaunchShapes:
    """The configuration of each kind of launch: ``rowwise`` where a job is rowwise or a gather
    (columnwise jobs beside them included: a whole layer's rowwise jobs get slab units),
    ``other`` for columnwise jobs and copies alone. The defaults are the fastest of each kind on
    an H200 (docs/kernel-notes.md); :meth:`fixed` gives every launch one shape."""

    rowwise: KernelConfig = KernelConfig(32, 256)
    other: KernelConfig = KernelConfig()  # the compiled default

    @classmethod
    def fixed(cls, config: KernelConfig) -> LaunchShapes:
        return cls(config, config)

    def __str__(self) -> str:
        if self.rowwise == self.other:
            return f"{self.rowwise} for every launch"
        return f"per launch: {self.rowwise} with a rowwise job, else {self.other}"


def _read_shapes() -> LaunchShapes:
    """MOK_KERNEL_SHAPE, checked: the one shape it fixes for every launch, or the defaults."""
    value = os.environ.get(SHAPE_ENV, "")
    if not value:
        return LaunchShapes()
    try:
        return LaunchShapes.fixed(KernelConfig.parse(value))
    except ValueError as exc:
        raise ValueError(f"environment variable {SHAPE_ENV}: {exc}") from None


@functools.cache
def launch_shapes() -> LaunchShapes:
    """The launch shapes the environment asks for, read and checked once; ``te_compat.refresh()``
    reads them again. An invalid variable raises ValueError naming it, its value and what is
    expected."""
    return _read_shapes()


on_refresh(launch_shapes.cache_clear)


def environment_report() -> dict[str, str]:
    """The kernel's variables for ``te-compat report``: what each asks for, or why it is invalid."""
    rows: dict[str, str] = {}
    try:
        rows["kernel shape"] = str(_read_shapes())
    except ValueError as exc:
        rows |= {"kernel shape": "invalid", "kernel shape reason": str(exc)}
    return rows
