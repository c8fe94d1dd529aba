"""Fakes of Transformer Engine's tensors, for unit tests that run without TE or a GPU.

A downstream project tests its own code on these the way it would on TE's objects::

    import te_compat
    from te_compat.testing import fake_mxfp8, installed_release

    def test_my_reader() -> None:
        with installed_release("2.20.2"):  # te_compat sees TE 2.20.2; nothing is imported
            weight = fake_mxfp8((256, 512), param=True, seed=1)
            s = te_compat.mxfp8_storage(weight)  # weight's own uint8 [256, 512] payload, padded scales
            ...

Every fake is built from te_compat's release table (``te_compat/table.py``) for one TE release:

- its class has the module path and name of TE's class in that release, so te_compat finds its
  kind from the class hierarchy as it does for TE's own; the bases are TE-like too (the storage
  mixin the row names, and that release's ``QuantizedTensor``/``QuantizedTensorStorage``);
- it has every attribute the row maps a logical storage name to, and every attribute the row
  knows, holding seeded random buffers of the shapes, dtypes and padding TE allocates (payload
  bytes random; scales random in their logical corner and 0xFF in TE's uninitialised padding);
- it behaves as TE's tensors do where readers meet them: ``torch.nn.Parameter(fake)`` is an
  instance of the fake's own class, ``fake.data`` is a new wrapper sharing the same buffers
  (TE's ``make_like``), and any torch operation on its values (arithmetic, printing, ``.to``,
  indexing) raises :class:`FakeDispatchError`: te_compat and mok promise never to materialise or
  dequantise TE's tensors, and a fake holds them to that.

``release=None`` (the default of every factory) means the release te_compat sees as installed:
inside ``installed_release(...)``, the pretended one. ``import te_compat`` does not import this
module; importing it imports torch.
"""

from __future__ import annotations

import copy
import enum
import math
import os
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

import torch
from packaging.version import Version

from te_compat import geometry, table
from te_compat.errors import TENotFoundError, describe
from te_compat.gemm_layout import QUANTIZER_ROWS
from te_compat.geometry import roundup as _roundup
from te_compat.metadata import metadata_keys
from te_compat.table import StorageRow, TensorKind, in_range
from te_compat.version import TEStatus, parse_te_version, pretend_installed, te_status, te_version

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11+; only read by type checkers here

__all__ = [
    "GROUPED_FORMATS",
    "HYBRID_FORMATS",
    "FakeDispatchError",
    "FakeOptions",
    "FakeQuantizer",
    "Float8BlockScaleTensorFormat",
    "GroupedBuffers",
    "blockwise_buffers",
    "fake_blockwise",
    "fake_class",
    "fake_float8",
    "fake_grouped",
    "fake_hybrid",
    "fake_identity",
    "fake_mxfp8",
    "fake_nvfp4",
    "fake_te_class",
    "fake_tensor",
    "float8_buffers",
    "grouped_buffers",
    "installed_release",
    "mxfp8_2d_buffers",
    "mxfp8_buffers",
    "new_fake",
    "nvfp4_buffers",
    "padded_scales",
]

Device = torch.device | str

BLOCKWISE_BLOCK = 128  # Float8BlockQuantizer.block_len
NVFP4_E4M3_MAX = 448  # NVFP4Tensor's default nvfp4_e4m3_max (2.17+)


# ------------------------------------------------------------------------------ the installed TE


def installed_release(release: str | None, *, source: str = "te_compat.testing") -> AbstractContextManager[TEStatus]:
    """Make te_compat treat TE ``release`` as installed within the block; None: no TE at all.

    Returns (as the ``with`` target) the :class:`te_compat.TEStatus` te_compat then reports. Use it
    so that te_compat reads fakes (its storage table is keyed by the installed release) or to
    test how your code behaves under another TE, or none, without installing one. ``release`` is
    read as TE's package metadata would give it: ``"2.20.2"``, a dev build such as
    ``"2.21.0.dev0+5fdd7bb"``, or a string te_compat cannot parse (it then reports a TE of
    unreadable version, as it would for such metadata). ``source`` is reported as where the
    version came from. te_compat's caches are cleared on entry and exit. Blocks nest and may end
    in any order (generators, fixtures): the newest block still open wins, and no block ends
    another. The pretence is context-local (:mod:`contextvars`): it holds in this thread and in
    the asyncio tasks started within the block; other threads see their own blocks, or the real
    installation. TE itself is neither imported nor changed: ``capabilities()`` still tries to
    import it, and reports a TE present but not usable (so its TE features missing) when that
    fails; ``capabilities(import_te=False)`` reads the pretended release alone.

    Each call makes one block: enter it once. Entering it again (nested or after it ended)
    raises RuntimeError; write a new ``installed_release(...)`` for each ``with``.
    """
    if release is not None and not isinstance(release, str):
        expected = "a TE version string such as '2.20.2' or None"
        raise TypeError(f"installed_release: expected {expected}; found {describe(release)}")
    if not isinstance(source, str):
        raise TypeError(
            f"installed_release: source: expected a str naming where the version came from; found {describe(source)}"
        )
    return _InstalledRelease(release, source)


class _InstalledRelease:
    """One :func:`installed_release` block, entered at most once (a generator-based context
    manager entered twice fails with an AttributeError that names none of this)."""

    def __init__(self, release: str | None, source: str) -> None:
        self._release, self._source = release, source
        self._block: AbstractContextManager[None] | None = None
        self._state = "new"  # then "open", then "ended"

    def __enter__(self) -> TEStatus:
        if self._state != "new":
            where = "still open (a nested with)" if self._state == "open" else "already ended (a second with)"
            raise RuntimeError(
                f"installed_release({self._release!r}): expected a fresh installed_release(...) for each with-block; "
                f"found this one entered before and {where}"
            )
        self._block = pretend_installed(self._release, self._source)
        self._block.__enter__()
        self._state = "open"
        return te_status()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> bool | None:
        self._state = "ended"
        block, self._block = self._block, None
        return None if block is None else block.__exit__(kind, exc, tb)


# ------------------------------------------------------------------------------ fake classes


class FakeDispatchError(AssertionError):
    """Torch dispatched an operation on a fake's values: something materialised or dequantised it."""


def _dispatch(cls: type, func: object, types_: object, args: object = (), kwargs: object = None) -> NoReturn:
    raise FakeDispatchError(
        f"{cls.__module__}.{cls.__qualname__} is a te_compat.testing fake: torch ran {func} on its values, "
        f"which materialises or dequantises the tensor (TE's tensors must only be read through their "
        f"storage: te_compat.storage_attr, mxfp8_storage, ...)"
    )


