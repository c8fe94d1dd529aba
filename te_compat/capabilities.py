"""What this process can do: TE, torch and the GPU. (cuda.core, a fact of mok's kernel alone, is
mok.backend's; ``cuda_core`` and the ``cuda_kernel`` feature answer here for one more release,
deprecated.)

Call once at start-up; ``require`` turns a missing feature into one clear error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from packaging.version import Version

from te_compat import table
from te_compat.behaviour import fsdp2_support, post_all_gather_support, reciprocal_rule_source, two_d_quantization
from te_compat.device import cuda_core_present, cuda_device
from te_compat.errors import MissingFeatureError, TECompatError, TEVersionError, describe
from te_compat.quantize import describe as describe_quantize
from te_compat.quantize import quantize_row, support
from te_compat.table import TensorKind
from te_compat.version import parse_te_version, release_of, te_import_status, te_status

# TE's recipe check asks for compute capability 10.0 for MXFP8 GEMMs (tcgen05). Where TE's MXFP8
# quantisation writes is te_compat.quantize's MXFP8_QUANTIZE_CC (10.x only: on an H200 it writes nothing).
MXFP8_GEMM_MIN_CC = (10, 0)


@dataclass(frozen=True)
class Capabilities:
    """Runtime capabilities, as data. ``require`` raises for what is missing."""

    te_present: bool
    te_version: str | None
    te_source: str | None
    te_usable: bool
    te_reason: str
    te_in_table: bool  # the release is one the table was checked against
    te_verified: bool | None  # te-compat verify: its own source agrees with the table (None: not run)
    te_verification: str  # the verdict, or why it was not run
    table_checked_through: str
    torch_version: str | None
    cuda_device: str | None
    compute_capability: tuple[int, int] | None
    tensor_kinds: tuple[str, ...]
    grouped_tensors: bool
    swizzled_scale_flag: bool
    mxfp8_hardware: bool
    mxfp8_quantization: bool  # TE can quantise MXFP8 here: usable, a quantize row, a 10.x device
    mxfp8_quantize_api: str | None  # how TE's own quantizer writes into given buffers; None before TE 2.0
    mxfp8_reciprocal_rule: str  # "shift" or "exact": TE's exp2f_rcp, the rule a quantiser follows to match TE
    mxfp8_reciprocal_rule_source: str  # the release, file and PR that say so
    mxfp8_2d_quantization: bool  # TE 2.19+: MXFP8Quantizer(with_2d_quantization=...), 32x32 blocks
    post_all_gather_processing: bool  # TE's post_all_gather_processing takes MXFP8 weights (a no-op)
    post_all_gather_processing_reason: str
    float8_fsdp2: bool  # torch FSDP2 can shard TE's Float8 Parameters here (TE 2.10+, a CUDA device)
    mxfp8_fsdp2: bool  # ... TE's MXFP8 Parameters (TE 2.10+, compute capability >= 10.0)
    fsdp2_reasons: dict[str, str]
    cuda_core: bool  # deprecated (one release): mok.backend.has_cuda_core() and mok's report row say it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def missing(self, *features: str) -> dict[str, str]:
        """Feature -> why it is unavailable, for each of ``features`` that is. The features of
        ``TE_FEATURES`` are all missing while TE is present but not usable (its import failed)."""
        return self._missing(features)

    def require(self, *features: str) -> None:
        """Raise MissingFeatureError naming every missing feature and why."""
        missing = self._missing(features)
        if missing:
            raise MissingFeatureError(describe_missing(missing))

    def _missing(self, features: tuple[str, ...]) -> dict[str, str]:
        """:meth:`missing`'s answer, for :meth:`missing` and :meth:`require`: a deprecated
        feature warns at the line that called either of them."""
        out: dict[str, str] = {}
        for name in features:
            check = FEATURES.get(name) if isinstance(name, str) else None
            if check is None:
                raise ValueError(f"unknown feature {describe(name)}; expected one of {', '.join(FEATURES)}")
            if name in _DEPRECATED_FEATURES:
                # this frame, then missing() or require(), then their caller
                warnings.warn(_DEPRECATED_FEATURES[name], DeprecationWarning, stacklevel=3)
            ok, why = check(self)
            if not ok:
                out[name] = why
        return out


def describe_missing(missing: dict[str, str]) -> str:
    """One line naming every missing feature and why (what :meth:`Capabilities.require` raises)."""
    return "required feature(s) not available: " + "; ".join(f"{k}: {v}" for k, v in missing.items())


def _te_reason(c: Capabilities) -> str:
    return c.te_reason if not c.te_usable else ""


def _kind(kind: TensorKind) -> Callable[[Capabilities], tuple[bool, str]]:
    def check(c: Capabilities) -> tuple[bool, str]:
        if kind.value in c.tensor_kinds:
            return True, ""
        first = table.rows_for(kind)[0].since
        return False, f"needs TE >= {first}; found {c.te_version or 'no TE'}"

    return check


def _quantize_reason(c: Capabilities) -> str:
    """Why TE cannot quantise MXFP8 in this process (te_compat.quantize.support's rule)."""
    release = None
    if c.te_version is not None:
        try:
            release = release_of(parse_te_version(c.te_version))
        except TEVersionError:
            pass
    why = support(release, c.te_usable, c.compute_capability)[1]
    return why or "TE can quantise MXFP8 on this device"


def _selftest(c: Capabilities) -> tuple[bool, str]:
    """te_compat.selftest(): run once per process, whatever else ``c`` says."""
    from te_compat.selfcheck import selftest

    result = selftest()
    return result.ok, result.failures() or f"every check that ran passed: {result.summary()}"


def _cuda_kernel(c: Capabilities) -> tuple[bool, str]:
    """Deprecated (one release): mok's kernel is mok's to describe, ``mok.kernel_backend("cuda")``.
    :meth:`Capabilities.missing` and :meth:`Capabilities.require` warn (:data:`_DEPRECATED_FEATURES`)."""
    return (
        c.cuda_core and c.cuda_device is not None,
        f"mok's CUDA kernel needs cuda.core ({'present' if c.cuda_core else 'pip install te-compat[cuda]'}) "
        f"and a CUDA device ({c.cuda_device or 'none visible to torch'})",
    )


# deprecated features: what asking for one warns
_DEPRECATED_FEATURES = {
    "cuda_kernel": "te_compat's 'cuda_kernel' feature is deprecated; use mok.kernel_backend('cuda'), which raises "
    "MissingFeatureError saying what mok's kernel lacks",
}

_CHECKS: dict[str, Callable[[Capabilities], tuple[bool, str]]] = {
    "te": lambda c: (c.te_usable, _te_reason(c) or "transformer_engine is usable"),
    "cuda": lambda c: (c.cuda_device is not None, "no CUDA device visible to torch"),
    "float8": _kind(TensorKind.FLOAT8),
    "mxfp8": _kind(TensorKind.MXFP8),
    "float8_blockwise": _kind(TensorKind.FLOAT8_BLOCKWISE),
    "nvfp4": _kind(TensorKind.NVFP4),
    "grouped": _kind(TensorKind.GROUPED),
    "hybrid": _kind(TensorKind.HYBRID),
    "verified": lambda c: (bool(c.te_verified), c.te_verification),
    "swizzled_scale_flag": lambda c: (c.swizzled_scale_flag, f"needs TE >= 2.12; found {c.te_version or 'no TE'}"),
    "mxfp8_hardware": lambda c: (
        c.mxfp8_hardware,
        f"MXFP8 GEMMs need compute capability >= {MXFP8_GEMM_MIN_CC[0]}.{MXFP8_GEMM_MIN_CC[1]}; "
        f"found {c.compute_capability or 'no CUDA device'}",
    ),
    "mxfp8_quantization": lambda c: (c.mxfp8_quantization, _quantize_reason(c)),
    "post_all_gather_processing": lambda c: (c.post_all_gather_processing, c.post_all_gather_processing_reason),
    "float8_fsdp2": lambda c: (c.float8_fsdp2, c.fsdp2_reasons["float8"]),
    "mxfp8_fsdp2": lambda c: (c.mxfp8_fsdp2, c.fsdp2_reasons["mxfp8"]),
    "cuda_kernel": _cuda_kernel,
    "selftest": _selftest,
}

# Features that use the installed TE: where TE is present but unusable (its import failed), each
# is missing, naming why, whatever its release offers. The others (cuda, mxfp8_hardware,
# cuda_kernel) are about the device and mok's kernel, which need no TE.
TE_FEATURES = (
    "te",
    "float8",
    "mxfp8",
    "float8_blockwise",
    "nvfp4",
    "grouped",
    "hybrid",
    "verified",
    "swizzled_scale_flag",
    "mxfp8_quantization",
    "post_all_gather_processing",
    "float8_fsdp2",
    "mxfp8_fsdp2",
)


def _needs_usable_te(check: Callable[[Capabilities], tuple[bool, str]]) -> Callable[[Capabilities], tuple[bool, str]]:
    def usable_te_first(c: Capabilities) -> tuple[bool, str]:
        if c.te_present and not c.te_usable:
            te = f"Transformer Engine {c.te_version}" if c.te_version else "Transformer Engine"
            return False, f"{te} is present but not usable: {c.te_reason}"
        return check(c)

    return usable_te_first


FEATURES: dict[str, Callable[[Capabilities], tuple[bool, str]]] = {
    name: _needs_usable_te(check) if name in TE_FEATURES else check for name, check in _CHECKS.items()
}


def _verification(present: bool, verify: bool) -> tuple[bool | None, str]:
    if not verify:
        return None, "not run (verify=False)"
    if not present:
        return None, "no Transformer Engine to verify"
    from te_compat.verify import verify_installed

    try:
        result = verify_installed()
    except TECompatError as exc:
        return None, f"not verified: {exc}"
    return result.ok, result.verdict


def capabilities(*, import_te: bool = True, verify: bool = True) -> Capabilities:
    """Probe the process once (imports TE when ``import_te``; never raises for a broken TE, only
    for an argument that is not a bool).

    ``verify`` checks the installed TE's own source against the release table (te_compat.verify;
    about 150 ms the first time, without importing TE)."""
    for name, value in (("import_te", import_te), ("verify", verify)):
        if not isinstance(value, bool):
            raise TypeError(f"capabilities: {name}: expected a bool (True or False); found {describe(value)}")
    status = te_import_status() if import_te else te_status()
    release = release_of(status.version) if status.version is not None else None
    kinds = table.kinds_in(release) if release is not None else ()
    swizzle_flag = release is not None and (
        (row := table.row_for(TensorKind.MXFP8, release)) is not None and "scales_swizzled" in row.storage
    )
    try:
        import torch

        torch_version: str | None = str(torch.__version__)
    except ImportError:
        torch_version = None
    device, cc, _ = cuda_device()
    qrow = quantize_row(release) if release is not None else None
    usable = bool(status.usable) if import_te else status.present
    verified, verdict = _verification(status.present, verify)
    rule, rule_source = reciprocal_rule_source()
    gather, gather_reason = post_all_gather_support(release, usable)
    fsdp2 = {kind: fsdp2_support(kind, release, cc) for kind in ("float8", "mxfp8")}
    return Capabilities(
        te_present=status.present,
        te_version=str(status.version) if status.version is not None else status.raw_version,
        te_source=status.source,
        te_usable=usable,
        te_reason=status.reason or ("not imported (import_te=False)" if not import_te else ""),
        te_in_table=release is not None and release <= Version(table.CHECKED_THROUGH),
        te_verified=verified,
        te_verification=verdict,
        table_checked_through=table.CHECKED_THROUGH,
        torch_version=torch_version,
        cuda_device=device,
        compute_capability=cc,
        tensor_kinds=tuple(k.value for k in kinds),
        grouped_tensors=TensorKind.GROUPED in kinds,
        swizzled_scale_flag=bool(swizzle_flag),
        mxfp8_hardware=cc is not None and cc >= MXFP8_GEMM_MIN_CC,
        mxfp8_quantization=support(release, usable, cc)[0],
        mxfp8_quantize_api=None if qrow is None or release is None else describe_quantize(qrow, release),
        mxfp8_reciprocal_rule=rule,
        mxfp8_reciprocal_rule_source=rule_source,
        mxfp8_2d_quantization=two_d_quantization(release)[0],
        post_all_gather_processing=gather,
        post_all_gather_processing_reason=gather_reason,
        float8_fsdp2=fsdp2["float8"][0],
        mxfp8_fsdp2=fsdp2["mxfp8"][0],
        fsdp2_reasons={kind: why for kind, (_, why) in fsdp2.items()},
        cuda_core=cuda_core_present(),
    )
