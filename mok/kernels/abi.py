"""The kernels' ABIs, written once, each side of the launch reading the same values.

The swizzle kernel (mxfp8_swizzle.cu): what a descriptor-table row's mode and flag bits mean, and
the byte count of a copy unit; mok.kernels.jobs writes rows with these values and every compile
(NVRTC, nvcc, the CPU emulator) receives them as macros from :func:`macros`. The quantize kernel
(mxfp8_quantize.cu): the bits of its ``flags`` argument (:class:`QuantizeFlag`, the QF_* macros
of :func:`quantize_macros`), which mok.kernels.quantize sets. The export kernel
(mxfp8_export.cu): its job kinds and flag bits (the EX_* values of :func:`export_macros`), which
mok.kernels.export_jobs writes. No source defines any of them and each refuses to compile
without them, so the two sides cannot disagree.
"""

from __future__ import annotations

from enum import IntFlag

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
    """The swizzle kernel's ABI as preprocessor definitions, for every compile of its source."""
    values = globals()
    return [(name, str(values[name])) for name in _NAMES]


class QuantizeFlag(IntFlag):
    """Bits of the quantize kernel's ``flags`` argument (the QF_* macros)."""

    ROWWISE = 1  # write the rowwise payload and scales
    COLWISE = 2  # write the columnwise payload and scales
    POINTERS = 4  # the source is a device table of per-expert addresses
    RCP_SHIFT = 8  # TE 2.9's exp2f_rcp (ReciprocalRule.SHIFT); else ReciprocalRule.EXACT
    LOGICAL = 16  # scales logical and compact, [E, R, C/32] and [E, R/32, C]; else the 128x4 layout
    FMA_ZERO = 32  # payloads from fma(x, rcp, +0) (ProductRule.FMA_ZERO); else x * rcp


def quantize_macros() -> list[tuple[str, str]]:
    """The quantize kernel's ABI (its flag bits) as preprocessor definitions."""
    return [(f"QF_{flag.name}", str(int(flag))) for flag in QuantizeFlag]


# The export kernel (mxfp8_export.cu). A job row's flags word: kind in bits 0-7, the widest source
# access (16, 4 or 1 bytes) in bits 8-15, the widest output access in bits 16-23, flags above.
EX_PAYLOAD = 0  # payload rows: dst[e][n][c] = src[e][perm(n)][c] inside [N, K], 0 in the padding
EX_SCALE_BYTES = 1  # scale tiles to logical bytes: (r, c) at r*dst_rs + c*dst_cs
EX_SCALE_WORDS = 2  # scale tiles to packed int32 words: (r, g) at r*dst_rs + g*dst_cs (DeepGEMM)
EX_SCALE_TILES = 3  # scale tiles kept whole, their 32 lanes permuted (TRT-LLM's Major-K)
EX_INDIRECT = 1 << 24  # src is a device array of per-expert addresses (split views' tables)
EX_SHUFFLE = 1 << 25  # payload rows permuted within blocks of 32 (FlashInfer's shuffle_matrix_a)
EX_SRC_VEC_SHIFT = 8
EX_DST_VEC_SHIFT = 16

_EXPORT_NAMES = (
    "EX_PAYLOAD",
    "EX_SCALE_BYTES",
    "EX_SCALE_WORDS",
    "EX_SCALE_TILES",
    "EX_INDIRECT",
    "EX_SHUFFLE",
    "EX_SRC_VEC_SHIFT",
    "EX_DST_VEC_SHIFT",
)


def export_macros() -> list[tuple[str, str]]:
    """The export kernel's ABI (job kinds, flag bits) as preprocessor definitions."""
    values = globals()
    return [(name, str(values[name])) for name in _EXPORT_NAMES]
