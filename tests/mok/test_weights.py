"""mok.weights, the drop-in for Megatron's MOK weights module: its documented signatures, and each
function against mok's public API (and the layout spec) on stand-ins of every release with the class."""

from __future__ import annotations

import inspect
import types
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

import mok
import te_compat
from mok import ExpertWeightError, LayoutError, RefreshError, StorageFreedError, shared_expert
from mok import weights as W
from mok.layout import layout_shape, swizzle_reference
from te_compat import names, table
from te_compat.names import logical_storage_name
from tests import te_objects as T
from tests.spec_oracle import spec_layout
from tests.upstream import refused

Installer = Callable[..., None]
MXFP8_RELEASES = T.releases_with("MXFP8Tensor")  # 2.1.0+
GROUPED_RELEASES = T.releases_with("GroupedTensor")  # 2.13+
SHAPES = [(256, 128), (160, 96)]  # aligned; padded (rows % 128, columns/32 % 4)
FLAG = "_SHARED_EXPERT_BF16_WARNING_EMITTED"


# ------------------------------------------------------------------ upstream's documented signatures
# Megatron-LM megatron/core/transformer/moe/megakernel/mok/weights.py, written out by hand.


def prepare_shared_expert_config(config): ...
def _storage_view(storage, shape, *, dtype, name): ...
def _single_grouped_mxfp8_scale_view(param, member_attr, shape, *, name): ...
def _swizzle_mxfp8_scale(logical_scale, *, rows, columns, out=None): ...
def _native_single_grouped_weight_view(weight, *, num_experts, rows, columns, use_mxfp8, cached_view=None): ...
def _parameter_storage_attr(param, name): ...
def _native_split_weight_view(params, *, rows, columns, use_mxfp8, cached_view=None): ...


UPSTREAM = [
    prepare_shared_expert_config,
    _storage_view,
    _single_grouped_mxfp8_scale_view,
    _swizzle_mxfp8_scale,
    _native_single_grouped_weight_view,
    _parameter_storage_attr,
    _native_split_weight_view,
]


def _params(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("upstream", UPSTREAM, ids=lambda f: f.__name__)
def test_signature_is_upstreams(upstream: Callable[..., Any]) -> None:
    ours = getattr(W, upstream.__name__)
    assert _params(ours) == _params(upstream)


def test_every_documented_name_imports() -> None:
    from mok.weights import (  # noqa: F401
        _SHARED_EXPERT_BF16_WARNING_EMITTED,
        _native_single_grouped_weight_view,
        _native_split_weight_view,
        _parameter_storage_attr,
        _single_grouped_mxfp8_scale_view,
        _storage_view,
        _swizzle_mxfp8_scale,
        prepare_shared_expert_config,
    )

    assert prepare_shared_expert_config is not mok.prepare_shared_expert_config  # upstream's flag and errors


# ------------------------------------------------------------------ the shared-expert warning flag


def test_flag_follows_the_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(W, FLAG, False)
    W.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=False))
    assert getattr(W, FLAG) is False  # no FP8 params: nothing to warn about
    with pytest.warns(UserWarning, match="MOK currently computes shared experts in BF16"):
        W.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))
    assert getattr(W, FLAG) is True


def test_resetting_the_flag_resets_the_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron's own test resets the flag with monkeypatch.setattr on the module: a plain global,
    as upstream's, independent of mok.prepare_shared_expert_config's own once-only state."""
    monkeypatch.setattr(shared_expert, "_warned", True)
    monkeypatch.setattr(W, FLAG, False)
    with pytest.warns(UserWarning):
        W.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))
    assert getattr(W, FLAG) is True and vars(W)[FLAG] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))
    monkeypatch.setattr(W, FLAG, "anything")  # upstream validates nothing on assignment; truthy: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W.prepare_shared_expert_config(types.SimpleNamespace(fp8="e4m3", fp8_param=True))


def test_shared_expert_config_follows_megatron(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron's function reads ``config.fp8_param`` as it is: falsy (None included) returns the
    config itself, unwarned; anything truthy gets the BF16 copy; no such attribute is Python's
    AttributeError, as there."""
    monkeypatch.setattr(W, FLAG, False)
    for falsy in (None, False, 0, ""):
        config = types.SimpleNamespace(fp8="e4m3", fp8_param=falsy)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert W.prepare_shared_expert_config(config) is config
    truthy = types.SimpleNamespace(fp8="e4m3", fp8_param="False")  # a non-empty string is truthy there too
    with pytest.warns(UserWarning, match="MOK currently computes shared experts in BF16. Shared-expert modules"):
        copy = W.prepare_shared_expert_config(truthy)
    assert (copy.fp8, copy.fp8_param, truthy.fp8_param) == (None, False, "False")
    with pytest.raises(AttributeError, match="fp8_param"):
        W.prepare_shared_expert_config(object())


