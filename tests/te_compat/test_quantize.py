"""te_compat.quantize: its rows against every release, the capability's rule, and
mxfp8_quantize_into on stand-ins of TE's classes built from each release's record.

The stand-ins accept exactly the keywords the release's own source accepts (its recorded
signatures, followed through ``**kwargs`` as Python would) and require the ones it requires, so a
keyword te_compat passes that a release lacks, or one a release needs that te_compat leaves out,
fails here for that release.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from packaging.version import Version

import te_compat
from matrix.check import check_release
from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from te_compat import MissingFeatureError, mxfp8_quantize_into
from te_compat import quantize as Q
from te_compat.source_facts import keyword_call, lineage, signature

# mxfp8_quantize_into is deprecated (mok.quantize_mxfp8 is the one quantise API) and still works
# for one release: these tests hold it to that; test_mxfp8_quantize_into_is_deprecated checks the warning.
pytestmark = pytest.mark.filterwarnings("ignore:te_compat.mxfp8_quantize_into is deprecated:DeprecationWarning")

Installer = Callable[..., None]
QUANTIZER = "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Quantizer"
TENSOR = "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor"
RELEASES_2X = [v for v in release_versions() if Version(v) >= Version("2.0")]


def _classes(release: str) -> dict[str, Any]:
    return load_record(matrix_release(release).source_from)["classes"]


# ---- recorded signatures ----


def _method(source: str) -> ast.FunctionDef:
    (cls,) = ast.parse(source).body
    assert isinstance(cls, ast.ClassDef)
    (func,) = cls.body
    assert isinstance(func, ast.FunctionDef)
    return func


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(self, a, /, b, c=1, *args, d, e=2, **kw): ...", ["a", "/", "b", "c=", "*args", "d", "e=", "**kw"]),
        (
            "def __new__(cls, *args, rowwise_data, quantizer=None, **kwargs): ...",
            ["*args", "rowwise_data", "quantizer=", "**kwargs"],
        ),
        ("def f(self, /, x, *, y): ...", ["x", "*", "y"]),
        ("@staticmethod\ndef f(x, y=3): ...", ["x", "y="]),
    ],
)
def test_signature_is_written_as_the_source_declares_it(source: str, expected: list[str]) -> None:
    assert signature(_method(f"class C:\n    {source.replace(chr(10), chr(10) + '    ')}")) == expected


def _facts(bases: list[str], signatures: dict[str, str]) -> dict[str, Any]:
    return {"bases": bases, "assigns": [], "properties": [], "methods": list(signatures), "signatures": signatures}


def test_keyword_call_follows_kwargs_to_the_next_definer() -> None:
    # Tensor(Storage, Base): Tensor names a and forwards; Storage requires a and b (a is supplied by
    # Tensor); Base requires shape and takes no **kwargs, so nothing past it is accepted
    classes = {
        "m.Tensor": _facts(["m.Storage", "m.Base"], {"__new__": "*args, a, c=, **kwargs"}),
        "m.Storage": _facts(["m.Base"], {"__new__": "a, b, *args, **kwargs"}),
        "m.Base": _facts([], {"__new__": "shape, dtype=, *, requires_grad="}),
    }
    call = keyword_call(classes, "m.Tensor", "__new__")
    assert call is not None
    assert call.accepted == {"a", "b", "c", "shape", "dtype", "requires_grad"}
    assert call.required == {"a", "b", "shape"}
    assert not call.open_ended and call.positional == ()
    assert keyword_call(classes, "m.Tensor", "update_quantized") is None
    lone = {"m.X": _facts([], {"__init__": "x, /, y, **kw"})}
    only = keyword_call(lone, "m.X", "__init__")
    assert only is not None and only.open_ended and only.accepted == {"y"} and only.positional == ("x", "y")


# ---- the rows against every release ----


@pytest.mark.parametrize("version", release_versions())
def test_quantize_rows_agree_with_every_release(version: str) -> None:
    classes = _classes(version)
    assert Q.check_quantize_rows(version, classes) == []
    row = Q.quantize_row(Version(version))
    assert (row is not None) == (QUANTIZER in classes)  # from TE 2.0, and only there


def test_the_rows_keywords_are_each_releases_own() -> None:
    """Read off the records, not the rows: what each release's constructors require."""
    for version in RELEASES_2X:
        classes = _classes(version)
        row = Q.quantize_row(Version(version))
        assert row is not None
        tensor = keyword_call(classes, TENSOR, "__new__")
        assert tensor is not None and tensor.required <= set(row.tensor_keywords) <= tensor.accepted, version
        needs_flag = "with_gemm_swizzled_scales" in tensor.required
        assert needs_flag == (Version(version) >= Version("2.12")), version


