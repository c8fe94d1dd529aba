"""The formats of mok's views: the enum a view's format is, and the one place a name becomes one.

How TE stores a block-scaled format (payload packing, padded scale buffers, orientation) is
te_compat's to say (te_compat.geometry); how mok reads it, mok.read.blocks'.
"""

from __future__ import annotations

from enum import Enum

from mok.checks import describe


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


def format_named(format: object, use_mxfp8: object) -> Format:
    """The format asked for: ``format`` (a :class:`Format` or its name) if given, else from the
    ``use_mxfp8`` flag (Megatron's). The one place a string becomes a format."""
    if use_mxfp8 is not None and not isinstance(use_mxfp8, bool):
        raise TypeError(f"use_mxfp8: expected a bool; found {describe(use_mxfp8)}")
    if format is None:
        if use_mxfp8 is None:
            raise TypeError("expected use_mxfp8=True/False or format= ('bf16', 'mxfp8', 'nvfp4'); found neither")
        return Format.MXFP8 if use_mxfp8 else Format.BF16
    found = _BY_NAME.get(format) if isinstance(format, str) else None
    if found is None:
        raise ValueError(f"format: expected one of {', '.join(map(repr, _BY_NAME))}; found {describe(format)}")
    if use_mxfp8 is not None and use_mxfp8 is not (found is Format.MXFP8):
        raise ValueError(f"use_mxfp8={use_mxfp8} contradicts format={format!r}; pass one of them")
    return found


_BY_NAME = {f.value: f for f in Format}  # a Format is a str too: its own key finds it
