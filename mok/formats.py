"""How TE stores each direction of a block-scaled weight, per format, in mok's terms.

A weight ``[rows, columns]`` has a rowwise direction (scales along ``columns``) and a columnwise
one (scales along ``rows``). For each, TE keeps a payload and a padded scale buffer; mok converts
the scale matrix to the 128x4 tcgen05 layout. Facts (TE 2.20.2 source, ``get_scale_shape`` of
``MXFP8Quantizer`` and ``NVFP4Quantizer``; /work/shared/spec for MXFP8):

- MXFP8 (32 values per E8M0 scale): payloads ``[rows, columns]`` in both directions; rowwise
  scales ``[roundup(rows,128), roundup(columns/32,4)]``; columnwise scales NOT transposed,
  ``[roundup(rows/32,4), roundup(columns,128)]``: mok reads their transpose.
- NVFP4 (16 values per E4M3 scale, payload packed two values a byte): rowwise payload
  ``[rows, columns/2]``, scales ``[roundup(rows,128), roundup(columns/16,4)]``; columnwise payload
  and scales stored TRANSPOSED: ``[columns, rows/2]``, ``[roundup(columns,128), roundup(rows/16,4)]``.

The columnwise layout is always that of the ``[columns, rows/block]`` matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from operator import attrgetter, methodcaller
from typing import Any

import torch

from mok.checks import describe
from mok.errors import ExpertWeightError, LayoutError
from mok.layout import Geometry, logical_view, roundup
from te_compat import StorageName, TensorKind, mxfp8_storage, nvfp4_storage

_shape, _stride, _dtype = attrgetter("shape"), methodcaller("stride"), attrgetter("dtype")


class Format(str, Enum):
    """The format of a view, or of one direction of it. mok passes these around; a string is
    turned into one only at the public boundary (:func:`format_named`). A ``str`` enum, so a
    view's ``format == "mxfp8"`` keeps reading naturally."""

    BF16 = "bf16"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    HYBRID = "hybrid"  # TE 2.19+ hybrid weights: each direction in its own block format

    def __str__(self) -> str:
        return self.value

    @property
    def block_format(self) -> BlockFormat:
        """How TE stores this block-scaled format (MXFP8 and NVFP4 only)."""
        found = BLOCK_FORMATS.get(self)
        if found is None:
            raise ValueError(f"{self.value} is not a block-scaled format; expected mxfp8 or nvfp4")
        return found


