"""The kernels' PTX, compiled as mok compiles them, for each architecture, launch shape and entry
point: shows whether a source change leaves the generated code of the measured configurations as
it was.

    PYTHONPATH=$PWD python benchmarks/kernel_ptx.py /tmp/ptx-before     # no GPU needed
    ... change the kernel ...
    PYTHONPATH=$PWD python benchmarks/kernel_ptx.py /tmp/ptx-after && diff -r /tmp/ptx-before /tmp/ptx-after

Writes OUT/<arch>-<TILES>x<THREADS>-<entry>.ptx for sm_75, sm_80 and sm_90 under both launch shapes
(mok.kernels.config.LaunchShapes) and each entry point of the source: the PTX header, the entry and
every function it calls, and the module-level declarations they use, so that adding one kernel
leaves the other's file as it was. ``--source FILE`` compiles another copy of the source (e.g.
``git show main:mok/kernels/mxfp8_swizzle.cu``). The options are cuda.core's for
launch.compile_kernel; the PTX comes from NVRTC itself (cuda.core's PTX path asks for a driver).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from cuda.bindings import nvrtc
from cuda.core import ProgramOptions

from mok.kernels import include_path
from mok.kernels.config import KernelConfig, LaunchShapes
from mok.kernels.launch import kernel_source

ARCHS = ("sm_75", "sm_80", "sm_90")
FUNCTION = re.compile(r"^(?:\.visible |\.weak |\.extern )?\.(func|entry)\b")
NAME = re.compile(r"(?<![.%$\w])[A-Za-z_][\w$]*")  # an identifier that is no directive, register or label


def _checked(result: tuple[Any, ...]) -> Any:
    err, *value = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {err}")
    return value[0] if value else None


def ptx(arch: str, config: KernelConfig, source: str) -> str:
    """The PTX of ``source`` for ``arch`` under ``config``."""
    name = b"mok_mxfp8_swizzle"
    options = ProgramOptions(
        std="c++17", arch=arch, name=name.decode(), define_macro=config.macros(), include_path=include_path()
    ).as_bytes("nvrtc")
    program = _checked(nvrtc.nvrtcCreateProgram(source.encode(), name, 0, [], []))
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = b" " * _checked(nvrtc.nvrtcGetProgramLogSize(program))
        nvrtc.nvrtcGetProgramLog(program, log)
        raise RuntimeError(f"NVRTC could not compile the kernel for {arch}, {config}:\n{log.decode()}")
    code = b" " * _checked(nvrtc.nvrtcGetPTXSize(program))
    _checked(nvrtc.nvrtcGetPTX(program, code))
    return code.rstrip(b"\0").decode()


def split(text: str) -> tuple[list[str], dict[str, str], list[str], list[str]]:
    """PTX as (header lines up to .address_size, {function name: its definition}, the entry
    names, the module-level declarations). Top-level comments (``// .globl``, a demoted
    variable's note) are no code and are left out."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith(".address_size")) + 1
    functions: dict[str, str] = {}
    entries: list[str] = []
    declarations: list[str] = []
    i = end
    while i < len(lines):
        line = lines[i]
        match = FUNCTION.match(line)
        if match is None:
            if line.strip() and not line.lstrip().startswith("//"):
                declarations.append(line)
            i += 1
            continue
        j, body = i, False  # a definition ends at its closing brace, a prototype at its ';'
        while not (lines[j] == "}" or (not body and lines[j].rstrip().endswith(";"))):
            body = body or lines[j] == "{"
            j += 1
        if lines[j] == "}":
            name = NAME.findall(line[match.end() :])[-1]  # the name follows any return parameter
            functions[name] = "\n".join(lines[i : j + 1])
            if match.group(1) == "entry":
                entries.append(name)
        i = j + 1
    return lines[:end], functions, entries, declarations


def entry_ptx(text: str, entry: str) -> str:
    """The PTX ``entry`` needs: the header, the module-level declarations its code names, and the
    entry with every function it calls (in the order NVRTC wrote them)."""
    header, functions, _, declarations = split(text)
    kept, todo = {entry}, [entry]
    while todo:
        names = set(NAME.findall(functions[todo.pop()]))
        for callee in names & functions.keys() - kept:
            kept.add(callee)
            todo.append(callee)
    used = {name for f in kept for name in NAME.findall(functions[f])}
    found = [d for d in declarations if set(NAME.findall(d)) & used]
    return "\n".join([*header, *found, *(body for name, body in functions.items() if name in kept)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="folder for the .ptx files")
    parser.add_argument("--source", type=Path, help="compile this file instead of mok's kernel source")
    args = parser.parse_args()
    source = args.source.read_text() if args.source else kernel_source()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = LaunchShapes()
    for config in (shapes.other, shapes.rowwise):
        for arch in ARCHS:
            text = ptx(arch, config, source)
            for entry in split(text)[2]:
                path = args.out / f"{arch}-{config}-{entry}.ptx"
                path.write_text(entry_ptx(text, entry))
                print(f"{path}  {config.macros()}")


if __name__ == "__main__":
    main()
