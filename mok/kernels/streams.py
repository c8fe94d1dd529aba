"""torch's current CUDA stream as cuda.core launches need it, cheaply: what every prepared launch
of mok's kernels calls once per launch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_streams: dict[int, Any] = {}  # raw handle -> cuda.core Stream, made once per handle
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # CUDA builds of torch have it


def _handle(index: int) -> int:
    """The raw handle of torch's current stream on device ``index``, for builds of torch without
    ``_cuda_getCurrentRawStream``."""
    return int(torch.cuda.current_stream(index).cuda_stream)


def _stream(handle: int) -> Any:
    """cuda.core's Stream for a raw handle (made once per handle)."""
    stream = _streams.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = _streams[handle] = Stream.from_handle(handle)
    return stream


class CurrentStream:
    """:meth:`current` gives cuda.core's Stream for torch's current stream on one device. The
    handle is looked up at each call (graph capture uses the capturing stream); the Stream of the
    last handle is kept, as one pair read once, since another thread may replace it meanwhile.
    A launch keeps the bound method: calling it skips the type's ``__call__`` slot, a launch's
    one Python frame besides its own."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._last: tuple[int, Any] = (-1, None)
        # torch's own getter where it has one (C, no Python frame a launch), else the slow path
        self._handle: Callable[[int], int] = _raw_stream if _raw_stream is not None else _handle

    def current(self) -> Any:
        handle = self._handle(self.index)
        last_handle, stream = self._last
        if handle != last_handle:
            stream = _stream(handle)
            self._last = (handle, stream)
        return stream