def _detach(self: torch.Tensor) -> torch.Tensor:
    """TE's make_like: a new wrapper of the same class sharing every buffer."""
    twin = torch.Tensor._make_wrapper_subclass(
        type(self), self.shape, dtype=self.dtype, device=self.device, requires_grad=False
    )
    twin.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_is_param"})
    _mark_faked(twin, _FAKED.get(id(self)))
    return twin


def _dict_property(name: str) -> property:
    """An attribute kept in the dict ``_fp8_attrs``, shared with detached copies (TE 1.x)."""

    def get(self: Any) -> Any:
        return self._fp8_attrs.get(name)

    def put(self: Any, value: Any) -> None:
        self._fp8_attrs[name] = value

    return property(get, put)


def fake_te_class(
    path: str, bases: Sequence[type] = (), *, doc: str | None = None, dict_backed: Iterable[str] = ()
) -> type:
    """A new class standing for TE's class ``path`` (``"module.Class"``), on ``bases``.

    Returns a class with that module and name (what te_compat's kind detection reads). When a
    base is a ``torch.Tensor``, its ``__torch_dispatch__`` raises :class:`FakeDispatchError`, and
    ``detach()`` and ``.data`` return a new wrapper sharing the buffers, as TE's tensors do, so
    ``torch.nn.Parameter(fake)`` is an instance of the class. ``dict_backed`` names attributes
    kept in the dict ``_fp8_attrs`` (TE 1.x Float8Tensor). Use it for a TE class the release
    table does not name (a custom recipe's QuantizedTensor, say); :func:`fake_class` gives the
    ones it does.
    """
    module, _, name = path.rpartition(".")
    namespace: dict[str, Any] = {
        "__module__": module,
        "__qualname__": name,
        "__doc__": doc or f"A te_compat.testing fake of TE's {path} (not TE itself).",
    }
    if any(issubclass(base, torch.Tensor) for base in bases):
        namespace["__torch_dispatch__"] = classmethod(_dispatch)
        namespace["detach"] = _detach
        namespace["data"] = property(_detach)
    for attr in dict_backed:
        namespace[attr] = _dict_property(attr)
    return types.new_class(name, tuple(bases) or (object,), exec_body=lambda ns: ns.update(namespace))


def new_fake(
    cls: type,
    attrs: Mapping[str, Any],
    *,
    names: Iterable[str],
    origin: str,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: Device = "cpu",
) -> Any:
    """An instance of the fake class ``cls`` with every attribute in ``names`` set.

    Returns the object: each name holds ``attrs[name]``, or None where ``attrs`` leaves it out. A
    tensor class is made a wrapper tensor of logical ``shape``, ``dtype`` and ``device`` (no
    memory of its own); another class, a plain object. An attribute of ``attrs`` outside
    ``names`` raises, naming ``origin`` (where ``names`` come from), so a fake cannot hold
    storage its release never had.
    """
    allowed = set(names)
    unknown = sorted(set(attrs) - allowed)
    if unknown:
        raise AttributeError(f"{origin} never assigns {unknown}; it assigns {sorted(allowed)}")
    if issubclass(cls, torch.Tensor):
        if shape is None:
            raise ValueError(f"{cls.__qualname__} is a torch.Tensor: a fake of it needs its logical shape")
        obj: Any = torch.Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=dtype, device=torch.device(device))
    else:
        obj = object.__new__(cls)
    if "_fp8_attrs" in allowed:
        obj.__dict__["_fp8_attrs"] = {}
    for name in sorted(allowed - {"_fp8_attrs"}):
        setattr(obj, name, attrs.get(name))
    return obj


def _version(release: str | None) -> Version:
    """The release a fake is made for: ``release``, else the installed (or pretended) one."""
    if release is None:
        installed = te_version()
        if installed is None:
            raise TENotFoundError(
                f"te_compat.testing: no release given and no Transformer Engine installed "
                f"({te_status().reason}); pass release='2.20.2', or use installed_release('2.20.2')"
            )
        return installed
    if not isinstance(release, str):
        raise TypeError(f"release: expected a TE version string such as '2.20.2'; found {describe(release)}")
    return parse_te_version(release)


def _kind(kind: TensorKind | str) -> TensorKind:
    faked = [k.value for k in TensorKind if table.rows_for(k)]
    found = None
    if isinstance(kind, str):  # Enum's own error for another value would print its repr
        try:
            found = TensorKind(kind)
        except ValueError:
            found = None
    if found is None or not table.rows_for(found):
        expected = f"one of {', '.join(faked)} (a kind of the release table)"
        raise ValueError(f"kind: expected {expected}; found {describe(kind)}")
    return found


def _row(kind: TensorKind, version: Version) -> StorageRow:
    row = table.row_for(kind, version)
    if row is None:
        spans = ", ".join(f"TE {r.span}" for r in table.rows_for(kind))
        raise ValueError(
            f"TE {version} has no {kind} tensors in te_compat's release table; the releases that do: {spans}"
        )
    return row


def _row_origin(row: StorageRow, version: Version, path: str) -> str:
    return f"TE {version}'s {path} (per te_compat's release table, row {row.kind} {row.span})"


def _row_attrs(row: StorageRow) -> frozenset[str]:
    """Every attribute the row's classes assign: the ones it probes and the ones it knows."""
    return frozenset(row.storage.values()) | row.known


def _base_paths(version: Version) -> tuple[str | None, str | None]:
    """TE's (QuantizedTensor, QuantizedTensorStorage/Base) class paths in ``version``, if any."""
    tensor = storage = None
    for path, since, until in table.QUANTIZED_BASES:
        if in_range(version, since, until):
            if path.endswith(".QuantizedTensor"):
                tensor = path
            else:
                storage = path
    return tensor, storage


@cache
def _base_class(path: str) -> type:
    return fake_te_class(path, (torch.Tensor,) if path.endswith(".QuantizedTensor") else ())


@cache
def _row_classes(index: int, tensor_base: str | None, storage_base: str | None) -> tuple[type, type | None]:
    """(tensor class, storage mixin or None) of row ``table.ROWS[index]`` on these TE bases.

    A grouped row with no storage mixin is TE 2.13's plain GroupedTensor class; GroupedTensor
    2.14+ derives from its storage and torch.Tensor, not from QuantizedTensor.
    """
    row = table.ROWS[index]
    doc = f"A te_compat.testing fake of TE's {{}} (release table row {row.kind} {row.span}; not TE itself)."
    grouped = row.kind is TensorKind.GROUPED
    mixin = None
    if len(row.classes) > 1:
        mixin_bases = (_base_class(storage_base),) if storage_base and not grouped else ()
        mixin = fake_te_class(row.classes[1], mixin_bases, doc=doc.format(row.classes[1]))
    if grouped and mixin is None:
        return fake_te_class(row.classes[0], doc=doc.format(row.classes[0])), None
    tensor_bases = (_base_class(tensor_base),) if tensor_base and not grouped else (torch.Tensor,)
    dict_backed = _row_attrs(row) - {"_data", "_fp8_attrs"} if "_fp8_attrs" in row.known else frozenset()
    bases = (mixin, *tensor_bases) if mixin else tensor_bases
    main = fake_te_class(row.classes[0], bases, doc=doc.format(row.classes[0]), dict_backed=dict_backed)
    (mixin or main).get_metadata = _GET_METADATA  # type: ignore[attr-defined]  # TE defines it on the storage class
    return main, mixin


