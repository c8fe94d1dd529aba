"""Property tests of te_compat's public API: storage flags of every type, on every kind and release
that has them, and repeated command-line options.

The expectations are written from outside te_compat: which release's class assigns which flag
comes from the matrix records (each release's own source), the types TE stores from TE's source
(``_with_gemm_swizzled_scales: bool``, ``_nvfp4_e4m3_max: int``, ...), and which feature a
release offers from the classes its record defines.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

import te_compat
from matrix.check import lineage
from matrix.extract import load_record
from matrix.releases import matrix_release, release_versions
from te_compat import StorageNotFoundError, StorageValueError, table
from te_compat.capabilities import FEATURES
from te_compat.cli import main
from tests import te_objects as T

Installer = Callable[..., None]
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# TE attribute -> (the snapshot field that reports it, the type TE stores in it)
STORED = {
    "_with_gemm_swizzled_scales": ("scales_swizzled", bool),
    "_row_scaled_nvfp4": ("row_scaled_nvfp4", bool),
    "_nvfp4_use_4over6": ("nvfp4_use_4over6", bool),
    "_is_2D_scaled": ("is_2d_scaled", bool),
    "_nvfp4_e4m3_max": ("nvfp4_e4m3_max", int),
}
SNAPSHOTS: dict[str, Callable[[object], Any]] = {
    "MXFP8Tensor": te_compat.mxfp8_storage,
    "NVFP4Tensor": te_compat.nvfp4_storage,
    "Float8BlockwiseQTensor": te_compat.blockwise_storage,
    "GroupedTensor": te_compat.grouped_storage,
}


@cache
def _classes(release: str) -> dict[str, Any]:
    classes: dict[str, Any] = load_record(matrix_release(release).source_from)["classes"]
    return classes


def _defines(release: str, name: str) -> bool:
    return any(c["name"] == name for c in _classes(release).values())


def _assigns(release: str, name: str) -> set[str]:
    classes = _classes(release)
    return {a for c in lineage(classes, T.class_path(release, name)) for a in classes[c]["assigns"]}


# (class, release, attribute) for every flag or count a release's class assigns, per its record
CASES = [
    (name, release, attr)
    for name in SNAPSHOTS
    for release in release_versions()
    if _defines(release, name)
    for attr in sorted(_assigns(release, name) & set(STORED))
]


def _build(name: str, release: str, attr: str, value: object, param: bool) -> object:
    if name == "MXFP8Tensor":
        return T.mxfp8_tensor(release, 64, 64, param=param, **{attr: value})
    if name == "NVFP4Tensor":
        return T.nvfp4_tensor(release, 64, 64, param=param, **{attr: value})
    if name == "Float8BlockwiseQTensor":
        return T.blockwise_tensor(release, 128, 128, param=param, **{attr: value})
    g = T.grouped_tensor(release, 2, 64, 64, mxfp8=True)
    setattr(g, attr, value)
    return g


VALUES = st.one_of(
    st.booleans(),
    st.none(),
    st.sampled_from(["True", "False", "true", "0", "1", "", "abc", "448"]),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, width=32),
    st.lists(st.booleans(), max_size=2),
    st.builds(torch.tensor, st.booleans()),
)


def test_every_flag_of_the_table_is_covered() -> None:
    # each flag the table probes is in some case: a new flag needs a type in STORED
    attrs = {attr for row in table.ROWS for attr in row.storage.values() if attr in STORED}
    assert attrs == {attr for _, _, attr in CASES} == set(STORED)
    assert {name for name, _, _ in CASES} == set(SNAPSHOTS)


@pytest.mark.parametrize(("name", "release", "attr"), CASES)
@settings(PROPERTY, max_examples=12)
@given(value=VALUES, param=st.booleans())
def test_a_stored_flag_is_read_as_it_is_or_refused(
    name: str, release: str, attr: str, value: object, param: bool, installed_te: Installer
) -> None:
    field, stored = STORED[attr]
    installed_te(release)
    obj = _build(name, release, attr, value, param)
    if value is None:  # "not set": a missing flag reads False, a missing optional one None
        if attr == "_is_2D_scaled":  # the blockwise layout cannot be read without it
            with pytest.raises(StorageNotFoundError, match="holds no is_2d_scaled"):
                SNAPSHOTS[name](obj)
            return
        assert getattr(SNAPSHOTS[name](obj), field) is (False if field == "scales_swizzled" else None)
        return
    if type(value) is stored:  # bool is a subclass of int, but never a count
        assert getattr(SNAPSHOTS[name](obj), field) == value
        return
    with pytest.raises(StorageValueError) as info:
        SNAPSHOTS[name](obj)
    message = str(info.value)
    plain_release = ".".join(release.split(".")[:3])  # a post release reads as its release
    assert name in message and repr(attr) in message and f"TE {plain_release}," in message
    # what was found, by type: a tensor by class and shape (never its values), a plain value with its type
    kind = type(value).__name__
    assert (f"found a {kind} of shape" if isinstance(value, torch.Tensor) else f"({kind})") in message
    assert isinstance(info.value, TypeError)


GROUPED_WITHOUT_OWN_FLAG = [
    r
    for r in release_versions()
    if _defines(r, "GroupedTensor") and "_with_gemm_swizzled_scales" not in _assigns(r, "GroupedTensor")
]


@PROPERTY
@given(release=st.sampled_from(GROUPED_WITHOUT_OWN_FLAG), value=VALUES)
def test_a_group_without_its_own_flag_reads_its_members_flags(
    release: str, value: object, installed_te: Installer
) -> None:
    # 2.13's GroupedTensor keeps no flag: its MXFP8 members carry theirs (2.12+)
    installed_te(release)
    g = T.grouped_tensor(release, 2, 64, 64, mxfp8=True)
    for member in g.quantized_tensors:
        member._with_gemm_swizzled_scales = value
    if value is None or isinstance(value, bool):
        assert te_compat.grouped_storage(g).scales_swizzled is bool(value)
        return
    with pytest.raises(StorageValueError, match=r"MXFP8Tensor: attribute '_with_gemm_swizzled_scales'"):
        te_compat.grouped_storage(g)


# ---- repeated command-line options ----

# class whose presence in a release's record means the release offers the feature
FEATURE_CLASSES = {
    "float8": "Float8Tensor",
    "mxfp8": "MXFP8Tensor",
    "float8_blockwise": "Float8BlockwiseQTensor",
    "nvfp4": "NVFP4Tensor",
    "grouped": "GroupedTensor",
    "hybrid": "HybridQuantizedTensor",
}
NEEDS_A_DEVICE = {"cuda", "mxfp8_hardware", "cuda_kernel", "mxfp8_quantization", "float8_fsdp2", "mxfp8_fsdp2"}


def _expected_available(feature: str, release: str, te_imports: bool) -> bool:
    """On a machine without a device, cuda.core or TE source, with TE ``release`` installed."""
    if feature == "selftest":  # what cannot run here skips, and skips fail nothing; it uses no TE of its own
        return True
    if feature in NEEDS_A_DEVICE or feature == "verified":  # no device; no TE source to verify
        return False
    if not te_imports:  # TE present but its import fails: nothing that uses TE is available
        return False
    if feature == "te":
        return True
    if feature == "post_all_gather_processing":  # a no-op for MXFP8 from 2.11 (the table's rows, matrix-checked)
        row = table.post_all_gather_row(Version(release))
        return row is not None and row.mxfp8 == "no-op"
    if feature == "swizzled_scale_flag":
        return _defines(release, "MXFP8Tensor") and "_with_gemm_swizzled_scales" in _assigns(release, "MXFP8Tensor")
    return _defines(release, FEATURE_CLASSES[feature])


@pytest.fixture
def bare_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA device, no cuda.core, no TE source on disk, and a TE whose import fails."""
    caps_module = sys.modules["te_compat.capabilities"]
    monkeypatch.setattr(caps_module, "cuda_device", lambda: (None, None, "no device (test)"))
    monkeypatch.setattr(caps_module, "cuda_core_present", lambda: False)
    monkeypatch.setattr(te_compat.verify, "find_te_source", lambda: None)
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)


