"""mok's checks for ``te_compat.selftest()`` (entry point ``te_compat.selftest``: ``mok = mok.selftest:checks``).

Each check proves one thing mok does on this machine, by comparing what mok gives with an oracle
that does not come from mok: the layout spec's hand-checkable vectors and its byte-offset formula
(``shared/spec/mxfp8-scale-layout.md``, copied here as data), hand-computed quantisation results,
the torch reference on this device, and, where TE is usable, TE's own swizzle, dequantize and
quantizer. Where what a check needs is missing (TE, a GPU, cuda.core, a release with the format)
it raises ``te_compat.SkipCheck`` saying so. They run in at most a few seconds on a GPU: tiny
layers (2 experts), one shape each (224 x 160 or 224 x 320: padded both ways); the first run of
mok's kernels includes their compilation.

Every comparison with TE runs on bytes this module wrote into TE's buffers first (TE's MXFP8
quantizers write nothing on compute capability 9.x), and must see many distinct values, so no
check can pass on empty buffers. Importing this module imports torch, mok and te_compat; TE only
inside the checks that use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from packaging.version import Version

import mok
import te_compat
from mok.quantize_reference import (
    ReciprocalRule,
    dequantize_mxfp8_reference,
    installed_rule,
    quantize_mxfp8_reference,
)
from te_compat import SkipCheck, TensorKind, factory
from te_compat import table as te_table
from te_compat.behaviour import reciprocal_rule_source
from te_compat.geometry import MXFP8
from te_compat.geometry import roundup as _roundup
from te_compat.version import release_of

EXPERTS = 2
MXFP8_SHAPE = (224, 160)  # rows pad to 256, K/32 = 5 scale columns to 8
NVFP4_SHAPE = (224, 320)  # rows pad to 256, K/16 = 20 to 24, M/16 = 14 to 16
MIN_DISTINCT = 32  # of 256 byte values: random bytes over >= 1000 positions give about 250
SEED = 45
KERNEL = "cuda"  # the backend the kernel checks ask for: mok's CUDA kernel

# --- the layout spec, independently of mok ------------------------------------------------------

# shared/spec/mxfp8-scale-layout.md, "Hand-checkable vectors": (R, C, ((r, c, byte offset), ...))
SPEC_VECTORS: tuple[tuple[int, int, tuple[tuple[int, int, int], ...]], ...] = (
    (
        128,
        4,
        ((0, 3, 3), (1, 0, 16), (31, 3, 499), (32, 0, 4), (33, 1, 21), (64, 2, 10), (96, 3, 15), (100, 1, 77)),
    ),
    (128, 4, ((127, 3, 511),)),
    (256, 8, ((0, 4, 512), (127, 4, 1020), (128, 0, 1024), (130, 5, 1569), (255, 7, 2047))),
    (200, 6, ((199, 5, 1657),)),  # padded to 256 x 8: 2048 bytes, every byte no entry maps to 0
)
# "Columnwise, data M=256, K=256: Scol[5,130] lands at 1569 (it is S'[130,5])": (M, K, i, j, offset)
SPEC_COLUMNWISE = (256, 256, 5, 130, 1569)


def spec_offsets(rows: int, columns: int) -> torch.Tensor:
    """The spec's byte offset of every ``S[r, c]`` of a logical ``[rows, columns]`` matrix (int64):
    ``((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``."""
    cp = _roundup(columns, 4)
    r = torch.arange(rows).view(rows, 1)
    c = torch.arange(columns).view(1, columns)
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def spec_layout(logical: torch.Tensor) -> torch.Tensor:
    """The spec's layout bytes of uint8 ``[R, C]`` or ``[E, R, C]`` logical scales, flat, on the
    CPU: each expert padded on its own to ``roundup(R,128) x roundup(C,4)``, padding 0."""
    batch = logical.cpu() if logical.dim() == 3 else logical.cpu().unsqueeze(0)
    experts, rows, columns = batch.shape
    size = _roundup(rows, 128) * _roundup(columns, 4)
    out = torch.zeros(experts * size, dtype=torch.uint8)
    offsets = spec_offsets(rows, columns).reshape(-1)
    for e in range(experts):
        out[e * size + offsets] = batch[e].reshape(-1)
    return out


# --- comparisons ------------------------------------------------------------------------------


def same_bytes(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Byte identity, or an AssertionError saying how many bytes differ and where the first is."""
    a = ours.detach().reshape(-1).view(torch.uint8).cpu()
    b = theirs.detach().reshape(-1).view(torch.uint8).cpu()
    if a.numel() != b.numel():
        raise AssertionError(f"{what}: mok has {a.numel()} bytes, the oracle {b.numel()}")
    if not torch.equal(a, b):
        where = (a != b).nonzero()
        first = int(where[0])
        raise AssertionError(
            f"{what}: {where.numel()} of {a.numel()} bytes differ (first at byte {first}: mok "
            f"{int(a[first]):#04x}, expected {int(b[first]):#04x})"
        )


def distinct(region: torch.Tensor, what: str, minimum: int = MIN_DISTINCT) -> None:
    """The compared bytes hold many values: a comparison on empty (or unseeded) buffers cannot pass."""
    found = int(torch.unique(region.reshape(-1).view(torch.uint8)).numel())
    if found < minimum:
        raise AssertionError(
            f"{what}: the compared bytes hold only {found} distinct values (expected >= {minimum}): "
            "they were not seeded, and a comparison on them proves nothing"
        )


def same_values(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Equal fp32 values, NaN where the other has NaN."""
    a, b = ours.float().cpu(), theirs.float().cpu()
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)) or not torch.equal(a[~nan], b[~nan]):
        differ = int(((a != b) & ~(nan & torch.isnan(b))).sum())
        raise AssertionError(f"{what}: {differ} of {a.numel()} values differ")


def fill_random_(generator: torch.Generator, *buffers: torch.Tensor | None, low: int = 0, high: int = 256) -> None:
    """Overwrite each whole buffer (padding included) in place with random bytes in [low, high)."""
    for buf in buffers:
        if buf is None:
            continue
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(low, high, raw.shape, dtype=torch.uint8, generator=generator).to(raw.device))


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


# --- what this machine has ----------------------------------------------------------------------


def _cuda_device() -> torch.device:
    """The current CUDA device, or SkipCheck naming why there is none."""
    name, cc, why = te_compat.cuda_device()
    if name is None or cc is None:
        raise SkipCheck(f"needs a CUDA device: {why}")
    return torch.device("cuda", torch.cuda.current_device())


def _sync(device: torch.device) -> None:
    """Wait for the device's work: a kernel's fault surfaces in the check that launched it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _kernel_device() -> torch.device:
    """The CUDA device mok's kernel runs on here, or SkipCheck naming what is missing."""
    device = _cuda_device()
    try:
        choice = mok.kernel_backend("auto")
    except Exception as exc:  # an invalid TE_COMPAT_KERNEL_BACKEND: the kernel was not asked for
        raise SkipCheck(f"mok's kernel backend: {exc}") from None
    if choice.name != "cuda":
        raise SkipCheck(f"mok's CUDA kernel is not available: {choice.reason}")
    return device


def _release_for_fakes() -> tuple[str | None, str]:
    """(the release to pretend while reading fakes, or None to read the installed TE's; its name)."""
    status = te_compat.te_status()
    if status.version is not None:
        return None, str(status.version)
    newest = te_table.CHECKED_THROUGH
    return newest, newest


@contextlib.contextmanager
def _fakes_release() -> Iterator[str]:
    pretend, release = _release_for_fakes()
    if pretend is None:
        yield release
        return
    from te_compat.testing import installed_release

    with installed_release(pretend):
        yield release


def _kinds(release: str) -> tuple[TensorKind, ...]:
    return te_table.kinds_in(release_of(te_compat.parse_te_version(release)))


# --- the checks that need neither TE nor a GPU ---------------------------------------------------


def check_layout_spec() -> str:
    """mok's conversion (the torch reference) puts every byte where the spec's vectors say, pads
    with zeros, and its inverse gives the scales back."""
    for rows, columns, vectors in SPEC_VECTORS:
        given = spec_offsets(rows, columns)
        for r, c, offset in vectors:
            if int(given[r, c]) != offset:  # the oracle's own formula against the spec's numbers
                raise AssertionError(
                    f"spec formula: S[{r},{c}] of {rows}x{columns} at {int(given[r, c])}; spec {offset}"
                )
        logical = torch.zeros(rows, columns, dtype=torch.uint8)
        for i, (r, c, _) in enumerate(vectors):
            logical[r, c] = i + 1
        out = mok.swizzle_mxfp8_scales(logical, backend="torch").reshape(-1)
        expected = torch.zeros(_roundup(rows, 128) * _roundup(columns, 4), dtype=torch.uint8)
        for i, (_, _, offset) in enumerate(vectors):
            expected[offset] = i + 1
        same_bytes(out, expected, f"the spec's {rows}x{columns} vectors")
    m, k, i, j, offset = SPEC_COLUMNWISE
    columnwise = torch.zeros(m // MXFP8.block, k, dtype=torch.uint8)
    columnwise[i, j] = 7
    out = mok.swizzle_mxfp8_scales(columnwise.t(), backend="torch").reshape(-1)  # S' = Scol.T
    if int(out[offset]) != 7 or int(out.count_nonzero()) != 1:
        raise AssertionError(f"columnwise Scol[{i},{j}] of data {m}x{k}: expected at byte {offset} alone")
    logical = torch.randint(0, 256, (EXPERTS, 200, 6), dtype=torch.uint8, generator=_generator())
    layout = mok.swizzle_mxfp8_scales(logical, backend="torch")
    same_bytes(layout, spec_layout(logical), "random [2, 200, 6] scales")
    back = mok.unswizzle_mxfp8_scales(layout, rows=200, columns=6 * MXFP8.block, experts=EXPERTS, backend="torch")
    same_bytes(back, logical, "the inverse of random [2, 200, 6] scales")
    return f"{sum(len(v) for _, _, v in SPEC_VECTORS) + 1} vectors of the spec, padding and the inverse"


def _mxfp8_logical(storage: te_compat.MXFP8Storage, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The matrices a GEMM reads (rowwise ``[M, K/32]``, columnwise ``[K, M/32]``) over TE's
    buffers, as te_compat's geometry reads them (its own self-test holds that to TE's buffers)."""
    if tuple(storage.shape) != (rows, columns):
        raise AssertionError(f"expected an MXFP8 weight of shape {(rows, columns)}; found {storage.shape}")
    return storage.scale_matrix("rowwise"), storage.scale_matrix("columnwise")


def _compare_split(
    view: mok.SplitExpertWeights,
    params: Sequence[object],
    rows: int,
    columns: int,
    what: str,
    minimum: int = MIN_DISTINCT,
) -> None:
    """A split MXFP8 view's layouts and pointer tables against the spec, over TE's logical scales
    (holding at least ``minimum`` distinct values)."""
    for e, p in enumerate(params):
        s = te_compat.mxfp8_storage(p)
        row, col = _mxfp8_logical(s, rows, columns)
        distinct(row, f"{what} expert {e} rowwise scales", minimum)
        if view.rowwise.scales is None or view.columnwise is None or view.columnwise.scales is None:
            raise AssertionError(f"{what}: the view has no MXFP8 scales in both directions")
        same_bytes(view.rowwise.scales[e], spec_layout(row), f"{what} expert {e} rowwise")
        same_bytes(view.columnwise.scales[e], spec_layout(col), f"{what} expert {e} columnwise")
        if s.rowwise_data is None or view.rowwise.data_ptrs is None:
            raise AssertionError(f"{what}: no rowwise payload or pointer table")
        if int(view.rowwise.data_ptrs[e]) != s.rowwise_data.data_ptr():
            raise AssertionError(f"{what} expert {e}: the pointer table does not hold TE's rowwise payload")


def check_views_over_fakes() -> str:
    """Views over te_compat.testing fakes of this release (per expert and grouped MXFP8, NVFP4,
    hybrid, 2-D MXFP8) hold the spec's layout of the fakes' scales and point at their payloads."""
    from te_compat.testing import fake_grouped, fake_hybrid, fake_mxfp8, fake_nvfp4

    rows, columns = MXFP8_SHAPE
    done = []
    with _fakes_release() as release:
        kinds = _kinds(release)
        if TensorKind.MXFP8 not in kinds:
            raise SkipCheck(f"TE {release} has no MXFP8 tensors (TE 2.0+)")
        params = [fake_mxfp8(MXFP8_SHAPE, param=True, seed=SEED + e) for e in range(EXPERTS)]
        view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8", backend="torch")
        _compare_split(view, params, rows, columns, "split mxfp8")
        back = mok.logical_scales(view, direction="columnwise")
        for e, p in enumerate(params):
            s = te_compat.mxfp8_storage(p)
            same_bytes(back[e], _mxfp8_logical(s, rows, columns)[1].t(), f"expert {e} columnwise read back")
        done.append("mxfp8")
        if any(r.storage == "quantized_2d" for r in te_table.quantizer_flag_rows(TensorKind.MXFP8, _v(release))):
            two_d = [fake_mxfp8(MXFP8_SHAPE, param=True, seed=SEED + e, quantized_2d=True) for e in range(EXPERTS)]
            if not all(te_compat.mxfp8_storage(p).quantized_2d for p in two_d):
                raise AssertionError("te_compat does not read a 2-D quantized MXFP8 weight as one")
            view = mok.split_weight_view(two_d, rows=rows, columns=columns, format="mxfp8", backend="torch")
            blocks = (rows // MXFP8.block) * (columns // MXFP8.block)  # 35 random scales, each repeated 32 times
            _compare_split(view, two_d, rows, columns, "2-D mxfp8", minimum=blocks // 2)
            done.append("2-D mxfp8")
        if TensorKind.GROUPED in kinds:
            weight = fake_grouped((EXPERTS, rows, columns), format="mxfp8", seed=SEED)
            grouped = mok.grouped_weight_view(
                weight, num_experts=EXPERTS, rows=rows, columns=columns, format="mxfp8", backend="torch"
            )
            members = te_compat.grouped_storage(weight).members or ()
            if len(members) != EXPERTS or grouped.rowwise.scales is None or grouped.columnwise is None:
                raise AssertionError(f"grouped mxfp8: expected {EXPERTS} members and scales both ways")
            rows_expected = torch.cat(
                [spec_layout(_mxfp8_logical(te_compat.mxfp8_storage(m), rows, columns)[0]) for m in members]
            )
            same_bytes(grouped.rowwise.scales[0], rows_expected, "grouped mxfp8 rowwise")
            if grouped.columnwise.scales is None:
                raise AssertionError("grouped mxfp8: no columnwise scales")
            cols_expected = torch.cat(
                [spec_layout(_mxfp8_logical(te_compat.mxfp8_storage(m), rows, columns)[1]) for m in members]
            )
            same_bytes(grouped.columnwise.scales[0], cols_expected, "grouped mxfp8 columnwise")
            done.append("grouped mxfp8")
        if TensorKind.NVFP4 in kinds:
            nrows, ncolumns = NVFP4_SHAPE
            nparams = [fake_nvfp4(NVFP4_SHAPE, param=True, seed=SEED + e) for e in range(EXPERTS)]
            nview = mok.split_weight_view(nparams, rows=nrows, columns=ncolumns, format="nvfp4", backend="torch")
            _compare_nvfp4(nview, nparams, nrows, ncolumns, "split nvfp4")
            done.append("nvfp4")
        if TensorKind.HYBRID in kinds:
            hparams = [fake_hybrid(NVFP4_SHAPE, param=True, seed=SEED + e) for e in range(EXPERTS)]
            hview = mok.split_weight_view(
                hparams, rows=NVFP4_SHAPE[0], columns=NVFP4_SHAPE[1], format="hybrid", backend="torch"
            )
            _compare_hybrid(hview, hparams, *NVFP4_SHAPE)
            done.append("hybrid")
    return f"TE {release}'s {', '.join(done)} fakes"


def _v(release: str) -> Version:
    return release_of(te_compat.parse_te_version(release))


def _nvfp4_logical(t: object, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = te_compat.nvfp4_storage(t)
    if s.rowwise_scale_inv is None or s.columnwise_scale_inv is None:
        raise AssertionError("an NVFP4 weight without both scale directions")
    kind = TensorKind.NVFP4
    return (
        te_compat.scale_matrix(s.rowwise_scale_inv, rows, columns, kind=kind, direction="rowwise"),
        te_compat.scale_matrix(s.columnwise_scale_inv, rows, columns, kind=kind, direction="columnwise"),
    )


def _compare_nvfp4(view: mok.SplitExpertWeights, params: Sequence[object], rows: int, columns: int, what: str) -> None:
    if view.rowwise.scales is None or view.columnwise is None or view.columnwise.scales is None:
        raise AssertionError(f"{what}: the view has no NVFP4 scales in both directions")
    for e, p in enumerate(params):
        row, col = _nvfp4_logical(p, rows, columns)
        distinct(row, f"{what} expert {e} rowwise scales")
        same_bytes(view.rowwise.scales[e], spec_layout(row.contiguous()), f"{what} expert {e} rowwise")
        same_bytes(view.columnwise.scales[e], spec_layout(col.contiguous()), f"{what} expert {e} columnwise")


def _compare_hybrid(view: mok.SplitExpertWeights, params: Sequence[object], rows: int, columns: int) -> None:
    """Each direction of a hybrid view against the spec over its own sub-storage's scales."""
    if view.rowwise.scales is None or view.columnwise is None or view.columnwise.scales is None:
        raise AssertionError("hybrid: the view has no scales in both directions")
    for e, p in enumerate(params):
        h = te_compat.hybrid_storage(p)
        parts = (
            (view.rowwise.scales[e], h.rowwise, "rowwise"),
            (view.columnwise.scales[e], h.columnwise, "columnwise"),
        )
        for ours, sub, direction in parts:
            kind = te_compat.tensor_kind(sub)
            if kind is TensorKind.MXFP8:
                s = te_compat.mxfp8_storage(sub)
                buffer = s.rowwise_scale_inv if direction == "rowwise" else s.columnwise_scale_inv
            elif kind is TensorKind.NVFP4:
                n = te_compat.nvfp4_storage(sub)
                buffer = n.rowwise_scale_inv if direction == "rowwise" else n.columnwise_scale_inv
            else:
                continue  # an identity (high-precision) direction has no scales to lay out
            if buffer is None:
                raise AssertionError(f"hybrid expert {e}: its {kind} sub-storage has no {direction} scales")
            logical = te_compat.scale_matrix(buffer, rows, columns, kind=kind, direction=direction)
            same_bytes(ours, spec_layout(logical.contiguous()), f"hybrid expert {e} {direction} ({kind})")


# hand-computed quantisations of one 32 x 64 BF16 block row (mok/quantize_reference.py has the
# rule): row 0 = 1.0 x32 | 0 x32; row 1 = 2^-130 x32 | -1.0 x32; row 2 = inf, 1.0 x31 | 3.0 x32;
# rows 3-31 zero. E4M3: 1.0*2^8 = 0x78, -1.0*2^7 = 0xF0, 3.0*2^7 = 0x7C, 448 = 0x7E, NaN = 0x7F,
# 2^-130*2^127 = 0.125 = 0x20, -1.0*2^8 = 0xF8. Codes: amax 1 -> 119, amax 3 -> 120, inf -> 254.
# Under SHIFT code 0 multiplies by 1 and code 254 by 0; under EXACT by 2^127 and 2^-127.
_TINY = 2.0**-130


def _hand_input() -> torch.Tensor:
    x = torch.zeros(32, 64, dtype=torch.float32)
    x[0, :32] = 1.0
    x[1, :32] = _TINY
    x[1, 32:] = -1.0
    x[2, 0] = float("inf")
    x[2, 1:32] = 1.0
    x[2, 32:] = 3.0
    return x.to(torch.bfloat16)


def _hand_expected(rule: ReciprocalRule) -> dict[str, dict[tuple[int, int], int]]:
    """Every byte of the hand-computed result that is not zero: (row, column) -> byte, per output."""
    shift = rule is ReciprocalRule.SHIFT
    row_scales = {(0, 0): 119, (1, 1): 119, (2, 0): 254, (2, 1): 120}
    row_data: dict[tuple[int, int], int] = {}
    for j in range(32):
        row_data[(0, j)] = 0x78
        row_data[(1, 32 + j)] = 0xF8
        row_data[(2, 32 + j)] = 0x7C
        if not shift:
            row_data[(1, j)] = 0x20  # 2^-130 * 2^127 (under SHIFT: 2^-130 * 1 rounds to 0)
    row_data[(2, 0)] = 0x7F if shift else 0x7E  # inf * 0 = NaN; inf * 2^-127 saturates to 448
    # columnwise: column 0 holds the infinity (code 254: 1.0 * 0 or 1.0 * 2^-127 round to 0);
    # columns 1-31 amax 1 (119); columns 32-63 amax 3 (120)
    col_scales = {(0, 0): 254, **{(0, j): 119 for j in range(1, 32)}, **{(0, j): 120 for j in range(32, 64)}}
    col_data = {(2, 0): 0x7F if shift else 0x7E}
    for j in range(1, 32):
        col_data[(0, j)] = 0x78
        col_data[(2, j)] = 0x78
    for j in range(32, 64):
        col_data[(1, j)] = 0xF0
        col_data[(2, j)] = 0x7C
    return {"row_data": row_data, "row_scales": row_scales, "col_data": col_data, "col_scales": col_scales}


def _against_hand(result: dict[str, torch.Tensor], rule: ReciprocalRule, what: str) -> None:
    for name, expected in _hand_expected(rule).items():
        got = result[name].reshape(result[name].shape[-2:]).view(torch.uint8).cpu()
        want = torch.zeros_like(got)
        for (r, c), byte in expected.items():
            want[r, c] = byte
        same_bytes(got, want, f"{what} {name} (rule {rule.value})")


def check_quantize_reference() -> str:
    """mok's quantisation reference gives the hand-computed bytes, under both reciprocal rules."""
    x = _hand_input()
    for rule in ReciprocalRule:
        q = quantize_mxfp8_reference(x, rule)
        _against_hand(q._asdict(), rule, "reference")
    back = dequantize_mxfp8_reference(q.row_data, q.row_scales, "rowwise")
    if float(back[0, 0]) != 1.0 or float(back[1, 40]) != -1.0 or float(back[2, 40]) != 3.0:
        raise AssertionError("the reference's dequantisation does not give the values back")
    return "zero, tiny, infinite and ordinary blocks, both rules, both directions"


def _quantised(x: torch.Tensor, backend: str) -> dict[str, torch.Tensor]:
    """mok.quantize_mxfp8's outputs with the scales read back into their logical matrices."""
    q = mok.quantize_mxfp8(x, backend=backend)
    rows, columns = x.shape[-2:]
    experts = 1 if x.dim() == 2 else x.shape[0]
    row = mok.unswizzle_mxfp8_scales(q.row_scales, rows=rows, columns=columns, experts=experts, backend="torch")
    col = mok.unswizzle_mxfp8_scales(q.col_scales, rows=columns, columns=rows, experts=experts, backend="torch")
    return {"row_data": q.row_data, "row_scales": row, "col_data": q.col_data, "col_scales": col.transpose(-1, -2)}


def followed_rule(device: torch.device | None = None, backend: str = "torch") -> ReciprocalRule | None:
    """The rule mok.quantize_mxfp8 follows on ``device`` (by default the CPU), found by quantising
    the hand-computed blocks that tell the rules apart; None when it follows neither."""
    x = _hand_input() if device is None else _hand_input().to(device)
    got = {k: v.cpu() for k, v in _quantised(x, backend).items()}
    for rule in ReciprocalRule:
        try:
            _against_hand(got, rule, "mok.quantize_mxfp8")
        except AssertionError:
            continue
        return rule
    return None


def check_quantiser_rule() -> str:
    """mok.quantize_mxfp8 follows the installed TE's reciprocal rule (te_compat's table: the
    newest where TE is absent), on the CPU and, with mok's kernel, on this device."""
    expected = installed_rule()
    rule, source = reciprocal_rule_source()
    places: list[tuple[str, torch.device | None, str]] = [("the CPU", None, "torch")]
    try:
        kernel = _kernel_device()
        places.append((f"{kernel} (mok's kernel)", kernel, KERNEL))
    except SkipCheck:
        pass
    for where, device, backend in places:
        found = followed_rule(device, backend)
        if found is not expected:
            follows = "neither rule" if found is None else f"the {found.value} rule"
            raise AssertionError(f"on {where} mok's quantiser follows {follows}; TE's is {rule} ({source})")
    return f"the {expected.value} rule ({source})"


# --- the checks that need a GPU (and cuda.core) -------------------------------------------------


def check_kernel_swizzle() -> str:
    """mok's CUDA kernel gives the spec's layout of random scales on this device, one launch for
    several experts, and its inverse gives them back."""
    device = _kernel_device()
    generator = _generator()
    done = 0
    for rows, columns in ((224, 5), (256, 8)):
        logical = torch.randint(0, 256, (3, rows, columns), dtype=torch.uint8, generator=generator)
        layout = mok.swizzle_mxfp8_scales(logical.to(device), backend=KERNEL)
        same_bytes(layout, spec_layout(logical), f"kernel layout of [3, {rows}, {columns}]")
        back = mok.unswizzle_mxfp8_scales(layout, rows=rows, columns=columns * MXFP8.block, experts=3, backend=KERNEL)
        same_bytes(back, logical, f"kernel inverse of [3, {rows}, {columns}]")
        many = mok.swizzle_mxfp8_scales_many([m.to(device) for m in logical], backend=KERNEL)
        same_bytes(
            torch.cat([m.reshape(-1) for m in many]), spec_layout(logical), f"kernel many of [{rows}, {columns}]"
        )
        done += 1
    _sync(device)
    return f"{done} shapes, 3 experts each, on {device}"


def check_kernel_refresh() -> str:
    """A view of per-expert and grouped MXFP8 weights (fakes on this device) converted by mok's
    kernel, then refreshed in place (``cached=``) after their scales changed: same addresses,
    the spec's layout of the new bytes."""
    device = _kernel_device()
    from te_compat.testing import fake_grouped, fake_mxfp8

    rows, columns = MXFP8_SHAPE
    generator = _generator()
    with _fakes_release() as release:
        if TensorKind.MXFP8 not in _kinds(release):
            raise SkipCheck(f"TE {release} has no MXFP8 tensors (TE 2.0+)")
        params = [fake_mxfp8(MXFP8_SHAPE, param=True, seed=SEED + e, device=device) for e in range(EXPERTS)]
        view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8", backend=KERNEL)
        _compare_split(view, params, rows, columns, "kernel view")
        if view.rowwise.scale_ptrs is None:
            raise AssertionError("kernel view: no scale pointer table")
        addresses = view.rowwise.scale_ptrs.tolist()
        for p in params:
            s = te_compat.mxfp8_storage(p)
            fill_random_(generator, s.rowwise_scale_inv, s.columnwise_scale_inv)
        again = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8", cached=view)
        if again is not view or view.rowwise.scale_ptrs.tolist() != addresses:
            raise AssertionError("the refresh moved the view's scale buffers (a CUDA graph would read stale ones)")
        _compare_split(view, params, rows, columns, "kernel refresh")
        if TensorKind.GROUPED in _kinds(release):
            weight = fake_grouped((EXPERTS, rows, columns), format="mxfp8", seed=SEED, device=device)
            grouped = mok.grouped_weight_view(
                weight, num_experts=EXPERTS, rows=rows, columns=columns, format="mxfp8", backend=KERNEL
            )
            gs = te_compat.grouped_storage(weight)
            fill_random_(generator, gs.rowwise_scale_inv, gs.columnwise_scale_inv)
            mok.grouped_weight_view(
                weight, num_experts=EXPERTS, rows=rows, columns=columns, format="mxfp8", cached=grouped
            )
            members = gs.members or ()
            if grouped.rowwise.scales is None:
                raise AssertionError("grouped kernel view: no rowwise scales")
            expected = torch.cat(
                [spec_layout(_mxfp8_logical(te_compat.mxfp8_storage(m), rows, columns)[0]) for m in members]
            )
            same_bytes(grouped.rowwise.scales[0], expected, "grouped kernel refresh rowwise")
    _sync(device)
    return f"TE {release}'s layouts on {device}, refreshed in place"


def _special_batch(device: torch.device) -> torch.Tensor:
    """BF16 [2, 64, 96]: random values of many magnitudes, with the hand-computed blocks (zero,
    tiny, infinite) in the first expert's corner."""
    generator = _generator()
    x = torch.randn(2, 64, 96, generator=generator) * torch.exp2(
        torch.randint(-20, 21, (2, 64, 1), generator=generator)
    )
    x[0, :32, :64] = _hand_input().float()
    return x.to(torch.bfloat16).to(device)


def check_kernel_quantize() -> str:
    """mok's quantize kernel gives the torch reference's bytes on this device, and quantises
    again in place (``out=``)."""
    device = _kernel_device()
    x = _special_batch(device)
    ours = mok.quantize_mxfp8(x, backend=KERNEL)
    reference = mok.quantize_mxfp8(x, backend="torch")
    for name in ("row_data", "row_scales", "col_data", "col_scales"):
        same_bytes(getattr(ours, name), getattr(reference, name), f"kernel {name}")
    addresses = [t.data_ptr() for t in ours]
    again = mok.quantize_mxfp8(x * 2, out=ours, backend=KERNEL)
    reference = mok.quantize_mxfp8(x * 2, backend="torch")
    if again is not ours or [t.data_ptr() for t in ours] != addresses:
        raise AssertionError("quantize_mxfp8(out=) moved its outputs")
    for name in ("row_data", "row_scales", "col_data", "col_scales"):
        same_bytes(getattr(ours, name), getattr(reference, name), f"kernel {name} in place")
    _sync(device)
    return f"[2, 64, 96] on {device}, special blocks included"


# --- the checks that need TE (and a GPU) ---------------------------------------------------------


def _te() -> tuple[str, torch.device]:
    """(the installed TE's release, the CUDA device) where TE is usable; else SkipCheck saying
    why. TE's tensors live on a CUDA device: none is a skip too. TE's objects are made by
    te_compat.factory: mok imports no TE."""
    status = te_compat.te_status()
    if not status.present:
        raise SkipCheck("no Transformer Engine installed")
    caps = te_compat.capabilities(verify=False)
    if not caps.te_usable:
        raise SkipCheck(f"Transformer Engine is not usable: {caps.te_reason}")
    return str(status.version), _cuda_device()


def _need(release: str, kind: TensorKind) -> None:
    if kind not in _kinds(release):
        first = te_table.rows_for(kind)[0].since
        raise SkipCheck(f"TE {release} has no {kind.value} tensors (TE {first}+)")


def _seed_mxfp8(generator: torch.Generator, t: object, low: int = 1, high: int = 255) -> None:
    """Random payloads, and scale codes in [low, high): codes 0 and 255 are where TE's dequantize
    (exp2f of the code's bits: 0 for code 0, inf for 255) and the E8M0 values part; layouts move
    bytes, whatever they hold."""
    s = te_compat.mxfp8_storage(t)
    fill_random_(generator, s.rowwise_data, s.columnwise_data)
    fill_random_(generator, s.rowwise_scale_inv, s.columnwise_scale_inv, low=low, high=high)


def _per_expert_mxfp8(rows: int, columns: int, device: torch.device) -> list[torch.nn.Parameter]:
    """The per-expert MXFP8 weights of a tiny TE GroupedLinear built under MXFP8 initialisation."""
    params = factory.grouped_linear_weights(EXPERTS, rows, columns, device=device, mxfp8=True)
    kinds = {te_compat.tensor_kind(p) for p in params}
    if kinds != {TensorKind.MXFP8}:
        raise AssertionError(f"TE's GroupedLinear under MXFP8 initialisation made {sorted(map(str, kinds))} weights")
    return params


def _against_te_swizzle(
    swizzle: Callable[[object], None],
    members: Sequence[object],
    row_layouts: Sequence[torch.Tensor],
    col_layouts: Sequence[torch.Tensor],
    kind: TensorKind,
    rows: int,
    columns: int,
    what: str,
) -> None:
    """TE swizzles each member in place; its new buffers must equal mok's layouts byte for byte."""
    for e, member in enumerate(members):
        swizzle(member)
        if kind is TensorKind.MXFP8:
            s = te_compat.mxfp8_storage(member)
            swizzled, row, col = s.scales_swizzled, s.rowwise_scale_inv, s.columnwise_scale_inv
        else:
            n = te_compat.nvfp4_storage(member)
            swizzled, row, col = n.scales_swizzled, n.rowwise_scale_inv, n.columnwise_scale_inv
        if not swizzled or row is None or col is None:
            raise AssertionError(f"{what} expert {e}: TE's swizzle_scales_for_gemm_ left no swizzled scales")
        same_bytes(row_layouts[e], row, f"{what} expert {e} rowwise against TE's swizzle")
        same_bytes(col_layouts[e], col, f"{what} expert {e} columnwise against TE's swizzle")


def _split_against_te_swizzle(
    view: mok.SplitExpertWeights,
    params: Sequence[object],
    kind: TensorKind,
    shape: tuple[int, int],
    what: str,
) -> Callable[[object], None] | None:
    """A split view's layouts (copied first: TE's swizzle replaces the buffers they were read
    from) against TE's swizzle of each parameter; the swizzle, None where the release has none."""
    rows, columns = shape
    swizzle = factory.te_swizzle()
    if swizzle is None:
        return None
    if view.rowwise.scales is None or view.columnwise is None or view.columnwise.scales is None:
        raise AssertionError(f"{what}: the view has no scales in both directions")
    rows_ours = [s.clone() for s in view.rowwise.scales]
    cols_ours = [s.clone() for s in view.columnwise.scales]
    _against_te_swizzle(swizzle, params, rows_ours, cols_ours, kind, rows, columns, what)
    return swizzle


def check_te_mxfp8_split() -> str:
    """A TE GroupedLinear's per-expert MXFP8 weights, TE's buffers filled with random bytes: mok's
    view against TE's own swizzle (TE 2.12+; before it, the spec over TE's buffers)."""
    release, device = _te()
    _need(release, TensorKind.MXFP8)
    rows, columns = MXFP8_SHAPE
    params = _per_expert_mxfp8(rows, columns, device)
    generator = torch.Generator().manual_seed(SEED)
    for p in params:
        _seed_mxfp8(generator, p)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8")
    _compare_split(view, params, rows, columns, "TE mxfp8")
    if _split_against_te_swizzle(view, params, TensorKind.MXFP8, (rows, columns), "TE mxfp8") is None:
        return f"TE {release} has no swizzle_scales_for_gemm_ (TE 2.12+): compared with the spec over TE's buffers"
    return f"TE {release}: {EXPERTS} experts, byte for byte with TE's swizzle"


def check_te_mxfp8_grouped() -> str:
    """One grouped MXFP8 weight made by TE's own GroupedTensor factory (TE 2.13+), its buffers
    seeded: mok's grouped view against TE's swizzle of each member TE made for it."""
    release, device = _te()
    _need(release, TensorKind.GROUPED)
    rows, columns = MXFP8_SHAPE
    weight = factory.make_grouped_tensor(EXPERTS, (rows, columns), TensorKind.MXFP8, device=device)
    gs = te_compat.grouped_storage(weight)
    generator = torch.Generator().manual_seed(SEED)
    fill_random_(generator, gs.rowwise_data, gs.columnwise_data)
    fill_random_(generator, gs.rowwise_scale_inv, gs.columnwise_scale_inv, low=1, high=255)
    view = mok.grouped_weight_view(weight, num_experts=EXPERTS, rows=rows, columns=columns, format="mxfp8")
    members = gs.members or ()
    if (
        len(members) != EXPERTS
        or view.rowwise.scales is None
        or view.columnwise is None
        or view.columnwise.scales is None
    ):
        raise AssertionError(f"TE grouped mxfp8: expected {EXPERTS} members and scales both ways")
    if view.rowwise.data[0].data_ptr() != (gs.rowwise_data.data_ptr() if gs.rowwise_data is not None else -1):
        raise AssertionError("TE grouped mxfp8: the view's payload is not TE's buffer")
    per_row = view.rowwise.scales[0].numel() // EXPERTS
    per_col = view.columnwise.scales[0].numel() // EXPERTS
    rows_ours = [view.rowwise.scales[0].reshape(-1)[e * per_row : (e + 1) * per_row].clone() for e in range(EXPERTS)]
    cols_ours = [view.columnwise.scales[0].reshape(-1)[e * per_col : (e + 1) * per_col].clone() for e in range(EXPERTS)]
    for e, m in enumerate(members):
        row, col = _mxfp8_logical(te_compat.mxfp8_storage(m), rows, columns)
        distinct(row, f"TE grouped expert {e} rowwise scales")
        same_bytes(rows_ours[e], spec_layout(row), f"TE grouped expert {e} rowwise")
        same_bytes(cols_ours[e], spec_layout(col), f"TE grouped expert {e} columnwise")
    done = []
    grouped_swizzle = factory.te_grouped_swizzle()
    if grouped_swizzle is not None:  # TE 2.14+: the whole group at once, into new buffers of the group's
        grouped_swizzle(weight, rowwise=True, columnwise=True)
        swizzled = te_compat.grouped_storage(weight)
        if not swizzled.scales_swizzled or swizzled.rowwise_scale_inv is None or swizzled.columnwise_scale_inv is None:
            raise AssertionError("TE's grouped_swizzle_for_gemm left no swizzled scales on the group")
        same_bytes(
            view.rowwise.scales[0], swizzled.rowwise_scale_inv, "TE grouped mxfp8 rowwise against TE's grouped swizzle"
        )
        same_bytes(
            view.columnwise.scales[0],
            swizzled.columnwise_scale_inv,
            "TE grouped mxfp8 columnwise against TE's grouped swizzle",
        )
        done.append("TE's grouped swizzle")
    swizzle = factory.te_swizzle()
    if swizzle is not None:  # each member TE made for the group, on its own (its buffers are still compact)
        _against_te_swizzle(swizzle, members, rows_ours, cols_ours, TensorKind.MXFP8, rows, columns, "TE grouped mxfp8")
        done.append("TE's swizzle of each member")
    if not done:
        return f"TE {release}: compared with the spec over TE's buffers (no swizzle_scales_for_gemm_)"
    return f"TE {release}: {EXPERTS} experts in one GroupedTensor, byte for byte with {' and '.join(done)}"


def _te_call(t: object, method: str, *args: object, **kwargs: object) -> Any:
    """A method TE's quantized tensors have and torch's own do not (mypy sees torch's)."""
    return getattr(t, method)(*args, **kwargs)


def _te_dequantize(t: object) -> torch.Tensor:
    """TE's own dequantize of one of its tensors, in fp32."""
    out = _te_call(t, "dequantize", dtype=torch.float32)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"TE's dequantize returned {type(out).__name__}")
    return out


def _dequantize_device() -> None:
    """SkipCheck below compute capability 10.0: TE's MXFP8 dequantize kernel has a body only for
    __CUDA_ARCH__ >= 1000 (common/cast/mxfp8/dequantize_mxfp8.cuh, and util/dequantize_kernels.cuh
    before 2.10), so on 9.x it writes nothing and there is nothing to compare with."""
    _, cc, _ = te_compat.cuda_device()
    if cc is None or cc < (10, 0):
        found = "no CUDA device" if cc is None else f"compute capability {cc[0]}.{cc[1]}"
        raise SkipCheck(
            "TE's MXFP8 dequantize kernel has a body only for compute capability >= 10.0 "
            f"(common/cast/mxfp8/dequantize_mxfp8.cuh); found {found}"
        )


def check_te_mxfp8_dequantize() -> str:
    """Seeded MXFP8 weights read back through mok's 128x4 layout (``mok.logical_scales``) and
    dequantized give the values TE's own dequantize gives (compute capability 10.0+)."""
    release, device = _te()
    _need(release, TensorKind.MXFP8)
    _dequantize_device()
    rows, columns = MXFP8_SHAPE
    params = _per_expert_mxfp8(rows, columns, device)
    generator = torch.Generator().manual_seed(SEED)
    for p in params:  # codes 64 to 190: every product a normal fp32 number, whatever TE's kernel flushes
        _seed_mxfp8(generator, p, low=64, high=191)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8")
    back = mok.logical_scales(view, direction="rowwise")
    for e, p in enumerate(params):
        theirs = _te_dequantize(p)
        payload = view.rowwise.data[e].view(torch.float8_e4m3fn)
        ours = dequantize_mxfp8_reference(payload, back[e], "rowwise")
        same_values(ours, theirs, f"expert {e} dequantized through mok's layout against TE's dequantize")
    return f"TE {release}: {EXPERTS} experts' values equal TE's dequantize"


def check_te_mxfp8_2d() -> str:
    """TE 2.19+'s 2-D (32x32) MXFP8: te_compat reads the flag from the tensor's quantizer, mok's
    view of such a tensor holds the spec's layout of its scales, and where TE quantizes (10.x)
    each block's scale is repeated over the 1x32 positions it covers, so mok's 1x32 reading of it
    dequantizes to TE's values."""
    release, device = _te()
    flag_rows = [r for r in te_table.quantizer_flag_rows(TensorKind.MXFP8, _v(release)) if r.storage == "quantized_2d"]
    if not flag_rows:
        raise SkipCheck(f"TE {release} has no 2-D MXFP8 block scaling (TE 2.19+, PR 2634)")
    rows, columns = MXFP8_SHAPE
    params = [
        factory.make_parameter(TensorKind.MXFP8, (rows, columns), device=device, with_2d_quantization=True)
        for _ in range(EXPERTS)
    ]
    plain = factory.make_parameter(TensorKind.MXFP8, (rows, columns), device=device)
    if (
        not all(te_compat.mxfp8_storage(t).quantized_2d is True for t in params)
        or te_compat.mxfp8_storage(plain).quantized_2d is not False
    ):
        raise AssertionError("te_compat does not read with_2d_quantization from the tensors' quantizers")
    generator = torch.Generator().manual_seed(SEED)
    for p in params:
        _seed_mxfp8(generator, p)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8")
    _compare_split(view, params, rows, columns, "TE 2-D mxfp8")
    if not te_compat.capabilities(verify=False).mxfp8_quantization:
        return f"TE {release}: flag read and layout checked; TE quantizes no MXFP8 on this device: no 2-D scales made"
    x = (torch.randn(rows, columns, generator=generator) * 4).to(torch.bfloat16).to(device)
    for p in params:
        _te_call(p, "quantize_", x)
    s = te_compat.mxfp8_storage(params[0])
    row, col = _mxfp8_logical(s, rows, columns)
    per_block = row[:: MXFP8.block]  # one scale per 32x32 block, [rows/32, columns/32]
    if not torch.equal(row, per_block.repeat_interleave(MXFP8.block, dim=0)) or not torch.equal(
        col.t(), per_block.repeat_interleave(MXFP8.block, dim=1)
    ):
        raise AssertionError(
            "TE's 2-D scales are not one per 32x32 block, at every 1x32 position rowwise and columnwise"
        )
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="mxfp8")
    back = mok.logical_scales(view, direction="rowwise")
    ours = dequantize_mxfp8_reference(view.rowwise.data[0].view(torch.float8_e4m3fn), back[0], "rowwise")
    same_values(ours, _te_dequantize(params[0]), "2-D weight through mok's 1x32 layout against TE's dequantize")
    return f"TE {release}: 2-D scales one per block, read through mok's layout as TE dequantizes"


def check_te_nvfp4() -> str:
    """Per-expert NVFP4 weights from TE's own NVFP4Quantizer (and, TE 2.13+, one grouped weight),
    seeded: mok's views against TE's swizzle (TE 2.12+; before it the spec over TE's buffers)."""
    release, device = _te()
    _need(release, TensorKind.NVFP4)
    rows, columns = NVFP4_SHAPE
    params = [factory.make_parameter(TensorKind.NVFP4, (rows, columns), device=device) for _ in range(EXPERTS)]
    generator = torch.Generator().manual_seed(SEED)
    for p in params:
        n = te_compat.nvfp4_storage(p)
        fill_random_(generator, n.rowwise_data, n.rowwise_scale_inv, n.columnwise_data, n.columnwise_scale_inv)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="nvfp4")
    _compare_nvfp4(view, params, rows, columns, "TE nvfp4")
    swizzle = _split_against_te_swizzle(view, params, TensorKind.NVFP4, (rows, columns), "TE nvfp4")
    if swizzle is None:
        return f"TE {release}: compared with the spec over TE's buffers (no swizzle_scales_for_gemm_)"
    done = "per expert"
    if TensorKind.GROUPED in _kinds(release):
        weight = factory.make_grouped_tensor(EXPERTS, (rows, columns), TensorKind.NVFP4, device=device)
        gs = te_compat.grouped_storage(weight)
        fill_random_(generator, gs.rowwise_data, gs.rowwise_scale_inv, gs.columnwise_data, gs.columnwise_scale_inv)
        grouped = mok.grouped_weight_view(weight, num_experts=EXPERTS, rows=rows, columns=columns, format="nvfp4")
        if grouped.rowwise.scales is None or grouped.columnwise is None or grouped.columnwise.scales is None:
            raise AssertionError("TE grouped nvfp4: the view has no scales in both directions")
        per_row = grouped.rowwise.scales[0].numel() // EXPERTS
        per_col = grouped.columnwise.scales[0].numel() // EXPERTS
        g_rows = [
            grouped.rowwise.scales[0].reshape(-1)[e * per_row : (e + 1) * per_row].clone() for e in range(EXPERTS)
        ]
        g_cols = [
            grouped.columnwise.scales[0].reshape(-1)[e * per_col : (e + 1) * per_col].clone() for e in range(EXPERTS)
        ]
        _against_te_swizzle(
            swizzle, gs.members or (), g_rows, g_cols, TensorKind.NVFP4, rows, columns, "TE grouped nvfp4"
        )
        done += " and grouped"
    return f"TE {release}: {done}, byte for byte with TE's swizzle"


def check_te_blockwise() -> str:
    """TE's Float8 blockwise weights (TE 2.3+), which mok has no view for, are refused by name,
    never read as another format."""
    release, device = _te()
    _need(release, TensorKind.FLOAT8_BLOCKWISE)
    params = [factory.make_parameter(TensorKind.FLOAT8_BLOCKWISE, (256, 256), device=device) for _ in range(EXPERTS)]
    if te_compat.tensor_kind(params[0]) is not TensorKind.FLOAT8_BLOCKWISE:
        raise AssertionError(f"TE's {type(params[0]).__name__} read as {te_compat.tensor_kind(params[0])}")
    for fmt in ("mxfp8", "nvfp4", "bf16"):
        try:
            mok.split_weight_view(params, rows=256, columns=256, format=fmt)
        except mok.ExpertWeightError as exc:
            if "float8_blockwise" not in str(exc):
                raise AssertionError(f"format {fmt}: refused without naming the kind: {exc}") from None
            continue
        raise AssertionError(f"mok viewed TE's Float8 blockwise weights as {fmt}")
    return f"TE {release}: refused by name as mxfp8, nvfp4 and bf16"


def check_te_hybrid() -> str:
    """TE 2.19+ hybrid weights (rowwise MXFP8, columnwise NVFP4) from TE's own HybridQuantizer,
    seeded: each direction of mok's view against the spec over that direction's sub-storage."""
    release, device = _te()
    _need(release, TensorKind.HYBRID)
    rows, columns = NVFP4_SHAPE
    hybrid = (TensorKind.MXFP8, TensorKind.NVFP4)
    params = [
        factory.make_parameter(TensorKind.HYBRID, (rows, columns), device=device, hybrid=hybrid) for _ in range(EXPERTS)
    ]
    generator = torch.Generator().manual_seed(SEED)
    for p in params:
        h = te_compat.hybrid_storage(p)
        r = te_compat.mxfp8_storage(h.rowwise)
        c = te_compat.nvfp4_storage(h.columnwise)
        fill_random_(generator, r.rowwise_data, r.rowwise_scale_inv, c.columnwise_data, c.columnwise_scale_inv)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="hybrid")
    _compare_hybrid(view, params, rows, columns)
    return f"TE {release}: rowwise mxfp8 and columnwise nvfp4, {EXPERTS} experts"


