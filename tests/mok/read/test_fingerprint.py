"""mok.read.fingerprint: the compiled reader of tensors' memory facts refuses what the Python
reader refuses and finds a change wherever the Python reader does, whatever happens to the
tensors between a record and a comparison. It compares strides exactly, so it may also see a
change the Python reader proves harmless (the stride of a size-1 dimension of a contiguous
tensor): that plans the view again, with the same result."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mok.errors import StorageFreedError
from mok.read import fingerprint, memory

COMPILED = fingerprint.compiled()
needs_compiled = pytest.mark.skipif(
    COMPILED is None, reason="mok's compiled memory reader is not built here (it needs a C compiler at install)"
)


@pytest.fixture
def python_reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(fingerprint.ENV, "python")
    fingerprint.compiled.cache_clear()
    yield
    monkeypatch.undo()
    fingerprint.compiled.cache_clear()


def _name(i: int) -> str:
    return f"tensor {i}"


# what may happen to a tensor between the view and its refresh: each returns the tensor read then
CHANGES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "nothing": lambda t: t,
    "bytes written": lambda t: t.fill_(7),
    "a dtype re-view through .data": lambda t: _set_data(t, t.detach().view(torch.int8)),
    "a shape re-view through .data": lambda t: _set_data(t, t.detach().view(-1)),
    "strides through .data": lambda t: _set_data(t, t.detach().t()),
    "one element on through .data": lambda t: _set_data(t, t.detach().view(-1)[1:].view(-1)[: t.numel() - 1]),
    "set_ to a copy": lambda t: t.set_(t.detach().clone()),
    "as_strided_ in place": lambda t: t.as_strided_(t.shape, (1, t.shape[0])),
    "storage freed": lambda t: _resize_storage(t, 0),
    "storage shrunk": lambda t: _resize_storage(t, t.untyped_storage().nbytes() // 2),
    "storage regrown": lambda t: _regrow(t),
    "another tensor": lambda t: t.detach().clone(),
    "a view at an offset": lambda t: t.detach().view(-1)[3:],
}


def _set_data(t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    t.data = new
    return t


def _resize_storage(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    t.untyped_storage().resize_(nbytes)
    return t


def _regrow(t: torch.Tensor) -> torch.Tensor:
    nbytes = t.untyped_storage().nbytes()
    t.untyped_storage().resize_(0)
    t.untyped_storage().resize_(nbytes)
    return t


def _tensors(shapes: list[tuple[int, int]], deep: list[bool]) -> list[torch.Tensor]:
    """Tensors of uint8, some deep into a larger storage (an offset), some sharing one."""
    flat = torch.zeros(4096, dtype=torch.uint8)
    found = []
    for (r, c), inside in zip(shapes, deep, strict=True):
        found.append(flat[100 : 100 + r * c].view(r, c) if inside else torch.zeros(r, c, dtype=torch.uint8))
    return found


def _read(tensors: list[torch.Tensor], reader: str) -> Any:
    """read_memory of ``tensors`` by ``reader`` ("compiled" or "python"): its Memory, or the text of
    its StorageFreedError."""
    with pytest.MonkeyPatch.context() as patch:
        if reader == "python":
            patch.setenv(fingerprint.ENV, "python")
        fingerprint.compiled.cache_clear()
        try:
            return memory.read_memory(tensors, _name)
        except StorageFreedError as exc:
            return str(exc)
        finally:
            fingerprint.compiled.cache_clear()


def _verdicts(tensors: list[torch.Tensor], change: str, at: int) -> dict[str, tuple[object, object]]:
    """For each reader, on the very same tensors (one change, so the allocator's choices are the
    same for both): (its refusal of a record after the change or None, whether it finds them the same)."""
    recorded = {reader: _read(tensors, reader) for reader in ("compiled", "python")}
    now = list(tensors)
    try:
        now[at] = CHANGES[change](now[at])
    except RuntimeError as exc:  # a change torch refuses for this tensor
        return {reader: ("torch refused", type(exc)) for reader in recorded}
    found = {}
    for reader, memory_ in recorded.items():
        after = _read(now, reader)
        found[reader] = (after if isinstance(after, str) else None, memory.comparer(memory_)(now))
    return found


CASES = st.tuples(
    st.lists(st.tuples(st.integers(1, 8), st.integers(2, 8)), min_size=1, max_size=4),
    st.data(),
)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(CASES)
def test_the_compiled_reader_sees_what_the_python_reader_sees(case: tuple[list[tuple[int, int]], Any]) -> None:
    shapes, data = case
    deep = data.draw(st.lists(st.booleans(), min_size=len(shapes), max_size=len(shapes)), label="deep")
    change = data.draw(st.sampled_from(sorted(CHANGES)), label="change")
    at = data.draw(st.integers(0, len(shapes) - 1), label="at")
    with torch.no_grad():
        found = _verdicts(_tensors(shapes, deep), change, at)
    compiled, in_python = found["compiled"], found["python"]
    assert compiled[0] == in_python[0], (change, at)  # the same refusal, or none
    assert compiled[1] is in_python[1] or (compiled[1] is False and in_python[1] is True), (change, at)
    if change == "nothing" or change == "bytes written":
        assert compiled == (None, True)


@needs_compiled
def test_every_change_of_what_a_view_reads_is_seen() -> None:
    """Each change but writing bytes (or regrowing a storage, which the allocator may give the same
    memory back) moves what a new view would read: the comparison says so."""
    with torch.no_grad():
        for change in CHANGES:
            if change in ("nothing", "bytes written", "storage regrown"):
                continue
            tensors = _tensors([(4, 6), (4, 6)], [True, False])
            compare = memory.comparer(memory.read_memory(tensors, _name))
            now = list(tensors)
            now[0] = CHANGES[change](now[0])
            assert not compare(now), change


def test_no_tensor_is_no_match_in_either_reader(python_reader: None) -> None:
    tensors = _tensors([(4, 6)], [False])
    compare = memory.comparer(memory.read_memory(tensors, _name))
    with pytest.raises((AttributeError, TypeError)):
        compare([None])


@needs_compiled
def test_the_compiled_reader_refuses_no_tensor_as_a_type_error() -> None:
    tensors = _tensors([(4, 6)], [False])
    compare = memory.comparer(memory.read_memory(tensors, _name))
    with pytest.raises(TypeError, match="expected a tensor; found NoneType"):
        compare([None])


@needs_compiled
def test_a_tensor_beyond_its_storage_is_named_as_the_python_reader_names_it() -> None:
    t = torch.zeros(64, dtype=torch.uint8)[40:]
    t.untyped_storage().resize_(48)
    with pytest.raises(StorageFreedError, match="tensor 0: its storage holds 48 bytes, but the tensor spans 24 bytes"):
        memory.read_memory([t], _name)


def test_the_report_says_which_reader_refreshes_use(python_reader: None) -> None:
    from mok.backend import memory_reader, report

    assert memory_reader() == f"python ({fingerprint.ENV}=python)" == report()["memory reader"]


@needs_compiled
def test_the_report_names_the_compiled_reader_where_it_is_in_use() -> None:
    from mok.backend import memory_reader

    assert memory_reader().startswith("compiled")