def test_unknown_module_attribute_raises() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        W.no_such_name  # noqa: B018


# ------------------------------------------------------------------ storage names and views


def test_storage_view_is_mok_storage_view() -> None:
    buf = torch.randint(0, 256, (2 * 64 * 32,), dtype=torch.uint8)
    ours = W._storage_view(buf, (2, 64, 32), dtype=torch.float8_e4m3fn, name="w")
    public = mok.storage_view(buf, (2, 64, 32), dtype=torch.float8_e4m3fn, name="w")
    assert (ours.data_ptr(), ours.dtype, ours.shape) == (public.data_ptr(), public.dtype, public.shape)
    assert ours.data_ptr() == buf.data_ptr() and ours.shape == (2, 64, 32)
    with refused(ExpertWeightError, match=r"w: expected 4000 elements for shape \(4000,\)"):
        W._storage_view(buf, (4000,), dtype=torch.uint8, name="w")


# facts.md: MXFP8Tensor keeps each logical storage in the private attribute "_" + logical name.
MXFP8_NAMES = ["rowwise_data", "columnwise_data", "rowwise_scale_inv", "columnwise_scale_inv"]


@pytest.mark.parametrize("release", MXFP8_RELEASES)
def test_parameter_storage_attr_mxfp8(release: str, installed_te: Installer) -> None:
    installed_te(release)
    p = T.mxfp8_tensor(release, 128, 64, param=True)
    for logical in MXFP8_NAMES:
        held = getattr(p, f"_{logical}")
        for name in (f"_{logical}", logical):  # TE's private attribute, or the public/logical name
            got = W._parameter_storage_attr(p, name)
            assert got is held and got is te_compat.storage_attr(p, logical), name


@pytest.mark.parametrize("release", GROUPED_RELEASES)
def test_parameter_storage_attr_grouped(release: str, installed_te: Installer) -> None:
    installed_te(release)
    g = T.grouped_tensor(release, 2, 128, 64, mxfp8=True)
    # facts.md: the group keeps public scale_inv / columnwise_scale_inv; a member's private names
    # mean the same storage
    for name in ("scale_inv", "rowwise_scale_inv", "_rowwise_scale_inv"):
        assert W._parameter_storage_attr(g, name) is g.scale_inv, name
    for name in ("columnwise_scale_inv", "_columnwise_scale_inv"):
        assert W._parameter_storage_attr(g, name) is g.columnwise_scale_inv, name
    payload = g.rowwise_data if T.rel(release) >= T.GROUPED_RENAME_SINCE else g.data
    for name in ("data", "rowwise_data", "_rowwise_data"):
        assert W._parameter_storage_attr(g, name) is payload, name


def test_parameter_storage_attr_plain_and_unknown(installed_te: Installer) -> None:
    """Names te_compat does not know for a TE tensor's kind are looked up as upstream does."""
    installed_te("2.20.2")
    assert W._parameter_storage_attr(torch.nn.Parameter(torch.zeros(4, 4)), "rowwise_data") is None
    p = T.mxfp8_tensor("2.20.2", 128, 64, param=True)
    assert W._parameter_storage_attr(p, "_rowwise_payload") is None
    assert W._parameter_storage_attr(p, "_transpose") is None  # a Float8 attribute, not an MXFP8 one
    assert W._parameter_storage_attr(p, "fp8_dtype") is p._fp8_dtype  # TE's, not storage: as upstream finds it
    assert W._parameter_storage_attr(torch.nn.Parameter(torch.zeros(4)), "_rowwise_payload") is None


