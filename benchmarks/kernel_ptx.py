"""The kernel's PTX, compiled as mok compiles it, for each architecture and launch shape: shows
whether a source change leaves the generated code of the measured configurations as it was.

    PYTHONPATH=$PWD python benchmarks/kernel_ptx.py /tmp/ptx-before     # no GPU needed
    ... change the kernel ...
    PYTHONPATH=$PWD python benchmarks/kernel_ptx.py /tmp/ptx-after && diff -r /tmp/ptx-before /tmp/ptx-after

Writes OUT/<arch>-<TILES>x<THREADS>.ptx for sm_75, sm_80 and sm_90 under both launch shapes
(mok.kernels.config.LaunchShapes). The options are cuda.core's for launch.compile_kernel; the PTX
comes from NVRTC itself (cuda.core's PTX path asks for a driver).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cuda.bindings import nvrtc
from cuda.core import ProgramOptions

from mok.kernels.config import KernelConfig, LaunchShapes
from mok.kernels.launch import kernel_source

ARCHS = ("sm_75", "sm_80", "sm_90")


def _checked(result: tuple[Any, ...]) -> Any:
    err, *value = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {err}")
    return value[0] if value else None


def ptx(arch: str, config: KernelConfig) -> bytes:
    """The kernel's PTX for ``arch`` under ``config``."""
    name = b"mok_mxfp8_swizzle"
    options = ProgramOptions(std="c++17", arch=arch, name=name.decode(), define_macro=config.macros()).as_bytes("nvrtc")
    program = _checked(nvrtc.nvrtcCreateProgram(kernel_source().encode(), name, 0, [], []))
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = b" " * _checked(nvrtc.nvrtcGetProgramLogSize(program))
        nvrtc.nvrtcGetProgramLog(program, log)
        raise RuntimeError(f"NVRTC could not compile the kernel for {arch}, {config}:\n{log.decode()}")
    code = b" " * _checked(nvrtc.nvrtcGetPTXSize(program))
    _checked(nvrtc.nvrtcGetPTX(program, code))
    return code.rstrip(b"\0")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    shapes = LaunchShapes()
    for config in (shapes.other, shapes.rowwise):
        for arch in ARCHS:
            path = out / f"{arch}-{config}.ptx"
            path.write_bytes(ptx(arch, config))
            print(f"{path}  {config.macros()}")


if __name__ == "__main__":
    main()
