"""te_compat.testing: every fake of every (kind, release) of the table read back by te_compat and
mok, the fakes against the release records, installed_release, the errors, and the "Try it
without TE" block of docs/te_compat.md run as it stands."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch
from packaging.version import Version

import mok
import te_compat
from matrix.releases import release_versions
from te_compat import TensorKind
from te_compat.table import ROWS, StorageRow
from te_compat.testing import (
    FakeDispatchError,
    FakeQuantizer,
    Float8BlockScaleTensorFormat,
    blockwise_buffers,
    fake_blockwise,
    fake_class,
    fake_float8,
    fake_grouped,
    fake_hybrid,
    fake_identity,
    fake_mxfp8,
    fake_nvfp4,
    fake_tensor,
    float8_buffers,
    grouped_buffers,
    installed_release,
    mxfp8_buffers,
    new_fake,
    nvfp4_buffers,
)
from tests import ROOT
from tests.spec_oracle import spec_layout
from tests.standins import assigned_names

ROWS_, COLS = 96, 160  # padded in every direction: 96 % 128, 160/32 % 4, 160/16 % 4, 96/16 % 4
EXPERTS = 3
SEED = 5


def _matrix_releases(row: StorageRow) -> list[str]:
    covered = [v for v in release_versions() if row.covers(Version(v))]
    assert covered, f"row {row.kind} {row.span} covers no release of the matrix"
    return covered


CASES = [(row, v) for row in ROWS for v in _matrix_releases(row)]
CASE_IDS = [f"{row.kind}-TE{v}" for row, v in CASES]


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _shape(kind: TensorKind) -> tuple[int, ...]:
    return (EXPERTS, ROWS_, COLS) if kind is TensorKind.GROUPED else (ROWS_, COLS)


def _is_tensor_row(row: StorageRow) -> bool:
    return not (row.kind is TensorKind.GROUPED and len(row.classes) == 1)


def _path(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _equal(found: torch.Tensor | None, expected: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (fp32 scales hold NaN in TE's padding: bytes, not values)."""
    if found is None or found.shape != expected.shape or found.dtype != expected.dtype:
        return False
    return torch.equal(found.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8))


# ---- what te_compat and mok read off each kind ---------------------------------------------------


def _check_buffers(snapshot: object, expected: dict[str, Any]) -> None:
    for name, buffer in expected.items():
        assert _equal(getattr(snapshot, name), buffer), name


