"""The kernel's ABI, written once: what a descriptor-table row's mode and flag bits mean, and the
byte count of a copy unit. mok.kernels.jobs writes rows with these values and every compile of
mxfp8_swizzle.cu (NVRTC, nvcc, the CPU emulator) receives them as macros from :func:`macros`, so
the two sides cannot disagree (the source refuses to compile without them)."""

from __future__ import annotations

COPY_CHUNK = 16384  # bytes of a copy unit
MODE_ROWS = 0  # cs == 1: rows contiguous
MODE_COLS = 1  # rs == 1: columns contiguous (a transposed view)
MODE_GATHER = 2  # any strides, byte by byte
MODE_COPY = 3  # already in the layout: copy R bytes (C unused)
FLAG_INDIRECT = 1 << 16  # src/dst of the job are device arrays of per-expert addresses
FLAG_JOIN_LAST = 1 << 17  # the job's one-tile last chunk joins the chunk before (Job._joins_last)
FLAG_PARTS = 1 << 18  # a job converted by parts (Job._width)
FLAG_SLAB = 1 << 19  # a rowwise job converted a whole slab a unit (Job._slab)
FLAG_INVERSE = 1 << 20  # a job of the inverse kernel (Job.inverse)

_NAMES = (
    "COPY_CHUNK",
    "MODE_ROWS",
    "MODE_COLS",
    "MODE_GATHER",
    "MODE_COPY",
    "FLAG_INDIRECT",
    "FLAG_JOIN_LAST",
    "FLAG_PARTS",
    "FLAG_SLAB",
    "FLAG_INVERSE",
)


def macros() -> list[tuple[str, str]]:
    """The ABI as preprocessor definitions, for every compile of the kernel source."""
    values = globals()
    return [(name, str(values[name])) for name in _NAMES]
