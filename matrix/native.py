"""Extract the C++/CUDA facts te_compat's table relies on from each TE release's own source.

TE's pure-Python wheel holds no C++; its torch extension is published as a source archive
(``transformer_engine_torch-V.tar.gz``) that carries the extension's ``csrc/`` and TE's common
headers (``common_headers/common/``, where ``util/ptx.cuh`` is). This module reads three facts
from that archive, as text (nothing is compiled), and writes ``matrix/native/<release>.json``:

- ``exp2f_rcp``: the MXFP8 kernels' reciprocal of a scale code, classified by its body (comments
  and spaces left out) as one of :data:`RECIPROCAL_FORMS`, or "unknown" with the body kept;
- ``quantize_post_swizzle``: ``tex.quantize`` (``csrc/extensions/cast.cpp``, function
  ``quantize``) swizzles the scales after quantising whenever the quantizer has
  ``optimize_for_gemm`` and the kernel did not write them swizzled (TE PR 3076);
- ``mxfp8_create_swizzled``: ``MXFP8Quantizer::create_tensor`` (``csrc/quantizer.cpp``) marks
  its tensor swizzled from ``optimize_for_gemm`` (TE PR 2486).

``python -m matrix.check`` checks te_compat's rows against these records (the reciprocal rows;
the quantizer rows' start releases).

    python -m matrix.native 2.17.0             # download (cached in matrix/.cache/) and write
    python -m matrix.native --all              # every release in matrix/releases.toml
    python -m matrix.native 2.17.0 --check     # fail if the committed record differs

The archive is downloaded from the index pip is configured with (PEP 691 JSON); when it cannot be
reached, :class:`matrix.extract.IndexUnreachable` says which one.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

from matrix.extract import WHEEL_CACHE, IndexUnreachable, index_unreachable, package_index, records_main

NATIVE_DIR = Path(__file__).resolve().parent / "native"
PACKAGE = "transformer-engine-torch"
# a matrix release whose archive is another's (1.9.0.post1 republished the wheels, not the archive)
ARCHIVE_OF = {"1.9.0.post1": "1.9.0"}

# exp2f_rcp's body, comments and spaces removed -> the form te_compat's reciprocal rows name
RECIPROCAL_FORMS = {
    "return(biased_exp==0)?1:exp2f(FP32_EXPONENT_BIAS-static_cast<float>(biased_exp));": "exp2f",
    "return(biased_exp==0)?1:__int_as_float((254-biased_exp)<<FP32_MANTISSA_BITS);": "shift",
    "if(biased_exp==255)return__int_as_float(0x7fffffff);if(biased_exp==254)return__int_as_float(0x00400000);"
    "return__int_as_float((254-biased_exp)<<FP32_MANTISSA_BITS);": "exact",
}
_RCP = re.compile(r"float\s+exp2f_rcp\s*(?:<\s*float\s*>)?\s*\(\s*e8m0_t\s+biased_exp\s*\)\s*\{")
_POST_SWIZZLE = re.compile(
    r"if\s*\(\s*quantizer_cpp->optimize_for_gemm\s*&&\s*!output_cpp\.get_with_gemm_swizzled_scales\(\)\s*\)\s*\{\s*"
    r"inplace_swizzle_scale_for_gemm\(output_py\);"
)
_MXFP8_CREATE = re.compile(r"with_gemm_swizzled_scales\s*=\s*this->optimize_for_gemm\s*;")


def archive_path(release: str, cache: Path = WHEEL_CACHE) -> Path:
    """The cached source archive of ``transformer-engine-torch==release``, downloaded if needed."""
    version = ARCHIVE_OF.get(release, release)
    name = f"transformer_engine_torch-{version}.tar.gz"
    path = cache / name
    if path.exists():
        return path
    url, where = package_index()
    why = index_unreachable(url)
    if why is not None:
        raise IndexUnreachable(f"{url} ({where}) unreachable: {why}; needed to download {name} into {cache}")
    page = urllib.request.Request(
        url.rstrip("/") + f"/{PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(page, timeout=60) as answer:
        files = {f["filename"]: f for f in json.load(answer)["files"]}
    if name not in files:
        raise FileNotFoundError(f"{url}/{PACKAGE}/ lists no {name}")
    with urllib.request.urlopen(files[name]["url"], timeout=300) as answer:
        data = answer.read()
    want = files[name].get("hashes", {}).get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise ValueError(f"{name}: sha256 {hashlib.sha256(data).hexdigest()} differs from the index's {want}")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL))


def _body(text: str, start: int) -> str:
    """The text between the brace at ``start`` and its match."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    return text[start + 1 :]


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _repo_path(member: str) -> str:
    """An archive member as TE's repository names it: common_headers/common/x -> transformer_engine/common/x."""
    inner = member.split("/", 1)[1]
    if inner.startswith("common_headers/"):
        return "transformer_engine/" + inner.removeprefix("common_headers/")
    return "transformer_engine/pytorch/" + inner


def reciprocal_fact(files: dict[str, str]) -> dict[str, Any]:
    """How ``exp2f_rcp`` of float is defined, where (file, line), in one release's sources."""
    for member, text in sorted(files.items()):
        found = _RCP.search(text)
        if found is None:
            continue
        body = _body(text, found.end() - 1)
        normal = re.sub(r"\s+", "", _without_comments(body))
        fact: dict[str, Any] = {"form": RECIPROCAL_FORMS.get(normal, "unknown"), "file": _repo_path(member)}
        fact["line"] = _line(text, found.start())
        if fact["form"] == "unknown":
            fact["body"] = normal
        return fact
    return {"form": "absent"}


def _function_fact(
    files: dict[str, str], suffix: str, head: re.Pattern[str], inside: re.Pattern[str]
) -> dict[str, Any]:
    for member, text in files.items():
        if not member.endswith(suffix):
            continue
        for found in head.finditer(text):
            body = _body(text, found.end() - 1)
            hit = inside.search(body)
            if hit is not None:
                return {"present": True, "file": _repo_path(member), "line": _line(text, found.end() + hit.start())}
        return {"present": False, "file": _repo_path(member)}
    return {"present": False}


def extract_archive(path: Path) -> dict[str, Any]:
    """The native facts of one source archive."""
    files: dict[str, str] = {}
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.endswith((".cuh", ".h", ".cpp", ".cu")):
                handle = archive.extractfile(member)
                if handle is not None:
                    files[member.name] = handle.read().decode("utf-8", errors="replace")
    quantize = re.compile(r"py::object\s+quantize\s*\([^)]*\)\s*\{")
    create = re.compile(r"MXFP8Quantizer::create_tensor\s*\([^)]*\)\s*const\s*\{")
    return {
        "source": path.name,
        "exp2f_rcp": reciprocal_fact(files),
        "quantize_post_swizzle": _function_fact(files, "csrc/extensions/cast.cpp", quantize, _POST_SWIZZLE),
        "mxfp8_create_swizzled": _function_fact(files, "csrc/quantizer.cpp", create, _MXFP8_CREATE),
    }


def record_path(release: str) -> Path:
    return NATIVE_DIR / f"{release}.json"


def load_native(release: str) -> dict[str, Any] | None:
    """The committed native record of ``release`` (None where there is none)."""
    path = record_path(release)
    return json.loads(path.read_text()) if path.exists() else None


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    return records_main(
        argv,
        prog="python -m matrix.native",
        description=__doc__.split("\n")[0],
        fresh=lambda release, cache: dumps({"release": release, **extract_archive(archive_path(release, cache))}),
        path_of=record_path,
        source="release's source archive",
    )


if __name__ == "__main__":
    raise SystemExit(main())