def _mxfp8_scales(rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layouts of an MXFP8 tensor's logical scales (columnwise: the transpose of TE's buffer)."""
    return spec_layout(rows[:ROWS_, : COLS // 32]), spec_layout(cols[: ROWS_ // 32, :COLS].t())


def _nvfp4_scales(rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layouts of an NVFP4 tensor's logical scales (columnwise stored transposed already)."""
    return spec_layout(rows[:ROWS_, : COLS // 16]), spec_layout(cols[:COLS, : ROWS_ // 16])


def _read_mxfp8(fake: Any) -> None:
    expected = mxfp8_buffers((ROWS_, COLS), _gen())
    s = te_compat.mxfp8_storage(fake)
    assert s.shape == (ROWS_, COLS) and s.scales_swizzled is False
    _check_buffers(s, expected)
    v = mok.split_weight_view([fake], rows=ROWS_, columns=COLS, format="mxfp8")
    assert v.rowwise.data[0].data_ptr() == s.need("rowwise_data").data_ptr() and v.rowwise.data[0].shape == (
        ROWS_,
        COLS,
    )
    row, col = _mxfp8_scales(expected["rowwise_scale_inv"], expected["columnwise_scale_inv"])
    assert (
        torch.equal(v.rowwise.scales[0], row)
        and v.columnwise.scales is not None
        and torch.equal(v.columnwise.scales[0], col)
    )


def _read_nvfp4(fake: Any) -> None:
    expected = nvfp4_buffers((ROWS_, COLS), _gen())
    s = te_compat.nvfp4_storage(fake)
    assert s.shape == (ROWS_, COLS) and s.scales_swizzled is False
    _check_buffers(s, expected)
    v = mok.split_weight_view([fake], rows=ROWS_, columns=COLS, format="nvfp4")
    assert v.rowwise.data[0].data_ptr() == s.need("rowwise_data").data_ptr() and v.rowwise.data[0].shape == (
        ROWS_,
        COLS // 2,
    )
    row, col = _nvfp4_scales(expected["rowwise_scale_inv"], expected["columnwise_scale_inv"])
    assert (
        torch.equal(v.rowwise.scales[0], row)
        and v.columnwise.scales is not None
        and torch.equal(v.columnwise.scales[0], col)
    )


def _read_blockwise(fake: Any) -> None:
    s = te_compat.blockwise_storage(fake)
    assert s.shape == (ROWS_, COLS) and s.is_2d_scaled and s.columnwise_transposed
    _check_buffers(s, blockwise_buffers((ROWS_, COLS), _gen()))


def _read_float8(fake: Any) -> None:
    s = te_compat.float8_storage(fake)
    assert s.shape == (ROWS_, COLS)
    _check_buffers(s, float8_buffers((ROWS_, COLS), _gen()))


def _read_identity(fake: Any) -> None:
    expected = torch.randn(ROWS_, COLS, generator=_gen()).to(torch.bfloat16)
    assert _equal(te_compat.storage_attr(fake, "data"), expected)


def _read_hybrid(fake: Any) -> None:
    h = te_compat.hybrid_storage(fake)
    assert (h.rowwise_kind, h.columnwise_kind) == (TensorKind.MXFP8, TensorKind.NVFP4)
    row = te_compat.mxfp8_storage(h.rowwise)
    col = te_compat.nvfp4_storage(h.columnwise)
    assert row.columnwise_data is None and col.rowwise_data is None  # each pinned to its direction
    _check_buffers(row, mxfp8_buffers((ROWS_, COLS), _gen(SEED), columnwise=False))
    _check_buffers(col, nvfp4_buffers((ROWS_, COLS), _gen(SEED + 1), rowwise=False))
    v = mok.split_weight_view([fake], rows=ROWS_, columns=COLS, format="hybrid")
    assert (v.rowwise.format, v.columnwise.format) == ("mxfp8", "nvfp4") and v.columnwise.scales is not None
    assert torch.equal(v.rowwise.scales[0], spec_layout(row.need("rowwise_scale_inv")[:ROWS_, : COLS // 32]))
    assert torch.equal(v.columnwise.scales[0], spec_layout(col.need("columnwise_scale_inv")[:COLS, : ROWS_ // 16]))


def _read_grouped(fake: Any) -> None:
    expected = grouped_buffers((EXPERTS, ROWS_, COLS), _gen())
    g = te_compat.grouped_storage(fake)
    assert g.num_tensors == EXPERTS and g.tensor_shapes == ((ROWS_, COLS),) * EXPERTS and g.quantized
    for name in ("rowwise_data", "columnwise_data", "rowwise_scale_inv", "columnwise_scale_inv"):
        assert _equal(getattr(g, name), expected.flat[name]), name
    assert g.rowwise_scale_inv_offsets == tuple(expected.flat["rowwise_scale_inv_offsets"])
    assert g.members is not None and len(g.members) == EXPERTS
    for member, piece in zip(g.members, expected.experts, strict=True):
        _check_buffers(te_compat.mxfp8_storage(member), piece)
    v = mok.grouped_weight_view(fake, num_experts=EXPERTS, rows=ROWS_, columns=COLS, format="mxfp8")
    assert v.rowwise.data[0].data_ptr() == g.need("rowwise_data").data_ptr()
    pieces = expected.experts
    rows = torch.stack([p["rowwise_scale_inv"][:ROWS_, : COLS // 32] for p in pieces])
    cols = torch.stack([p["columnwise_scale_inv"][: ROWS_ // 32, :COLS].t() for p in pieces])
    assert torch.equal(v.rowwise.scales[0], spec_layout(rows)) and torch.equal(
        v.columnwise.scales[0], spec_layout(cols)
    )


READERS: dict[TensorKind, Callable[[Any], None]] = {
    TensorKind.MXFP8: _read_mxfp8,
    TensorKind.NVFP4: _read_nvfp4,
    TensorKind.FLOAT8_BLOCKWISE: _read_blockwise,
    TensorKind.FLOAT8: _read_float8,
    TensorKind.IDENTITY: _read_identity,
    TensorKind.HYBRID: _read_hybrid,
    TensorKind.GROUPED: _read_grouped,
}


@pytest.mark.parametrize("param", [False, True], ids=["tensor", "param"])
@pytest.mark.parametrize(("row", "release"), CASES, ids=CASE_IDS)
def test_every_fake_is_read_back_by_te_compat_and_mok(row: StorageRow, release: str, param: bool) -> None:
    if param and not _is_tensor_row(row):  # TE 2.13's GroupedTensor
        with pytest.raises(ValueError, match=f"TE {release}'s GroupedTensor is a plain class, not a torch.Tensor"):
            fake_tensor(row.kind, _shape(row.kind), release=release, param=True)
        return
    with installed_release(release), warnings.catch_warnings():
        warnings.simplefilter("error")  # no "moved class" or "newer than the table" warning
        fake = fake_tensor(row.kind, _shape(row.kind), release=release, seed=SEED, param=param)
        assert _path(fake) == row.classes[0] and te_compat.tensor_kind(fake) is row.kind
        assert isinstance(fake, torch.nn.Parameter) is param
        READERS[row.kind](fake)


@pytest.mark.parametrize(("row", "release"), CASES, ids=CASE_IDS)
def test_a_fake_holds_what_its_release_assigns(row: StorageRow, release: str) -> None:
    """Per matrix/records (TE's own source): the fake and its storage mixin have every attribute
    the release's class assigns; any other is one the row knows (of another release or class of
    the row; None on the fake), never one it probes."""
    fakes = [fake_tensor(row.kind, _shape(row.kind), release=release)]
    if len(row.classes) > 1 and row.kind is not TensorKind.GROUPED:
        fakes.append(fake_tensor(row.kind, _shape(row.kind), release=release, storage=True))
    for fake, path in zip(fakes, row.classes, strict=False):
        assert _path(fake) == path
        held = set(vars(fake)) | set(vars(fake).get("_fp8_attrs", {}))
        assigned = assigned_names(release, path)
        assert assigned <= held, f"{path} lacks {sorted(assigned - held)}"
        extra = held - assigned
        assert extra <= row.known, f"{path} holds {sorted(extra - row.known)}, which TE {release} never assigns"
        assert all(getattr(fake, name) is None for name in extra - {"_dtype", "fake_dtype", "dtype"})


# ---- shapes, seeds and TE's behaviours -----------------------------------------------------------


def test_buffer_shapes_are_facts_md_s() -> None:
    """The numbers of facts.md / tests/te_objects.py's notes for a [96, 160] weight, by hand."""
    mx = mxfp8_buffers((96, 160), _gen())
    assert {k: tuple(v.shape) for k, v in mx.items()} == {
        "rowwise_data": (96, 160),
        "rowwise_scale_inv": (128, 8),  # roundup(96, 128), roundup(160/32, 4)
        "columnwise_data": (96, 160),
        "columnwise_scale_inv": (4, 256),  # roundup(96/32, 4), roundup(160, 128)
    }
    fp4 = nvfp4_buffers((96, 160), _gen(), row_scaled=True)
    assert {k: tuple(v.shape) for k, v in fp4.items()} == {
        "rowwise_data": (96, 80),
        "rowwise_scale_inv": (128, 12),  # roundup(96, 128), roundup(160/16, 4)
        "amax_rowwise": (96,),  # row-scaled: one per row
        "columnwise_data": (160, 48),  # transposed, packed
        "columnwise_scale_inv": (256, 8),  # roundup(160, 128), roundup(96/16, 4)
        "amax_columnwise": (1,),
    }
    two_d = blockwise_buffers((200, 300), _gen())
    one_d = blockwise_buffers((200, 300), _gen(), two_d=False)
    compact = blockwise_buffers((200, 300), _gen(), two_d=False, compact=True)
    assert [tuple(two_d[k].shape) for k in two_d] == [(200, 300), (2, 4), (300, 200), (3, 4)]
    assert [tuple(one_d[k].shape) for k in one_d] == [(200, 300), (3, 200), (300, 200), (2, 300)]
    assert [tuple(compact[k].shape) for k in compact] == [(200, 300), (200, 3), (200, 300), (2, 300)]
    assert two_d["rowwise_scale_inv"].dtype == torch.float32 and fp4["rowwise_scale_inv"].dtype == torch.uint8


def test_grouped_offsets_are_te_s_e_plus_1_element_offsets() -> None:
    """TE's GroupedTensor keeps each scale buffer's offsets as E+1 element offsets, expert-major,
    the last one the flat buffer's size; the per-expert sizes are facts.md's, by hand."""
    mx = grouped_buffers((3, 96, 160), _gen())
    assert mx.flat["rowwise_scale_inv_offsets"] == [0, 1024, 2048, 3072]  # 128 x 8 per expert
    assert mx.flat["columnwise_scale_inv_offsets"] == [0, 1024, 2048, 3072]  # 4 x 256 per expert
    fp4 = grouped_buffers((2, 96, 160), _gen(), format="nvfp4", columnwise=True)
    assert fp4.flat["rowwise_scale_inv_offsets"] == [0, 1536, 3072]  # 128 x 12 per expert
    assert fp4.flat["columnwise_scale_inv_offsets"] == [0, 2048, 4096]  # 256 x 8 per expert
    one = grouped_buffers((1, 64, 128), _gen(), columnwise=False)
    assert one.flat["rowwise_scale_inv_offsets"] == [0, 512] and "columnwise_scale_inv_offsets" not in one.flat
    for buffers in (mx, fp4, one):
        for name in ("rowwise_scale_inv", "columnwise_scale_inv"):
            if name in buffers.flat:
                offsets = buffers.flat[f"{name}_offsets"]
                assert offsets[-1] == buffers.flat[name].numel()
                for e, piece in enumerate(buffers.experts):  # each expert's view starts at its offset
                    start = piece[name].data_ptr() - buffers.flat[name].data_ptr()
                    assert (start, piece[name].numel()) == (offsets[e], offsets[e + 1] - offsets[e])
    assert grouped_buffers((2, 64, 128), _gen(), format="bf16").flat.keys() == {"rowwise_data"}  # no scales


def test_padding_is_0xff_and_the_logical_corner_is_seeded() -> None:
    scales = mxfp8_buffers((96, 160), _gen())["rowwise_scale_inv"]
    assert bool((scales[96:] == 0xFF).all()) and bool((scales[:, 5:] == 0xFF).all())
    assert len(scales[:96, :5].unique()) > 64  # random bytes, not a constant
    assert torch.equal(scales, mxfp8_buffers((96, 160), _gen())["rowwise_scale_inv"])
    assert not torch.equal(scales, mxfp8_buffers((96, 160), _gen(SEED + 1))["rowwise_scale_inv"])
    f32 = blockwise_buffers((200, 300), _gen())["rowwise_scale_inv"]
    assert bool(f32[:2, :3].ge(0.5).all()) and bool(f32[:, 3].view(torch.int32).eq(-1).all())


def test_parameter_data_and_dispatch_behave_as_te() -> None:
    with installed_release("2.20.2"):
        fake = fake_mxfp8((64, 128))
        param = torch.nn.Parameter(fake)
        assert type(param) is type(fake) and param.requires_grad and isinstance(param, torch.nn.Parameter)
        inner = param.data
        assert type(inner) is type(fake) and inner is not param and not isinstance(inner, torch.nn.Parameter)
        assert te_compat.storage_attr(inner, "rowwise_data") is te_compat.storage_attr(param, "rowwise_data")
        for touch in (lambda: fake + 1, lambda: repr(fake), fake.float, lambda: fake[0], lambda: fake.to("meta")):
            with pytest.raises(FakeDispatchError, match=r"mxfp8_tensor\.MXFP8Tensor is a te_compat.testing fake"):
                touch()


def test_float8_1x_keeps_its_attributes_in_a_dict_shared_with_data() -> None:
    fake = fake_float8((64, 128), release="1.13.0")
    assert "_scale_inv" not in vars(fake) and set(fake._fp8_attrs) >= {"_scale_inv", "_transpose"}
    assert fake.data._fp8_attrs is fake._fp8_attrs and fake.data._scale_inv is fake._scale_inv


def test_device_dtype_and_storage_only_objects() -> None:
    fake = fake_nvfp4((64, 128), release="2.20.2", device="meta", dtype=torch.float16)
    assert fake.device.type == "meta" and fake.dtype == torch.float16 and fake._rowwise_data.device.type == "meta"
    storage = fake_nvfp4((64, 128), release="2.20.2", storage=True)
    assert _path(storage).endswith("storage.nvfp4_tensor_storage.NVFP4TensorStorage")
    assert not isinstance(storage, torch.Tensor) and isinstance(fake, fake_class("nvfp4", "2.20.2", storage=True))
    with installed_release("2.20.2"):
        assert te_compat.nvfp4_storage(storage).shape == (64, 128)  # from the data: storage has no shape


def test_flags_follow_the_release() -> None:
    with installed_release("2.20.2"):
        assert te_compat.mxfp8_storage(fake_mxfp8((64, 128), swizzled=True)).scales_swizzled is True
        n = te_compat.nvfp4_storage(fake_nvfp4((64, 128), row_scaled=True))
        assert (n.row_scaled_nvfp4, n.nvfp4_use_4over6, n.nvfp4_e4m3_max) == (True, False, 448)
    with installed_release("2.15.0"):
        assert te_compat.nvfp4_storage(fake_nvfp4((64, 128))).row_scaled_nvfp4 is None
    with installed_release("2.11.0"):
        b = te_compat.blockwise_storage(fake_blockwise((256, 384), two_d=False, compact=True))
        assert b.data_format == "COMPACT" and not b.columnwise_transposed and b.shape == (256, 384)
        assert fake_blockwise((64, 128))._data_format is Float8BlockScaleTensorFormat.GEMM_READY


def test_grouped_variants() -> None:
    with installed_release("2.13.0"):  # no flag on the group: the members carry it
        g13 = fake_grouped((2, 64, 128), swizzled=True)
        assert not isinstance(g13, torch.Tensor) and te_compat.grouped_storage(g13).scales_swizzled
    with installed_release("2.20.2"):
        storage = fake_grouped((2, 64, 128), storage=True)  # 2.14+: GroupedTensorStorage
        assert not isinstance(storage, torch.Tensor) and te_compat.grouped_storage(storage).num_tensors == 2
        bf16 = te_compat.grouped_storage(fake_grouped((2, 64, 128), format="bf16", param=True))
        assert not bf16.quantized and bf16.members is None and bf16.need("rowwise_data").dtype == torch.bfloat16
        fp4 = fake_grouped((2, 64, 128), format="nvfp4")
        s = te_compat.grouped_storage(fp4)
        assert s.amax_rowwise is not None and s.amax_rowwise.shape == (2,) and s.members is not None
        assert te_compat.tensor_kind(s.members[1]) is TensorKind.NVFP4
        v = mok.grouped_weight_view(fp4, num_experts=2, rows=64, columns=128, format="nvfp4")
        assert torch.equal(
            v.rowwise.scales[0][1:], spec_layout(s.members[1]._rowwise_scale_inv[:64, :8])
        )  # one tile row each


def test_fake_quantizers_let_request_gemm_layout_scales_work() -> None:
    with installed_release("2.20.2"):
        param = fake_mxfp8((64, 128), param=True)
        report = te_compat.request_gemm_layout_scales([param])
        assert report.enabled == ("[0]",) and param._quantizer.optimize_for_gemm is True
        assert _path(param._quantizer) == "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Quantizer"
    with installed_release("2.11.0"):  # no quantizer row before 2.12: a generic stand-in
        param = fake_mxfp8((64, 128), param=True)
        assert type(param._quantizer) is FakeQuantizer
        assert te_compat.request_gemm_layout_scales([param]).unsupported == ("[0]",)


# ---- installed_release ---------------------------------------------------------------------------


def test_installed_release_nests_restores_and_clears_caches() -> None:
    outside = te_compat.te_status()
    with installed_release("2.11.0") as status:
        assert status.raw_version == "2.11.0" and status.source == "te_compat.testing"
        p = fake_mxfp8((64, 128), param=True, release="2.12.0")
        assert te_compat.storage_field(p, "scales_swizzled") is None  # 2.11's row has no flag
        with installed_release("2.12.0"):  # entering cleared the cached resolution
            assert te_compat.storage_field(p, "scales_swizzled") is False
        assert te_compat.storage_field(p, "scales_swizzled") is None  # and so did leaving
        with installed_release(None) as none:
            assert not none.present and te_compat.te_version() is None
        with pytest.raises(RuntimeError, match="boom"), installed_release("2.20.2", source="mine") as mine:
            assert mine.source == "mine"
            raise RuntimeError("boom")
        assert te_compat.te_version() == Version("2.11.0")
    assert te_compat.te_status() == outside


def test_installed_release_takes_any_version_string() -> None:
    with installed_release("2.21.0.dev0+5fdd7bb"):
        assert te_compat.te_min_version("2.21") and fake_class("mxfp8").__qualname__ == "MXFP8Tensor"
    with installed_release("not a version") as status:
        assert status.version is None and "cannot read" in status.reason
    with pytest.raises(TypeError, match=r"expected a TE version string such as '2.20.2' or None; found 2.2 \(float\)"):
        installed_release(2.2)  # type: ignore[arg-type]


REUSED = r"^installed_release\('2.20.2'\): expected a fresh installed_release\(...\) for each with-block; found "


def test_one_installed_release_entered_twice_is_refused_saying_so() -> None:
    """One block object is one with-block: entering it again, inside itself or after it ended,
    is refused naming the mistake, and leaves the pretence as the first entry made it."""
    outside = te_compat.te_status()
    block = installed_release("2.20.2")
    with block as status:
        assert status.raw_version == "2.20.2"
        with pytest.raises(RuntimeError, match=REUSED + r"this one entered before and still open \(a nested with\)$"):
            with block:
                pass
        assert te_compat.te_status().raw_version == "2.20.2"  # the refused entry changed nothing
        with installed_release("2.11.0"):  # a fresh one nests as documented
            assert te_compat.te_status().raw_version == "2.11.0"
        assert te_compat.te_status().raw_version == "2.20.2"
    assert te_compat.te_status() == outside
    with pytest.raises(RuntimeError, match=REUSED + r"this one entered before and already ended \(a second with\)$"):
        with block:
            pass
    assert te_compat.te_status() == outside


def _in_thread(work: Callable[[], object]) -> object:
    """``work()`` run in a new thread (a new, empty context); what it returned, or it raises."""
    result: list[object] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    if failure:
        raise failure[0]
    return result[0]


def test_a_block_in_another_thread_neither_shows_nor_ends_this_ones() -> None:
    outside = te_compat.te_status()
    a_in, b_in, a_out, b_checked = (threading.Event() for _ in range(4))
    seen: dict[str, object] = {}

    def a() -> None:
        with installed_release("2.14.1"):
            a_in.set()
            b_in.wait(10)
            seen["a inside"] = str(te_compat.te_version())
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with installed_release("2.20.2"):
            b_in.set()
            a_out.wait(10)  # A has left its block
            seen["b inside"] = str(te_compat.te_version())
            seen["b's fake"] = _path(fake_hybrid((64, 128)))  # the release b sees: 2.19+ has hybrids
        b_checked.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    b_in.wait(10)
    seen["main"] = te_compat.te_status()  # this thread entered no block
    for thread in threads:
        thread.join(60)
    assert b_checked.is_set() and seen["main"] == outside
    assert seen["a inside"] == "2.14.1" and seen["b inside"] == "2.20.2"
    assert seen["b's fake"].endswith(".HybridQuantizedTensor")
    assert te_compat.te_status() == outside


def test_blocks_left_out_of_order_end_only_themselves() -> None:
    outside = te_compat.te_status()
    first, second, third = installed_release("2.14.1"), installed_release("2.20.2"), installed_release("2.16.0")
    first.__enter__()
    second.__enter__()
    third.__enter__()
    first.__exit__(None, None, None)  # the outermost block ends first (a fixture's teardown, say)
    assert str(te_compat.te_version()) == "2.16.0"
    third.__exit__(None, None, None)
    assert str(te_compat.te_version()) == "2.20.2"  # second's entry survived first's exit
    second.__exit__(None, None, None)
    assert te_compat.te_status() == outside


def test_a_block_left_from_another_thread_ends_in_the_thread_that_entered_it() -> None:
    outside = te_compat.te_status()
    block = installed_release("2.14.1")
    block.__enter__()
    assert str(te_compat.te_version()) == "2.14.1"
    _in_thread(lambda: block.__exit__(None, None, None))
    assert te_compat.te_status() == outside


def test_asyncio_tasks_see_their_own_blocks() -> None:
    async def task(release: str, mine: tuple[asyncio.Event, asyncio.Event], other: tuple[asyncio.Event, ...]) -> str:
        with installed_release(release):
            mine[0].set()
            await other[0].wait()  # both blocks are open now
            found = str(te_compat.te_version())
            mine[1].set()
            await other[1].wait()  # neither ends before both have read
        return found

    async def both() -> list[str]:
        a, b = (asyncio.Event(), asyncio.Event()), (asyncio.Event(), asyncio.Event())
        return list(await asyncio.gather(task("2.14.1", a, b), task("2.20.2", b, a)))

    assert asyncio.run(both()) == ["2.14.1", "2.20.2"]


def test_contexts_that_see_different_releases_share_no_cached_resolution() -> None:
    p = fake_mxfp8((64, 128), param=True, release="2.12.0")
    older_in, newer_read, older_done = threading.Event(), threading.Event(), threading.Event()

    def older() -> tuple[object, object]:
        with installed_release("2.11.0"):  # 2.11's row has no flag
            first = te_compat.storage_field(p, "scales_swizzled")
            older_in.set()
            newer_read.wait(10)  # the newer context resolved p's class since it entered
            second = te_compat.storage_field(p, "scales_swizzled")
        older_done.set()
        return first, second

    def newer() -> object:
        older_in.wait(10)
        with installed_release("2.12.0"):
            found = te_compat.storage_field(p, "scales_swizzled")
            newer_read.set()
            older_done.wait(10)  # no block starts or ends (clearing caches) until older has read
        return found

    results: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda: results.update(older=older())),
        threading.Thread(target=lambda: results.update(newer=newer())),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {"older": (None, None), "newer": False}


# ---- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: fake_mxfp8((64, 128), release="1.13.0"),
            ValueError,
            r"TE 1.13.0 has no mxfp8 tensors .* TE 2.0 \.\. 2.9, TE 2.9 \.\. 2.12, TE 2.12 \+",
        ),
        (
            lambda: fake_hybrid((64, 128), release="2.18.0"),
            ValueError,
            r"TE 2.18.0 has no hybrid tensors .*: TE 2.19 \+",
        ),
        (
            lambda: fake_mxfp8((64, 128), release="2.11.0", swizzled=True),
            ValueError,
            r"TE 2.11.0's mxfp8 tensors have no 'scales_swizzled' \(asked for True\); it is in: TE 2.12 \+",
        ),
        (
            lambda: fake_nvfp4((64, 128), release="2.15.0", row_scaled=True),
            ValueError,
            r"no 'row_scaled_nvfp4' .* TE 2.16 \.\. 2.17, TE 2.17 \+",
        ),
        (
            lambda: fake_blockwise((64, 128), release="2.12.0", compact=True),
            ValueError,
            r"no 'data_format' .* TE 2.5 \.\. 2.9, TE 2.9 \.\. 2.12",
        ),
        (
            lambda: fake_float8((64, 128), release="1.13.0", storage=True),
            ValueError,
            r"names no storage class, only .*float8_tensor.Float8Tensor",
        ),
        (
            lambda: fake_grouped((2, 64, 128), release="2.13.0", param=True),
            ValueError,
            r"TE 2.13.0's GroupedTensor is a plain class, not a torch.Tensor",
        ),
        (
            lambda: fake_grouped((2, 64, 128), release="2.20.2", format="bf16", swizzled=True),
            ValueError,
            "a bf16 group has no scales",
        ),
        (
            lambda: fake_grouped((64, 128), release="2.20.2"),
            ValueError,
            r"expected \(experts, rows, columns\); found \(64, 128\)",
        ),
        (
            lambda: fake_grouped((2, 64, 128), release="2.20.2", format="fp4"),
            ValueError,
            r"format: expected one of 'mxfp8', 'nvfp4', 'bf16'; found 'fp4'",
        ),
        (
            lambda: fake_mxfp8((64, 100), release="2.20.2"),
            ValueError,
            r"divisible by 32 .* found shape \(64, 100\) \(M=64, K=100\)",
        ),
        (
            lambda: fake_mxfp8((64, -1), release="2.20.2"),
            ValueError,
            r"expected a shape of positive ints such as \(128, 256\); found \(64, -1\)",
        ),
        (
            lambda: fake_hybrid((64, 128), release="2.20.2", rowwise="fp8"),
            ValueError,
            r"rowwise: expected one of 'mxfp8', 'nvfp4', 'blockwise', 'identity' or None; found 'fp8'",
        ),
        (
            lambda: fake_tensor("plain", (64, 128), release="2.20.2"),
            ValueError,
            r"kind: expected one of float8, mxfp8, .* found 'plain'",
        ),
        (
            lambda: fake_mxfp8((64, 128), release="2.x"),
            te_compat.TEVersionError,
            r"cannot read Transformer Engine version '2.x'",
        ),
        (lambda: fake_mxfp8((64, 128), release="2.20.2", seed=1.5), TypeError, r"seed: expected an int; found 1.5"),
        (
            lambda: fake_mxfp8((64, 128), release="2.20.2", colwise=False),
            TypeError,
            r"fake_mxfp8: unexpected keyword argument\(s\) \['colwise'\]; expected its own or FakeOptions' \['device'",
        ),
    ],
)
def test_errors_say_what_was_expected_and_found(make: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


FACTORIES = {
    "fake_float8": fake_float8,
    "fake_mxfp8": fake_mxfp8,
    "fake_nvfp4": fake_nvfp4,
    "fake_blockwise": fake_blockwise,
    "fake_identity": fake_identity,
    "fake_hybrid": fake_hybrid,
    "fake_grouped": fake_grouped,
}
HUGE = (2**40, 32)  # 2**45 values: tens of TB of buffers
BAD_OPTIONS: list[tuple[dict[str, Any], type[Exception], str]] = [
    (
        {"seed": 2**70},
        ValueError,
        r"seed: expected an int from -2\*\*63 to 2\*\*64 - 1 .*; found 1180591620717411303424",
    ),
    ({"seed": -(2**63) - 1}, ValueError, r"seed: expected an int from -2\*\*63"),
    (
        {"device": "garbage"},
        ValueError,
        r"device: expected a torch.device or a string such as 'cpu'.*; found 'garbage'",
    ),
    ({"device": 3}, TypeError, r"device: expected a torch.device or a string .*; found 3 \(int\)"),
    ({"device": "cuda:99"}, ValueError, r"device: expected a device this process has; found 'cuda:99', which torch"),
    ({"dtype": torch.int8}, TypeError, r"dtype: expected a floating-point torch.dtype .*; found torch.int8"),
    ({"dtype": "bf16"}, TypeError, r"dtype: expected a floating-point torch.dtype .*; found 'bf16'"),
]
if not torch.cuda.is_available():
    BAD_OPTIONS.append(({"device": "cuda"}, ValueError, r"device: expected a device this process has; found 'cuda'"))


@pytest.fixture
def nothing_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the fakes make a buffer raises: a refusal must come before any of them."""

    def allocated(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("a buffer was allocated before the arguments were checked")

    for name in ("randint", "randn", "rand", "full", "empty", "cat"):
        monkeypatch.setattr(torch, name, allocated)


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize(("options", "error", "match"), BAD_OPTIONS, ids=[str(o) for o, _, _ in BAD_OPTIONS])
def test_bad_options_are_refused_before_allocating_naming_factory_and_argument(
    factory: str, options: dict[str, Any], error: type[Exception], match: str, nothing_allocated: None
) -> None:
    shape = (EXPERTS, 64, 128) if factory == "fake_grouped" else (64, 128)
    with pytest.raises(error, match=rf"^{factory}: {match}"):
        FACTORIES[factory](shape, release="2.20.2", **options)


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_shape_too_large_for_memory_is_refused_before_allocating(
    factory: str, device: str, nothing_allocated: None
) -> None:
    shape = (2**10, 2**30, 32) if factory == "fake_grouped" else HUGE
    shown = re.escape(str(shape))
    match = rf"^{factory}: shape {shown} needs at least \d+ bytes of buffers; expected at most the \d+ bytes cpu has"
    with pytest.raises(ValueError, match=match):
        FACTORIES[factory](shape, release="2.20.2", device=device)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: mxfp8_buffers(HUGE, _gen()), r"^mxfp8_buffers: shape \(1099511627776, 32\) needs at least"),
        (lambda: nvfp4_buffers(HUGE, _gen()), r"^nvfp4_buffers: shape .* needs at least 35184372088832 bytes"),
        (lambda: blockwise_buffers(HUGE, _gen(), columnwise=False), r"^blockwise_buffers: .* 35184372088832 bytes"),
        (lambda: float8_buffers(HUGE, _gen()), r"^float8_buffers: shape .* needs at least 70368744177664 bytes"),
        (lambda: grouped_buffers((2**10, 2**30, 32), _gen()), r"^grouped_buffers: shape .* needs at least"),
        (lambda: grouped_buffers((2, 64, 128), _gen(), device="garbage"), r"^grouped_buffers: device: expected"),
    ],
)
def test_the_buffer_functions_refuse_too_before_allocating(
    make: Callable[[], object], match: str, nothing_allocated: None
) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize("seed", [-(2**63), -1, 0, 2**64 - 1])
def test_every_seed_torch_takes_makes_a_fake(seed: int) -> None:
    expected = mxfp8_buffers((64, 128), torch.Generator().manual_seed(seed))
    # a hybrid's columnwise direction is seeded seed + 1, wrapped into torch's seeds as torch wraps them
    after = torch.Generator().manual_seed((seed + 1) % 2**64)
    expected_columnwise = nvfp4_buffers((64, 128), after, rowwise=False)["columnwise_data"]
    with installed_release("2.20.2"):
        assert _equal(te_compat.mxfp8_storage(fake_mxfp8((64, 128), seed=seed)).rowwise_data, expected["rowwise_data"])
        columnwise = te_compat.hybrid_storage(fake_hybrid((64, 128), seed=seed)).columnwise
        assert _equal(te_compat.nvfp4_storage(columnwise).columnwise_data, expected_columnwise)


def test_no_release_and_no_te_is_a_named_error() -> None:
    with (
        installed_release(None),
        pytest.raises(te_compat.TENotFoundError, match=r"no release given .* installed_release\('2.20.2'\)"),
    ):
        fake_mxfp8((64, 128))


def test_new_fake_refuses_attributes_the_class_never_has() -> None:
    cls = fake_class("mxfp8", "2.20.2")
    with pytest.raises(AttributeError, match=r"origin never assigns \['_rowwise_payload'\]; it assigns \['_a'\]"):
        new_fake(cls, {"_rowwise_payload": 1}, names=["_a"], origin="origin", shape=(1, 1))


# ---- the project itself --------------------------------------------------------------------------


def _docs_block(heading: str) -> str:
    """The first python code block of the section ``heading`` of docs/te_compat.md, as it stands."""
    page = (ROOT / "docs" / "te_compat.md").read_text()
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, f"docs/te_compat.md section {heading!r} has no python block"
    return found.group(1)


def test_the_try_it_without_te_block_runs(capsys: pytest.CaptureFixture[str]) -> None:
    before = te_compat.te_status()
    namespace: dict[str, Any] = {"__name__": "docs/te_compat.md"}
    exec(compile(_docs_block("Try it without TE"), "docs/te_compat.md (Try it without TE)", "exec"), namespace)
    assert "1 enabled" in capsys.readouterr().out
    assert namespace["g"].num_tensors == namespace["E"] and namespace["h"].columnwise_kind is TensorKind.NVFP4
    assert namespace["hv"].rowwise.format == "mxfp8" and tuple(namespace["layout"].shape) == (2, 4, 32, 16)
    assert (
        len(namespace["many"]) == namespace["E"]
        and namespace["v"].rowwise.data[0].data_ptr() == namespace["g"].need("rowwise_data").data_ptr()
    )
    n, k = namespace["N"], namespace["K"]
    with installed_release("2.20.2"):
        members = [te_compat.mxfp8_storage(m).need("rowwise_scale_inv")[:n, : k // 32] for m in namespace["g"].members]
    assert torch.equal(namespace["back"], torch.stack(members))  # the fakes' own scales, round-tripped
    assert te_compat.te_status() == before  # the block restored what te_compat sees


PATCH = re.compile(r"_read_installed\s*=|[\"']_read_installed[\"']")


def test_no_test_or_benchmark_patches_read_installed() -> None:
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]
    patching = [str(f.relative_to(ROOT)) for f in files if PATCH.search(f.read_text())]
    assert len(files) > 20 and patching == [], f"use te_compat.testing.installed_release instead: {patching}"


def test_bench_host_stand_ins_run_on_te_compat_testing(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    cmd = [sys.executable, "benchmarks/bench_host.py", "--source", "standins", "--repeats", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["meta"]["te"] == "2.20.2" and found["meta"]["source"] == "standins"
    assert [r["case"].split()[0] for r in found["results"]] == ["E=8", "E=8", "E=32", "E=32", "E=256", "E=256"]
    assert all(r["split refresh"] > 0 and r["grouped refresh"] > 0 for r in found["results"])


def test_te_compat_does_not_import_it_and_fakes_import_no_te() -> None:
    script = (
        "import sys, te_compat; assert 'te_compat.testing' not in sys.modules; "
        "from te_compat.testing import fake_tensor, installed_release\n"
        "with installed_release('2.20.2'):\n"
        "    [fake_tensor(k, (2, 64, 128) if k == 'grouped' else (64, 128)) for k in "
        "('float8', 'mxfp8', 'nvfp4', 'float8_blockwise', 'hybrid', 'identity', 'grouped')]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformer_engine'))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"  # the fakes name TE's modules without creating any
