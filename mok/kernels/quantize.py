"""BF16 expert weights to MXFP8, both directions, into fixed buffers: one launch of
mxfp8_quantize.cu (compiled by NVRTC through cuda.core, as launch.py compiles the swizzle kernel),
or the torch reference (mok.quantize_reference) on the CPU.

The kernel's shape is :class:`QuantizeConfig`, its flag bits mok.kernels.abi's QuantizeFlag, as
the swizzle kernel's are; both reach the compiler as macros, and the source defines none of them.

A :class:`QuantizeLaunch` is prepared once for a source (one grouped ``[E, R, C]`` BF16 tensor, or
E ``[R, C]`` tensors, one per expert, read through a device table of their addresses) and its
output buffers; calling it launches ONE kernel on the current torch stream and does nothing else
(no allocation, no synchronisation: a refresh, a CUDA-graph capture and its replays).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import torch

from mok.checks import describe
from mok.errors import LayoutError
from mok.kernels import compiled_once, include_path
from mok.kernels.abi import QuantizeFlag, quantize_macros
from mok.kernels.streams import CurrentStream
from mok.layout import check_writable, layout_shape, new_buffers, swizzle_reference
from mok.overlap import check_no_overlap
from mok.quantize_reference import ProductRule, ReciprocalRule, check_input, quantize_mxfp8_reference
from te_compat.geometry import MXFP8

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

KERNEL_NAME = "mxfp8_quantize"
SOURCE_NAME = "mxfp8_quantize.cu"
MAX_GRID = 2**31 - 1
ALIGN = 16  # bytes: the kernel reads the BF16 rows with 16-byte loads


@dataclass(frozen=True)
class QuantizeConfig:
    """The compiled kernel's shape: a block of ``threads`` converts tiles of 32 rows x
    ``tile_cols`` columns (one thread per 1x32 block of a tile), ``min_blocks`` blocks resident on
    an SM (the registers a thread may use follow from it)."""

    threads: int = 256
    tile_rows: int = 32
    tile_cols: int = 256
    min_blocks: int = 5  # 48 registers a thread (no spills), 5 x 37 KB of shared memory

    def __post_init__(self) -> None:
        if (self.threads, self.tile_rows, self.tile_cols) != (256, 32, 256) or not 1 <= self.min_blocks <= 8:
            raise ValueError(
                "unsupported quantize kernel shape: expected 256 threads, 32 x 256 tiles and 1 to 8 blocks an SM; "
                f"found {self.threads} threads, {self.tile_rows} x {self.tile_cols} tiles and {self.min_blocks} "
                "blocks an SM"
            )

    def macros(self) -> list[tuple[str, str]]:
        """The preprocessor definitions of the launch ABI (NVRTC options, or g++ -D)."""
        shape = [("QTHREADS", self.threads), ("QMIN_BLOCKS", self.min_blocks)]
        shape += [("QTILE_ROWS", self.tile_rows), ("QTILE_COLS", self.tile_cols)]
        return [(name, str(value)) for name, value in shape] + quantize_macros()

    def tiles(self, experts: int, rows: int, cols: int) -> int:
        """Tiles (blocks of work) of ``experts`` matrices ``[rows, cols]``."""
        return experts * (rows // self.tile_rows) * -(-cols // self.tile_cols)

    def units(self, experts: int, rows: int, cols: int) -> int:
        """Units (what one block converts at a time: four tiles' rows, 128, of one expert) of
        ``experts`` matrices ``[rows, cols]``; a launch needs no more blocks than these."""
        return experts * -(-rows // (4 * self.tile_rows)) * -(-cols // self.tile_cols)


class QuantizeOutputs(NamedTuple):
    """The four output buffers: payloads ``[E, R, C]`` (``torch.float8_e4m3fn``) and uint8 scales,
    in the 128x4 layout (rowwise ``layout_shape(R, C/32, E)``, columnwise ``layout_shape(C, R/32,
    E)``) or logical (``[E, R, C/32]``, ``[E, R/32, C]``)."""

    row_data: torch.Tensor
    row_scales: torch.Tensor
    col_data: torch.Tensor
    col_scales: torch.Tensor


Shapes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]
DTYPES = (torch.float8_e4m3fn, torch.uint8, torch.float8_e4m3fn, torch.uint8)  # of the four outputs


def output_shapes(experts: int, rows: int, cols: int, *, swizzled: bool = True) -> Shapes:
    """The shape each output must have, in QuantizeOutputs' order."""
    data = (experts, rows, cols)
    if swizzled:
        return (
            data,
            layout_shape(rows, cols // MXFP8.block, experts),
            data,
            layout_shape(cols, rows // MXFP8.block, experts),
        )
    return data, (experts, rows, cols // MXFP8.block), data, (experts, rows // MXFP8.block, cols)


def empty_outputs(
    experts: int, rows: int, cols: int, device: torch.device | str, *, swizzled: bool = True
) -> QuantizeOutputs:
    """New (uninitialised) output buffers for ``experts`` BF16 matrices ``[rows, cols]``: more
    bytes than ``device`` has in all are refused before anything is allocated (mok.layout.new_buffers)."""
    shapes = output_shapes(experts, rows, cols, swizzled=swizzled)
    what = f"the MXFP8 quantisation of {experts} x [{rows}, {cols}] BF16 weights (its payloads and scales)"
    return QuantizeOutputs(*new_buffers(list(zip(shapes, DTYPES, strict=True)), torch.device(device), what))


class Source(NamedTuple):
    """A checked source: its experts as ``[R, C]`` views, and how the kernel reads them."""

    experts: tuple[torch.Tensor, ...]  # one [R, C] view per expert
    grouped: torch.Tensor | None  # the [E, R, C] tensor, when given as one
    row_stride: int  # elements
    expert_stride: int  # elements (grouped only)

    @property
    def dims(self) -> tuple[int, int, int]:
        """``(experts, rows, cols)``: what every size of a launch follows from."""
        rows, cols = self.experts[0].shape
        return len(self.experts), rows, cols


def _check_expert(x: torch.Tensor, name: str) -> None:
    if x.stride(-1) != 1 or x.stride(-2) < x.shape[-1] or x.stride(-2) % 8:
        raise LayoutError(
            f"{name}: expected rows of contiguous columns, 16-byte aligned (row stride a multiple of 8 elements); "
            f"found strides {x.stride()} for shape {tuple(x.shape)}"
        )
    if x.data_ptr() % ALIGN:
        raise LayoutError(f"{name}: expected a 16-byte aligned start; found address {x.data_ptr():#x}")


def check_source(src: torch.Tensor | Sequence[torch.Tensor]) -> Source:
    """``src`` (a BF16 ``[E, R, C]`` or ``[R, C]`` tensor, or a sequence of E ``[R, C]`` ones of one
    shape, device and row stride) checked for what the kernel needs."""
    if isinstance(src, torch.Tensor):
        batch = check_input(src, "src")
        _check_expert(batch, "src")
        if batch.shape[0] > 1 and batch.stride(0) % 8:
            raise LayoutError(f"src: expected experts 16-byte apart (stride a multiple of 8); found {batch.stride()}")
        return Source(tuple(batch.unbind(0)), batch, batch.stride(1), batch.stride(0))
    if isinstance(src, (str, bytes)) or not isinstance(src, Sequence) or len(src) == 0:
        raise LayoutError(f"src: expected a BF16 tensor or a non-empty sequence of them; found {describe(src)}")
    experts = tuple(check_input(x, f"src[{i}]")[0] for i, x in enumerate(src))
    first = experts[0]
    for i, x in enumerate(experts):
        _check_expert(x, f"src[{i}]")
        if (x.shape, x.stride(), x.device) != (first.shape, first.stride(), first.device):
            raise LayoutError(
                f"src[{i}]: expected every expert of shape {tuple(first.shape)}, strides {first.stride()} on "
                f"{first.device}; found shape {tuple(x.shape)}, strides {x.stride()} on {x.device}"
            )
    return Source(experts, None, first.stride(0), 0)


def check_outputs(out: QuantizeOutputs, source: Source, *, swizzled: bool) -> QuantizeOutputs:
    """``out`` must be exactly the buffers :func:`empty_outputs` would make for ``source``, apart
    from each other and from the source, each writable here."""
    if not isinstance(out, QuantizeOutputs):
        raise LayoutError(f"out: expected a QuantizeOutputs; found {describe(out)}")
    device = source.experts[0].device
    wants = output_shapes(*source.dims, swizzled=swizzled)
    for name, t, shape, dtype in zip(QuantizeOutputs._fields, out, wants, DTYPES, strict=True):
        found = (tuple(t.shape), t.dtype, t.device, t.is_contiguous()) if isinstance(t, torch.Tensor) else None
        if found != (tuple(shape), dtype, device, True) or t.data_ptr() % ALIGN:
            raise LayoutError(
                f"out.{name}: expected a contiguous 16-byte aligned {dtype} tensor {tuple(shape)} on {device}; "
                f"found {found if found else type(t).__name__}"
            )
        check_writable(t, f"out.{name}")
    # one [E, R, C] source without gaps covers exactly its experts' bytes: one span, not E
    grouped = source.grouped
    inputs = [grouped] if grouped is not None and grouped.is_contiguous() else list(source.experts)
    check_no_overlap(list(out), inputs, "quantize", out_label="out", input_label="src")
    return out


def kernel_source() -> str:
    return resources.files("mok.kernels").joinpath(SOURCE_NAME).read_text()


def compile_quantize(arch: str, config: QuantizeConfig = QuantizeConfig(), source: str | None = None) -> Any:
    """Compile the kernel for ``arch`` (e.g. "sm_90") with NVRTC; cuda.core ObjectCode. Needs no GPU.
    ``source``: the text of another version of the kernel (a benchmark compares them), compiled
    with this ABI's macros and headers; default mok's own."""
    from cuda.core import Program, ProgramOptions

    if source is None:
        source = kernel_source()
    elif not isinstance(source, str):
        raise TypeError(
            f"source: expected the kernel's text (a str, e.g. Path(f).read_text()); found {describe(source)}"
        )
    options = ProgramOptions(
        std="c++17", arch=arch, name="mok_mxfp8_quantize", define_macro=config.macros(), include_path=include_path()
    )
    return Program(source, code_type="c++", options=options).compile("cubin")


class Compiled(NamedTuple):
    """The kernel compiled for one device, and the most blocks of it the device holds at once
    (the grid of a launch: each block converts unit after unit)."""

    kernel: Any
    resident: int


_kernels: dict[tuple[int, QuantizeConfig], Compiled] = {}


def _kernel(index: int, config: QuantizeConfig) -> Compiled:
    """The kernel compiled for device ``index`` (once per device and configuration, thread-safe)."""

    def build(arch: str) -> Compiled:
        kernel = compile_quantize(arch, config).get_kernel(KERNEL_NAME)
        per_sm = kernel.occupancy.max_active_blocks_per_multiprocessor(config.threads, 0)
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        return Compiled(kernel, max(1, per_sm) * sms)

    return compiled_once(_kernels, (index, config), index, build)


def flags_for(
    *, rule: ReciprocalRule, swizzled: bool, pointers: bool, product: ProductRule = ProductRule.MUL
) -> QuantizeFlag:
    """The flags of a launch writing both directions."""
    flags = QuantizeFlag.ROWWISE | QuantizeFlag.COLWISE
    if ReciprocalRule(rule) is ReciprocalRule.SHIFT:
        flags |= QuantizeFlag.RCP_SHIFT
    if ProductRule(product) is ProductRule.FMA_ZERO:
        flags |= QuantizeFlag.FMA_ZERO
    if not swizzled:
        flags |= QuantizeFlag.LOGICAL
    if pointers:
        flags |= QuantizeFlag.POINTERS
    return flags


def kernel_arguments(
    source: Source, out: QuantizeOutputs, flags: QuantizeFlag, table: torch.Tensor | None, config: QuantizeConfig
) -> tuple[int, ...]:
    """The kernel's arguments after ``src``-table resolution, as plain ints (the launch wraps them
    in numpy scalars; the CPU emulator passes them through ctypes)."""
    experts, rows, cols = source.dims
    src = table.data_ptr() if table is not None else source.experts[0].data_ptr()
    pointers = (out.row_data.data_ptr(), out.row_scales.data_ptr(), out.col_data.data_ptr(), out.col_scales.data_ptr())
    tiles = config.tiles(experts, rows, cols)
    if tiles > MAX_GRID:
        raise LayoutError(f"src: {experts} experts [{rows}, {cols}] make {tiles} tiles; expected at most {MAX_GRID}")
    return (src, source.expert_stride, source.row_stride, *pointers, rows, cols, int(flags), tiles)


def address_table(source: Source, device: torch.device) -> torch.Tensor:
    """The experts' addresses as int64 words on ``device`` (the pointer table the kernel reads)."""
    table = torch.empty(len(source.experts), dtype=torch.int64, device=device)
    table.copy_(torch.tensor([x.data_ptr() for x in source.experts], dtype=torch.int64))
    return table


class QuantizeLaunch:
    """One prepared launch quantising ``src`` into ``out`` (both checked here, once): compiled
    kernel, pointer table (per-expert sources), grid and arguments. Calling it launches on the
    current torch stream: no allocation, no host synchronisation (CUDA-graph safe). The sources
    and outputs must stay alive, and in place, as long as the launch is used, and the launch
    itself (its pointer table) as long as a CUDA graph that captured it may be replayed."""

    def __init__(
        self,
        src: torch.Tensor | Sequence[torch.Tensor],
        out: QuantizeOutputs,
        *,
        rule: ReciprocalRule = ReciprocalRule.EXACT,
        product: ProductRule = ProductRule.MUL,
        swizzled: bool = True,
        config: QuantizeConfig = QuantizeConfig(),
    ) -> None:
        import numpy as np
        from cuda.core import LaunchConfig, launch

        self.source = check_source(src)
        self.out = check_outputs(out, self.source, swizzled=swizzled)
        device = self.source.experts[0].device
        if device.type != "cuda":
            raise LayoutError(f"QuantizeLaunch: expected CUDA tensors; found {device} (run_reference runs on the CPU)")
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        pointers = self.source.grouped is None
        self.table = address_table(self.source, device) if pointers else None
        self.flags = flags_for(rule=rule, swizzled=swizzled, pointers=pointers, product=product)
        compiled = _kernel(self._index, config)
        self.kernel = compiled.kernel
        args = kernel_arguments(self.source, self.out, self.flags, self.table, config)
        kinds = (np.uint64, np.int64, np.int64, np.uint64, np.uint64, np.uint64, np.uint64)
        self._args = (*(k(a) for k, a in zip(kinds, args, strict=False)), *map(np.int32, args[7:]))
        self.grid = max(1, min(config.units(*self.source.dims), compiled.resident))
        self._launch = launch
        self._threads = config.threads
        self._launch_config = LaunchConfig(grid=self.grid, block=config.threads)
        self._stream = CurrentStream(self._index).current

    def __call__(self) -> None:
        self._launch(self._stream(), self._launch_config, self.kernel, *self._args)

    def with_kernel(self, kernel: Any, grid: int | None = None) -> QuantizeLaunch:
        """The same launch (buffers, arguments, stream) of another compiled ``kernel`` of this ABI,
        e.g. another version of the source (:func:`compile_quantize`), on ``grid`` blocks (default
        this launch's; the kernel converts every tile under any grid): a benchmark compares them."""
        from cuda.core import LaunchConfig

        grid = self.grid if grid is None else grid
        if isinstance(grid, bool) or not isinstance(grid, int):
            raise TypeError(f"grid: expected an int number of blocks; found {describe(grid)}")
        if not 1 <= grid <= MAX_GRID:
            raise ValueError(f"grid: expected a whole number of blocks from 1 to {MAX_GRID}; found {grid}")
        other = copy.copy(self)
        other.kernel, other.grid = kernel, grid
        other._launch_config = LaunchConfig(grid=grid, block=self._threads)
        return other


def _layout_of(buffer: torch.Tensor, e: int, rows: int, cols: int) -> torch.Tensor:
    """Expert ``e``'s layout of logical ``[rows, cols]`` scales inside a batch layout ``buffer``."""
    shape = layout_shape(rows, cols, 1)
    size = shape[0] * shape[1] * 512
    return buffer.view(-1)[e * size : (e + 1) * size].view(shape)


def run_reference(
    src: torch.Tensor | Sequence[torch.Tensor],
    out: QuantizeOutputs,
    *,
    rule: ReciprocalRule = ReciprocalRule.EXACT,
    product: ProductRule = ProductRule.MUL,
    swizzled: bool = True,
) -> None:
    """What a QuantizeLaunch writes, computed by the torch reference (any device; one expert at a
    time, so memory peaks at one expert's temporaries)."""
    source = check_source(src)
    out = check_outputs(out, source, swizzled=swizzled)
    rows, cols = source.experts[0].shape
    for e, x in enumerate(source.experts):
        q = quantize_mxfp8_reference(x, rule, product)
        out.row_data[e].copy_(q.row_data)
        out.col_data[e].copy_(q.col_data)
        if swizzled:
            swizzle_reference(q.row_scales[None], _layout_of(out.row_scales, e, rows, cols // MXFP8.block))
            swizzle_reference(q.col_scales.t()[None], _layout_of(out.col_scales, e, cols, rows // MXFP8.block))
        else:
            out.row_scales[e].copy_(q.row_scales)
            out.col_scales[e].copy_(q.col_scales)


class QuantizeOptions(TypedDict, total=False):
    """The rules and scale layout of a quantisation (QuantizeLaunch's and run_reference's keywords)."""

    rule: ReciprocalRule
    product: ProductRule
    swizzled: bool


def prepare(
    src: torch.Tensor | Sequence[torch.Tensor],
    out: QuantizeOutputs,
    *,
    use_kernel: bool | None = None,
    **options: Unpack[QuantizeOptions],
) -> Callable[[], None]:
    """The quantisation of ``src`` into ``out`` ready to run again and again: a QuantizeLaunch
    (``use_kernel``; by default on CUDA tensors), else the torch reference (checked once here in
    both cases). A resolved backend passes ``use_kernel``: the kernel needs CUDA tensors, the
    reference runs anywhere."""
    source = check_source(src)
    if use_kernel is None:
        use_kernel = source.experts[0].device.type == "cuda"
    if use_kernel:
        return QuantizeLaunch(src, out, **options)
    check_outputs(out, source, swizzled=options.get("swizzled", True))
    return functools.partial(run_reference, src, out, **options)