def _row(**changes: Any) -> Q.QuantizeRow:
    return dataclasses.replace(Q.QUANTIZE_ROWS[-1], **changes)


def test_a_row_reaching_past_its_release_fails() -> None:
    old = dataclasses.replace(Q.QUANTIZE_ROWS[0], until=None)
    problems = Q.check_quantize_rows("2.12.0", _classes("2.12.0"), (old,))
    assert any("requires with_gemm_swizzled_scales" in p for p in problems), problems
    assert any("TE offers GEMM-layout scales here (optimize_for_gemm)" in p for p in problems), problems
    early = _row(since="2.0")
    problems = Q.check_quantize_rows("2.11.0", _classes("2.11.0"), (early,))
    assert any("does not accept with_gemm_swizzled_scales" in p for p in problems), problems


def test_a_rename_in_a_release_fails() -> None:
    classes = copy.deepcopy(_classes("2.20.2"))
    sig = classes[QUANTIZER]["signatures"]
    sig["__init__"] = sig["__init__"].replace("rowwise=", "row_wise=")
    problems = Q.check_quantize_rows("2.20.2", classes)
    assert problems == [f"TE 2.20.2: quantize row 2.12 +: {QUANTIZER}.__init__ does not accept rowwise (a rename?)"]
    swapped = _row(into_positional=("dst", "src"))
    (problem,) = Q.check_quantize_rows("2.20.2", _classes("2.20.2"), (swapped,))
    assert "takes src, dst positionally; the row passes dst, src" in problem


def test_uncovered_and_doubly_covered_releases_fail() -> None:
    assert Q.check_quantize_rows("2.20.2", _classes("2.20.2"), ()) == [
        f"TE 2.20.2: defines {QUANTIZER} but no quantize row covers it"
    ]
    twice = Q.check_quantize_rows("2.20.2", _classes("2.20.2"), (Q.QUANTIZE_ROWS[-1], _row(since="2.13")))
    assert twice[0] == "TE 2.20.2: 2 quantize rows cover it (2.12 +, 2.13 +)"
    assert Q.check_quantize_rows("1.13.0", _classes("1.13.0"), ()) == []  # no quantizer, no row needed


def test_release_check_covers_the_quantize_rows() -> None:
    record = copy.deepcopy(load_record("2.20.2"))
    record["classes"][QUANTIZER]["signatures"]["update_quantized"] = "src, *, noop_flag="
    problems = check_release("2.20.2", record)
    assert any("update_quantized takes src positionally" in p for p in problems), problems
    assert check_release("2.20.2") == []


def test_every_row_cites_its_release() -> None:
    for row in Q.QUANTIZE_ROWS:
        assert row.introduced_by.startswith(f"TE {row.since}"), row


# ---- the capability's rule ----


@pytest.mark.parametrize(
    ("cc", "ok"),
    [
        ((9, 0), False),
        ((8, 9), False),
        ((10, 0), True),
        ((10, 3), True),
        ((11, 0), True),
        ((12, 0), False),
        (None, False),
    ],
)
def test_the_device_rule(cc: tuple[int, int] | None, ok: bool) -> None:
    assert Q.device_quantizes(cc) is ok
    found, why = Q.support(Version("2.20.2"), True, cc)
    assert found is ok and (why == "") is ok
    if not ok:
        assert "write only on 10.0 <= compute capability < 12.0" in why


def test_support_needs_a_usable_te_with_a_row() -> None:
    assert Q.support(None, True, (10, 0)) == (False, "needs a usable Transformer Engine; found none usable")
    assert Q.support(Version("2.20.2"), False, (10, 0))[0] is False
    assert Q.support(Version("1.13.0"), True, (10, 0)) == (False, "needs TE >= 2.0 (MXFP8Quantizer); found TE 1.13.0")


