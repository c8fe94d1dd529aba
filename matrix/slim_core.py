"""Keep one GPU architecture's device code in TE's core wheel, so a release travels in one part.

TE's core library (``transformer_engine/wheel_lib/libtransformer_engine.so``, about 340 MB) is
mostly its ``.nv_fatbin`` section: one fat binary per CUDA source file, each holding a cubin per
GPU architecture (sm_75 to sm_120). A GPU runs only cubins of its own major architecture (an
sm_90 GPU: sm_90 and sm_90a), and these libraries carry no PTX to compile for another. So for a
run on the H200 each fat binary is rewritten in place to hold just its sm_90 entries, byte for
byte as TE shipped them, and the rest of its space is zeroed: every address and every host byte
of the library stays where it was, and the zeroed space compresses to nothing (TE 2.20.2's core
wheel: 276 MB to about 33 MB). A fat binary without an entry for the architecture is left whole.

    python -m matrix.slim_core V [--arch 90]

reads the parts ``../shared/gpu/te-wheelhouse.sh V`` made in ``.te-wheelhouse/V/p1..pN`` and writes
``.te-wheelhouse/V/sm90/``: the slimmed core wheel (same name), the small wheels, the torch
extension's source, ``CORE_NAME``, and ``CORE_NOTE`` (what was done, for the run's record); and
a copy of the torch extension's source in ``.te-wheelhouse/sources/`` (half a megabyte a release,
all of them carried in one path, for background builds on the GPU machine: GPU_LIVE_NEXT in
matrix/gpu_live.sh). matrix/gpu_live.sh stages any folder under ``.te-wheelhouse/V/`` and every
source in ``.te-wheelhouse/sources/``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".te-wheelhouse"
FATBIN_MAGIC = 0xBA55ED50  # each fat binary's header: magic u32, version u16, header size u16, size u64
ENTRY_ARCH = 28  # offset of an entry's architecture (u32: 90 for sm_90 and sm_90a) in its header
PART_LIMIT = 56_000_000  # one part of a device call (the working tree travels beside it)


@dataclass
class SlimReport:
    """What one library's fat binaries held, and what was kept."""

    fatbins: int = 0
    kept_whole: int = 0  # fat binaries with no entry for the architecture
    entries: dict[int, int] = field(default_factory=dict)  # architecture -> entries found
    kept_bytes: int = 0
    zeroed_bytes: int = 0


