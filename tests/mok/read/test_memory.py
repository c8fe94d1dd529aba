"""The freed-memory check (mok/read/memory.py) seen from a caller: a view or a refresh of weights
whose storage no longer holds every byte of a tensor refuses with mok.StorageFreedError, naming
the tensor, wherever in its storage the tensor lies.

Experts often share one flat buffer (Megatron's parameter buffers, FSDP's all-gather output),
each a view at its own storage offset. A storage that shrank (``resize_``) may still hold as many
bytes as one expert spans while an expert deep into it lies partly or wholly beyond its end:
reading that expert would read freed memory.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mok
from te_compat.testing import installed_release

R, C = 64, 64
PER_EXPERT = R * C  # elements
ITEM = torch.bfloat16.itemsize


pytestmark = pytest.mark.usefixtures("memory_reader")  # both memory readers


def _experts_in_one_buffer(experts: int, lead: int) -> tuple[torch.Tensor, list[torch.nn.Parameter]]:
    """One flat BF16 buffer and a Parameter per expert over it, expert e starting ``lead + e * R * C``
    elements in (``lead`` a multiple of 8: every expert 16-byte aligned, as mok's quantiser needs)."""
    flat = torch.randn(lead + experts * PER_EXPERT, generator=torch.Generator().manual_seed(experts)).bfloat16()
    params = [
        torch.nn.Parameter(flat[lead + e * PER_EXPERT : lead + (e + 1) * PER_EXPERT].view(R, C), requires_grad=False)
        for e in range(experts)
    ]
    return flat, params


@settings(max_examples=60, deadline=None)
@given(
    experts=st.integers(1, 4),
    lead=st.sampled_from([0, 8, 64]),
    kept=st.floats(0.0, 1.0),
    fmt=st.sampled_from(["bf16", "mxfp8"]),  # mxfp8: BF16 weights mok quantises itself
    refresh=st.booleans(),
)
@example(experts=3, lead=0, kept=0.9, fmt="bf16", refresh=False)
@example(experts=3, lead=8, kept=0.5, fmt="mxfp8", refresh=True)
def test_an_expert_beyond_the_end_of_its_shrunk_storage_is_refused(
    experts: int, lead: int, kept: float, fmt: str, refresh: bool
) -> None:
    """The experts' shared storage shrinks to ``kept`` of its bytes: a new view (or a refresh of
    one made before) raises StorageFreedError naming the first expert not wholly inside what is
    left, and succeeds where every expert still is."""
    with installed_release("2.20.2"):
        flat, params = _experts_in_one_buffer(experts, lead)
        cached = mok.split_weight_view(params, rows=R, columns=C, format=fmt) if refresh else None
        nbytes = int(kept * flat.untyped_storage().nbytes())
        flat.untyped_storage().resize_(nbytes)
        cut = [e for e in range(experts) if (lead + (e + 1) * PER_EXPERT) * ITEM > nbytes]
        if cut:
            with pytest.raises(mok.StorageFreedError, match=rf"^expert {cut[0]} weight: its storage holds {nbytes} "):
                mok.split_weight_view(params, rows=R, columns=C, format=fmt, cached=cached)
        else:
            view = mok.split_weight_view(params, rows=R, columns=C, format=fmt, cached=cached)
            if fmt == "bf16":
                assert view.rowwise.data_ptrs is not None
                assert view.rowwise.data_ptrs.tolist() == [p.data_ptr() for p in params]


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])
def test_a_grouped_weight_deep_into_a_shrunk_storage_is_refused(fmt: str) -> None:
    """The same for one grouped BF16 weight that starts past its storage's first byte."""
    with installed_release("2.20.2"):
        flat = torch.randn(8 + 2 * PER_EXPERT).bfloat16()
        weight = flat[8:].view(2, R, C)
        mok.grouped_weight_view(weight, num_experts=2, rows=R, columns=C, format=fmt)
        flat.untyped_storage().resize_(2 * PER_EXPERT * ITEM)  # as many bytes as the weight spans, 16 too few
        with pytest.raises(mok.StorageFreedError, match="grouped weight: its storage holds"):
            mok.grouped_weight_view(weight, num_experts=2, rows=R, columns=C, format=fmt)
