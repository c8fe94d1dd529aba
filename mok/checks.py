"""Typed checks of the scalar and sequence arguments of mok's public functions.

Each raises ``TypeError`` (wrong type) or ``ValueError`` (out of range) with a message naming the
parameter, the value found (:func:`describe`: its type, a container's length and items, a
tensor's shape and dtype, never a repr that would print a tensor) and what was expected, so a
bad argument never turns into a silent wrong result or a raw error from deep inside torch. ``bool`` is never an int here
(``rows=True`` is a mistake, not 1); numpy integers are accepted as ints.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from itertools import repeat
from typing import TypeVar, overload

from te_compat.errors import describe as describe  # re-exported: mok describes what it found as te_compat does

T = TypeVar("T")


def _range_text(minimum: int, maximum: int | None) -> str:
    return f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bool, float, str and the rest are refused."""
    if type(value) is int:  # the usual case, asked many times a view
        number = value
    elif isinstance(value, bool) or not isinstance(value, (int, numbers.Integral)):
        raise TypeError(f"{name}: expected an int {_range_text(minimum, maximum)}; found {describe(value)}")
    else:
        number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"{name}: expected an int {_range_text(minimum, maximum)}; found {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a real bool (a string such as "False" is truthy, so it is refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool (True or False); found {describe(value)}")
    return value


def check_index(name: str, value: object, size: int) -> int:
    """``value`` as an index into something of ``size`` items: an int in ``[0, size)``."""
    expected = f"an index in [0, {size})" if size > 0 else f"an index, but there is nothing to index (size {size})"
    if isinstance(value, bool) or not isinstance(value, (int, numbers.Integral)):
        raise TypeError(f"{name}: expected {expected}; found {describe(value)}")
    index = int(value)
    if not 0 <= index < size:
        raise ValueError(f"{name}: expected {expected}; found {index}")
    return index


@overload
def check_sequence(name: str, value: object, what: str, *, item_type: None = None) -> tuple[object, ...]: ...


@overload
def check_sequence(name: str, value: object, what: str, *, item_type: type[T]) -> tuple[T, ...]: ...


def check_sequence(name: str, value: object, what: str, *, item_type: type[T] | None = None) -> tuple[object, ...]:
    """``value`` as a tuple, if it is a sequence (list, tuple, ...) of ``what``.

    None, str, bytes, a tensor and other non-sequences raise TypeError; with ``item_type``, the
    first element of another type (None included) raises TypeError naming its index.
    """
    if type(value) is not list and type(value) is not tuple:  # the usual cases, without the ABC's check
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes, bytearray)):
            raise TypeError(f"{name}: expected a sequence (list or tuple) of {what}; found {describe(value)}")
    items = tuple(value)
    # one check per distinct class (a view's experts share one): a refresh of 256 experts pays
    # a set of their classes, not 256 isinstance calls, in C-level passes
    if item_type is not None and not all(map(issubclass, set(map(type, items)), repeat(item_type))):
        index = next(i for i, item in enumerate(items) if not isinstance(item, item_type))
        raise TypeError(f"{name}[{index}]: expected {what}; found {describe(items[index])}")
    return items
