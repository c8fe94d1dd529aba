"""How Transformer Engine lays out each direction of a block-scaled tensor: the shape and packing
of its payload, the padded scale buffer it allocates, which way that buffer's matrix runs, and
where a grouped tensor puts each expert's scales. Written once, here: te_compat's snapshots, its
fakes (te_compat.testing), its quantize API and mok all read these facts from this module, and
:data:`MXFP8` ``.block`` and :func:`roundup` are the only definitions of the MXFP8 block and of
rounding up a TE dimension in the project.

A weight is ``[rows, columns]``. Its rowwise direction has a scale per ``block`` values of a row
(for the forward GEMM), its columnwise direction a scale per ``block`` values of a column (for the
backward GEMMs). The matrix a GEMM's scale layout holds is, per direction, ``[rows, columns/block]``
rowwise and ``[columns, rows/block]`` columnwise (:meth:`DirectionGeometry.scale_matrix`). TE
keeps each in a buffer padded to multiples of 128 rows and 4 columns, in its own orientation:

- MXFP8 (TE 2.0+; 32 values per E8M0 scale byte): payloads uint8 ``[rows, columns]`` both ways;
  rowwise scales ``[roundup(rows, 128), roundup(columns/32, 4)]``; columnwise scales NOT
  transposed, ``[roundup(rows/32, 4), roundup(columns, 128)]``, the transpose of the matrix a
  GEMM reads. (``MXFP8Quantizer.get_scale_shape``, unchanged 2.0-2.20.2.)
- NVFP4 (TE 2.8+; 16 values per E4M3 scale byte, two E2M1 values a payload byte): rowwise payload
  ``[rows, columns/2]``, scales ``[roundup(rows, 128), roundup(ceil(columns/16), 4)]``; columnwise
  payload and scales stored TRANSPOSED, ``[columns, rows/2]`` and
  ``[roundup(columns, 128), roundup(ceil(rows/16), 4)]``. (``NVFP4Quantizer.get_scale_shape``,
  ``get_columnwise_shape``, unchanged 2.8-2.20.2.)
- A GroupedTensor (TE 2.13+) of E experts keeps each buffer flat, each expert's padded buffer
  after the previous one: expert e's scales start at byte ``e * prod(padded buffer)``
  (:meth:`DirectionGeometry.grouped_offsets`).

:meth:`DirectionGeometry.logical_matrices` gives the logical matrices over TE's buffer (sizes and
strides, its orientation undone) and :meth:`DirectionGeometry.orient` turns a matrix between the
two orientations, so that no reader of TE's buffers works the orientation out again.

Importing this module imports no torch; payload dtypes are named, and resolved by whoever views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from te_compat.errors import describe
from te_compat.table import StorageName, TensorKind

if TYPE_CHECKING:
    import torch

Strided = tuple[tuple[int, int, int], tuple[int, int, int]]  # sizes and strides of logical [E, R, C]

SCALE_ROW_MULTIPLE = 128  # TE pads a scale buffer's rows to a multiple of this
SCALE_COLUMN_MULTIPLE = 4  # and its columns to a multiple of this


def roundup(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class DirectionGeometry:
    """One direction of a block-scaled tensor as TE stores it."""

    name: str  # "rowwise" or "columnwise"
    data: StorageName
    scales: StorageName
    amax: StorageName | None  # NVFP4 keeps a per-tensor amax per direction
    block: int  # values per scale
    packing: int  # values per payload byte
    transposed: bool  # TE stores payload and scales [columns, ...] (NVFP4 columnwise)
    scales_transposed: bool  # TE's scale buffer holds the transpose of scale_matrix (MXFP8 columnwise)

    @property
    def rowwise(self) -> bool:
        return self.name == "rowwise"

    def _along(self, rows: int, columns: int) -> tuple[int, int]:
        """(the GEMM operand's rows, the values a scale covers run along): the weight's own
        for rowwise, swapped for columnwise."""
        return (rows, columns) if self.rowwise else (columns, rows)

    # typed: a question in floats or numpy ints (equal to ints, and hashed alike) is cached apart,
    # so that its answer in those types is never the answer to an int question
    @lru_cache(maxsize=4096, typed=True)  # noqa: B019  asked per tensor of every view; the instances live for good
    def payload_shape(self, rows: int, columns: int) -> tuple[int, int]:
        """TE's payload of a ``[rows, columns]`` weight (packed: the last dim holds ``packing``
        values an element)."""
        r, c = (columns, rows) if self.transposed else (rows, columns)
        return r, c // self.packing

    @lru_cache(maxsize=4096, typed=True)  # noqa: B019  asked per tensor of every view; the instances live for good
    def scale_matrix(self, rows: int, columns: int) -> tuple[int, int]:
        """``[R, C]``: the scale matrix of a ``[rows, columns]`` weight as a GEMM reads it (and
        as the 128x4 layout holds it), R the operand's rows, C its scales per row."""
        r, c = self._along(rows, columns)
        return r, -(-c // self.block)  # scales a row: values over block, rounded up

    @lru_cache(maxsize=4096, typed=True)  # noqa: B019  asked per tensor of every view; the instances live for good
    def buffer_matrix(self, rows: int, columns: int) -> tuple[int, int]:
        """The same matrix in the orientation of TE's buffer (its unpadded corner)."""
        r, c = self.scale_matrix(rows, columns)
        return (c, r) if self.scales_transposed else (r, c)

    @lru_cache(maxsize=4096, typed=True)  # noqa: B019  asked per tensor of every view; the instances live for good
    def scale_buffer(self, rows: int, columns: int) -> tuple[int, int]:
        """TE's padded scale allocation for one ``[rows, columns]`` weight, in its orientation."""
        r, c = self.scale_matrix(rows, columns)
        padded = roundup(r, SCALE_ROW_MULTIPLE), roundup(c, SCALE_COLUMN_MULTIPLE)
        return (padded[1], padded[0]) if self.scales_transposed else padded

    def logical_matrices(self, rows: int, columns: int, shape: Sequence[int], strides: Sequence[int]) -> Strided:
        """(sizes, strides) of the logical ``[E, R, C]`` scale matrices (:meth:`scale_matrix`, as
        a GEMM reads them) over TE's buffer of ``shape`` and ``strides`` (in elements): one padded
        buffer ``[R', C']`` (E = 1) or ``[E, R', C']``, each in TE's orientation and holding at
        least :meth:`buffer_matrix`; the transpose of TE's where TE keeps it the other way round.
        From the buffer's own offset; ValueError where the buffer cannot hold the matrices."""
        r, c = self.buffer_matrix(rows, columns)
        if len(shape) not in (2, 3) or len(strides) != len(shape) or shape[-2] < r or shape[-1] < c:
            raise ValueError(f"expected a buffer of at least [{r}, {c}] (TE pads it); found {tuple(shape)}")
        e, es = (1, 0) if len(shape) == 2 else (shape[0], strides[0])
        rs, cs = strides[-2], strides[-1]
        if self.scales_transposed:
            return (e, c, r), (es, cs, rs)
        return (e, r, c), (es, rs, cs)

    def orient(self, matrices: torch.Tensor) -> torch.Tensor:
        """``matrices`` (``[..., R, C]``) turned from the orientation a GEMM reads to that of TE's
        buffer, or back: the transpose of the last two dims where TE keeps the buffer the other way
        round (a view, no copy), else ``matrices`` itself. Its own inverse."""
        return matrices.transpose(-1, -2) if self.scales_transposed else matrices

    @lru_cache(maxsize=4096, typed=True)  # noqa: B019  asked per tensor of every view; the instances live for good
    def grouped_offsets(self, experts: int, rows: int, columns: int) -> tuple[int, ...]:
        """Where each of ``experts`` experts' scales start in a GroupedTensor's flat buffer
        (bytes, expert-major), and where the last ends: E + 1 offsets."""
        r, c = self.scale_buffer(rows, columns)
        return tuple(range(0, (experts + 1) * r * c, r * c)) if r * c else (0,) * (experts + 1)


@dataclass(frozen=True)
class BlockGeometry:
    """A block-scaled kind (MXFP8, NVFP4) as TE stores it: its block, payload and directions."""

    kind: TensorKind
    block: int  # values per scale
    payload_dtype: str  # the torch dtype a payload is viewed as ("float8_e4m3fn", "uint8")
    rowwise: DirectionGeometry
    columnwise: DirectionGeometry

    def directions(self) -> tuple[DirectionGeometry, DirectionGeometry]:
        return self.rowwise, self.columnwise

    def direction(self, name: str) -> DirectionGeometry:
        """The direction called ``name`` ("rowwise" or "columnwise")."""
        if not isinstance(name, str) or name not in ("rowwise", "columnwise"):
            raise ValueError(f"direction: expected 'rowwise' or 'columnwise'; found {describe(name)}")
        return self.rowwise if name == "rowwise" else self.columnwise

    def fits(self, rows: int, columns: int) -> bool:
        """Whether TE's quantizer takes a ``[rows, columns]`` weight (both multiples of the block)."""
        return rows > 0 and columns > 0 and not rows % self.block and not columns % self.block


def _block(kind: TensorKind, block: int, packing: int, dtype: str, amax: bool, columnwise: str) -> BlockGeometry:
    """A kind whose columnwise direction is stored ``columnwise``: "scales transposed" (MXFP8) or
    "transposed" (NVFP4: payload and scales)."""
    amaxes = (StorageName.AMAX_ROWWISE, StorageName.AMAX_COLUMNWISE) if amax else (None, None)
    rowwise = DirectionGeometry(
        "rowwise", StorageName.ROWWISE_DATA, StorageName.ROWWISE_SCALE_INV, amaxes[0], block, packing, False, False
    )
    col = DirectionGeometry(
        "columnwise",
        StorageName.COLUMNWISE_DATA,
        StorageName.COLUMNWISE_SCALE_INV,
        amaxes[1],
        block,
        packing,
        columnwise == "transposed",
        columnwise == "scales transposed",
    )
    return BlockGeometry(kind, block, dtype, rowwise, col)


MXFP8 = _block(TensorKind.MXFP8, 32, 1, "float8_e4m3fn", False, "scales transposed")
NVFP4 = _block(TensorKind.NVFP4, 16, 2, "uint8", True, "transposed")
GEOMETRY: dict[TensorKind, BlockGeometry] = {MXFP8.kind: MXFP8, NVFP4.kind: NVFP4}


def block_geometry(kind: TensorKind) -> BlockGeometry:
    """How TE stores a block-scaled ``kind`` (MXFP8, NVFP4); ValueError for any other kind."""
    found = GEOMETRY.get(kind) if isinstance(kind, TensorKind) else None
    if found is None:
        known = ", ".join(k.value for k in GEOMETRY)
        raise ValueError(f"kind: expected a block-scaled kind ({known}); found {describe(kind)}")
    return found
