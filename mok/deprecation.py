"""Names mok renamed or removed, kept working for one release: each use warns, naming the
successor, so a caller that imports mok as a stable adapter learns what to change before the
name goes."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (a DeprecationWarning at the caller's
    line: ``stacklevel`` counts this function, the deprecated name's own frame, then its caller)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


F = TypeVar("F", bound=Callable[..., Any])


def renamed_keywords(**renamed: str) -> Callable[[F], F]:
    """A public function whose keyword ``old`` (the argument's name) is now ``new``
    (``renamed_keywords(cols="columns")``): ``old=`` still works for a release, warning."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    deprecated(f"{fn.__name__}({old}=)", f"{fn.__name__}({new}=)")
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}: expected {new}= alone; found both {old}= and {new}=")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(F, call)

    return wrap