def check_te_bf16() -> str:
    """BF16 expert weights of a TE GroupedLinear (and, TE 2.13+, a high-precision GroupedTensor):
    mok's views are TE's own memory, no copy."""
    release, device = _te()
    rows, columns = MXFP8_SHAPE
    params = factory.grouped_linear_weights(EXPERTS, rows, columns, device=device, mxfp8=False)
    view = mok.split_weight_view(params, rows=rows, columns=columns, format="bf16")
    if view.rowwise.data_ptrs is None or view.rowwise.data_ptrs.tolist() != [p.data_ptr() for p in params]:
        raise AssertionError("the BF16 view's pointer table does not hold TE's weights")
    done = "per expert"
    if TensorKind.GROUPED in _kinds(release):
        weight = factory.make_grouped_tensor(EXPERTS, (rows, columns), None, device=device)
        grouped = mok.grouped_weight_view(weight, num_experts=EXPERTS, rows=rows, columns=columns, format="bf16")
        storage = te_compat.storage_field(weight, te_compat.StorageName.ROWWISE_DATA)
        if storage is None or grouped.rowwise.data[0].data_ptr() != storage.data_ptr():
            raise AssertionError("the grouped BF16 view is not TE's rowwise_data")
        done += " and grouped"
    return f"TE {release}: {done}, zero-copy"