# (kind, release) of each live fake by id, for get_metadata: a row's classes serve many releases, and
# a fake holds no attribute its release never assigns
_FAKED: dict[int, tuple[TensorKind, Version]] = {}


def _mark_faked(obj: object, faked: tuple[TensorKind, Version] | None) -> None:
    if faked is not None:
        _FAKED[id(obj)] = faked
        weakref.finalize(obj, _FAKED.pop, id(obj), None)


def _metadata_of(obj: Any) -> Callable[[], dict[str, Any]]:
    """TE's ``get_metadata`` of the faked release: exactly the keys its storage class returns
    (te_compat.metadata), each holding the attribute TE returns there. AttributeError where the
    release's class has no such method (TE before 2.0), as TE's own class would."""
    faked = _FAKED.get(id(obj))
    keys = metadata_keys(*faked) if faked else ()
    if not keys:
        raise AttributeError(f"{type(obj).__qualname__} has no get_metadata in this release")

    def get_metadata() -> dict[str, Any]:
        out = {}
        for k in keys:
            if k.attribute is not None:
                out[k.key] = getattr(obj, k.attribute, None)
            else:  # Float8's device (2.14-2.15): its data's, else its transpose's
                data = getattr(obj, "_data", None)
                data = data if data is not None else getattr(obj, "_transpose", None)
                out[k.key] = None if data is None else data.device
        return out

    return get_metadata


_GET_METADATA = property(_metadata_of)


def _fake_class(kind: TensorKind, version: Version, storage: bool) -> type:
    row = _row(kind, version)
    index = next(i for i, r in enumerate(table.ROWS) if r is row)
    main, mixin = _row_classes(index, *_base_paths(version))
    if not storage:
        return main
    if mixin is None:
        with_mixin = ", ".join(f"TE {r.span}" for r in table.rows_for(kind) if len(r.classes) > 1)
        raise ValueError(
            f"TE {version}'s {kind} row names no storage class, only {row.classes[0]}; "
            f"storage-only {kind} objects exist in: {with_mixin or 'no release'}"
        )
    return mixin


def fake_class(kind: TensorKind | str, release: str | None = None, *, storage: bool = False) -> type:
    """The fake class of ``kind`` in TE ``release`` (default: the installed one).

    Returns the tensor class (TE's ``MXFP8Tensor``, ``GroupedTensor``, ...) or, with ``storage``,
    the storage-only mixin (``MXFP8TensorStorage`` 2.9+, ``MXFP8TensorBase`` 2.0-2.8, ...), built
    once per table row and TE base classes from te_compat's release table. Use it for
    ``isinstance`` checks or to build objects of your own with :func:`new_fake`; the ``fake_*``
    factories fill one in. Raises ValueError, naming the releases that have it, for a kind the
    release lacks.
    """
    _bools("fake_class", storage=storage)
    return _fake_class(_kind(kind), _version(release), storage)


# ------------------------------------------------------------------------------ quantizers


class FakeQuantizer:
    """Stands for the quantizer TE keeps on a tensor where te_compat knows no quantizer class of
    that kind and release: te_compat and mok only read whether there is one."""


@cache
def _quantizer_class(path: str) -> type:
    return fake_te_class(path, doc=f"A te_compat.testing fake of TE's {path} (te_compat.gemm_layout's rows).")


def _quantizer(kind: TensorKind, version: Version) -> object:
    """A fake of the quantizer TE keeps on a ``kind`` tensor: of the class te_compat's quantizer
    rows (te_compat.gemm_layout's, and the table's quantizer flag rows) name, every flag they read
    False, as TE's constructors default; else a FakeQuantizer."""
    flags: dict[str, set[str]] = {}
    for row in QUANTIZER_ROWS:
        if kind in row.kinds and row.covers(version):
            flags.setdefault(row.quantizer, set()).update(row.reads)
    for flag_row in table.quantizer_flag_rows(kind, version):
        flags.setdefault(flag_row.quantizer, set()).add(flag_row.attribute)
    if not flags:
        return FakeQuantizer()
    path, names = next(iter(flags.items()))
    quantizer: object = object.__new__(_quantizer_class(path))
    for flag in sorted(names):
        setattr(quantizer, flag, False)
    return quantizer


# ------------------------------------------------------------------------------ buffers


def _dims(shape: Sequence[int], what: str) -> tuple[tuple[int, ...], int, int]:
    """(shape, M, K) of a logical shape: M the product of the leading dims, K the last."""
    dims = tuple(shape) if isinstance(shape, Sequence) else ()
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise ValueError(f"{what}: expected a shape of positive ints such as (128, 256); found {describe(shape)}")
    return dims, math.prod(dims[:-1]), dims[-1]


def padded_scales(
    rows: int, cols: int, pad_rows: int, pad_cols: int, generator: torch.Generator, dtype: torch.dtype = torch.uint8
) -> torch.Tensor:
    """A TE-padded scale buffer ``[pad_rows, pad_cols]`` of ``dtype`` (uint8 or float32).

    Returns random values in the logical ``[rows, cols]`` corner (bytes; or floats in [0.5, 1.5))
    and 0xFF bytes in the padding, which TE (2.7+) leaves uninitialised: a reader that strays
    into the padding reads garbage, as it would on TE's own buffers.
    """
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.uint8, torch.float32):
        raise ValueError(f"padded_scales: expected dtype torch.uint8 or torch.float32; found {describe(dtype)}")
    if dtype == torch.uint8:
        buf = torch.full((pad_rows, pad_cols), 0xFF, dtype=torch.uint8)
        buf[:rows, :cols] = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=generator)
        return buf
    if dtype == torch.float32:
        floats = torch.full((pad_rows, pad_cols * 4), 0xFF, dtype=torch.uint8).view(torch.float32)
        floats[:rows, :cols] = torch.rand(rows, cols, generator=generator) + 0.5
        return floats
    raise AssertionError("unreachable: the dtype was checked above")


def _bytes(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, tuple(shape), dtype=torch.uint8, generator=generator)