def elf_section(data: bytes | bytearray, name: str) -> tuple[int, int] | None:
    """(file offset, size) of a section of a 64-bit little-endian ELF file, None when absent."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError(f"expected a 64-bit little-endian ELF file; found header {bytes(data[:6])!r}")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[names_index][4]
    for name_at, _type, _flags, _addr, offset, size in headers:
        end = data.index(b"\0", names + name_at)
        if data[names + name_at : end].decode() == name:
            return offset, size
    return None


def _entries(data: bytearray, start: int, end: int, where: str) -> list[tuple[int, int, int]]:
    """(offset, length with header, architecture) of each entry of one fat binary."""
    found = []
    at = start
    while at < end:
        header, payload = struct.unpack_from("<IQ", data, at + 4)
        found.append((at, header + payload, struct.unpack_from("<I", data, at + ENTRY_ARCH)[0]))
        at += header + payload
    if at != end:
        raise ValueError(f"{where}: entries end at {at}, expected {end}: not a fat binary layout this tool knows")
    return found


def slim_fatbins(data: bytearray, arch: int) -> SlimReport:
    """Rewrite each fat binary of ``data`` (an ELF library, changed in place) to hold only ``arch``."""
    report = SlimReport()
    section = elf_section(data, ".nv_fatbin")
    if section is None:
        return report
    at, end = section[0], section[0] + section[1]
    while at < end:
        magic, _version, header = struct.unpack_from("<IHH", data, at)
        if magic != FATBIN_MAGIC:
            if any(data[at : at + 8]):
                raise ValueError(
                    f".nv_fatbin at {at}: expected a fat binary header (0x{FATBIN_MAGIC:X}); found {magic:#x}"
                )
            at += 8  # alignment padding between fat binaries
            continue
        size = struct.unpack_from("<Q", data, at + 8)[0]
        body_start, body_end = at + header, at + header + size
        entries = _entries(data, body_start, body_end, f"fat binary at {at}")
        report.fatbins += 1
        for _, _, entry_arch in entries:
            report.entries[entry_arch] = report.entries.get(entry_arch, 0) + 1
        kept = b"".join(bytes(data[o : o + n]) for o, n, a in entries if a == arch)
        if not kept:
            report.kept_whole += 1
            report.kept_bytes += size
        else:
            data[body_start:body_end] = bytes(size)
            data[body_start : body_start + len(kept)] = kept
            struct.pack_into("<Q", data, at + 8, len(kept))
            report.kept_bytes += len(kept)
            report.zeroed_bytes += size - len(kept)
        at = body_end
    return report


def record_hash(data: bytes) -> str:
    """A wheel RECORD's hash field (PEP 376/427): sha256, urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim_wheel(src: Path, dst: Path, arch: int) -> dict[str, SlimReport]:
    """Copy wheel ``src`` to ``dst`` with every library's device code slimmed; RECORD follows."""
    reports: dict[str, SlimReport] = {}
    changed: dict[str, bytes] = {}
    with zipfile.ZipFile(src) as zin:
        for info in zin.infolist():
            if info.filename.endswith(".so") or ".so." in info.filename:
                data = bytearray(zin.read(info))
                if data[:4] == b"\x7fELF" and elf_section(data, ".nv_fatbin") is not None:
                    reports[info.filename] = slim_fatbins(data, arch)
                    changed[info.filename] = bytes(data)
        records = [n for n in zin.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise ValueError(f"{src.name}: expected one .dist-info/RECORD; found {records}")
        lines = zin.read(records[0]).decode().splitlines()
        for i, line in enumerate(lines):
            name = line.rsplit(",", 2)[0]
            if name in changed:
                lines[i] = f"{name},{record_hash(changed[name])},{len(changed[name])}"
        changed[records[0]] = ("\n".join(lines) + "\n").encode()
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                zout.writestr(info, changed.get(info.filename) or zin.read(info), zipfile.ZIP_DEFLATED)
    return reports


def pack_release(version: str, arch: int = 90, wheelhouse: Path = WHEELHOUSE) -> Path:
    """``.te-wheelhouse/V/smARCH/``: the whole release, its core slimmed, ready to carry."""
    src = wheelhouse / version
    parts = sorted(src.glob("p*/core.part*"), key=lambda p: int(p.name.removeprefix("core.part")))
    names = list(src.glob("p*/CORE_NAME"))
    if not parts or len(names) != 1:
        raise FileNotFoundError(
            f"{src}: expected core.part* files and one CORE_NAME (../shared/gpu/te-wheelhouse.sh {version})"
        )
    core_name = names[0].read_text().strip()
    out = src / f"sm{arch}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    whole = out / f"{core_name}.full"
    with whole.open("wb") as f:
        for part in parts:
            f.write(part.read_bytes())
    reports = slim_wheel(whole, out / core_name, arch)
    whole.unlink()
    for small in names[0].parent.iterdir():
        if small.is_file() and not small.name.startswith("core.part"):
            shutil.copy2(small, out / small.name)
    sources = wheelhouse / "sources"
    sources.mkdir(exist_ok=True)
    for archive in out.glob("transformer_engine_torch-*.tar.gz"):
        shutil.copy2(archive, sources / archive.name)
    lib = max(reports.items(), key=lambda kv: kv[1].zeroed_bytes)
    note = (
        f"core wheel slimmed to sm_{arch} device code by matrix/slim_core.py: "
        f"{lib[0].rsplit('/', 1)[-1]} keeps its {lib[1].entries.get(arch, 0)} sm_{arch} cubins as TE shipped them "
        f"({lib[1].kept_whole} of {lib[1].fatbins} fat binaries kept whole)"
    )
    (out / "CORE_NOTE").write_text(note + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.slim_core", description=__doc__.split("\n")[0])
    parser.add_argument("version", help="a TE release whose parts are in .te-wheelhouse/VERSION/")
    parser.add_argument("--arch", type=int, default=90, help="the GPU architecture to keep (default 90: H100, H200)")
    args = parser.parse_args(argv)
    out = pack_release(args.version, args.arch)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {size / 1e6:.1f} MB in all; {(out / 'CORE_NOTE').read_text().strip()}")
    for path in sorted(out.iterdir()):
        print(f"  {path.stat().st_size / 1e6:8.1f} MB  {path.name}")
    if size > PART_LIMIT:
        print(f"WARNING: over {PART_LIMIT / 1e6:.0f} MB: it does not fit one device call beside the working tree")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