FEATURE_NAMES = st.sampled_from([*FEATURES, "bogus"])


@PROPERTY
@given(
    release=st.sampled_from(release_versions()),
    groups=st.lists(st.lists(FEATURE_NAMES, min_size=1, max_size=4), min_size=1, max_size=4),
    no_import=st.booleans(),
    as_json=st.booleans(),
)
@pytest.mark.usefixtures("bare_machine")
def test_repeated_require_options_merge(
    release: str,
    groups: list[list[str]],
    no_import: bool,
    as_json: bool,
    installed_te: Installer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    installed_te(release)
    argv = ["report", *(["--no-import"] if no_import else []), *(["--json"] if as_json else [])]
    for group in groups:
        argv += ["--require", *group]
    code = main(argv)
    err = capsys.readouterr().err
    wanted = {f for group in groups for f in group}  # every list counts, not only the last
    if "bogus" in wanted:
        assert code == 2 and "unknown feature 'bogus'" in err
        return
    if "selftest" in wanted and no_import:  # the self-test imports TE: a usage error
        assert code == 2 and "drop --no-import" in err
        return
    missing = {f for f in wanted if not _expected_available(f, release, te_imports=no_import)}
    assert code == (1 if missing else 0), (argv, err)
    for feature in wanted:
        named = re.search(rf"(?:available: |; ){feature}: ", err) is not None
        assert named is (feature in missing), (feature, err)
    if missing - {"te"} - NEEDS_A_DEVICE and not no_import:  # the reason names the failed import
        assert f"Transformer Engine {release} is present but not usable: import transformer_engine" in err


TABLE_NAMES = sorted({n for r in table.ROWS for n in (*r.storage, *r.storage.values())})


@PROPERTY
@given(
    name=st.one_of(st.sampled_from(TABLE_NAMES), st.text(alphabet="_abcdefghijklmnopqrstuvwxyz", max_size=24)),
    kind=st.sampled_from([None, *te_compat.TensorKind]),
)
def test_known_storage_name_is_none_exactly_when_the_table_has_no_such_name(name: str, kind: Any) -> None:
    rows = [r for r in table.ROWS if kind is None or r.kind is kind]
    in_table = any(name in r.storage or name in r.storage.values() for r in rows)
    found = te_compat.known_storage_name(name, kind)
    assert (found is not None) is in_table
    if found is None:
        with pytest.raises(te_compat.UnknownStorageNameError):
            te_compat.logical_storage_name(name, kind)
    else:
        assert te_compat.logical_storage_name(name, kind) == found
        assert any(r.storage.get(found) == name or found == name for r in rows)