def float8_buffers(shape: Sequence[int], generator: torch.Generator, *, transpose: bool = True) -> dict[str, Any]:
    """A Float8 tensor's buffers by te_compat logical name: ``data`` uint8 ``shape``, ``scale_inv``
    fp32 ``[1]``, ``transpose`` uint8 ``[K, *shape[:-1]]`` (left out without ``transpose``)."""
    dims, _, k = _dims(shape, "float8 shape")
    _check_fits("float8_buffers", dims, _CPU, 1 + transpose)
    out = {"data": _bytes(dims, generator), "scale_inv": torch.rand(1, generator=generator)}
    if transpose:
        out["transpose"] = _bytes((k, *dims[:-1]), generator)
    return out


def mxfp8_buffers(
    shape: Sequence[int], generator: torch.Generator, *, rowwise: bool = True, columnwise: bool = True
) -> dict[str, Any]:
    """An MXFP8 tensor's buffers by te_compat logical name, as TE allocates them.

    With ``M = prod(shape[:-1])``, ``K = shape[-1]`` (both multiples of 32, as TE's MXFP8
    quantizer needs): payloads uint8 ``shape`` in both directions (columnwise NOT transposed);
    scales uint8 E8M0, rowwise ``[roundup(M,128), roundup(K/32,4)]``, columnwise
    ``[roundup(M/32,4), roundup(K,128)]``.
    """
    dims, m, k = _dims(shape, "mxfp8 shape")
    _check_fits("mxfp8_buffers", dims, _CPU, rowwise + columnwise)
    if m % geometry.MXFP8.block or k % geometry.MXFP8.block:
        raise ValueError(
            f"MXFP8 needs both dimensions divisible by {geometry.MXFP8.block} (TE's MXFP8 quantizer); "
            f"found shape {dims} (M={m}, K={k})"
        )
    return _block_buffers(geometry.MXFP8, dims, m, k, generator, rowwise, columnwise)