@pytest.mark.parametrize(
    ("release", "cc", "ok", "api"),
    [
        ("2.20.2", (10, 0), True, "GEMM-layout scales via MXFP8Quantizer.optimize_for_gemm"),
        ("2.20.2", (9, 0), False, "GEMM-layout scales via MXFP8Quantizer.optimize_for_gemm"),
        ("2.11.0", (10, 0), True, "compact scales only"),
        ("1.13.0", (10, 0), False, None),
    ],
)
def test_capabilities_say_whether_te_quantizes_here(
    release: str,
    cc: tuple[int, int],
    ok: bool,
    api: str | None,
    installed_te: Installer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caps_module = sys.modules["te_compat.capabilities"]
    monkeypatch.setattr(caps_module, "cuda_device", lambda: ("a GPU", cc, ""))
    installed_te(release)
    caps = te_compat.capabilities(import_te=False, verify=False)
    assert caps.mxfp8_quantization is ok
    assert (caps.mxfp8_quantize_api is None) if api is None else (api in str(caps.mxfp8_quantize_api))
    missing = caps.missing("mxfp8_quantization")
    assert (missing == {}) is ok
    if release == "2.20.2" and not ok:
        assert "found compute capability 9.0" in missing["mxfp8_quantization"]


# ---- mxfp8_quantize_into on stand-ins built from the records ----


class DType(enum.Enum):
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8


@dataclasses.dataclass
class FakeTE:
    release: str
    quantizers: list[Any] = dataclasses.field(default_factory=list)
    tensors: list[Any] = dataclasses.field(default_factory=list)
    written: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)


def _accepting(call: Any, what: str, kwargs: dict[str, Any]) -> None:
    """What Python would raise for this call of the release's own signature."""
    unknown = set(kwargs) - call.accepted
    missing = call.required - set(kwargs)
    if (unknown and not call.open_ended) or missing:
        raise TypeError(f"{what}: unexpected {sorted(unknown)}, missing {sorted(missing)}")


def _install_fake_te(monkeypatch: pytest.MonkeyPatch, release: str) -> FakeTE:
    classes = _classes(release)
    state = FakeTE(release)
    init = keyword_call(classes, QUANTIZER, "__init__")
    new = keyword_call(classes, TENSOR, "__new__")
    assert init is not None and new is not None
    flags = {a for c in lineage(classes, QUANTIZER) for a in classes[c]["assigns"]} & {"optimize_for_gemm"}

    class MXFP8Quantizer:
        def __init__(self, **kwargs: Any) -> None:
            _accepting(init, "MXFP8Quantizer", kwargs)
            self.kwargs = kwargs
            for flag in flags:  # TE's Quantizer.__init__ sets it False
                setattr(self, flag, False)
            state.quantizers.append(self)

        def update_quantized(self, src: torch.Tensor, dst: Any, *, noop_flag: Any = None) -> Any:
            state.written.append((src, dst))
            for i, name in enumerate(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")):
                buffer = dst.kwargs[name]
                if buffer is not None:
                    buffer.fill_(0x10 + i)
            return dst

    class MXFP8Tensor:
        def __init__(self, **kwargs: Any) -> None:
            _accepting(new, "MXFP8Tensor", kwargs)
            self.kwargs = kwargs
            state.tensors.append(self)

    mxfp8 = types.ModuleType("transformer_engine.pytorch.tensor.mxfp8_tensor")
    mxfp8.MXFP8Quantizer = MXFP8Quantizer  # type: ignore[attr-defined]
    mxfp8.MXFP8Tensor = MXFP8Tensor  # type: ignore[attr-defined]
    tex = types.ModuleType("transformer_engine_torch")
    tex.DType = DType  # type: ignore[attr-defined]
    for name in ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.tensor"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mxfp8.__name__, mxfp8)
    monkeypatch.setitem(sys.modules, "transformer_engine_torch", tex)
    return state


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch, installed_te: Installer) -> Iterator[Callable[[str], FakeTE]]:
    """TE ``release`` installed and importable (stand-ins from its record) on a 10.0 device."""
    monkeypatch.setattr(Q, "_device_capability", lambda device: (10, 0))

    def install(release: str) -> FakeTE:
        state = _install_fake_te(monkeypatch, release)
        installed_te(release)
        return state

    yield install