@dataclass(frozen=True)
class Direction:
    """One direction of a block format as TE stores it: its te_compat storage names and geometry."""

    name: str  # "rowwise" or "columnwise"
    data: StorageName
    scales: StorageName
    amax: StorageName | None  # NVFP4 keeps a per-tensor amax per direction
    transposed_storage: bool  # TE stores payload and scales transposed ([columns, ...])
    transposed_scales: bool  # the logical scale matrix is the transpose of TE's buffer


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format (MXFP8, NVFP4) as TE stores it: payload packing, block size, and the
    storage of each direction."""

    format: Format
    kind: TensorKind  # te_compat's kind of its tensors
    block: int  # values per scale (0: not block-scaled)
    payload_dtype: torch.dtype
    packing: int  # values per payload byte
    rowwise: Direction
    columnwise: Direction

    def snapshot(self, obj: object) -> Any:
        """te_compat's typed snapshot of one tensor or storage of this format."""
        return _SNAPSHOTS[self.format](obj)

    def directions(self) -> tuple[Direction, Direction]:
        return self.rowwise, self.columnwise

    @cached_property
    def storage_names(self) -> tuple[str, ...]:
        """The te_compat logical names a view of this format reads."""
        return self.names_of(self.directions())

    @cached_property
    def _alone(self) -> dict[str, tuple[str, ...]]:
        return {d.name: self.names_of((d,)) for d in self.directions()}

    @cached_property
    def own_names(self) -> dict[str, tuple[str, ...]]:
        """The payload, scales and amax of each direction (TE's flag left out), by its name."""
        return {name: names[1:] for name, names in self._alone.items()}

    def names_for(self, directions: Sequence[Direction]) -> tuple[str, ...]:
        """:meth:`names_of` this format's ``directions`` (both, or one alone), worked out once."""
        if directions == self.directions():  # equal directions (a Direction compares by value)
            return self.storage_names
        if len(directions) == 1 and (directions[0] is self.rowwise or directions[0] is self.columnwise):
            return self._alone[directions[0].name]
        return self.names_of(directions)

    @staticmethod
    def names_of(directions: Sequence[Direction]) -> tuple[str, ...]:
        """TE's swizzled flag, and the payload, scales and amax of each of ``directions``."""
        names = [str(StorageName.SCALES_SWIZZLED)]
        for d in directions:
            names += [str(d.data), str(d.scales)] + ([str(d.amax)] if d.amax else [])
        return tuple(names)

    def payload_shape(self, d: Direction, rows: int, columns: int) -> tuple[int, int]:
        r, c = (columns, rows) if d.transposed_storage else (rows, columns)
        return r, c // self.packing

    def te_scale_shape(self, d: Direction, rows: int, columns: int) -> tuple[int, int]:
        """TE's padded scale allocation for one ``[rows, columns]`` weight."""
        if d.transposed_storage or not d.transposed_scales:
            r, c = (columns, rows) if d.transposed_storage else (rows, columns)
            return roundup(r, 128), roundup(-(-c // self.block), 4)
        return roundup(-(-rows // self.block), 4), roundup(columns, 128)

    def logical_scales(self, d: Direction, buffer: torch.Tensor, rows: int, columns: int, name: str) -> torch.Tensor:
        """The logical scale matrices ``[E, R, C]`` (uint8, no copy) of ``buffer``: one TE-padded
        ``[Rpad, Cpad]`` matrix, or ``[E, Rpad, Cpad]``. One strided view, no per-step views."""
        return logical_view(*self.scale_source(d, buffer, rows, columns, name))

    def scale_source(
        self, d: Direction, buffer: torch.Tensor, rows: int, columns: int, name: str
    ) -> tuple[torch.Tensor, Geometry]:
        """``buffer`` as uint8 with the geometry (sizes, strides) of its logical ``[E, R, C]``
        scale matrices, from its own offset, after checking it."""
        (found,), (geometry,) = self._scale_columns_one_by_one(d, (buffer,), rows, columns, (name,))
        return found, geometry

    def scale_columns(
        self, d: Direction, buffers: Sequence[torch.Tensor], rows: int, columns: int, names: Sequence[str]
    ) -> tuple[Sequence[torch.Tensor], list[Geometry]]:
        """:meth:`scale_source` of many buffers, as two columns: the buffers and their geometries.
        Buffers of one (shape, strides, dtype), what TE gives every expert, are read in C-level
        passes and checked once; anything else buffer by buffer, raising where the first bad one is."""
        try:
            shapes, strides, dtypes = set(map(_shape, buffers)), set(map(_stride, buffers)), set(map(_dtype, buffers))
        except (AttributeError, TypeError):  # no tensor: buffer by buffer
            return self._scale_columns_one_by_one(d, buffers, rows, columns, names)
        if len(shapes) != 1 or len(strides) != 1 or len(dtypes) != 1 or len(names) != len(buffers):
            return self._scale_columns_one_by_one(d, buffers, rows, columns, names)
        geometry = self._scale_geometry(d, buffers[0], rows, columns, names[0])
        found = buffers if dtypes == {torch.uint8} else [b.view(torch.uint8) for b in buffers]
        return found, [geometry] * len(buffers)

    def _scale_columns_one_by_one(
        self, d: Direction, buffers: Sequence[torch.Tensor], rows: int, columns: int, names: Sequence[str]
    ) -> tuple[list[torch.Tensor], list[Geometry]]:
        geometry: dict[tuple[Any, ...], Geometry] = {}
        found, geometries = [], []
        for buffer, name in zip(buffers, names, strict=True):
            if not isinstance(buffer, torch.Tensor):
                raise LayoutError(f"{name}: expected a tensor of 1-byte scales; found {describe(buffer)}")
            key = (buffer.shape, buffer.stride(), buffer.dtype)
            g = geometry.get(key)
            if g is None:
                g = geometry[key] = self._scale_geometry(d, buffer, rows, columns, name)
            found.append(buffer if buffer.dtype == torch.uint8 else buffer.view(torch.uint8))
            geometries.append(g)
        return found, geometries

    def _scale_geometry(self, d: Direction, buffer: torch.Tensor, rows: int, columns: int, name: str) -> Geometry:
        """(size, strides) of the logical ``[E, R, C]`` view of ``buffer``, after checking it."""
        r, c = (columns, rows) if (d.transposed_storage or d.transposed_scales) else (rows, columns)
        c //= self.block
        if d.transposed_scales:
            r, c = c, r
        shape = buffer.shape
        if len(shape) not in (2, 3) or shape[-2] < r or shape[-1] < c:
            raise LayoutError(f"{name}: expected a buffer of at least [{r}, {c}] (TE pads it); found {tuple(shape)}")
        if buffer.element_size() != 1:
            raise LayoutError(f"{name}: expected 1-byte scales; found dtype {buffer.dtype}")
        strides = buffer.stride()
        e, es = (1, 0) if len(shape) == 2 else (shape[0], strides[0])
        rs, cs = strides[-2], strides[-1]
        if d.transposed_scales:
            return (e, c, r), (es, cs, rs)
        return (e, r, c), (es, rs, cs)

    def check_dims(self, rows: int, columns: int, what: str) -> None:
        if rows % self.block or columns % self.block:
            raise ExpertWeightError(
                f"{what}: expected rows and columns that are positive multiples of {self.block} ({self.format.name} "
                f"has one scale per {self.block} values); "
                f"found rows={rows}, columns={columns}"
            )


_ROW = Direction("rowwise", StorageName.ROWWISE_DATA, StorageName.ROWWISE_SCALE_INV, None, False, False)
_MX_COL = Direction("columnwise", StorageName.COLUMNWISE_DATA, StorageName.COLUMNWISE_SCALE_INV, None, False, True)
MXFP8 = BlockFormat(Format.MXFP8, TensorKind.MXFP8, 32, torch.float8_e4m3fn, 1, _ROW, _MX_COL)
NVFP4 = BlockFormat(
    Format.NVFP4,
    TensorKind.NVFP4,
    16,
    torch.uint8,
    2,
    Direction(
        "rowwise", StorageName.ROWWISE_DATA, StorageName.ROWWISE_SCALE_INV, StorageName.AMAX_ROWWISE, False, False
    ),
    Direction(
        "columnwise",
        StorageName.COLUMNWISE_DATA,
        StorageName.COLUMNWISE_SCALE_INV,
        StorageName.AMAX_COLUMNWISE,
        True,
        False,
    ),
)
BLOCK_FORMATS = {Format.MXFP8: MXFP8, Format.NVFP4: NVFP4}
_SNAPSHOTS: dict[Format, Callable[[object], Any]] = {Format.MXFP8: mxfp8_storage, Format.NVFP4: nvfp4_storage}
FORMAT_OF_KIND = {f.kind: f for f in BLOCK_FORMATS.values()}


def format_named(format: object, use_mxfp8: object) -> Format:
    """The format asked for: ``format`` (a :class:`Format` or its name) if given, else from the
    seed's ``use_mxfp8`` flag. The one place a string becomes a format."""
    if use_mxfp8 is not None and not isinstance(use_mxfp8, bool):
        raise TypeError(f"use_mxfp8: expected a bool; found {use_mxfp8!r} ({type(use_mxfp8).__name__})")
    if format is None:
        if use_mxfp8 is None:
            raise TypeError("expected use_mxfp8=True/False or format= ('bf16', 'mxfp8', 'nvfp4'); found neither")
        return Format.MXFP8 if use_mxfp8 else Format.BF16
    names = [f.value for f in Format]
    if not isinstance(format, str) or format not in names:
        raise ValueError(f"format: expected one of {', '.join(map(repr, names))}; found {format!r}")
    found = Format(format)
    if use_mxfp8 is not None and use_mxfp8 is not (found is Format.MXFP8):
        raise ValueError(f"use_mxfp8={use_mxfp8} contradicts format={format!r}; pass one of them")
    return found