def _block_buffers(
    kind: geometry.BlockGeometry,
    dims: tuple[int, ...],
    m: int,
    k: int,
    generator: torch.Generator,
    rowwise: bool,
    columnwise: bool,
) -> dict[str, Any]:
    """Each wanted direction's payload and padded scales, as te_compat.geometry says TE keeps
    them (a rowwise payload keeps the logical ``dims``, its last packed)."""
    out: dict[str, Any] = {}
    for d, wanted in zip(kind.directions(), (rowwise, columnwise), strict=True):
        if not wanted:
            continue
        payload = d.payload_shape(m, k) if d.transposed else (*dims[:-1], k // d.packing)
        out[str(d.data)] = _bytes(payload, generator)
        out[str(d.scales)] = padded_scales(*d.buffer_matrix(m, k), *d.scale_buffer(m, k), generator)
    return out


def nvfp4_buffers(
    shape: Sequence[int],
    generator: torch.Generator,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    row_scaled: bool = False,
) -> dict[str, Any]:
    """An NVFP4 tensor's buffers by te_compat logical name, as TE allocates them.

    With ``M = prod(shape[:-1])``, ``K = shape[-1]``: rowwise payload uint8 ``shape[:-1] + [K/2]``
    (two E2M1 values a byte), scales uint8 E4M3 ``[roundup(M,128), roundup(ceil(K/16),4)]``, amax
    fp32 ``[1]`` (``[M]`` when ``row_scaled``); columnwise payload ``[K, M/2]`` and scales
    ``[roundup(K,128), roundup(ceil(M/16),4)]``, both stored TRANSPOSED, amax fp32 ``[1]``.
    """
    dims, m, k = _dims(shape, "nvfp4 shape")
    _check_fits("nvfp4_buffers", dims, _CPU, (rowwise + columnwise) / 2)
    if k % 2 or (columnwise and m % 2):
        raise ValueError(f"NVFP4 packs two values a byte: K (and M, for columnwise data) must be even; found {dims}")
    out = _block_buffers(geometry.NVFP4, dims, m, k, generator, rowwise, columnwise)
    if rowwise:
        out["amax_rowwise"] = torch.rand(m if row_scaled else 1, generator=generator)
    if columnwise:
        out["amax_columnwise"] = torch.rand(1, generator=generator)
    return out


def _blockwise_scales(m: int, k: int, two_d: bool, flat: bool, columnwise: bool) -> tuple[int, int, int, int]:
    """(rows, cols, padded rows, padded cols) of one direction's fp32 blockwise scales."""

    def c(x: int) -> int:
        return _roundup(x, BLOCKWISE_BLOCK) // BLOCKWISE_BLOCK

    pad = geometry.SCALE_COLUMN_MULTIPLE
    if two_d:
        r, s = (c(k), c(m)) if columnwise else (c(m), c(k))
        return r, s, r, _roundup(s, pad)
    if flat:
        return (c(m), k, c(m), k) if columnwise else (m, c(k), m, c(k))
    return (c(m), k, c(m), _roundup(k, pad)) if columnwise else (c(k), m, c(k), _roundup(m, pad))


def blockwise_buffers(
    shape: Sequence[int],
    generator: torch.Generator,
    *,
    two_d: bool = True,
    rowwise: bool = True,
    columnwise: bool = True,
    compact: bool = False,
) -> dict[str, Any]:
    """A Float8 blockwise tensor's buffers by te_compat logical name, as TE allocates them.

    Blocks are 128 long; with ``M = prod(shape[:-1])``, ``K = shape[-1]``, ``c(x) = ceil(x/128)``:
    payloads uint8, rowwise ``shape``, columnwise TRANSPOSED ``[K, *shape[:-1]]``; scales fp32,
    2-D (``two_d``, 128x128 blocks) rowwise ``[c(M), roundup(c(K),4)]``, columnwise
    ``[c(K), roundup(c(M),4)]``; 1-D (1x128) rowwise ``[c(K), roundup(M,4)]``, columnwise
    ``[c(M), roundup(K,4)]``. ``compact`` (TE 2.5-2.11's COMPACT format) changes 1-D scaling
    only: columnwise data untransposed ``shape``, scales unpadded ``[M, c(K)]`` and ``[c(M), K]``.
    """
    dims, m, k = _dims(shape, "blockwise shape")
    _check_fits("blockwise_buffers", dims, _CPU, rowwise + columnwise)
    flat = compact and not two_d
    out: dict[str, Any] = {}
    if rowwise:
        out["rowwise_data"] = _bytes(dims, generator)
        out["rowwise_scale_inv"] = padded_scales(*_blockwise_scales(m, k, two_d, flat, False), generator, torch.float32)
    if columnwise:
        out["columnwise_data"] = _bytes(dims if flat else (k, *dims[:-1]), generator)
        scales = _blockwise_scales(m, k, two_d, flat, True)
        out["columnwise_scale_inv"] = padded_scales(*scales, generator, torch.float32)
    return out


@dataclass(frozen=True)
class GroupedBuffers:
    """The buffers of a grouped tensor: TE's flat 1-D buffers, and each expert's pieces of them."""

    flat: dict[str, Any]  # logical name -> flat buffer (offsets: lists of ints, expert-major)
    experts: list[dict[str, torch.Tensor]]  # per expert: logical name -> a view into ``flat``


GROUPED_FORMATS = ("mxfp8", "nvfp4", "bf16")
_SINGLE_BUFFERS: dict[str, Callable[..., dict[str, Any]]] = {"mxfp8": mxfp8_buffers, "nvfp4": nvfp4_buffers}


def grouped_buffers(
    shape: Sequence[int],
    generator: torch.Generator,
    *,
    format: str = "mxfp8",
    columnwise: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    device: Device = "cpu",
) -> GroupedBuffers:
    """The buffers of a grouped tensor of ``shape`` ``(E, rows, columns)``, as TE 2.13+ allocates
    them: each of ``format``'s buffers (see :func:`mxfp8_buffers`, :func:`nvfp4_buffers`; "bf16":
    one ``dtype`` payload) for each expert, flattened and concatenated expert-major; NVFP4 amax
    ``[E]`` fp32; ``*_scale_inv_offsets`` the E+1 element offsets of each expert's scales.

    Returns the flat buffers on ``device`` and, per expert, views into them shaped as one
    tensor's buffers are (what TE's per-expert members hold).
    """
    experts, rows, columns = _grouped_dims(shape)
    _choice("grouped_buffers", "format", format, GROUPED_FORMATS)
    where, dtype = _device("grouped_buffers", device), _dtype("grouped_buffers", dtype)
    _check_fits("grouped_buffers", shape, where, _grouped_bytes(format, columnwise, dtype))
    if format == "bf16":
        singles = [{"rowwise_data": torch.randn(rows, columns, generator=generator).to(dtype)} for _ in range(experts)]
    elif format in _SINGLE_BUFFERS:
        singles = [_SINGLE_BUFFERS[format]((rows, columns), generator, columnwise=columnwise) for _ in range(experts)]
    else:
        raise AssertionError(f"unreachable: {format} is one of {GROUPED_FORMATS}")
    flat = {name: torch.cat([one[name].flatten() for one in singles]).to(device) for name in singles[0]}
    pieces: list[dict[str, torch.Tensor]] = [{} for _ in singles]
    for name, buffer in flat.items():
        size, piece_shape = singles[0][name].numel(), singles[0][name].shape
        for e, piece in enumerate(pieces):
            piece[name] = buffer[e * size : (e + 1) * size].view(piece_shape)
    kind = {"mxfp8": geometry.MXFP8, "nvfp4": geometry.NVFP4}.get(format)
    offsets = {
        f"{d.scales}_offsets": list(d.grouped_offsets(experts, rows, columns))
        for d in (kind.directions() if kind is not None else ())
        if str(d.scales) in flat
    }
    return GroupedBuffers({**flat, **offsets}, pieces)


def _grouped_dims(shape: Sequence[int]) -> tuple[int, int, int]:
    dims, _, _ = _dims(shape, "grouped shape")
    if len(dims) != 3:
        raise ValueError(f"grouped shape: expected (experts, rows, columns); found {describe(shape)}")
    return dims[0], dims[1], dims[2]


# ------------------------------------------------------------------------------ fakes


class Float8BlockScaleTensorFormat(enum.Enum):
    """Stands for TE 2.5-2.11's ``tex.Float8BlockScaleTensorFormat`` (a pybind11 enum)."""

    GEMM_READY = 0
    COMPACT = 1


def _flag(row: StorageRow, version: Version, name: str, value: Any, default: Any) -> dict[str, Any]:
    """``{name: value}`` where the row has storage ``name``; {} where it lacks it and ``value`` is
    the default; an error (naming the releases that have it) when asked for a value it cannot hold."""
    if name in row.storage:
        return {name: value}
    if value == default:
        return {}
    having = ", ".join(f"TE {r.span}" for r in table.rows_for(row.kind) if name in r.storage) or "no release"
    raise ValueError(f"TE {version}'s {row.kind} tensors have no {name!r} (asked for {value!r}); it is in: {having}")


class FakeOptions(TypedDict, total=False):
    """The keyword arguments every ``fake_*`` factory takes besides its kind's own.

    - ``release``: the TE release to fake, as TE reports it (default: the release te_compat sees
      as installed, so inside ``installed_release("2.20.2")`` a plain ``fake_mxfp8(shape)`` fakes
      2.20.2);
    - ``seed``: the seed of the random contents (default 0; the same seed, the same bytes; any
      seed ``torch.Generator.manual_seed`` takes, -2**63 to 2**64 - 1);
    - ``param``: return ``torch.nn.Parameter(fake)``, which is still of the fake's class, as a
      Parameter of a TE tensor is (default False);
    - ``storage``: return the storage-only object of the row's mixin class instead of the tensor
      (``MXFP8TensorStorage``, ...: what a hybrid tensor holds per direction; default False);
    - ``device``: where the buffers live (default ``"cpu"``; ``"cuda"`` or ``"meta"`` too); the
      buffers are made on the CPU and moved there;
    - ``dtype``: the nominal high-precision dtype TE reports for the tensor (default bfloat16).

    Each is checked before anything is allocated, and so is the shape: a device torch cannot use
    here, or buffers larger than the CPU's (or the device's) memory, are refused with an error
    naming the factory and the argument.
    """

    release: str | None
    seed: int
    param: bool
    storage: bool
    device: Device
    dtype: torch.dtype


@dataclass(frozen=True)
class _Target:
    """A factory's FakeOptions, checked, with the release resolved and the contents' generator."""

    shape: Sequence[int]
    version: Version
    storage: bool
    param: bool
    device: Device
    dtype: torch.dtype
    generator: torch.Generator


_SEEDS = range(-(2**63), 2**64)  # what torch.Generator.manual_seed takes (a negative seed wraps)


def _bools(factory: str, **flags: object) -> None:
    """Refuse, naming ``factory`` and the flag, any flag that is not a real bool (a string such
    as "False" is truthy; a tensor's truth is its value)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{factory}: {name}: expected a bool; found {describe(value)}")


def _choice(factory: str, name: str, value: object, choices: Sequence[str | None]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (strings, or None where None is one)."""
    if not (value is None or isinstance(value, str)) or value not in choices:
        shown = ", ".join(repr(c) for c in choices if c is not None) + (" or None" if None in choices else "")
        raise ValueError(f"{factory}: {name}: expected one of {shown}; found {describe(value)}")


def _device(factory: str, device: object) -> torch.device:
    """``device`` as a torch.device this process has; refused, naming the factory, otherwise."""
    expected = "a torch.device or a string such as 'cpu', 'meta' or 'cuda:0'"
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{factory}: device: expected {expected}; found {describe(device)}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{factory}: device: expected {expected}; found {str(device)!r}") from None
    if parsed.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=parsed)  # nothing allocated: whether torch can reach the device at all
        except Exception as exc:  # AssertionError without CUDA, RuntimeError for a device index too high
            raise ValueError(
                f"{factory}: device: expected a device this process has; found {str(device)!r}, which torch "
                f"cannot use here ({type(exc).__name__}: {_first_line(exc)})"
            ) from None
    return parsed


