"""Stand-ins for Transformer Engine classes, generated from the matrix records.

Every stand-in class is built from ``matrix/records/<release>.json``, the facts extracted from
that release's real source: the same module path and class name, the same TE base classes, and
only the attributes that release's constructors assign (setting any other name raises). On top,
the behaviour facts.md records for real TE objects on a GPU:

- ``torch.nn.Parameter(t)`` returns an instance of the TE class itself (``detach`` builds a
  new wrapper sharing the buffers, as TE's ``make_like`` does);
- ``t.data`` is a NEW wrapper of the same class sharing the same buffers;
- 1.x Float8Tensor keeps ``_scale_inv``/``_transpose`` in the dict ``_fp8_attrs`` behind
  properties.

``__torch_dispatch__`` of a stand-in raises :class:`StandInDispatched`: a probe that would
materialise or dequantise the logical tensor fails the test instead.
"""

from __future__ import annotations

import types
from functools import cache
from typing import Any

import torch

from matrix.check import lineage
from matrix.extract import load_record
from matrix.releases import matrix_release

STANDIN_DOC = "Stand-in for TE {release} {path}, generated from matrix/records (not TE itself)."


class StandInDispatched(AssertionError):
    """A stand-in's __torch_dispatch__ ran: something touched the logical tensor's values."""


def _record(release: str) -> dict[str, Any]:
    return load_record(matrix_release(release).source_from)["classes"]


def assigned_names(release: str, path: str) -> set[str]:
    """Attributes the release's class ``path`` (with its TE bases) assigns or exposes as properties."""
    classes = _record(release)
    names: set[str] = set()
    for cls in lineage(classes, path):
        names |= set(classes[cls]["assigns"])
    return names


def _dict_backed(release: str, path: str) -> set[str]:
    """1.x: attributes that are properties over the shared dict ``_fp8_attrs``."""
    classes = _record(release)
    chain = lineage(classes, path)
    assigns = {a for c in chain for a in classes[c]["assigns"]}
    props = {p for c in chain for p in classes[c]["properties"]}
    if "_fp8_attrs" not in assigns:
        return set()
    return (props & assigns) - {"data", "_data", "_fp8_attrs"}


def _dispatch(cls, func, types_, args=(), kwargs=None):  # type: ignore[no-untyped-def]
    raise StandInDispatched(f"{cls.__qualname__} stand-in: __torch_dispatch__({func}) was called")


def _detach(self: Any) -> Any:
    """TE's make_like: a new wrapper of the same class sharing every buffer."""
    twin = torch.Tensor._make_wrapper_subclass(
        type(self), self.shape, dtype=self.dtype, device=self.device, requires_grad=False
    )
    twin.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_is_param"})
    return twin


def _dict_property(name: str) -> property:
    def get(self: Any) -> Any:
        return self._fp8_attrs.get(name)

    def put(self: Any, value: Any) -> None:
        self._fp8_attrs[name] = value

    return property(get, put)


@cache
def standin_class(release: str, path: str) -> type:
    """The stand-in for class ``path`` as TE ``release`` defines it."""
    classes = _record(release)
    if path not in classes:
        raise KeyError(f"TE {release} defines no class {path} (per matrix/records)")
    facts = classes[path]
    bases: list[type] = []
    for base in facts["bases"]:
        if base in classes:
            bases.append(standin_class(release, base))
        elif base == "torch.Tensor":
            bases.append(torch.Tensor)
    namespace: dict[str, Any] = {
        "__module__": facts["module"],
        "__qualname__": facts["name"],
        "__doc__": STANDIN_DOC.format(release=release, path=path),
        "_standin_release": release,
        "_standin_path": path,
    }
    if torch.Tensor in bases:
        namespace["__torch_dispatch__"] = classmethod(_dispatch)
        namespace["detach"] = _detach
        namespace["data"] = property(_detach)
    for name in _dict_backed(release, path):
        namespace[name] = _dict_property(name)
    return types.new_class(facts["name"], tuple(bases) or (object,), exec_body=lambda ns: ns.update(namespace))


def make_standin(
    release: str,
    path: str,
    attrs: dict[str, Any] | None = None,
    *,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> Any:
    """An instance of the stand-in, with ``attrs`` set by the release's own attribute names.

    Every attribute the release assigns and ``attrs`` leaves out is None; a name the release
    does not assign raises, so a fixture cannot invent storage the release never had.
    """
    attrs = attrs or {}
    cls = standin_class(release, path)
    allowed = assigned_names(release, path)
    unknown = sorted(set(attrs) - allowed)
    if unknown:
        raise AttributeError(
            f"TE {release}'s {path} never assigns {unknown} (per matrix/records); it assigns {sorted(allowed)}"
        )
    if issubclass(cls, torch.Tensor):
        if shape is None:
            raise ValueError("a tensor stand-in needs its logical shape")
        obj = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device)
    else:
        obj = object.__new__(cls)
    if "_fp8_attrs" in allowed:
        obj.__dict__["_fp8_attrs"] = {}
    for name in sorted(allowed):
        if name != "_fp8_attrs":
            setattr(obj, name, attrs.get(name))
    return obj