def _member_logical(g: Any, which: str, rows: int, cols: int) -> torch.Tensor:
    """Each member's logical scales, cut from its own TE-padded buffer (facts.md's attributes)."""
    if which == "rowwise":
        return torch.stack([m._rowwise_scale_inv[:rows, : cols // 32] for m in g.quantized_tensors])
    return torch.stack([m._columnwise_scale_inv[: rows // 32, :cols] for m in g.quantized_tensors])


@pytest.mark.parametrize("release", GROUPED_RELEASES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_single_grouped_scale_view(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    e = 3
    g = T.grouped_tensor(release, e, rows, cols, mxfp8=True)
    public = mok.grouped_weight_view(g, num_experts=e, rows=rows, columns=cols, format="mxfp8")
    for member_attr in ("_rowwise_scale_inv", "rowwise_scale_inv", "scale_inv"):
        v = W._single_grouped_mxfp8_scale_view(g, member_attr, (e, rows, cols // 32), name="fc1")
        assert v.data_ptr() == g.scale_inv.data_ptr()  # a view of TE's buffer, padding skipped
        assert torch.equal(v, _member_logical(g, "rowwise", rows, cols))
        assert torch.equal(mok.swizzle_mxfp8_scales(v), public.rowwise.scales[0])
    for member_attr in ("_columnwise_scale_inv", "columnwise_scale_inv"):
        v = W._single_grouped_mxfp8_scale_view(g, member_attr, (e, rows // 32, cols), name="fc1")
        assert v.data_ptr() == g.columnwise_scale_inv.data_ptr()
        assert torch.equal(v, _member_logical(g, "columnwise", rows, cols))
        assert torch.equal(mok.swizzle_mxfp8_scales(v.transpose(1, 2)), public.columnwise.scales[0])


def test_single_grouped_scale_view_errors(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    with refused(ExpertWeightError, match="fc1: member_attr '_rowwise_data'.*found another tensor"):
        W._single_grouped_mxfp8_scale_view(g, "_rowwise_data", (2, 128, 4), name="fc1")
    with refused(ExpertWeightError, match="MOK fc1 expected 3 grouped members, got 2"):  # Megatron's first check
        W._single_grouped_mxfp8_scale_view(g, "scale_inv", (3, 128, 4), name="fc1")
    for wrong in ((2, 256, 4), (2, 120, 4), (2, 128, 3)):  # experts are 2 x (128, 128)
        with refused(LayoutError, match=r"fc1: expected the rowwise scale shape \(2, 128, 4\) of 2 experts"):
            W._single_grouped_mxfp8_scale_view(g, "scale_inv", wrong, name="fc1")
    with refused(LayoutError, match=r"fc1: expected the columnwise scale shape \(2, 4, 128\)"):
        W._single_grouped_mxfp8_scale_view(g, "_columnwise_scale_inv", (2, 128, 4), name="fc1")
    swizzled = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True, swizzled=True)
    with refused(LayoutError, match="fc1: TE already holds these scales in the GEMM layout"):
        W._single_grouped_mxfp8_scale_view(swizzled, "scale_inv", (2, 128, 4), name="fc1")
    bf16 = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=False)
    with refused(ExpertWeightError, match="fc1: expected a quantized"):
        W._single_grouped_mxfp8_scale_view(bf16, "scale_inv", (2, 128, 4), name="fc1")


# ------------------------------------------------------------------ the layout


@pytest.mark.parametrize(("rows", "cols"), [*SHAPES, (128, 1024), (32, 32)])
def test_swizzle_mxfp8_scale(rows: int, cols: int) -> None:
    g = torch.Generator().manual_seed(rows + cols)
    logical = torch.randint(0, 256, (2, cols // 32, rows), dtype=torch.uint8, generator=g).transpose(1, 2)
    want = torch.empty(layout_shape(rows, cols // 32, 2), dtype=torch.uint8)
    swizzle_reference(logical, want)
    got = W._swizzle_mxfp8_scale(logical, rows=rows, columns=cols)
    assert torch.equal(got, want) and torch.equal(got, spec_layout(logical))
    out = torch.full_like(want, 0xAB)
    assert W._swizzle_mxfp8_scale(logical, rows=rows, columns=cols, out=out) is out
    assert torch.equal(out, want)  # written in place, padding zeroed


def test_swizzle_mxfp8_scale_errors() -> None:
    s = torch.zeros(2, 128, 4, dtype=torch.uint8)
    with refused(LayoutError, match=r"expected shape \(2, 256, 4\) for rows=256, columns=128"):
        W._swizzle_mxfp8_scale(s, rows=256, columns=128)
    with refused(LayoutError, match=r"columns: expected a multiple of 32 \(one scale per block\); found 100"):
        W._swizzle_mxfp8_scale(s, rows=128, columns=100)
    with refused(LayoutError, match=r"expected a 3-D tensor \[E, rows, columns/32\]; found \(128, 4\)"):
        W._swizzle_mxfp8_scale(s[0], rows=128, columns=128)
    with refused(LayoutError, match="out cannot hold the layout"):
        W._swizzle_mxfp8_scale(s, rows=128, columns=128, out=torch.empty(1, 1, 32, 16, dtype=torch.uint8))


# ------------------------------------------------------------------ one grouped parameter


@pytest.mark.parametrize("release", GROUPED_RELEASES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_grouped_view_is_the_public_view(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    e = 2
    g = T.grouped_tensor(release, e, rows, cols, mxfp8=True)
    got = W._native_single_grouped_weight_view(g, num_experts=e, rows=rows, columns=cols, use_mxfp8=True)
    public = mok.grouped_weight_view(g, num_experts=e, rows=rows, columns=cols, format="mxfp8")
    assert isinstance(got, tuple) and len(got) == 5 and got[4] is True
    row_data, row_scales, col_data, col_scales, _ = got
    payload = g.rowwise_data if T.rel(release) >= T.GROUPED_RENAME_SINCE else g.data
    assert row_data.data_ptr() == payload.data_ptr() == public.rowwise.data[0].data_ptr()
    assert col_data.data_ptr() == g.columnwise_data.data_ptr() == public.columnwise.data[0].data_ptr()
    for data in (row_data, col_data):
        assert data.dtype == torch.float8_e4m3fn and data.shape == (e, rows, cols)
    assert torch.equal(row_scales, public.rowwise.scales[0]) and torch.equal(col_scales, public.columnwise.scales[0])
    assert torch.equal(row_scales, spec_layout(_member_logical(g, "rowwise", rows, cols)))
    assert torch.equal(col_scales, spec_layout(_member_logical(g, "columnwise", rows, cols).transpose(1, 2)))

    addresses = (row_scales.data_ptr(), col_scales.data_ptr())
    g.scale_inv.random_(0, 255)  # TE re-quantised in place: new bytes, same buffers
    g.columnwise_scale_inv.random_(0, 255)
    again = W._native_single_grouped_weight_view(
        g, num_experts=e, rows=rows, columns=cols, use_mxfp8=True, cached_view=got
    )
    assert again is got and (got[1].data_ptr(), got[3].data_ptr()) == addresses
    assert torch.equal(got[1], spec_layout(_member_logical(g, "rowwise", rows, cols)))
    assert torch.equal(got[3], spec_layout(_member_logical(g, "columnwise", rows, cols).transpose(1, 2)))


def test_grouped_refresh_of_any_tuple(installed_te: Installer) -> None:
    """Upstream refreshes items 1 and 3 of whatever 5-tuple it is given; the returned tuple also
    carries the checked refresh, whose payloads follow memory TE moved."""
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    got = W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True)
    plain = tuple(got)
    addresses = (plain[1].data_ptr(), plain[3].data_ptr())
    plain[1].fill_(0xEE), plain[3].fill_(0xEE)
    again = W._native_single_grouped_weight_view(
        g, num_experts=2, rows=128, columns=128, use_mxfp8=True, cached_view=plain
    )
    assert again[1] is plain[1] and again[3] is plain[3] and (again[1].data_ptr(), again[3].data_ptr()) == addresses
    assert torch.equal(again[1], spec_layout(_member_logical(g, "rowwise", 128, 128)))
    assert torch.equal(again[3], spec_layout(_member_logical(g, "columnwise", 128, 128).transpose(1, 2)))
    g.rowwise_data = g.rowwise_data.clone()  # TE moved the payload: the tuple's payload view follows it
    W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True, cached_view=got)
    assert got[0].data_ptr() == g.rowwise_data.data_ptr()
    g.rowwise_data.untyped_storage().resize_(0)  # freed (FSDP between steps): refused, naming it
    with refused(StorageFreedError, match="grouped weight (rowwise )?data: its storage holds 0 bytes"):
        W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True, cached_view=got)


def test_grouped_without_columnwise(installed_te: Installer) -> None:
    installed_te("2.20.2")
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True, columnwise=False)
    with refused(ExpertWeightError, match="the 5-tuple needs columnwise data"):
        W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True)


@pytest.mark.parametrize("release", GROUPED_RELEASES)
def test_grouped_bf16(release: str, installed_te: Installer) -> None:
    installed_te(release)
    g = T.grouped_tensor(release, 3, 64, 32, mxfp8=False)
    got = W._native_single_grouped_weight_view(g, num_experts=3, rows=64, columns=32, use_mxfp8=False)
    public = mok.grouped_weight_view(g, num_experts=3, rows=64, columns=32, format="bf16")
    payload = g.rowwise_data if T.rel(release) >= T.GROUPED_RENAME_SINCE else g.data
    assert got.data_ptr() == payload.data_ptr() == public.rowwise.data[0].data_ptr()
    assert got.shape == (3, 64, 32) and got.dtype == torch.bfloat16 and torch.equal(got, public.rowwise.data[0])


def test_grouped_bf16_plain_weight() -> None:
    w = torch.nn.Parameter(torch.randn(2, 64, 32, dtype=torch.bfloat16))
    assert W._native_single_grouped_weight_view(w, num_experts=2, rows=64, columns=32, use_mxfp8=False) is w
    with refused(ExpertWeightError, match=r"expected a contiguous torch.bfloat16 tensor of shape \(2, 64, 32\)"):
        W._native_single_grouped_weight_view(w.float(), num_experts=2, rows=64, columns=32, use_mxfp8=False)


# ------------------------------------------------------------------ one parameter per expert


def _col_t(p: Any, rows: int, cols: int) -> torch.Tensor:
    """An expert's logical columnwise scales, transposed to [cols, rows/32] (facts.md's attribute)."""
    return p._columnwise_scale_inv[: rows // 32, :cols].t()


@pytest.mark.parametrize("release", MXFP8_RELEASES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_split_view_is_the_public_view(release: str, rows: int, cols: int, installed_te: Installer) -> None:
    installed_te(release)
    ps = [T.mxfp8_tensor(release, rows, cols, seed=e, param=True) for e in range(3)]
    got = W._native_split_weight_view(tuple(ps), rows=rows, columns=cols, use_mxfp8=True)
    public = mok.split_weight_view(ps, rows=rows, columns=cols, format="mxfp8")
    assert got.native_columnwise is True
    assert got.data.data_ptr() == ps[0]._rowwise_data.data_ptr() and got.data.dtype == torch.float8_e4m3fn
    assert got.transposed_data.data_ptr() == ps[0]._columnwise_data.data_ptr()
    assert got.storage_table.tolist() == public.rowwise.data_ptrs.tolist() == [p._rowwise_data.data_ptr() for p in ps]
    assert got.transposed_storage_table.tolist() == [p._columnwise_data.data_ptr() for p in ps]
    assert got.scale is got.scale_tensors[0] and got.transposed_scale is got.transposed_scale_tensors[0]
    assert got.scale_storage_table.tolist() == [s.data_ptr() for s in got.scale_tensors]
    assert got.transposed_scale_storage_table.tolist() == [s.data_ptr() for s in got.transposed_scale_tensors]
    for e, p in enumerate(ps):
        assert torch.equal(got.scale_tensors[e], public.rowwise.scales[e])
        assert torch.equal(got.transposed_scale_tensors[e], public.columnwise.scales[e])
        assert torch.equal(got.scale_tensors[e], spec_layout(p._rowwise_scale_inv[:rows, : cols // 32]))
        assert torch.equal(got.transposed_scale_tensors[e], spec_layout(_col_t(p, rows, cols)))

    tables = (got.scale_storage_table.clone(), got.transposed_scale_storage_table.clone())
    for p in ps:  # TE re-quantised in place: new bytes, same buffers
        p._rowwise_scale_inv.random_(0, 255)
        p._columnwise_scale_inv.random_(0, 255)
    assert W._native_split_weight_view(ps, rows=rows, columns=cols, use_mxfp8=True, cached_view=got) is got
    assert [s.data_ptr() for s in got.scale_tensors] == tables[0].tolist()
    assert [s.data_ptr() for s in got.transposed_scale_tensors] == tables[1].tolist()
    for e, p in enumerate(ps):
        assert torch.equal(got.scale_tensors[e], spec_layout(p._rowwise_scale_inv[:rows, : cols // 32]))
        assert torch.equal(got.transposed_scale_tensors[e], spec_layout(_col_t(p, rows, cols)))


def test_split_refresh_errors(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    got = W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=True)
    with pytest.raises(RefreshError, match=r"cached_view: expected an earlier split view \(a SplitRoutedWeight, or"):
        W._native_split_weight_view(
            ps, rows=128, columns=128, use_mxfp8=True, cached_view=types.SimpleNamespace(scale_tensors=())
        )
    with pytest.raises(RefreshError, match="expected None for BF16 split weights"):
        W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=False, cached_view=got)
    no_col = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True, columnwise=False) for e in range(2)]
    with refused(ExpertWeightError, match="the view needs columnwise data"):
        W._native_split_weight_view(no_col, rows=128, columns=128, use_mxfp8=True)


def test_a_cached_view_of_the_other_kind_is_named(installed_te: Installer) -> None:
    """A refresh given a view of the other kind (grouped for split weights, or the reverse), mok's
    own view where this module's result is the contract, or any other object: refused as
    Megatron refuses (a RuntimeError), saying which is grouped, nothing written."""
    installed_te("2.20.2")
    ps = [T.mxfp8_tensor("2.20.2", 128, 128, seed=e, param=True) for e in range(2)]
    g = T.grouped_tensor("2.20.2", 2, 128, 128, mxfp8=True)
    split = W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=True)
    grouped = W._native_single_grouped_weight_view(g, num_experts=2, rows=128, columns=128, use_mxfp8=True)
    layouts = [*split.scale_tensors, *split.transposed_scale_tensors, grouped[1], grouped[3]]
    before = [t.clone() for t in layouts]

    def split_refresh(cached: object) -> object:
        return W._native_split_weight_view(ps, rows=128, columns=128, use_mxfp8=True, cached_view=cached)

    def grouped_refresh(cached: object) -> object:
        return W._native_single_grouped_weight_view(
            g, num_experts=2, rows=128, columns=128, use_mxfp8=True, cached_view=cached
        )

    grouped_for_split = r": the view is grouped and the weights are not \(one parameter per expert\)"
    split_for_grouped = r": the view is per expert and the weight is grouped \(one \[E, rows, columns\] parameter\)"
    with refused(RefreshError, match=r"found a mok.seams.GroupedWeightTuple of 5 items \(.*\)" + grouped_for_split):
        split_refresh(grouped)
    with refused(RefreshError, match=r"found an object of class mok.views.GroupedExpertWeights" + grouped_for_split):
        split_refresh(grouped.expert_view)
    with refused(RefreshError, match=r"found an object of class mok.seams.SplitRoutedWeight" + split_for_grouped):
        grouped_refresh(split)
    with refused(RefreshError, match=r"found an object of class mok.views.SplitExpertWeights" + split_for_grouped):
        grouped_refresh(split.expert_view)
    with refused(RefreshError, match=r"SplitExpertWeights: mok's own view; pass the SplitRoutedWeight this function"):
        split_refresh(split.expert_view)
    with refused(RefreshError, match=r"GroupedExpertWeights: mok's own view; pass the 5-tuple this function"):
        grouped_refresh(grouped.expert_view)
    for refresh in (split_refresh, grouped_refresh):
        with refused(RefreshError, match=r"; found an object of class object$"):
            refresh(object())
    assert all(torch.equal(t, b) for t, b in zip(layouts, before, strict=True))
    assert split_refresh(split) is split and grouped_refresh(grouped) is grouped  # the right kind still refreshes


def test_split_bf16(installed_te: Installer) -> None:
    installed_te("2.20.2")
    ps = [torch.nn.Parameter(torch.randn(64, 32, dtype=torch.bfloat16)) for _ in range(3)]
    got = W._native_split_weight_view(tuple(ps), rows=64, columns=32, use_mxfp8=False)
    assert got.data.data_ptr() == ps[0].data_ptr() and got.data.shape == (64, 32)
    assert got.storage_table.tolist() == [p.data_ptr() for p in ps]
    assert got.scale is None and got.scale_tensors is None and got.transposed_data is None
    assert got.native_columnwise is False
    with refused(ExpertWeightError, match="expert 1 BF16 rowwise: expected dtype torch.bfloat16; found torch.float32"):
        W._native_split_weight_view(
            [ps[0], torch.nn.Parameter(torch.randn(64, 32))], rows=64, columns=32, use_mxfp8=False
        )


# ------------------------------------------------------------------ te_compat.names


@pytest.mark.parametrize(
    ("attr", "kind", "logical"),
    [  # facts.md's attribute names, each release's, translated
        ("_rowwise_scale_inv", None, "rowwise_scale_inv"),
        ("_columnwise_data", te_compat.TensorKind.MXFP8, "columnwise_data"),
        ("_with_gemm_swizzled_scales", None, "scales_swizzled"),
        ("_scale_inv", te_compat.TensorKind.FLOAT8, "scale_inv"),
        ("shape", te_compat.TensorKind.GROUPED, "tensor_shapes"),  # 2.13's name, 2.14+ tensor_shapes
        ("scale_inv", te_compat.TensorKind.GROUPED, "scale_inv"),  # an alias of rowwise_scale_inv
        ("data", te_compat.TensorKind.GROUPED, "data"),
        ("rowwise_scale_inv", te_compat.TensorKind.MXFP8, "rowwise_scale_inv"),  # already logical
    ],
)
def test_logical_storage_name(attr: str, kind: te_compat.TensorKind | None, logical: str) -> None:
    assert logical_storage_name(attr, kind) == logical


def test_every_attribute_of_the_table_translates_back() -> None:
    for row in table.ROWS:
        for attr in row.storage.values():
            for kind in (row.kind, None):
                assert row.storage[logical_storage_name(attr, kind)] == attr, (row.kind, row.span, attr)


def test_unknown_and_ambiguous_names(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'_rowwise_scale_inv' is neither .* of float8 tensors.*_scale_inv"):
        logical_storage_name("_rowwise_scale_inv", te_compat.TensorKind.FLOAT8)
    rows = (
        replace(table.ROWS[0], storage={"data": "_payload"}),
        replace(table.ROWS[1], storage={"transpose": "_payload"}),
    )
    monkeypatch.setattr(table, "ROWS", rows)
    names._inverse.cache_clear()
    try:
        with pytest.raises(ValueError, match="'_payload' holds different storage .*: it stands for data, transpose"):
            logical_storage_name("_payload")
    finally:
        names._inverse.cache_clear()
        names._logical_names.cache_clear()
