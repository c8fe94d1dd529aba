"""The export kernel's work as jobs, and its descriptor table: pure planning (addresses, strides
and sizes in, integers out; no device, no tensor).

An export (mok.export_mxfp8) is at most four jobs, one launch of mxfp8_export.cu: each direction's
payload (:func:`payload_job`) and scales (:func:`scale_job`), every expert of each. A job reads a
grouped weight at ``src + e * src_es`` or, for a split view, the addresses in a device pointer
table at ``src`` (``indirect``); its output is one buffer, expert ``e`` at ``dst + e * dst_es``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mok.errors import LayoutError
from mok.kernels.abi import (
    EX_DST_VEC_SHIFT,
    EX_INDIRECT,
    EX_PAYLOAD,
    EX_SCALE_BYTES,
    EX_SCALE_TILES,
    EX_SCALE_WORDS,
    EX_SHUFFLE,
    EX_SRC_VEC_SHIFT,
    export_macros,
)

SCALE_KINDS = {"bytes": EX_SCALE_BYTES, "words": EX_SCALE_WORDS, "tiles": EX_SCALE_TILES}
_MAX_PIECES = 2**31 - 1  # the kernel indexes an expert's pieces with 32-bit unsigned arithmetic


@dataclass(frozen=True)
class ExportConfig:
    """The compiled export kernel's shape: ``threads`` a block, units of ``unit_pieces`` 16-byte
    payload pieces or ``unit_tiles`` 512-byte scale tiles (32 KB each by default: a few hundred
    units an expert of 2048 x 7168, so 256 experts fill any GPU many times over, and eight 16-byte
    loads a thread in flight). Tests use smaller units to cross unit boundaries on small shapes."""

    threads: int = 256
    unit_pieces: int = 2048
    unit_tiles: int = 64

    def __post_init__(self) -> None:
        t, p, u = self.threads, self.unit_pieces, self.unit_tiles
        ok = all(type(v) is int and v > 0 for v in (t, p, u)) and t % 32 == 0 and t <= 1024
        if not ok or p % t or u % (t // 32) or p // t > 16 or u // (t // 32) > 16:
            raise ValueError(
                "unsupported export kernel shape: expected threads a multiple of 32 up to 1024, unit_pieces a "
                "multiple of threads and unit_tiles of threads/32 (at most 16 of each a thread or warp); "
                f"found threads={t}, unit_pieces={p}, unit_tiles={u}"
            )

    def macros(self) -> list[tuple[str, str]]:
        """The preprocessor definitions of this shape, then the ABI (mok.kernels.abi)."""
        shape = [("EX_THREADS", self.threads), ("EX_UNIT_PIECES", self.unit_pieces), ("EX_UNIT_TILES", self.unit_tiles)]
        return [(name, str(value)) for name, value in shape] + export_macros()


class ExportJob(NamedTuple):
    """One row of the descriptor table (``struct ExportJob`` of mxfp8_export.cu), in bytes:
    ``experts`` matrices read at ``src`` (+ ``e * src_es``, rows ``src_rs`` apart; or the e-th
    address of the table at ``src`` where ``flags`` has EX_INDIRECT), written at ``dst`` +
    ``e * dst_es``. Payload: ``[rows, cols]`` into ``[out_rows, out_cols]`` rows ``dst_rs`` apart.
    Scales: the 128x4 layout of a logical ``[rows, cols]``, written at ``r * dst_rs + c * dst_cs``
    (bytes), ``r * dst_rs + g * dst_cs`` (words) or whole tiles."""

    src: int
    src_es: int
    src_rs: int
    dst: int
    dst_es: int
    dst_rs: int
    dst_cs: int
    rows: int
    cols: int
    out_rows: int
    out_cols: int
    experts: int
    flags: int

    @property
    def kind(self) -> int:
        return self.flags & 0xFF

    def units(self, config: ExportConfig) -> int:
        """The blocks' units of work of this job: every expert's, each expert's from a unit's start."""
        if self.kind == EX_PAYLOAD:
            pieces = self.out_rows * -(-self.out_cols // 16)
            return self.experts * -(-pieces // config.unit_pieces)
        tiles = -(-self.rows // 128) * -(-self.cols // 4)
        return self.experts * -(-tiles // config.unit_tiles)


def vec(*values: int) -> int:
    """The widest access (16, 4 or 1 bytes) that every address and stride of ``values`` allows."""
    bits = 0
    for v in values:
        bits |= v
    return 16 if bits % 16 == 0 else 4 if bits % 4 == 0 else 1


def _flags(kind: int, src_vec: int, dst_vec: int, indirect: bool, shuffle: bool = False) -> int:
    flags = kind | src_vec << EX_SRC_VEC_SHIFT | dst_vec << EX_DST_VEC_SHIFT
    return flags | (EX_INDIRECT if indirect else 0) | (EX_SHUFFLE if shuffle else 0)


def _positive(what: str, **sizes: int) -> None:
    bad = {k: v for k, v in sizes.items() if type(v) is not int or v < 1}
    if bad:
        raise LayoutError(f"{what}: expected sizes of at least 1; found {bad}")


def payload_job(
    *,
    src: int,
    src_es: int,
    src_rs: int,
    indirect: bool,
    rows: int,
    cols: int,
    dst: int,
    dst_es: int,
    dst_rs: int,
    out_rows: int,
    out_cols: int,
    experts: int,
    shuffle: bool = False,
) -> ExportJob:
    """The job copying ``experts`` payloads ``[rows, cols]`` (bytes contiguous along a row) into
    ``[out_rows, out_cols]`` outputs, zero-filled past the payload, rows shuffled (``shuffle``:
    FlashInfer's ``shuffle_matrix_a(.., 128)``, which needs rows in whole blocks of 32)."""
    _positive("payload", rows=rows, cols=cols, out_rows=out_rows, out_cols=out_cols, experts=experts)
    if out_rows < rows or out_cols < cols or dst_rs < out_cols or src_rs < cols:
        raise LayoutError(
            f"payload: expected output [{out_rows}, {out_cols}] (rows {dst_rs} apart) to hold the source "
            f"[{rows}, {cols}] (rows {src_rs} apart)"
        )
    if shuffle and rows % 32:
        raise LayoutError(f"data: expected N a multiple of 32 to shuffle rows in blocks of 32; found N = {rows}")
    if out_rows * -(-out_cols // 16) > _MAX_PIECES:
        raise LayoutError(
            f"payload: expected at most {_MAX_PIECES} 16-byte pieces an expert; found [{out_rows}, {out_cols}]"
        )
    source = src_rs if indirect else src | src_rs | (src_es if experts > 1 else 0)
    output = dst | dst_rs | (dst_es if experts > 1 else 0)
    flags = _flags(EX_PAYLOAD, vec(source), vec(output), indirect, shuffle)
    return ExportJob(
        src, 0 if indirect else src_es, src_rs, dst, dst_es, dst_rs, 0, rows, cols, out_rows, out_cols, experts, flags
    )


def scale_job(
    *,
    kind: str,
    src: int,
    src_es: int,
    indirect: bool,
    rows: int,
    cols: int,
    dst: int,
    dst_es: int,
    dst_rs: int = 0,
    dst_cs: int = 0,
    experts: int,
) -> ExportJob:
    """The job writing ``experts`` layouts of logical ``[rows, cols]`` scales (``Rp * Cp`` bytes
    each, 16-byte tiles' lines) as ``kind``: "bytes" (byte ``(r, c)`` at ``r * dst_rs + c *
    dst_cs``), "words" (int32 ``(r, c // 4)`` at ``r * dst_rs + (c // 4) * dst_cs``, whole) or
    "tiles" (whole tiles, lanes permuted as TRT-LLM's Major-K scales are)."""
    if kind not in SCALE_KINDS:
        raise LayoutError(f"scale job kind: expected one of {', '.join(map(repr, SCALE_KINDS))}; found {kind!r}")
    _positive("scales", rows=rows, cols=cols, experts=experts)
    code = SCALE_KINDS[kind]
    if code == EX_SCALE_WORDS and vec(dst, dst_rs, dst_cs, dst_es if experts > 1 else 0) < 4:
        raise LayoutError(
            f"scales: int32 words need 4-byte aligned outputs; found address {dst:#x}, strides {dst_rs}, {dst_cs}"
        )
    source = 0 if indirect else src | (src_es if experts > 1 else 0)
    output = dst | (dst_es if experts > 1 else 0) | (dst_rs if code == EX_SCALE_BYTES else 0)
    return ExportJob(
        src,
        0 if indirect else src_es,
        0,
        dst,
        dst_es,
        dst_rs,
        dst_cs,
        rows,
        cols,
        0,
        0,
        experts,
        _flags(code, vec(source), vec(output), indirect),
    )


class ExportTable(NamedTuple):
    """The descriptor table: a row a job (its fields, then its first unit) and the units in all."""

    rows: list[tuple[int, ...]]
    units: int

    def values(self) -> list[int]:
        return [v for row in self.rows for v in row]


def describe(jobs: Sequence[ExportJob], config: ExportConfig) -> ExportTable:
    """The descriptor table of ``jobs`` under ``config`` (jobs keep their order)."""
    if not jobs:
        raise LayoutError("export: expected at least one job; found none")
    rows: list[tuple[int, ...]] = []
    total = 0
    for job in jobs:
        rows.append((*job, total))
        total += job.units(config)
    return ExportTable(rows, total)
