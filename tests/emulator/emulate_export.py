"""Run the MXFP8 export kernel on the CPU and compare it byte for byte with the torch reference.

    python -m tests.emulator.emulate_export

Builds mok/kernels/mxfp8_export.cu with emulator.h (g++ -std=c++20, the ABI and shape macros of
mok.kernels.export_jobs.ExportConfig; see export_main.cpp) and runs the very jobs an export
launches (mok.kernels.export_launch.export_jobs) on CPU tensors: a split view's own pointer
tables, a grouped view's tensors, or lists of tensors with tables made here. Every output buffer's
whole storage is filled with MARK before the run, for the kernel and for the reference
(torch.ops.mok.mxfp8_export's CPU implementation) alike, and compared whole: a byte left
unwritten, or written where it should not be (DeepGEMM's gap rows), shows; and a layout's padding
copied into an output shows when inputs whose padding is not zero (TE's own GEMM-layout scales)
export otherwise than the same inputs with zero padding. It checks the planning,
addressing and access widths without a GPU; not speed, and not a hardware rule the model lacks
(tests/gpu/test_export_gpu.py is the judge).
"""

from __future__ import annotations

import ctypes
import functools
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

import mok.kernels
from mok.export_ops import _export_args, export_reference
from mok.kernels.export_jobs import ExportConfig, ExportJob, describe
from mok.kernels.export_launch import DEFAULT_CONFIG, Operand, export_jobs
from mok.views import ExpertWeights

HERE = Path(__file__).parent
KERNEL_DIR = Path(mok.kernels.__file__).parent
MARK = 0xAB  # what every output byte holds before a run
# the launches' shape, and units small enough that a small expert spans several of each kind
CONFIGS = [DEFAULT_CONFIG, ExportConfig(threads=64, unit_pieces=128, unit_tiles=4)]


@functools.cache
def build(config: ExportConfig, kernel_dir: Path = KERNEL_DIR) -> ctypes.CDLL:
    """Compile the emulator (cached per process) from the mxfp8_export.cu in ``kernel_dir``."""
    out = Path(tempfile.mkdtemp(prefix="mok-emu-export-")) / "emu.so"
    macros = [f"-D{k}={v}" for k, v in config.macros()]
    obj = out.with_suffix(".o")
    compile_ = ["g++", "-std=c++20", "-O1", "-fPIC", "-fsanitize=alignment", f"-I{kernel_dir}", f"-I{HERE}", *macros]
    subprocess.run([*compile_, "-c", str(HERE / "export_main.cpp"), "-o", str(obj)], check=True)
    subprocess.run(["g++", "-shared", str(obj), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.mok_emulate_export.restype = ctypes.c_int
    lib.mok_emulate_export.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
    lib.mok_emulate_export.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return lib


def span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of ``t``'s elements."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def run(
    jobs: Sequence[ExportJob],
    inputs: Sequence[torch.Tensor],
    outs: Sequence[torch.Tensor],
    config: ExportConfig = DEFAULT_CONFIG,
    grid: int = 0,
    kernel_dir: Path = KERNEL_DIR,
) -> None:
    """One emulated launch of ``jobs`` on ``grid`` blocks (0: one a unit); ``inputs`` are all the
    kernel may read (besides the tables), ``outs`` all it may write."""
    table = describe(jobs, config)
    words = torch.tensor(table.values(), dtype=torch.int64)
    readable = torch.tensor([a for t in inputs for a in span(t)], dtype=torch.int64)
    writable = torch.tensor([a for t in outs for a in span(t)], dtype=torch.int64)
    blocks = table.units if grid == 0 else min(grid, table.units)
    lib = build(config, kernel_dir)
    errors = lib.mok_emulate_export(
        words.data_ptr(),
        len(table.rows),
        table.units,
        blocks,
        readable.data_ptr(),
        len(inputs),
        writable.data_ptr(),
        len(outs),
    )
    if errors:
        raise AssertionError(f"{errors} violations of the emulated hardware's rules (see stderr)")


def marked_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape, dtype and strides whose whole storage holds MARK."""
    size = t.untyped_storage().nbytes() // t.element_size()
    storage = torch.empty(size, dtype=t.dtype)
    storage.view(torch.uint8).fill_(MARK)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes(t.untyped_storage())), dtype=torch.uint8)


def lists_of(view: ExpertWeights, columnwise: bool) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    directions = [view.rowwise] + ([view.columnwise] if columnwise and view.columnwise is not None else [])
    return [(list(d.data), list(d.scales or ())) for d in directions]


def operands_of(view: ExpertWeights, columnwise: bool) -> list[Operand]:
    """What mok.export_mxfp8 launches on: the view's own tensors and pointer tables."""
    directions = [view.rowwise] + ([view.columnwise] if columnwise and view.columnwise is not None else [])
    return [Operand(d.data, d.scales or (), d.data_ptrs, d.scale_ptrs) for d in directions]


def operands_with_tables(inputs: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> list[Operand]:
    """Per-expert lists with pointer tables made here (what the op's CUDA implementation makes)."""
    found = []
    for data, scales in inputs:
        if len(data) == 1 and data[0].dim() == 3:
            found.append(Operand(data, scales))
            continue
        tables = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64) for ts in (data, scales)]
        found.append(Operand(data, scales, *tables))
    return found


def compare(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], what: str) -> None:
    """Raise AssertionError naming the first differing bytes of each output whose storage differs."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        gb, wb = storage_bytes(g), storage_bytes(w)
        if not torch.equal(gb, wb):
            bad = (gb != wb).nonzero().flatten()[:5].tolist()
            pairs = [f"{gb[j].item():#04x} for {wb[j].item():#04x}" for j in bad]
            raise AssertionError(
                f"{what}: out[{i}] differs at storage bytes {bad} (found {', '.join(pairs)}; "
                f"{int((gb != wb).sum())} bytes differ)"
            )


def check(
    layout: str,
    inputs: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
    outs_like: Sequence[torch.Tensor],
    *,
    operands: list[Operand] | None = None,
    config: ExportConfig = DEFAULT_CONFIG,
    grid: int = 0,
    what: str = "",
    kernel_dir: Path = KERNEL_DIR,
) -> list[torch.Tensor]:
    """The emulated kernel (on ``operands``: by default tables made here) and the reference, each
    into its own marked copy of ``outs_like``'s buffers, compared whole; the kernel's buffers."""
    columnwise = inputs[1] if len(inputs) > 1 else ([], [])
    got = [marked_like(t) for t in outs_like]
    want = [marked_like(t) for t in outs_like]
    args = _export_args(*inputs[0], *columnwise, got, layout)
    export_reference(_export_args(*inputs[0], *columnwise, want, layout), "torch")
    ops = operands if operands is not None else operands_with_tables(inputs)
    jobs = export_jobs(layout, ops, got, experts=args.experts, rows=args.rows, cols=args.cols)
    run(jobs, [t for d, s in inputs for t in (*d, *s)], got, config, grid, kernel_dir)
    compare(got, want, f"{what} ({layout}, {config}, grid {grid})")
    return got