def check_te_quantize() -> str:
    """mok.quantize_mxfp8 gives TE's own MXFP8 quantizer's bytes (where TE quantizes MXFP8 on this
    device: compute capability 10.x)."""
    caps = te_compat.capabilities(verify=False)
    if not caps.te_present:
        raise SkipCheck("no Transformer Engine installed: mok's kernel is checked against its torch reference instead")
    if not caps.mxfp8_quantization:
        why = caps.missing("mxfp8_quantization").get("mxfp8_quantization", "")
        raise SkipCheck(
            f"TE does not quantise MXFP8 here ({why}): mok's kernel is checked against its torch reference instead"
        )
    release, device = _te()
    generator = _generator()
    x = (
        (
            torch.randn(2, 256, 128, generator=generator)
            * torch.exp2(torch.randint(-8, 9, (2, 256, 1), generator=generator))
        )
        .to(torch.bfloat16)
        .to(device)
    )
    ours = mok.quantize_mxfp8(x)
    for e in range(x.shape[0]):
        theirs = factory.quantizer(TensorKind.MXFP8)(x[e])
        s = te_compat.mxfp8_storage(theirs)
        row, col = _mxfp8_logical(s, 256, 128)
        if s.rowwise_data is None or s.columnwise_data is None:
            raise AssertionError("TE's quantizer made no payload in both directions")
        distinct(s.rowwise_data, f"expert {e} TE's rowwise payload")
        same_bytes(ours.row_data[e], s.rowwise_data, f"expert {e} rowwise payload against TE's quantizer")
        same_bytes(ours.col_data[e], s.columnwise_data, f"expert {e} columnwise payload against TE's quantizer")
        same_bytes(ours.row_scales.reshape(2, -1)[e], spec_layout(row), f"expert {e} rowwise scales against TE's")
        same_bytes(ours.col_scales.reshape(2, -1)[e], spec_layout(col), f"expert {e} columnwise scales against TE's")
    return f"TE {release}'s MXFP8Quantizer, byte for byte"