_CPU = torch.device("cpu")


def _dtype(factory: str, dtype: object) -> torch.dtype:
    """``dtype`` if it is a floating-point torch.dtype (TE's nominal dtypes are), else refused."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{factory}: dtype: expected a floating-point torch.dtype such as torch.bfloat16; found {describe(dtype)}"
        )
    return dtype


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0]


def _capacity(device: torch.device) -> int | None:
    """Bytes of memory ``device`` has in all (None where unknown or where nothing is stored: meta)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return None


def _check_fits(factory: str, shape: Sequence[int], device: torch.device, per_value: float) -> None:
    """Refuse, before anything is allocated, a fake whose buffers cannot fit: they are made on
    the CPU, then moved to ``device``; ``per_value`` is their bytes per logical value, at least."""
    try:
        dims, _, _ = _dims(shape, "shape")
    except ValueError:
        return  # the buffers' own check names the shape
    need = int(math.prod(dims) * per_value)
    for where in dict.fromkeys((torch.device("cpu"), device)):
        capacity = _capacity(where)
        if capacity is not None and need > capacity:
            raise ValueError(
                f"{factory}: shape {tuple(dims)} needs at least {need} bytes of buffers; expected at most "
                f"the {capacity} bytes {where} has in all"
            )


def _target(
    factory: str, shape: Sequence[int], options: FakeOptions, per_value: Callable[[torch.dtype], float]
) -> _Target:
    """The checked options of ``factory``; ``per_value(dtype)``: the bytes its buffers take per
    logical value, at least (a shape that cannot fit is refused before allocating)."""
    known = FakeOptions.__optional_keys__
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"{factory}: unexpected keyword argument(s) {unknown}; expected its own or FakeOptions' {sorted(known)}"
        )
    seed = options.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"{factory}: seed: expected an int; found {describe(seed)}")
    if seed not in _SEEDS:
        raise ValueError(f"{factory}: seed: expected an int from -2**63 to 2**64 - 1 (torch's seeds); found {seed}")
    storage, param = options.get("storage", False), options.get("param", False)
    _bools(factory, storage=storage, param=param)
    dtype = _dtype(factory, options.get("dtype", torch.bfloat16))
    device = _device(factory, options.get("device", "cpu"))
    version = _version(options.get("release"))
    _check_fits(factory, shape, device, per_value(dtype))
    return _Target(shape, version, storage, param, device, dtype, torch.Generator().manual_seed(seed))


def _build(kind: TensorKind, target: _Target, logical: Mapping[str, Any]) -> Any:
    """A fake of ``kind`` holding ``logical`` (te_compat names -> values) under the attribute
    names of the release's table row, with a fake quantizer where the row has one and
    ``logical`` none; every other attribute of the row is None."""
    version, device, dtype = target.version, target.device, target.dtype
    row = _row(kind, version)
    if "quantizer" in row.storage and "quantizer" not in logical:
        logical = {**logical, "quantizer": _quantizer(kind, version)}
    attrs = {row.storage[name]: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in logical.items()}
    attrs.update({name: dtype for name in ("_dtype", "fake_dtype", "dtype") if name in row.known})
    cls = _fake_class(kind, version, target.storage)
    origin = _row_origin(row, version, f"{cls.__module__}.{cls.__qualname__}")
    obj = new_fake(cls, attrs, names=_row_attrs(row), origin=origin, shape=target.shape, dtype=dtype, device=device)
    _mark_faked(obj, (kind, version))
    if not target.param:
        return obj
    if not isinstance(obj, torch.Tensor):
        what = "a storage-only object" if target.storage else "a plain class"
        raise ValueError(
            f"param=True: TE {version}'s {cls.__qualname__} is {what}, not a torch.Tensor; it cannot be a Parameter"
        )
    return torch.nn.Parameter(obj)


def fake_float8(shape: Sequence[int], *, transpose: bool = True, **options: Unpack[FakeOptions]) -> Any:
    """A fake Float8Tensor of logical ``shape`` (TE 1.x and 2.x; 1.x keeps ``_scale_inv`` and
    ``_transpose`` in the dict ``_fp8_attrs``, as TE did), buffers from :func:`float8_buffers`.

    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` (2.0+) and the rest).
    """
    _bools("fake_float8", transpose=transpose)
    target = _target("fake_float8", shape, options, lambda _: 1 + transpose)
    return _build(TensorKind.FLOAT8, target, float8_buffers(shape, target.generator, transpose=transpose))


def fake_mxfp8(
    shape: Sequence[int],
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    swizzled: bool = False,
    quantized_2d: bool = False,
    compact_scales: bool = False,
    **options: Unpack[FakeOptions],
) -> Any:
    """A fake MXFP8Tensor (TE 2.0+) of logical ``shape``, buffers from :func:`mxfp8_buffers`.

    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` and the rest).
    ``rowwise``/``columnwise`` choose the directions held; ``swizzled`` sets TE 2.12+'s
    ``_with_gemm_swizzled_scales`` (the flag only: the scale bytes are random either way). The
    quantizer is a fake of TE's ``MXFP8Quantizer`` (2.12+, ``optimize_for_gemm`` False; 2.19+,
    ``with_2d_quantization`` False) or a :class:`FakeQuantizer`. ``quantized_2d`` (TE 2.19+) makes
    it a tensor TE quantized in 32x32 blocks: its quantizer's ``with_2d_quantization`` True, one
    random scale per block written at every 1x32 position it covers, rowwise and columnwise, and
    the columnwise payload a copy of the rowwise one, as TE writes them (:func:`mxfp8_2d_buffers`).
    ``compact_scales``: scale buffers without TE's padding (:func:`compact_mxfp8_scales`).
    """
    _bools(
        "fake_mxfp8",
        rowwise=rowwise,
        columnwise=columnwise,
        swizzled=swizzled,
        quantized_2d=quantized_2d,
        compact_scales=compact_scales,
    )
    target = _target("fake_mxfp8", shape, options, lambda _: rowwise + columnwise)
    logical = mxfp8_buffers(shape, target.generator, rowwise=rowwise, columnwise=columnwise)
    row = _row(TensorKind.MXFP8, target.version)
    logical.update(_flag(row, target.version, "scales_swizzled", swizzled, False))
    if quantized_2d:
        flag_rows = [
            r for r in table.quantizer_flag_rows(TensorKind.MXFP8, target.version) if r.storage == "quantized_2d"
        ]
        if not flag_rows:
            having = ", ".join(f"TE {r.span}" for r in table.QUANTIZER_FLAG_ROWS if r.storage == "quantized_2d")
            raise ValueError(
                f"fake_mxfp8: quantized_2d: TE {target.version}'s MXFP8Quantizer has no 2-D block scaling; it is in: "
                f"{having}"
            )
        quantizer = _quantizer(TensorKind.MXFP8, target.version)
        setattr(quantizer, flag_rows[0].attribute, True)
        logical["quantizer"] = quantizer
        mxfp8_2d_buffers(logical, shape, target.generator)
    if compact_scales:
        compact_mxfp8_scales(logical, shape)
    return _build(TensorKind.MXFP8, target, logical)


