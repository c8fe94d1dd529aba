"""What a caller of upstream's MOK weights module expects of a refusal: a RuntimeError. The
project's own error (the class a mok or te_compat caller would catch) is its cause."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def refused(cls: type[BaseException], match: str) -> Iterator[None]:
    """The block raises a RuntimeError matching ``match`` whose own error is a ``cls``: the
    RuntimeError itself (mok's RefreshError is one) or its ``__cause__``."""
    with pytest.raises(RuntimeError, match=match) as caught:
        yield
    own = caught.value if type(caught.value) is not RuntimeError else caught.value.__cause__
    assert isinstance(own, cls), f"expected a {cls.__name__} behind the RuntimeError; found {own!r}"
