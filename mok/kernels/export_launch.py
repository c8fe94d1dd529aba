"""Compile (NVRTC through cuda.core, once per device and shape) and launch the export kernel
(mxfp8_export.cu): a whole MXFP8 export, every expert and direction, in one launch.

:func:`export_jobs` turns an export's tensors (each direction's payloads and scale layouts, a
grouped tensor or one per expert with the device pointer tables a split view keeps) and its
output buffers into jobs (mok.kernels.export_jobs). An :class:`ExportLaunch` is prepared once for
those jobs: compiled kernel, descriptor table uploaded, grid, arguments. Calling it launches ONE
kernel on the current torch stream and does nothing else (no allocation, no synchronisation, no
import: CUDA-graph safe). A split view's per-expert addresses are read from the view's own pointer
tables, which a refresh rewrites in place where TE moved a buffer: the launch needs no new table.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

import torch

from mok.errors import LayoutError
from mok.kernels import compiled_once, include_path
from mok.kernels.export_jobs import ExportConfig, ExportJob, describe, payload_job, scale_job
from mok.kernels.streams import CurrentStream
from mok.layout import padded_shape
from te_compat.geometry import MXFP8

SOURCE_NAME = "mxfp8_export.cu"
KERNEL_NAME = "mxfp8_export_jobs"
MAX_GRID = 2**31 - 1  # one block a unit (the kernel loops past it)
_CACHE_SIZE = 64
DEFAULT_CONFIG = ExportConfig()  # the shape every launch takes (tests emulate smaller units)

_lock = threading.Lock()
_kernels: dict[tuple[int, ExportConfig], Any] = {}
_launches: OrderedDict[tuple[Any, ...], ExportLaunch] = OrderedDict()
# launches a CUDA graph captured: a replay reads their descriptor tables, so they are never evicted
_captured: dict[tuple[Any, ...], ExportLaunch] = {}


class Operand(NamedTuple):
    """One direction of an export's input as the kernel reads it: ``data`` one ``[E, N, K]``
    tensor or E ``[N, K]`` ones (bytes contiguous along rows), ``scales`` the 128x4 layout (one
    for all experts, or one an expert), and for per-expert tensors the int64 device tables of
    their addresses (a split view's ``data_ptrs``/``scale_ptrs``)."""

    data: Sequence[torch.Tensor]
    scales: Sequence[torch.Tensor]
    data_table: torch.Tensor | None = None
    scale_table: torch.Tensor | None = None


def _scale_matrix(rows: int, cols: int, columnwise: bool) -> tuple[int, int]:
    """The logical ``[R, C]`` a direction's layout holds: rowwise ``[N, K/32]``, columnwise the
    GEMM's ``[K, N/32]``."""
    return (cols, rows // MXFP8.block) if columnwise else (rows, cols // MXFP8.block)


def _table_address(table: torch.Tensor | None, experts: int, what: str) -> int:
    if table is None or table.dtype != torch.int64 or tuple(table.shape) != (experts,) or not table.is_contiguous():
        found = None if table is None else f"{table.dtype} {tuple(table.shape)}"
        raise LayoutError(
            f"{what}: expected an int64 pointer table [{experts}] of the per-expert tensors; found {found}"
        )
    return table.data_ptr()


def export_jobs(
    layout: str,
    operands: Sequence[Operand],
    outs: Sequence[torch.Tensor],
    *,
    experts: int,
    rows: int,
    cols: int,
) -> list[ExportJob]:
    """The jobs of an export of ``experts`` weights ``[rows, cols]`` in ``layout``: for each
    operand (rowwise, then columnwise), its payload into ``outs[2d]`` and its scales into
    ``outs[2d + 1]``, as mok.export allocates them (checked there and by the op)."""
    jobs: list[ExportJob] = []
    for d, operand in enumerate(operands):
        out_data, out_scales = outs[2 * d], outs[2 * d + 1]
        columnwise = d == 1
        grouped = len(operand.data) == 1 and operand.data[0].dim() == 3
        first = operand.data[0]
        if grouped:
            src, src_es, src_rs, indirect = first.data_ptr(), first.stride(0), first.stride(1), False
        else:
            src, src_es, src_rs = _table_address(operand.data_table, experts, "data table"), 0, first.stride(0)
            indirect = True
        if first.stride(-1) != 1:
            raise LayoutError(f"data: expected bytes contiguous along rows; found strides {first.stride()}")
        jobs.append(
            payload_job(
                src=src,
                src_es=src_es,
                src_rs=src_rs,
                indirect=indirect,
                rows=rows,
                cols=cols,
                dst=out_data.data_ptr(),
                dst_es=out_data.stride(0),
                dst_rs=out_data.stride(1),
                out_rows=out_data.shape[1],
                out_cols=out_data.shape[2],
                experts=experts,
                shuffle=layout == "flashinfer",
            )
        )
        r, c = _scale_matrix(rows, cols, columnwise)
        rp, cp = padded_shape(r, c)
        if grouped:
            ssrc = operand.scales[0].data_ptr()
        else:
            ssrc = _table_address(operand.scale_table, experts, "scale table")
        src_es, dst, indirect = rp * cp, out_scales.data_ptr(), not grouped
        stride = [v * out_scales.element_size() for v in out_scales.stride()]
        if layout == "flashinfer":
            kind, dst_rs, dst_cs = "tiles", 0, 0
        elif layout == "deepgemm":  # int32 [E, R, words]: word (r, g) at r*stride(1) + g*stride(2)
            kind, dst_rs, dst_cs = "words", stride[1], stride[2]
        elif columnwise:  # TE's [E, N/32, K]: logical (r = k, c = j) at j*stride(1) + k*stride(2)
            kind, dst_rs, dst_cs = "bytes", stride[2], stride[1]
        else:
            kind, dst_rs, dst_cs = "bytes", stride[1], stride[2]
        jobs.append(
            scale_job(
                kind=kind,
                src=ssrc,
                src_es=src_es,
                indirect=indirect,
                rows=r,
                cols=c,
                dst=dst,
                dst_es=stride[0],
                dst_rs=dst_rs,
                dst_cs=dst_cs,
                experts=experts,
            )
        )
    return jobs


def kernel_source() -> str:
    return resources.files("mok.kernels").joinpath(SOURCE_NAME).read_text()


def compile_export(arch: str, config: ExportConfig = DEFAULT_CONFIG) -> Any:
    """Compile the export kernel for ``arch`` (e.g. "sm_90") with NVRTC; cuda.core ObjectCode.
    Needs no GPU: CI checks the source through the path users take."""
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(
        std="c++17", arch=arch, name="mok_mxfp8_export", define_macro=config.macros(), include_path=include_path()
    )
    return Program(kernel_source(), code_type="c++", options=options).compile("cubin")


def _kernel(index: int, config: ExportConfig) -> Any:
    """The kernel compiled for device ``index`` (once per device and shape, thread-safe)."""
    return compiled_once(
        _kernels, (index, config), index, lambda arch: compile_export(arch, config).get_kernel(KERNEL_NAME)
    )


def upload(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as int64 words in a new tensor on ``device``."""
    words = torch.empty(len(values), dtype=torch.int64, device=device)
    words.copy_(torch.tensor(list(values), dtype=torch.int64))
    return words


class ExportLaunch:
    """One prepared launch of ``jobs`` on ``device``: compiled kernel, uploaded descriptor table,
    grid, arguments; ``keep`` holds the tensors whose addresses the table holds (pointer tables
    made for the launch), alive as long as the launch. The inputs and outputs the jobs name must
    stay where they are while the launch is used (a split view's tables may change their
    contents, not their address). Calling it launches on the current torch stream."""

    def __init__(
        self,
        jobs: Sequence[ExportJob],
        device: torch.device,
        *,
        keep: Sequence[torch.Tensor] = (),
        config: ExportConfig = DEFAULT_CONFIG,
    ) -> None:
        import numpy as np
        from cuda.core import LaunchConfig, launch

        if device.type != "cuda":
            raise LayoutError(f"ExportLaunch: expected CUDA tensors; found {device} (the torch reference runs there)")
        if torch.cuda.is_current_stream_capturing():
            raise LayoutError(
                "export_mxfp8: these buffers were never exported outside CUDA-graph capture: export once before "
                "capturing (the first call uploads the descriptor table; later calls only launch)"
            )
        self.jobs = tuple(jobs)
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self.kernel = _kernel(self._index, config)
        table = describe(self.jobs, config)
        self.table = upload(table.values(), device)
        self.units = table.units
        self.keep = tuple(keep)
        self._launch = launch
        self._launch_config = LaunchConfig(grid=max(1, min(self.units, MAX_GRID)), block=config.threads)
        self._args = (np.uint64(self.table.data_ptr()), np.int32(len(self.jobs)), np.int64(self.units))
        self._stream = CurrentStream(self._index).current

    def __call__(self) -> None:
        self._launch(self._stream(), self._launch_config, self.kernel, *self._args)


def pointer_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The int64 table of ``tensors``' addresses on ``device``."""
    return upload([t.data_ptr() for t in tensors], device)


def cached_launch(
    layout: str,
    inputs: Sequence[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]],
    outs: Sequence[torch.Tensor],
    *,
    experts: int,
    rows: int,
    cols: int,
) -> ExportLaunch:
    """The launch exporting these very tensors (each direction's payloads and scale layouts,
    grouped or per expert) into ``outs``: prepared at the first call for their addresses (per-expert
    tensors get pointer tables of their own), then found by them. What torch.ops.mok.mxfp8_export
    runs on CUDA; mok.export_mxfp8 keeps its own launch with each export instead (a split view's
    tables, no key over every expert's tensors). A launch found while a CUDA graph captures is
    kept for the process's life: the graph reads its descriptor table at every replay."""
    device = outs[0].device
    tensors = [t for data, scales in inputs for t in (*data, *scales)]
    key = (
        device.index,
        layout,
        experts,
        rows,
        cols,
        tuple((t.data_ptr(), t.stride()) for t in tensors),
        tuple((t.data_ptr(), t.stride(), tuple(t.shape)) for t in outs),
    )
    with _lock:
        hit = _captured.get(key)
        if hit is not None:
            return hit
        hit = _launches.get(key)
        if hit is not None:
            _launches.move_to_end(key)
            if torch.cuda.is_current_stream_capturing():  # kept as long as the graph may replay it
                _captured[key] = hit
            return hit
    operands: list[Operand] = []
    keep: list[torch.Tensor] = []
    for data, scales in inputs:
        if len(data) == 1 and data[0].dim() == 3:
            operands.append(Operand(data, scales))
            continue
        tables = (pointer_table(data, device), pointer_table(scales, device))
        keep += tables
        operands.append(Operand(data, scales, *tables))
    jobs = export_jobs(layout, operands, outs, experts=experts, rows=rows, cols=cols)
    launch = ExportLaunch(jobs, device, keep=keep)
    with _lock:
        _launches[key] = launch
        while len(_launches) > _CACHE_SIZE:
            _launches.popitem(last=False)
    return launch
