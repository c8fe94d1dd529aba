"""mok.export_mxfp8 against references written here from each layout's owner's definition.

The references read TE's buffers as TE allocates them (attributes of the fakes, TE's padding
rule) and never call mok: compact from TE's padded buffers; DeepGEMM from its own torch
reference (DeepGEMM tests/test_layout.py, ``get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl``);
FlashInfer from Megatron-Core's ``prepare_routed_mxfp8_weights`` steps
(``_unshuffle_cublas_scale``, ``_shuffle_routed_scale``, FlashInfer's ``shuffle_matrix_a``),
fed the cuBLAS 128x4 layout built here from the spec's byte-offset formula.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
from mok import ExpertWeightError, LayoutError, MXFP8Export, StorageFreedError, export_mxfp8
from te_compat.testing import fake_grouped, fake_mxfp8, fake_nvfp4

Installer = Callable[..., None]
FP8 = torch.float8_e4m3fn
# padded (N not a multiple of 128, K/32 not a multiple of 4, K not a multiple of 128) and aligned
SHAPES = [(96, 160), (256, 512)]
SPLIT_RELEASES = ["2.1.0", "2.12.0", "2.20.2"]
GROUPED_RELEASES = ["2.13.0", "2.14.0", "2.20.2"]  # 2.13: a plain class, no Parameter


def _roundup(v: int, m: int) -> int:
    return (v + m - 1) // m * m


# ------------------------------------------------------------------------ TE's buffers, read here


def _te_expert(p: Any, n: int, k: int) -> dict[str, torch.Tensor]:
    """One expert's logical bytes from TE's own buffers (TE's padding dropped)."""
    return {
        "data": p._rowwise_data.view(torch.uint8).clone(),
        "scales": p._rowwise_scale_inv.view(torch.uint8)[:n, : k // 32].clone(),
        "columnwise_data": p._columnwise_data.view(torch.uint8).clone(),
        "columnwise_scales": p._columnwise_scale_inv.view(torch.uint8)[: n // 32, :k].clone(),
    }


def _te_grouped(g: Any, e: int, n: int, k: int) -> dict[str, torch.Tensor]:
    """The same from a group's flat buffers: each expert's padded buffer after the previous one."""
    rp, rc = _roundup(n, 128), _roundup(k // 32, 4)
    cp, cc = _roundup(n // 32, 4), _roundup(k, 128)
    data = g.__dict__["rowwise_data" if "rowwise_data" in g.__dict__ else "data"]  # 2.13 names it "data"
    return {
        "data": data.view(torch.uint8).view(e, n, k).clone(),
        "scales": g.scale_inv.view(torch.uint8).view(e, rp, rc)[:, :n, : k // 32].clone(),
        "columnwise_data": g.columnwise_data.view(torch.uint8).view(e, n, k).clone(),
        "columnwise_scales": g.columnwise_scale_inv.view(torch.uint8).view(e, cp, cc)[:, : n // 32, :k].clone(),
    }


def _stack(experts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([x[name] for x in experts]) for name in experts[0]}


# ------------------------------------------------------------------- the owners' definitions


def _deepgemm_reference(scales: torch.Tensor) -> torch.Tensor:
    """DeepGEMM tests/test_layout.py ``get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl``,
    its float32 input made from the E8M0 bytes (exponent bits), as DeepGEMM's quantiser gives."""
    x = (scales.to(torch.int32) << 23).view(torch.float32)
    ue8m0 = (x.view(torch.int) >> 23).to(torch.uint8)
    b, mn, k = x.shape
    aligned_mn, aligned_k = _roundup(mn, 4), _roundup(k, 4)  # get_tma_aligned_size(mn, 4), align(k, 4)
    padded = torch.zeros((b, aligned_mn, aligned_k), dtype=torch.uint8)
    padded[:, :mn, :k] = ue8m0
    padded = padded.view(-1).view(dtype=torch.int).view(b, aligned_mn, aligned_k // 4)
    transposed = torch.zeros((b, aligned_k // 4, aligned_mn), dtype=torch.int).mT
    transposed[:, :, :] = padded
    return transposed[:, :mn, :]


def _cublas_layout(s: torch.Tensor, fill: int = 0) -> torch.Tensor:
    """The spec's 128x4 layout of one logical ``[R, C]``: byte
    ``((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``, padding ``fill``
    (0 where mok swizzles; whatever TE left there where TE swizzled)."""
    r, c = s.shape
    rp, cp = _roundup(r, 128), _roundup(c, 4)
    rr, cc = torch.meshgrid(torch.arange(r), torch.arange(c), indexing="ij")
    offset = ((rr // 128) * (cp // 4) + cc // 4) * 512 + (rr % 32) * 16 + ((rr % 128) // 32) * 4 + cc % 4
    out = torch.full((rp * cp,), fill, dtype=torch.uint8)
    out[offset.flatten()] = s.flatten()
    return out


_BLK32_ROW_MAP = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27]
_BLK32_ROW_MAP += [4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]  # FlashInfer srcToDstBlk32RowMap


def _shuffle_row_indices(m: int) -> torch.Tensor:
    """FlashInfer ``get_shuffle_matrix_a_row_indices(x, 128)``: row_indices[new_row] = old_row."""
    row_indices = torch.empty(m, dtype=torch.long)
    for old_row in range(m):
        new_row = old_row // 32 * 32 + _BLK32_ROW_MAP[old_row % 32]
        row_indices[new_row] = old_row
    return row_indices


def _unshuffle_cublas_scale(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Megatron-Core ``_unshuffle_cublas_scale``."""
    padded_rows, scale_cols = _roundup(rows, 128), cols // 32
    padded_scale_cols = _roundup(scale_cols, 4)
    logical = (
        scale.contiguous()
        .view(torch.uint8)
        .reshape(padded_rows // 128, padded_scale_cols // 4, 32, 4, 4)
        .permute(0, 3, 2, 1, 4)
        .contiguous()
        .reshape(padded_rows, padded_scale_cols)
    )
    return logical[:rows, :scale_cols]


def _shuffle_routed_scale(scale: torch.Tensor) -> torch.Tensor:
    """Megatron-Core ``_shuffle_routed_scale`` (with ``_block_scale_interleave``)."""
    s = scale.contiguous().view(torch.uint8)[_shuffle_row_indices(scale.shape[0])]
    rows, columns = s.shape
    return s.reshape(rows // 128, 4, 32, columns // 4, 4).permute(0, 3, 2, 1, 4).contiguous().reshape(-1)


def _flashinfer_reference(data: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-Core ``prepare_routed_mxfp8_weights``, expert by expert, from the cuBLAS layout."""
    e, n, k = data.shape
    np_, kp = _roundup(n, 128), _roundup(k, 128)
    out_data = torch.empty(e, np_, kp, dtype=torch.uint8)
    out_scale = torch.empty(e, np_ * kp // 32, dtype=torch.uint8)
    for x in range(e):
        padded = torch.zeros(np_, kp, dtype=torch.uint8)
        padded[:n, :k] = data[x]
        out_data[x] = padded[_shuffle_row_indices(np_)]
        logical = torch.zeros(np_, kp // 32, dtype=torch.uint8)
        logical[:n, : k // 32] = _unshuffle_cublas_scale(_cublas_layout(scales[x]), n, k)
        out_scale[x] = _shuffle_routed_scale(logical)
    return out_data, out_scale


# ------------------------------------------------------------------------------------ checks


def _distinct(ref: dict[str, torch.Tensor]) -> None:
    """The inputs must exercise the conversion: at least 64 distinct scale values."""
    assert ref["scales"].unique().numel() >= 64
    assert ref["columnwise_scales"].unique().numel() >= 64


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def _check(result: MXFP8Export, ref: dict[str, torch.Tensor]) -> None:
    layout = result.layout
    if layout == "compact":
        assert set(result.tensors) == set(ref)
        for name, want in ref.items():
            assert torch.equal(_bytes(result.tensors[name]), want), name
        assert result.data.dtype == FP8 and result.columnwise_scales is not None
        return
    if layout == "deepgemm":
        want = _deepgemm_reference(ref["scales"])
        assert torch.equal(result.data.view(torch.uint8), ref["data"])
        assert result.scales.dtype == torch.int32 and torch.equal(result.scales, want)
        assert result.scales.stride() == want.stride()
        # the whole storage, TMA gap rows included
        assert torch.equal(_storage(result.scales), _storage(want))
        return
    data, scale = _flashinfer_reference(ref["data"], ref["scales"])
    assert torch.equal(result.data.view(torch.uint8), data)
    assert torch.equal(result.scales, scale)


def _storage(t: torch.Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes(t.untyped_storage())), dtype=torch.uint8)


def _addresses(result: MXFP8Export) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in result.tensors.items()}


def _experts(n: int, k: int, e: int = 3, seed: int = 0, **kw: Any) -> list[Any]:
    return [fake_mxfp8((n, k), param=True, seed=seed + x, **kw) for x in range(e)]


# ------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("release", SPLIT_RELEASES)
def test_split_export_matches_reference(
    installed_te: Installer, release: str, shape: tuple[int, int], layout: str
) -> None:
    installed_te(release)
    n, k = shape
    experts = _experts(n, k)
    ref = _stack([_te_expert(p, n, k) for p in experts])
    _distinct(ref)
    _check(export_mxfp8(experts, rows=n, columns=k, layout=layout), ref)


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("release", GROUPED_RELEASES)
def test_grouped_export_matches_reference(
    installed_te: Installer, release: str, shape: tuple[int, int], layout: str
) -> None:
    installed_te(release)
    n, k = shape
    g = fake_grouped((3, n, k), format="mxfp8", param=release != "2.13.0", seed=7)
    ref = _te_grouped(g, 3, n, k)
    _distinct(ref)
    _check(export_mxfp8(g, rows=n, columns=k, layout=layout, num_experts=3), ref)


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_swizzled_input_exports_the_same(installed_te: Installer, shape: tuple[int, int], layout: str) -> None:
    """TE's scales already in the GEMM layout (2.12+) export as their logical bytes would (an
    aligned shape's are read zero-copy by the view, an unaligned one's copied)."""
    installed_te("2.20.2")
    n, k = shape
    plain = _experts(n, k)
    ref = _stack([_te_expert(p, n, k) for p in plain])
    swizzled = _experts(n, k, swizzled=True)
    for p, q in zip(plain, swizzled, strict=True):  # TE's buffers, swizzled into the layout TE writes
        rows = _cublas_layout(p._rowwise_scale_inv[:n, : k // 32])
        q._rowwise_scale_inv = rows.view(p._rowwise_scale_inv.shape)
        columns = _cublas_layout(p._columnwise_scale_inv[: n // 32, :k].t())
        q._columnwise_scale_inv = columns.view(p._columnwise_scale_inv.shape)
    result = export_mxfp8(swizzled, rows=n, columns=k, layout=layout)
    assert result.view is not None and result.view.rowwise.scales_zero_copy is (n % 128 == 0 and k % 128 == 0)
    _check(result, ref)


PAD = 0xFF  # E8M0's NaN: what TE may have left in the padding of a layout it swizzled itself
PADDED_SHAPES = [(96, 160), (160, 288)]  # rowwise [96, 5], [160, 9]; columnwise [160, 3], [288, 5]


def _swizzled_with_padding(kind: str, n: int, k: int) -> tuple[Any, dict[str, torch.Tensor], int]:
    """TE-swizzled weights (split or grouped, 3 experts) whose scales hold the logical bytes of
    plain fakes in the 128x4 layout, with every padding byte (rows past R, columns past C) PAD;
    the logical bytes; the padding bytes in all."""
    if kind == "split":
        plain = _experts(n, k)
        ref = _stack([_te_expert(p, n, k) for p in plain])
        weights: Any = _experts(n, k, swizzled=True)
        for x, q in enumerate(weights):
            rows = _cublas_layout(ref["scales"][x], PAD)
            q._rowwise_scale_inv = rows.view(q._rowwise_scale_inv.shape)
            columns = _cublas_layout(ref["columnwise_scales"][x].t(), PAD)
            q._columnwise_scale_inv = columns.view(q._columnwise_scale_inv.shape)
    else:
        ref = _te_grouped(fake_grouped((3, n, k), format="mxfp8", param=True, seed=7), 3, n, k)
        weights = fake_grouped((3, n, k), format="mxfp8", param=True, seed=7, swizzled=True)
        rows = torch.cat([_cublas_layout(s, PAD) for s in ref["scales"]])
        weights.scale_inv.view(torch.uint8).copy_(rows.view(weights.scale_inv.shape))
        columns = torch.cat([_cublas_layout(s.t(), PAD) for s in ref["columnwise_scales"]])
        weights.columnwise_scale_inv.view(torch.uint8).copy_(columns.view(weights.columnwise_scale_inv.shape))
    matrices = [(n, k // 32), (k, n // 32)]  # the GEMM's [R, C] of each direction
    padding = 3 * sum(_roundup(r, 128) * _roundup(c, 4) - r * c for r, c in matrices)
    return weights, ref, padding


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
@pytest.mark.parametrize("shape", PADDED_SHAPES)
@pytest.mark.parametrize("kind", ["split", "grouped"])
def test_te_swizzled_padding_is_exported_as_zero(
    installed_te: Installer, kind: str, shape: tuple[int, int], layout: str
) -> None:
    """Scales TE already keeps in the GEMM layout are the view's layout as TE left it: its
    padding is not guaranteed zero (here every padding byte is 0xFF, E8M0's NaN). The owners'
    references always write zeros there (Megatron-Core zero-pads the logical scales before
    shuffling them; DeepGEMM packs a row's last word with zeros), and FlashInfer multiplies its
    zero K padding by them: an export writes zeros, whatever the layout holds, and so matches
    the references built from the logical bytes. compact never reads the padding."""
    installed_te("2.20.2")
    n, k = shape
    weights, ref, padding = _swizzled_with_padding(kind, n, k)
    _distinct(ref)
    if kind == "split":
        result = export_mxfp8(weights, rows=n, columns=k, layout=layout)
    else:
        result = export_mxfp8(weights, rows=n, columns=k, layout=layout, num_experts=3)
    assert result.view is not None and result.view.columnwise is not None
    held = [t for d in (result.view.rowwise, result.view.columnwise) for t in d.scales or ()]
    assert sum(int((t == PAD).sum()) for t in held) >= padding > 0  # the view's layouts hold TE's padding
    _check(result, ref)


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
def test_out_rewrites_the_same_buffers_and_follows_reassigned_buffers(installed_te: Installer, layout: str) -> None:
    installed_te("2.20.2")
    n, k = 96, 160
    experts = _experts(n, k)
    first = export_mxfp8(experts, rows=n, columns=k, layout=layout)
    addresses = _addresses(first)
    fresh = _experts(n, k, seed=50)  # TE reassigns expert 1's buffers (a re-quantisation that allocates)
    for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
        setattr(experts[1], name, getattr(fresh[1], name))
    ref = _stack([_te_expert(p, n, k) for p in experts])
    assert not torch.equal(ref["scales"][1], _te_expert(_experts(n, k)[1], n, k)["scales"])  # the bytes did change
    second = export_mxfp8(experts, rows=n, columns=k, layout=layout, out=first)
    assert second is first and _addresses(second) == addresses
    _check(second, ref)
    experts[2]._rowwise_data.untyped_storage().resize_(0)  # freed (FSDP between steps)
    with pytest.raises(StorageFreedError, match="rowwise"):
        export_mxfp8(experts, rows=n, columns=k, layout=layout, out=first)


def test_in_place_rewrite_of_te_bytes_is_exported(installed_te: Installer) -> None:
    """TE re-quantising into the same buffers: the refresh reruns and the export has the new bytes."""
    installed_te("2.20.2")
    n, k = 256, 512
    g = fake_grouped((2, n, k), format="mxfp8", param=True, seed=3)
    first = export_mxfp8(g, rows=n, columns=k, layout="compact", num_experts=2)
    g.scale_inv.copy_(torch.randint(0, 256, g.scale_inv.shape, dtype=torch.uint8))
    g.rowwise_data.copy_(torch.randint(0, 256, g.rowwise_data.shape, dtype=torch.uint8))
    second = export_mxfp8(g, rows=n, columns=k, layout="compact", num_experts=2, out=first)
    _check(second, _te_grouped(g, 2, n, k))


def test_e8m0_scales_and_rowwise_only(installed_te: Installer) -> None:
    installed_te("2.20.2")
    n, k = 96, 160
    experts = _experts(n, k)
    ref = _stack([_te_expert(p, n, k) for p in experts])
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is not None:
        result = export_mxfp8(experts, rows=n, columns=k, layout="compact", scale_dtype=e8m0)
        assert result.scales.dtype == e8m0 and result.columnwise_scales is not None
        _check(result, ref)
    rowwise = export_mxfp8(experts, rows=n, columns=k, layout="compact", columnwise=False)
    assert rowwise.columnwise_data is None and torch.equal(rowwise.scales, ref["scales"])
    only_rowwise = _experts(n, k, columnwise=False)
    with pytest.raises(ExpertWeightError, match="TE keeps none"):
        export_mxfp8(only_rowwise, rows=n, columns=k, layout="compact", columnwise=True)
    both = export_mxfp8(experts, rows=n, columns=k, layout="compact")
    with pytest.raises(ValueError, match="leave stale"):
        export_mxfp8(experts, rows=n, columns=k, layout="compact", columnwise=False, out=both)


def test_refuses_swizzled_scales_that_are_not_the_layout(installed_te: Installer) -> None:
    """Scales TE marks swizzled must be exactly the 128x4 layout: an unaligned shape's compact
    buffer (96 rows, not the 128 of the layout) is refused, never read as a layout."""
    installed_te("2.20.2")
    n, k = 96, 160
    experts = _experts(n, k, swizzled=True)
    experts[0]._rowwise_scale_inv = experts[0]._rowwise_scale_inv[:n, : k // 32].contiguous()
    with pytest.raises(LayoutError, match="swizzled"):
        export_mxfp8(experts, rows=n, columns=k, layout="compact")


def test_refuses_undersized_scales(installed_te: Installer) -> None:
    installed_te("2.20.2")
    n, k = 96, 160
    experts = _experts(n, k)
    experts[1]._rowwise_scale_inv = experts[1]._rowwise_scale_inv[: n - 32].contiguous()
    with pytest.raises(LayoutError, match=r"at least \[96, 5\]"):
        export_mxfp8(experts, rows=n, columns=k, layout="deepgemm")


def test_refuses_weights_that_are_not_mxfp8(installed_te: Installer) -> None:
    installed_te("2.20.2")
    bf16 = [torch.nn.Parameter(torch.randn(64, 128, dtype=torch.bfloat16)) for _ in range(2)]
    with pytest.raises(ExpertWeightError, match="never quantises"):
        export_mxfp8(bf16, rows=64, columns=128, layout="compact")
    nvfp4 = [fake_nvfp4((64, 128), param=True, seed=e) for e in range(2)]
    with pytest.raises((ExpertWeightError, ValueError), match="(?i)nvfp4"):
        export_mxfp8(nvfp4, rows=64, columns=128, layout="compact")


def test_refuses_wrong_out(installed_te: Installer) -> None:
    installed_te("2.20.2")
    n, k = 96, 160
    experts = _experts(n, k)
    first = export_mxfp8(experts, rows=n, columns=k, layout="deepgemm")
    with pytest.raises(LayoutError, match=r"layout, rows, columns\) \('flashinfer', 96, 160\); found \('deepgemm'"):
        export_mxfp8(experts, rows=n, columns=k, layout="flashinfer", out=first)
    with pytest.raises(LayoutError, match=r"out: expected an export of \(layout, rows, columns\)"):
        export_mxfp8(experts, rows=n, columns=k - 32, layout="deepgemm", out=first)
    with pytest.raises(LayoutError, match="expected an export of one grouped weight; found one of per-expert weights"):
        grouped = fake_grouped((3, n, k), format="mxfp8", param=True)
        export_mxfp8(grouped, rows=n, columns=k, layout="deepgemm", num_experts=3, out=first)
    with pytest.raises(LayoutError, match=r"layout, experts, rows, columns\) \('deepgemm', 2, 96, 160\)"):
        export_mxfp8(
            experts[:2], rows=n, columns=k, layout="deepgemm", out=mok.export.dataclasses.replace(first, view=None)
        )
    contiguous = torch.zeros(first.scales.shape, dtype=torch.int32)  # not DeepGEMM's MN-major strides
    with pytest.raises(LayoutError, match=r"out.scales: expected torch.int32"):
        export_mxfp8(
            experts, rows=n, columns=k, layout="deepgemm", out=mok.export.dataclasses.replace(first, scales=contiguous)
        )
    compact = export_mxfp8(experts, rows=n, columns=k, layout="compact")
    short = mok.export.dataclasses.replace(compact, data=torch.empty(3, n - 32, k, dtype=FP8))
    with pytest.raises(LayoutError, match=r"out.data: expected torch.float8_e4m3fn \(3, 96, 160\)"):
        export_mxfp8(experts, rows=n, columns=k, layout="compact", out=short)
    wrong_dtype = mok.export.dataclasses.replace(compact, scales=torch.empty(3, n, k // 32, dtype=torch.int8))
    with pytest.raises(LayoutError, match="found torch.int8"):
        export_mxfp8(experts, rows=n, columns=k, layout="compact", out=wrong_dtype)
    with pytest.raises(TypeError, match="MXFP8Export"):
        export_mxfp8(experts, rows=n, columns=k, layout="compact", out=compact.data)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout: expected one of"):
        export_mxfp8(experts, rows=n, columns=k, layout="cutlass")


# --------------------------------------------------------------------------------- the ops


def _layouts(e: int, r: int, c: int, seed: int, fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random logical scales [E, R, C] and their 128x4 layout [E*Rp/128, Cp/4, 32, 16], built here,
    padding ``fill``."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 256, (e, r, c), dtype=torch.uint8, generator=g)
    layout = torch.stack([_cublas_layout(x, fill) for x in s]).view(-1, _roundup(c, 4) // 4, 32, 16)
    return s, layout


def _deepgemm_out(e: int, r: int, c: int) -> torch.Tensor:
    words, aligned = _roundup(c, 4) // 4, _roundup(r, 4)
    return torch.zeros(e * aligned * words, dtype=torch.int32).as_strided((e, r, words), (aligned * words, 1, aligned))


@pytest.mark.parametrize(("e", "r", "c"), [(1, 1, 1), (2, 33, 5), (2, 130, 8), (3, 256, 7)])
def test_deepgemm_op_any_rows(e: int, r: int, c: int) -> None:
    s, layout = _layouts(e, r, c, seed=r)
    out = _deepgemm_out(e, r, c)
    torch.ops.mok.mxfp8_scales_to_deepgemm(layout, out)
    want = _deepgemm_reference(s)
    assert torch.equal(out, want) and torch.equal(_storage(out), _storage(want))


@pytest.mark.parametrize(("e", "r", "c"), [(1, 1, 1), (2, 33, 5), (2, 130, 8), (3, 256, 7), (2, 96, 6)])
def test_deepgemm_op_writes_zeros_past_the_logical_columns(e: int, r: int, c: int) -> None:
    """Given the logical columns, the spare bytes of a row's last word are 0 whatever the
    layout's padding holds (TE's own GEMM layout: here 0xFF), as DeepGEMM packs them."""
    s, layout = _layouts(e, r, c, seed=r, fill=PAD)
    out = _deepgemm_out(e, r, c)
    torch.ops.mok.mxfp8_scales_to_deepgemm(layout, out, c)
    want = _deepgemm_reference(s)
    assert torch.equal(out, want) and torch.equal(_storage(out), _storage(want))
    again = _deepgemm_out(e, r, c)
    torch.ops.mok.mxfp8_scales_to_deepgemm(layout, again, columns=c)
    assert torch.equal(again, want)
    with pytest.raises(LayoutError, match=rf"columns: expected .* padded to {_roundup(c, 4)} columns; found {c + 4}"):
        torch.ops.mok.mxfp8_scales_to_deepgemm(layout, again, c + 4)


@pytest.mark.parametrize(("e", "r", "c"), [(1, 32, 1), (2, 160, 5), (2, 256, 8)])
def test_trtllm_scale_op(e: int, r: int, c: int) -> None:
    s, layout = _layouts(e, r, c, seed=c)
    out = torch.empty(e, _roundup(r, 128) * _roundup(c, 4), dtype=torch.uint8)
    torch.ops.mok.mxfp8_scales_to_trtllm(layout, out)
    data = torch.zeros(e, r, c * 32, dtype=torch.uint8)
    assert torch.equal(out, _flashinfer_reference(data, s)[1])


@pytest.mark.parametrize(("e", "r", "c"), [(1, 1, 1), (1, 32, 1), (2, 96, 5), (2, 160, 9), (2, 256, 8), (1, 127, 3)])
def test_trtllm_scale_op_writes_zeros_past_the_logical_matrix(e: int, r: int, c: int) -> None:
    """Given the logical [R, C], every byte of rows past R or columns past C is 0 whatever the
    layout's padding holds (here 0xFF), as Megatron-Core's zero-padded logical scales give."""
    s, layout = _layouts(e, r, c, seed=c, fill=PAD)
    out = torch.full((e, _roundup(r, 128) * _roundup(c, 4)), 0xAB, dtype=torch.uint8)
    torch.ops.mok.mxfp8_scales_to_trtllm(layout, out, r, c)
    logical = torch.zeros(e, _roundup(r, 128), c, dtype=torch.uint8)
    logical[:, :r] = s
    want = torch.stack([_shuffle_routed_scale(_pad_columns(x)) for x in logical])
    assert torch.equal(out, want)
    with pytest.raises(LayoutError, match=r"rows: expected .* padded to \d+ rows; found"):
        torch.ops.mok.mxfp8_scales_to_trtllm(layout, out, r + 128, c)


def _pad_columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` [Rp, C] zero-padded to [Rp, roundup(C, 4)] (Megatron-Core's logical scales)."""
    out = torch.zeros(x.shape[0], _roundup(x.shape[1], 4), dtype=torch.uint8)
    out[:, : x.shape[1]] = x
    return out


def test_ops_opcheck_and_fake_checks() -> None:
    e, r, c = 2, 160, 5
    _, layout = _layouts(e, r, c, seed=2)
    data = torch.randint(0, 256, (e, r, c * 32), dtype=torch.uint8)  # opcheck does arithmetic: no float8 on CPU
    checks = [
        (torch.ops.mok.mxfp8_scales_to_deepgemm.default, (layout, _deepgemm_out(e, r, c))),
        (torch.ops.mok.mxfp8_scales_to_trtllm.default, (layout, torch.empty(e, 256 * 8, dtype=torch.uint8))),
        (torch.ops.mok.mxfp8_payload_to_trtllm.default, (data, torch.empty(e, 256, 256, dtype=torch.uint8))),
    ]
    for op, args in checks:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    with FakeTensorMode():
        fake_layout = torch.empty(layout.shape, dtype=torch.uint8, device="cuda")
        with pytest.raises(LayoutError, match="MN-major TMA-aligned strides"):
            torch.ops.mok.mxfp8_scales_to_deepgemm(fake_layout, torch.empty(e, r, 2, dtype=torch.int32, device="cuda"))
        with pytest.raises(LayoutError, match=r"out: expected a contiguous uint8 \[2, 2048\]"):
            torch.ops.mok.mxfp8_scales_to_trtllm(fake_layout, torch.empty(e, 1024, dtype=torch.uint8, device="cuda"))
        fake_data = torch.empty(e, r, c * 32, dtype=FP8, device="cuda")
        with pytest.raises(LayoutError, match=r"\(2, 256, 256\)"):
            torch.ops.mok.mxfp8_payload_to_trtllm(fake_data, torch.empty(e, r, c * 32, dtype=FP8, device="cuda"))


# ------------------------------------------------------------- compact scale buffers (TE PR 3519)


@pytest.mark.parametrize("layout", mok.export.LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_compact_scale_buffers_as_input(installed_te: Installer, shape: tuple[int, int], layout: str) -> None:
    """Unpadded scale buffers export as TE's padded ones with the same bytes do, and a refresh
    follows TE swapping one kind of buffer for the other."""
    installed_te("2.20.2")
    n, k = shape
    padded = _experts(n, k)
    compact = _experts(n, k, compact_scales=True)
    assert tuple(compact[0]._rowwise_scale_inv.shape) == (n, k // 32)
    assert tuple(compact[0]._columnwise_scale_inv.shape) == (n // 32, k)
    ref = _stack([_te_expert(p, n, k) for p in padded])
    result = export_mxfp8(compact, rows=n, columns=k, layout=layout)
    _check(result, ref)
    view = mok.split_weight_view(compact, rows=n, columns=k, format="mxfp8")
    assert torch.equal(torch.stack(list(mok.logical_scales(view))), ref["scales"])  # type: ignore[arg-type]
    other = _experts(n, k, seed=20, compact_scales=True)
    padded[1]._rowwise_scale_inv = other[1]._rowwise_scale_inv  # TE hands expert 1 a compact buffer
    padded[1]._columnwise_scale_inv = other[1]._columnwise_scale_inv
    first = export_mxfp8(_experts(n, k), rows=n, columns=k, layout=layout)
    second = export_mxfp8(padded, rows=n, columns=k, layout=layout, out=first)
    _check(second, _stack([_te_expert(p, n, k) for p in padded]))


def test_compact_scales_marked_swizzled_are_refused(installed_te: Installer) -> None:
    installed_te("2.20.2")
    experts = _experts(96, 160, compact_scales=True, swizzled=True)
    with pytest.raises(LayoutError, match="TE marks these scales swizzled"):
        export_mxfp8(experts, rows=96, columns=160, layout="flashinfer")
