"""Stand-ins for Transformer Engine classes, generated from the matrix records.

Every stand-in class is built from ``matrix/records/<release>.json``, the facts extracted from
that release's real source: the same module path and class name, the same TE base classes, and
only the attributes that release's constructors assign (setting any other name raises). This
records-based exactness is what the tests check te_compat's table against; the machinery is
te_compat.testing's (``fake_te_class``, ``new_fake``), which builds downstream fakes from the
table instead. So a stand-in behaves as facts.md records for real TE objects on a GPU:

- ``torch.nn.Parameter(t)`` returns an instance of the TE class itself (``detach`` builds a
  new wrapper sharing the buffers, as TE's ``make_like`` does);
- ``t.data`` is a NEW wrapper of the same class sharing the same buffers;
- 1.x Float8Tensor keeps ``_scale_inv``/``_transpose`` in the dict ``_fp8_attrs`` behind
  properties.

``__torch_dispatch__`` of a stand-in raises :class:`StandInDispatched`: a probe that would
materialise or dequantise the logical tensor fails the test instead.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from matrix.check import lineage
from matrix.extract import load_record
from matrix.releases import matrix_release
from te_compat.testing import FakeDispatchError, fake_te_class, new_fake

STANDIN_DOC = "Stand-in for TE {release} {path}, generated from matrix/records (not TE itself)."

# A stand-in's __torch_dispatch__ ran: something touched the logical tensor's values.
StandInDispatched = FakeDispatchError


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


@cache
def standin_class(release: str, path: str) -> type:
    """The stand-in for class ``path`` as TE ``release`` defines it."""
    classes = _record(release)
    if path not in classes:
        raise KeyError(f"TE {release} defines no class {path} (per matrix/records)")
    bases: list[type] = []
    for base in classes[path]["bases"]:
        if base in classes:
            bases.append(standin_class(release, base))
        elif base == "torch.Tensor":
            bases.append(torch.Tensor)
    doc = STANDIN_DOC.format(release=release, path=path)
    return fake_te_class(path, bases, doc=doc, dict_backed=_dict_backed(release, path))


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
    origin = f"TE {release}'s {path} (per matrix/records)"
    names = assigned_names(release, path)
    cls = standin_class(release, path)
    return new_fake(cls, attrs or {}, names=names, origin=origin, shape=shape, dtype=dtype, device=device)