def compact_mxfp8_scales(buffers: dict[str, Any], shape: Sequence[int]) -> None:
    """Replace ``buffers``' padded MXFP8 scales with compact ones holding the same logical bytes:
    rowwise ``[M, K/32]``, columnwise ``[M/32, K]``, as TE's ``quantize_()`` accepts them once its
    PR 3519 (issue 3518) is in, for scales not swizzled; TE's GEMM refuses them."""
    _, m, k = _dims(shape, "mxfp8 shape")
    for d in geometry.MXFP8.directions():
        scales = buffers.get(str(d.scales))
        if scales is not None:
            r, c = d.buffer_matrix(m, k)
            buffers[str(d.scales)] = scales[:r, :c].contiguous()


def mxfp8_2d_buffers(buffers: dict[str, Any], shape: Sequence[int], generator: torch.Generator) -> None:
    """Make :func:`mxfp8_buffers`'s ``buffers`` (in place) what TE 2.19+ writes with
    ``with_2d_quantization``: one random E8M0 scale per 32x32 block, at every position of the
    1x32 rowwise and 32x1 columnwise layouts it covers (TE's quantize_mxfp8.cuh writes the block's
    scale with the 1-D scale_idx), the padding left as it was, and the columnwise payload equal to
    the rowwise one (tests/pytorch/test_mxfp8_2d_quantize.py asserts both)."""
    _, m, k = _dims(shape, "mxfp8 shape")
    block = geometry.MXFP8.block
    blocks = torch.randint(0, 256, (m // block, k // block), dtype=torch.uint8, generator=generator)
    if "rowwise_scale_inv" in buffers:
        buffers["rowwise_scale_inv"][:m, : k // block] = blocks.repeat_interleave(block, dim=0)
    if "columnwise_scale_inv" in buffers:
        buffers["columnwise_scale_inv"][: m // block, :k] = blocks.repeat_interleave(block, dim=1)
    if "rowwise_data" in buffers and "columnwise_data" in buffers:
        buffers["columnwise_data"].copy_(buffers["rowwise_data"])


def fake_nvfp4(
    shape: Sequence[int],
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    swizzled: bool = False,
    row_scaled: bool = False,
    **options: Unpack[FakeOptions],
) -> Any:
    """A fake NVFP4Tensor (TE 2.8+) of logical ``shape``, buffers from :func:`nvfp4_buffers`.

    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` and the rest). The
    flags are TE's constructor defaults where the release has them: ``swizzled`` (2.12+),
    ``row_scaled`` (2.16+; then one fp32 rowwise amax per row), ``nvfp4_use_4over6`` False and
    ``nvfp4_e4m3_max`` 448 (2.17+). Asking for a flag the release lacks raises.
    """
    _bools("fake_nvfp4", rowwise=rowwise, columnwise=columnwise, swizzled=swizzled, row_scaled=row_scaled)
    target = _target("fake_nvfp4", shape, options, lambda _: (rowwise + columnwise) / 2)
    row, version = _row(TensorKind.NVFP4, target.version), target.version
    logical = nvfp4_buffers(shape, target.generator, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled)
    logical.update(_flag(row, version, "scales_swizzled", swizzled, False))
    logical.update(_flag(row, version, "row_scaled_nvfp4", row_scaled, False))
    logical.update(_flag(row, version, "nvfp4_use_4over6", False, False))
    logical.update(_flag(row, version, "nvfp4_e4m3_max", NVFP4_E4M3_MAX, NVFP4_E4M3_MAX))
    return _build(TensorKind.NVFP4, target, logical)


def fake_blockwise(
    shape: Sequence[int],
    *,
    two_d: bool = True,
    compact: bool = False,
    rowwise: bool = True,
    columnwise: bool = True,
    **options: Unpack[FakeOptions],
) -> Any:
    """A fake Float8BlockwiseQTensor (TE 2.3+) of logical ``shape``, buffers from
    :func:`blockwise_buffers`.

    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` and the rest).
    ``two_d``: 128x128 blocks (``_is_2D_scaled``), else 1x128. ``compact``: TE 2.5-2.11's COMPACT
    data format (``_data_format``, a :class:`Float8BlockScaleTensorFormat`; GEMM_READY otherwise).
    """
    _bools("fake_blockwise", two_d=two_d, compact=compact, rowwise=rowwise, columnwise=columnwise)
    target = _target("fake_blockwise", shape, options, lambda _: rowwise + columnwise)
    logical = blockwise_buffers(
        shape, target.generator, two_d=two_d, rowwise=rowwise, columnwise=columnwise, compact=compact
    )
    logical["is_2d_scaled"] = two_d
    fmt = Float8BlockScaleTensorFormat.COMPACT if compact else Float8BlockScaleTensorFormat.GEMM_READY
    row = _row(TensorKind.FLOAT8_BLOCKWISE, target.version)
    logical.update(_flag(row, target.version, "data_format", fmt, Float8BlockScaleTensorFormat.GEMM_READY))
    return _build(TensorKind.FLOAT8_BLOCKWISE, target, logical)


def fake_identity(shape: Sequence[int], **options: Unpack[FakeOptions]) -> Any:
    """A fake IdentityTensor (TE 2.19+): high-precision ``dtype`` data of ``shape`` (random
    normal) behind TE's quantized interface, as a hybrid tensor holds for an unquantized direction.
    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` and the rest)."""
    target = _target("fake_identity", shape, options, _identity_bytes)
    dims, _, _ = _dims(shape, "identity shape")
    data = torch.randn(dims, generator=target.generator).to(target.dtype)
    return _build(TensorKind.IDENTITY, target, {"data": data})


HYBRID_FORMATS = ("mxfp8", "nvfp4", "blockwise", "identity")


def _identity_bytes(dtype: torch.dtype) -> float:
    return 4 + dtype.itemsize  # random fp32 values, then cast


def _hybrid_bytes(fmt: str | None, dtype: torch.dtype) -> float:
    """Bytes per value of one hybrid direction (0 for none, or a format refused later)."""
    return _identity_bytes(dtype) if fmt == "identity" else {"mxfp8": 1, "nvfp4": 0.5, "blockwise": 1}.get(str(fmt), 0)


def _hybrid_direction(fmt: str, shape: Sequence[int], rowwise: bool, options: FakeOptions) -> Any:
    """One direction of a hybrid: ``fmt`` pinned to that direction, as TE's HybridQuantizer pins it."""
    if fmt == "identity":
        return fake_identity(shape, **options)
    factories: dict[str, Callable[..., Any]] = {"mxfp8": fake_mxfp8, "nvfp4": fake_nvfp4, "blockwise": fake_blockwise}
    return factories[fmt](shape, rowwise=rowwise, columnwise=not rowwise, **options)


def fake_hybrid(
    shape: Sequence[int],
    *,
    rowwise: str | None = "mxfp8",
    columnwise: str | None = "nvfp4",
    sub_storage: bool = True,
    **options: Unpack[FakeOptions],
) -> Any:
    """A fake HybridQuantizedTensor (TE 2.19+) of logical ``shape``: ``rowwise`` and ``columnwise``
    name each direction's format (one of :data:`HYBRID_FORMATS`; None: that direction absent),
    each sub-storage holding only its own direction (seeds ``seed`` and ``seed + 1``).

    Returns the tensor (see :class:`FakeOptions` for ``param``, ``storage`` and the rest).
    ``sub_storage``: the sub-storages are storage-only objects (what an internal sub-quantizer
    makes), else tensors.
    """
    _bools("fake_hybrid", sub_storage=sub_storage)
    _choice("fake_hybrid", "rowwise", rowwise, (*HYBRID_FORMATS, None))
    _choice("fake_hybrid", "columnwise", columnwise, (*HYBRID_FORMATS, None))
    target = _target(
        "fake_hybrid", shape, options, lambda dtype: sum(_hybrid_bytes(f, dtype) for f in (rowwise, columnwise))
    )
    seed = options.get("seed", 0)
    logical: dict[str, Any] = {}
    for offset, (name, fmt) in enumerate((("rowwise", rowwise), ("columnwise", columnwise))):
        sub_seed = (seed + offset) % 2**64  # a seed torch takes (it wraps negative ones alike)
        sub: FakeOptions = {**options, "release": str(target.version), "seed": sub_seed, "storage": sub_storage}
        sub["param"] = False
        logical[f"{name}_storage"] = _hybrid_direction(fmt, shape, name == "rowwise", sub) if fmt else None
    return _build(TensorKind.HYBRID, target, logical)


def _grouped_members(
    group: _Target, buffers: GroupedBuffers, kind: TensorKind, quantizer: object, swizzled: bool
) -> list[Any]:
    """The per-expert tensors TE makes for a quantized group (each with its own copy of the
    group's quantizer): their buffers are views of the group's."""
    flag = _flag(_row(kind, group.version), group.version, "scales_swizzled", swizzled, False)
    shape = tuple(group.shape)[1:]
    member = _Target(shape, group.version, False, False, group.device, group.dtype, group.generator)
    return [_build(kind, member, {**piece, **flag, "quantizer": copy.copy(quantizer)}) for piece in buffers.experts]


def _grouped_bytes(format: str, columnwise: bool, dtype: torch.dtype) -> float:
    """Bytes per value of a group's buffers: each expert's, then their flat concatenation."""
    if format == "bf16":
        return 4 + 2 * dtype.itemsize
    return 2 * (1 + columnwise) * {"mxfp8": 1, "nvfp4": 0.5}.get(format, 0)


def fake_grouped(
    shape: Sequence[int],
    *,
    format: str = "mxfp8",
    columnwise: bool = True,
    members: bool = True,
    swizzled: bool = False,
    **options: Unpack[FakeOptions],
) -> Any:
    """A fake GroupedTensor (TE 2.13 plain class; 2.14+ a torch.Tensor) of ``shape``
    ``(experts, rows, columns)``: ``format`` "mxfp8", "nvfp4" or "bf16", buffers from
    :func:`grouped_buffers` (2.13 names its payload ``data`` and shapes ``shape``; 2.14+
    ``rowwise_data`` and ``tensor_shapes``: the table maps both).

    Returns the group (see :class:`FakeOptions`; ``param`` needs 2.14+). A quantized group has a
    fake quantizer and, with ``members``, its per-expert tensors in ``quantized_tensors``, whose
    buffers are views of the group's. ``swizzled`` sets the group's flag (2.14+) and its members'.
    """
    _bools("fake_grouped", columnwise=columnwise, members=members, swizzled=swizzled)
    _choice("fake_grouped", "format", format, GROUPED_FORMATS)
    target = _target("fake_grouped", shape, options, lambda dtype: _grouped_bytes(format, columnwise, dtype))
    experts, rows, columns = _grouped_dims(shape)
    buffers = grouped_buffers(
        shape, target.generator, format=format, columnwise=columnwise, dtype=target.dtype, device=target.device
    )
    logical: dict[str, Any] = {**buffers.flat, "num_tensors": experts, "tensor_shapes": [(rows, columns)] * experts}
    if format == "bf16" and swizzled:
        raise ValueError("swizzled=True: a bf16 group has no scales to be swizzled")
    logical["quantizer"] = None  # a bf16 group has none
    if format != "bf16":
        kind = TensorKind.MXFP8 if format == "mxfp8" else TensorKind.NVFP4
        logical["quantizer"] = _quantizer(kind, target.version)
        if members:
            logical["quantized_tensors"] = _grouped_members(target, buffers, kind, logical["quantizer"], swizzled)
    # 2.13 keeps no flag on the group: there only its members can carry swizzled=True
    carried_by_members = swizzled and "quantized_tensors" in logical
    row = _row(TensorKind.GROUPED, target.version)
    logical.update(_flag(row, target.version, "scales_swizzled", swizzled, carried_by_members))
    return _build(TensorKind.GROUPED, target, logical)


_FACTORIES: dict[TensorKind, Callable[..., Any]] = {
    TensorKind.FLOAT8: fake_float8,
    TensorKind.MXFP8: fake_mxfp8,
    TensorKind.NVFP4: fake_nvfp4,
    TensorKind.FLOAT8_BLOCKWISE: fake_blockwise,
    TensorKind.IDENTITY: fake_identity,
    TensorKind.HYBRID: fake_hybrid,
    TensorKind.GROUPED: fake_grouped,
}


def fake_tensor(kind: TensorKind | str, shape: Sequence[int], **options: Any) -> Any:
    """A fake of any ``kind`` of the release table: the ``fake_*`` factory of that kind, called
    with ``shape`` and ``options`` (:class:`FakeOptions` and the kind's own). Returns what that
    factory returns; use it to write one test over every kind."""
    return _FACTORIES[_kind(kind)](shape, **options)