def _buffers(shape: tuple[int, ...], *, fill: int = 0xEE) -> dict[str, torch.Tensor]:
    rows, columns = 1, shape[-1]
    for d in shape[:-1]:
        rows *= d
    rup = lambda v, m: -(-v // m) * m  # noqa: E731
    return {
        "rowwise_data": torch.full(shape, fill, dtype=torch.uint8),
        "rowwise_scale_inv": torch.full((rup(rows, 128), rup(columns // 32, 4)), fill, dtype=torch.uint8),
        "columnwise_data": torch.full(shape, fill, dtype=torch.uint8),
        "columnwise_scale_inv": torch.full((rup(rows // 32, 4), rup(columns, 128)), fill, dtype=torch.uint8),
    }


@pytest.mark.parametrize("release", RELEASES_2X)
def test_quantize_into_the_callers_buffers(release: str, fake_te: Callable[[str], FakeTE]) -> None:
    te = fake_te(release)
    src = torch.randn(2, 64, 96, dtype=torch.bfloat16)
    given = _buffers((2, 64, 96))
    dst = mxfp8_quantize_into(src, **given)
    ((seen_src, seen_dst),) = te.written
    assert seen_src is src and seen_dst is dst and te.tensors == [dst]
    for i, name in enumerate(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")):
        assert te.tensors[0].kwargs[name].data_ptr() == given[name].data_ptr(), name
        assert bool((given[name] == 0x10 + i).all()), name  # TE wrote the caller's memory
    (quantizer,) = te.quantizers
    assert quantizer.kwargs == {"fp8_dtype": DType.kFloat8E4M3, "rowwise": True, "columnwise": True}
    assert dst.kwargs["quantizer"] is quantizer and dst.kwargs["shape"] == (2, 64, 96)  # type: ignore[attr-defined]
    assert dst.kwargs["dtype"] is torch.bfloat16 and dst.kwargs["fp8_dtype"] is DType.kFloat8E4M3  # type: ignore[attr-defined]
    if Version(release) >= Version("2.12"):
        assert dst.kwargs["with_gemm_swizzled_scales"] is False and quantizer.optimize_for_gemm is False  # type: ignore[attr-defined]


@pytest.mark.parametrize("release", ["2.12.0", "2.20.2"])
def test_gemm_layout_asks_te_for_swizzled_scales(release: str, fake_te: Callable[[str], FakeTE]) -> None:
    te = fake_te(release)
    src = torch.randn(256, 128, dtype=torch.bfloat16)
    rows = torch.zeros(256, 128, dtype=torch.uint8).view(torch.float8_e4m3fn)  # mok's payload dtype
    layout = torch.zeros(256 // 128, 128 // 128, 32, 16, dtype=torch.uint8)  # mok's layout shape, same bytes
    dst = mxfp8_quantize_into(src, rowwise_data=rows, rowwise_scale_inv=layout, gemm_layout=True)
    (quantizer,) = te.quantizers
    assert quantizer.optimize_for_gemm is True and dst.kwargs["with_gemm_swizzled_scales"] is True  # type: ignore[attr-defined]
    assert quantizer.kwargs["columnwise"] is False and dst.kwargs["columnwise_data"] is None  # type: ignore[attr-defined]
    scales = dst.kwargs["rowwise_scale_inv"]  # type: ignore[attr-defined]
    assert scales.shape == (256, 4) and scales.data_ptr() == layout.data_ptr()
    assert bool((layout == 0x11).all()) and bool((rows.view(torch.uint8) == 0x10).all())


def test_gemm_layout_before_2_12_is_refused(fake_te: Callable[[str], FakeTE]) -> None:
    te = fake_te("2.11.0")
    given = _buffers((64, 64))
    with pytest.raises(
        MissingFeatureError, match=r"gemm_layout=True\) needs TE >= 2.12 \(optimize_for_gemm\); found TE 2.11.0"
    ):
        mxfp8_quantize_into(torch.randn(64, 64), **given, gemm_layout=True)
    assert te.quantizers == [] and all(bool((b == 0xEE).all()) for b in given.values())


def test_a_device_te_does_not_write_on_is_refused(
    fake_te: Callable[[str], FakeTE], monkeypatch: pytest.MonkeyPatch
) -> None:
    te = fake_te("2.20.2")
    monkeypatch.setattr(Q, "_device_capability", lambda device: (9, 0))  # an H200
    given = _buffers((64, 64))
    with pytest.raises(
        MissingFeatureError, match=r"write only on 10.0 <= compute capability < 12.0 .*found compute capability 9.0"
    ):
        mxfp8_quantize_into(torch.randn(64, 64), **given)
    monkeypatch.setattr(Q, "_device_capability", lambda device: None)
    with pytest.raises(MissingFeatureError, match="found no CUDA device"):
        mxfp8_quantize_into(torch.randn(64, 64), **given)
    assert te.quantizers == [] and all(bool((b == 0xEE).all()) for b in given.values())


def test_no_usable_te_is_refused(installed_te: Installer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # its import raises
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    installed_te("2.20.2")
    with pytest.raises(
        MissingFeatureError, match="needs a usable Transformer Engine; found: import transformer_engine"
    ):
        mxfp8_quantize_into(torch.randn(64, 64), **_buffers((64, 64)))


BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "an int source",
        {"src": torch.zeros(64, 64, dtype=torch.int32)},
        ValueError,
        "expected a bfloat16, float16 or float32",
    ),
    ("a 1-D source", {"src": torch.zeros(64)}, ValueError, "of 2 or more dims; found torch.float32 of shape (64,)"),
    ("rows not a multiple of 32", {"src": torch.zeros(3, 16, 64)}, ValueError, "found 48 x 64 (shape (3, 16, 64))"),
    (
        "no buffers",
        {"buffers": {}},
        ValueError,
        "expected the rowwise buffers, the columnwise ones, or both; found none",
    ),
    ("data without scales", {"drop": "rowwise_scale_inv"}, ValueError, "found only rowwise_data"),
    ("scales without data", {"drop": "columnwise_data"}, ValueError, "found only columnwise_scale_inv"),
    (
        "a short payload",
        {"replace": ("rowwise_data", torch.zeros(32, 64, dtype=torch.uint8))},
        ValueError,
        "rowwise_data: expected shape (64, 64); found shape (32, 64)",
    ),
    (
        "a float payload",
        {"replace": ("columnwise_data", torch.zeros(64, 64))},
        ValueError,
        "columnwise_data: expected a contiguous torch.uint8 or torch.float8_e4m3fn tensor",
    ),
    (
        "scales of the wrong size",
        {"replace": ("rowwise_scale_inv", torch.zeros(64, 2, dtype=torch.uint8))},
        ValueError,
        "rowwise_scale_inv: expected 512 bytes (TE's padded (128, 4)); found shape (64, 2)",
    ),
    (
        "strided scales",
        {"replace": ("columnwise_scale_inv", torch.zeros(128, 8, dtype=torch.uint8).t())},
        ValueError,
        "not contiguous",
    ),
    ("a non-bool flag", {"gemm_layout": 1}, TypeError, "gemm_layout: expected a bool; found 1 (int)"),
]


@pytest.mark.parametrize(("what", "change", "error", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_what_was_expected(
    what: str, change: dict[str, Any], error: type[Exception], message: str, fake_te: Callable[[str], FakeTE]
) -> None:
    te = fake_te("2.20.2")
    src = change.get("src", torch.randn(64, 64))
    given: dict[str, Any] = change.get("buffers", _buffers((64, 64)))
    if "drop" in change:
        del given[change["drop"]]
    if "replace" in change:
        name, value = change["replace"]
        given[name] = value
    kept = {k: v.clone() for k, v in given.items()}
    with pytest.raises(error) as caught:
        mxfp8_quantize_into(src, **given, gemm_layout=change.get("gemm_layout", False))
    assert message in str(caught.value) and "expected" in str(caught.value)
    assert te.quantizers == [] and all(torch.equal(given[k], kept[k]) for k in given)  # nothing touched


def test_importing_te_compat_stays_cheap() -> None:
    import subprocess

    code = "import sys, te_compat; print('torch' in sys.modules, 'transformer_engine' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_mxfp8_quantize_into_is_deprecated_naming_its_successor() -> None:
    with (
        pytest.warns(DeprecationWarning, match=r"te_compat.mxfp8_quantize_into is deprecated; use mok.quantize_mxfp8"),
        pytest.raises(TypeError, match="src: expected a torch.Tensor"),
    ):
        mxfp8_quantize_into([1.0])  # type: ignore[arg-type]
