"""The formats of mok's views: the enum a view's format is, and the one place a name becomes one.

How TE stores a block-scaled format (payload packing, padded scale buffers, orientation) is
te_compat's to say (te_compat.geometry); how mok reads it, mok.read.blocks'.
"""

from __future__ import annotations

from enum import Enum

from mok.checks import describe
from mok.deprecation import deprecated


class Format(str, Enum):
    """The format of a view, or of one direction of it. mok passes these around; a string is
    turned into one only at the public boundary (:func:`format_named`). A ``str`` enum, so a
    view's ``format == "mxfp8"`` keeps reading naturally."""

    BF16 = "bf16"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    HYBRID = "hybrid"  # TE 2.19+ hybrid weights: each direction in its own block format

    def __str__(self) -> str:
        return self.value


def format_named(format: object) -> Format:
    """The format asked for: a :class:`Format` or its name. The one place a string becomes a
    format."""
    found = _BY_NAME.get(format) if isinstance(format, str) else None
    if found is None:
        if format is None:
            raise TypeError(f"format: expected one of {', '.join(map(repr, _BY_NAME))}; found None")
        raise ValueError(f"format: expected one of {', '.join(map(repr, _BY_NAME))}; found {describe(format)}")
    return found


def format_asked(format: object, use_mxfp8: object) -> object:
    """``format=`` as mok's view functions take it, with the deprecated ``use_mxfp8=`` (Megatron's
    flag, which mok.weights keeps) turned into it: True/False for "mxfp8"/"bf16", both given
    must agree. Warns (DeprecationWarning) wherever ``use_mxfp8`` is given."""
    if use_mxfp8 is None:
        return format
    deprecated("use_mxfp8= of mok's view functions", "format='mxfp8' or format='bf16'", stacklevel=4)
    if not isinstance(use_mxfp8, bool):
        raise TypeError(f"use_mxfp8: expected a bool; found {describe(use_mxfp8)}")
    if format is None:
        return Format.MXFP8 if use_mxfp8 else Format.BF16
    if use_mxfp8 is not (format_named(format) is Format.MXFP8):
        raise ValueError(f"use_mxfp8={use_mxfp8} contradicts format={format!r}; pass one of them")
    return format


_BY_NAME = {f.value: f for f in Format}  # a Format is a str too: its own key finds it
