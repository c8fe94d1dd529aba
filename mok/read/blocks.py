"""How mok reads the directions of a block-scaled weight (MXFP8, NVFP4): the te_compat storage
names of each direction, its payload dtype, and the logical scale matrices over TE's padded
buffers, checked in bulk. What TE stores where, and how it pads and orients it, is
te_compat.geometry's; this module only reads by it.

The logical scale matrices of a direction are ``[E, R, C]``: per expert, the matrix a GEMM reads
(``DirectionGeometry.scale_matrix``), as a geometry (sizes, strides in bytes) over TE's uint8
buffer from its own offset, as ``DirectionGeometry.logical_matrices`` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter, methodcaller
from typing import Any

import torch

from mok.checks import describe
from mok.errors import ExpertWeightError, LayoutError
from mok.formats import Format
from mok.layout import Geometry, logical_view
from te_compat import StorageName, TensorKind, mxfp8_storage, nvfp4_storage
from te_compat.geometry import MXFP8, NVFP4, BlockGeometry, DirectionGeometry

_shape, _stride, _dtype = attrgetter("shape"), methodcaller("stride"), attrgetter("dtype")
Direction = DirectionGeometry


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format as mok reads it: te_compat's geometry of it, and its te_compat
    snapshot for the slow path (a name missing, to be named in the error)."""

    format: Format
    geometry: BlockGeometry
    snapshot: Callable[[object], Any]
    kind: TensorKind  # te_compat's kind of its tensors, and the rest of geometry's, as fields
    block: int
    rowwise: Direction
    columnwise: Direction

    @cached_property
    def payload_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.geometry.payload_dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype

    def directions(self) -> tuple[Direction, Direction]:
        return self.geometry.directions()

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
        if tuple(directions) == self.directions():
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

    def gemm_scales(self, d: Direction, buffer: torch.Tensor, rows: int, columns: int, name: str) -> torch.Tensor:
        """The scale matrices ``[E, R, C]`` of ``buffer`` as the GEMMs read them (uint8, no copy;
        columnwise, the transpose of TE's orientation, which mok.logical_scales returns): one
        TE-padded matrix, or ``[E, ...]`` of them. One strided view, no per-step views."""
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
        geometry = _scale_geometry(d, buffers[0], rows, columns, names[0])
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
                g = geometry[key] = _scale_geometry(d, buffer, rows, columns, name)
            found.append(buffer if buffer.dtype == torch.uint8 else buffer.view(torch.uint8))
            geometries.append(g)
        return found, geometries

    def check_dims(self, rows: int, columns: int, what: str) -> None:
        if not self.geometry.fits(rows, columns):
            raise ExpertWeightError(
                f"{what}: expected rows and columns that are positive multiples of {self.block} ({self.format.name} "
                f"has one scale per {self.block} values); "
                f"found rows={rows}, columns={columns}"
            )


def _scale_geometry(d: Direction, buffer: torch.Tensor, rows: int, columns: int, name: str) -> Geometry:
    """(sizes, strides) of the logical ``[E, R, C]`` view of ``buffer`` (te_compat's
    ``logical_matrices`` over TE's padded buffer, its orientation undone), after checking it."""
    try:
        geometry = d.logical_matrices(rows, columns, buffer.shape, buffer.stride())
    except ValueError as exc:
        raise LayoutError(f"{name}: {exc}") from None
    if buffer.element_size() != 1:
        raise LayoutError(f"{name}: expected 1-byte scales; found dtype {buffer.dtype}")
    return geometry


def _reading(fmt: Format, geometry: BlockGeometry, snapshot: Callable[[object], Any]) -> BlockFormat:
    return BlockFormat(fmt, geometry, snapshot, geometry.kind, geometry.block, geometry.rowwise, geometry.columnwise)


BLOCKS = {
    Format.MXFP8: _reading(Format.MXFP8, MXFP8, mxfp8_storage),
    Format.NVFP4: _reading(Format.NVFP4, NVFP4, nvfp4_storage),
}
BLOCK_OF_KIND = {block.kind: block for block in BLOCKS.values()}


def block_format(fmt: Format) -> BlockFormat:
    """How mok reads block-scaled ``fmt`` (MXFP8 and NVFP4 only)."""
    found = BLOCKS.get(fmt)
    if found is None:
        raise ValueError(f"{fmt.value} is not a block-scaled format; expected mxfp8 or nvfp4")
    return found
