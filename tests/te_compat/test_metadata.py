"""get_metadata() of te_compat's fakes against each release's wheel: exactly the keys TE's
storage class returns there, each holding the attribute TE returns under it."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

import te_compat.testing as tt
from matrix.releases import release_versions
from te_compat.metadata import METADATA_KEYS, check_metadata
from te_compat.table import TensorKind, in_range
from te_compat.verify import verify_installed
from tests.te_compat.test_verify import wheel_or_skip

KINDS = [TensorKind.FLOAT8, TensorKind.MXFP8, TensorKind.NVFP4, TensorKind.FLOAT8_BLOCKWISE]
KINDS += [TensorKind.HYBRID, TensorKind.IDENTITY]


def _releases() -> list[str]:
    return [r for r in release_versions() if r.startswith("2.")]


def _wheel_keys(wheel: Path, cls: type) -> list[tuple[str, str]] | None:
    """(key, value expression) of ``cls``'s get_metadata dict in the wheel's source, in order
    (None: the class defines no get_metadata)."""
    path = cls.__module__.replace(".", "/") + ".py"
    tree = ast.parse(zipfile.ZipFile(wheel).read(path).decode())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__qualname__:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "get_metadata":
                    dicts = [d for d in ast.walk(fn) if isinstance(d, ast.Dict)]
                    return [
                        (k.value, ast.unparse(v))
                        for d in dicts
                        for k, v in zip(d.keys, d.values, strict=True)
                        if isinstance(k, ast.Constant)
                    ]
    return None


@pytest.mark.parametrize("release", _releases())
def test_fake_get_metadata_has_the_wheels_keys(release: str) -> None:
    wheel = wheel_or_skip(release)
    checked = 0
    for kind in KINDS:
        try:
            fake = tt.fake_tensor(kind, (64, 64), release=release)
            storage_class = tt.fake_class(kind, release, storage=True)
        except ValueError:  # the release has no such kind, or no storage class for it
            continue
        want = _wheel_keys(wheel, storage_class)
        if want is None:
            assert not hasattr(fake, "get_metadata"), (release, kind)
            continue
        got = fake.get_metadata()
        assert list(got) == [k for k, _ in want], (release, kind)
        for key, expression in want:
            if expression.startswith("self._") and expression[5:].isidentifier():
                assert got[key] is getattr(fake, expression[5:]), (release, kind, key)
        checked += 1
    assert checked >= 2  # Float8 and MXFP8 in every 2.x release


def test_every_row_is_used() -> None:
    """No row of the table outside every release the matrix reads (a typo in a span)."""
    releases = [Version(r) for r in _releases()]
    assert all(any(in_range(v, k.since, k.until) for v in releases) for k in METADATA_KEYS)


def _unpacked(release: str, into: Path) -> Path:
    """The release's ``transformer_engine`` Python package, unpacked from its wheel."""
    with zipfile.ZipFile(wheel_or_skip(release)) as z:
        z.extractall(into, [n for n in z.namelist() if n.startswith("transformer_engine/")])
    return into / "transformer_engine"


@pytest.mark.parametrize("release", ["2.1.0", "2.12.0", "2.16.0", "2.20.2"])
def test_verify_checks_the_keys_against_the_source(release: str, tmp_path: Path) -> None:
    pkg = _unpacked(release, tmp_path)
    checked, problems = check_metadata(Version(release), pkg)
    assert checked >= 11 and problems == ()
    # a key TE renames is a disagreement naming the class and both key lists
    storage = tt.fake_class(TensorKind.MXFP8, release, storage=True)
    path = tmp_path / (storage.__module__.replace(".", "/") + ".py")
    path.write_text(path.read_text().replace('"rowwise_scale_inv":', '"rowwise_scales":'))
    checked, problems = check_metadata(Version(release), pkg)
    assert len(problems) == 1 and storage.__qualname__ in problems[0] and "'rowwise_scales'" in problems[0]
    result = verify_installed(pkg, release)
    assert not result.ok and result.metadata_problems == problems
    assert result.verdict.startswith(f"TE {release}: 1 disagreement(s)")
