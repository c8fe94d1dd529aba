"""matrix/slim_core.py against libraries nvcc builds here: the kept architecture's cubin stays
byte for byte where it was, the other goes, and nothing outside the fat binaries moves."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from matrix import slim_core

KERNEL = """
__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" void launch(float* x) { add_one<<<1, 32>>>(x); }
"""


def _nvcc(tmp: Path, *args: str) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc to build a library with device code")
    subprocess.run([nvcc, "--compress-mode=none", *args, str(tmp / "k.cu")], check=True, capture_output=True, cwd=tmp)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lib2.so (sm_80 and sm_90), lib80.so (sm_80 only), and each architecture's cubin alone."""
    tmp = tmp_path_factory.mktemp("fatbin")
    (tmp / "k.cu").write_text(KERNEL)
    so = ["-shared", "-Xcompiler", "-fPIC"]
    _nvcc(tmp, *so, "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", "-o", "lib2.so")
    _nvcc(tmp, *so, "-gencode", "arch=compute_80,code=sm_80", "-o", "lib80.so")
    _nvcc(tmp, "-cubin", "-arch=sm_90", "-o", "k90.cubin")
    _nvcc(tmp, "-cubin", "-arch=sm_80", "-o", "k80.cubin")
    return tmp


def test_only_the_kept_architecture_stays_where_it_was(built: Path) -> None:
    original = (built / "lib2.so").read_bytes()
    sm90, sm80 = (built / "k90.cubin").read_bytes(), (built / "k80.cubin").read_bytes()
    assert sm90 in original and sm80 in original
    data = bytearray(original)
    report = slim_core.slim_fatbins(data, 90)
    # one fat binary for k.cu and one from CUDA's runtime linked in, each built for both
    assert report.fatbins == 2 and report.entries == {80: 2, 90: 2} and report.kept_whole == 0
    assert len(data) == len(original)
    assert sm90 in data and sm80 not in data
    section = slim_core.elf_section(original, ".nv_fatbin")
    assert section is not None
    start, end = section[0], section[0] + section[1]
    assert data[:start] == original[:start] and data[end:] == original[end:]  # host code and addresses
    assert report.zeroed_bytes >= len(sm80) and data[start:end].count(0) >= report.zeroed_bytes


def test_a_fat_binary_without_the_architecture_is_left_whole(built: Path) -> None:
    original = (built / "lib80.so").read_bytes()
    data = bytearray(original)
    report = slim_core.slim_fatbins(data, 90)
    assert report.kept_whole == report.fatbins == 2 and report.zeroed_bytes == 0 and bytes(data) == original


def test_a_library_without_device_code_is_unchanged() -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler")
    data = bytearray(Path(cc).resolve().read_bytes())
    if data[:6] != b"\x7fELF\x02\x01":
        pytest.skip("the C compiler here is no 64-bit ELF file")
    before = bytes(data)
    assert slim_core.slim_fatbins(data, 90).fatbins == 0 and bytes(data) == before


def test_anything_but_an_elf_library_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected a 64-bit little-endian ELF file; found header b'PK"):
        slim_core.elf_section(b"PK\x03\x04 a zip", ".nv_fatbin")


def _sha(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


INIT_SHA = _sha(b"x = 1\n")


def test_the_slim_wheel_keeps_every_other_file_and_its_record_matches(built: Path, tmp_path: Path) -> None:
    lib = (built / "lib2.so").read_bytes()
    src, dst = tmp_path / "core.whl", tmp_path / "slim.whl"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("pkg/lib/libk.so")
        info.external_attr = 0o755 << 16
        z.writestr(info, lib)
        z.writestr("pkg/__init__.py", "x = 1\n")
        record = f"pkg/lib/libk.so,{_sha(lib)},{len(lib)}\npkg/__init__.py,{INIT_SHA},6\npkg-1.dist-info/RECORD,,\n"
        z.writestr("pkg-1.dist-info/RECORD", record)
    reports = slim_core.slim_wheel(src, dst, 90)
    assert list(reports) == ["pkg/lib/libk.so"]
    with zipfile.ZipFile(dst) as z:
        slim = z.read("pkg/lib/libk.so")
        assert (built / "k90.cubin").read_bytes() in slim and len(slim) == len(lib) and slim != lib
        assert z.getinfo("pkg/lib/libk.so").external_attr >> 16 == 0o755
        assert z.read("pkg/__init__.py") == b"x = 1\n"
        lines = z.read("pkg-1.dist-info/RECORD").decode().splitlines()
    assert lines == [
        f"pkg/lib/libk.so,{_sha(slim)},{len(slim)}",
        f"pkg/__init__.py,{INIT_SHA},6",
        "pkg-1.dist-info/RECORD,,",
    ]


def test_pack_release_gathers_one_part_and_the_source_alone(built: Path, tmp_path: Path) -> None:
    """From the parts ../shared/gpu/te-wheelhouse.sh writes to what one device call carries."""
    lib = (built / "lib2.so").read_bytes()
    wheel = tmp_path / "core.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("te/lib/libk.so", lib)
        z.writestr("te-9.9.9.dist-info/RECORD", f"te/lib/libk.so,{_sha(lib)},{len(lib)}\nte-9.9.9.dist-info/RECORD,,\n")
    data = wheel.read_bytes()
    release = tmp_path / "house" / "9.9.9"
    for i, chunk in enumerate((data[: len(data) // 2], data[len(data) // 2 :])):
        (release / f"p{i + 1}").mkdir(parents=True)
        (release / f"p{i + 1}" / f"core.part{i}").write_bytes(chunk)
    last = release / "p2"
    (last / "CORE_NAME").write_text("te_cu13-9.9.9-py3-none-any.whl\n")
    (last / "transformer_engine_torch-9.9.9.tar.gz").write_bytes(b"sdist")
    out = slim_core.pack_release("9.9.9", 90, tmp_path / "house")
    assert sorted(p.name for p in out.iterdir()) == [
        "CORE_NAME",
        "CORE_NOTE",
        "te_cu13-9.9.9-py3-none-any.whl",
        "transformer_engine_torch-9.9.9.tar.gz",
    ]
    with zipfile.ZipFile(out / "te_cu13-9.9.9-py3-none-any.whl") as z:
        slim = z.read("te/lib/libk.so")
    assert (built / "k90.cubin").read_bytes() in slim and (built / "k80.cubin").read_bytes() not in slim
    assert "libk.so keeps its 2 sm_90 cubins" in (out / "CORE_NOTE").read_text()
    sources = tmp_path / "house" / "sources"
    assert [p.name for p in sources.iterdir()] == ["transformer_engine_torch-9.9.9.tar.gz"]