def checks() -> dict[str, Callable[[], object]]:
    """mok's checks, in the order they run (the entry point te_compat.selftest names this)."""
    return {
        "mok.layout.spec": check_layout_spec,
        "mok.views.fakes": check_views_over_fakes,
        "mok.quantize.reference": check_quantize_reference,
        "mok.quantize.rule": check_quantiser_rule,
        "mok.kernel.swizzle": check_kernel_swizzle,
        "mok.kernel.refresh": check_kernel_refresh,
        "mok.kernel.quantize": check_kernel_quantize,
        "mok.te.mxfp8_split": check_te_mxfp8_split,
        "mok.te.mxfp8_grouped": check_te_mxfp8_grouped,
        "mok.te.mxfp8_dequantize": check_te_mxfp8_dequantize,
        "mok.te.mxfp8_2d": check_te_mxfp8_2d,
        "mok.te.nvfp4": check_te_nvfp4,
        "mok.te.blockwise": check_te_blockwise,
        "mok.te.hybrid": check_te_hybrid,
        "mok.te.bf16": check_te_bf16,
        "mok.te.quantize": check_te_quantize,
    }


def report() -> dict[str, object]:
    """mok's quantiser rows of ``te-compat report`` (entry point ``te_compat.report``): the
    reciprocal rule it follows, found by quantising blocks that tell the rules apart on the CPU,
    beside the installed TE's; never raises."""
    try:
        found = followed_rule()
        rule, source = reciprocal_rule_source()
    except Exception as exc:
        return {
            "quantiser reciprocal rule": "unknown",
            "quantiser reciprocal rule reason": f"{type(exc).__name__}: {exc}",
        }
    follows = "neither rule" if found is None else found.value
    agrees = "as TE's" if found is not None and found.value == rule else f"TE's is {rule}"
    return {"quantiser reciprocal rule": follows, "quantiser reciprocal rule reason": f"{agrees} ({source})"}
