"""Is torch's C++ address check faster than mok's refresh guard's? (issue 9; GPU, CUDA builds)

    python benchmarks/probe_address_check.py

mok's guard compares every watched tensor's address with ``list(map(Tensor.data_ptr, ts)) ==``.
CUDA builds of torch have ``torch._C._tensors_data_ptrs_at_indices_equal`` (inductor's CUDA-graph
trees use it for the same question). Both over 512 CUDA tensors (256 experts, payload and
scales), the best of 9 repeats of 500 calls; prints microseconds per check.
"""

import timeit

import torch

tensors = [torch.empty(16, device="cuda") for _ in range(512)]
addresses = [t.data_ptr() for t in tensors]
indices = list(range(len(tensors)))
data_ptr = torch.Tensor.data_ptr
checks = {"map(data_ptr) ==": lambda: list(map(data_ptr, tensors)) == addresses}
helper = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
if helper is not None:
    checks["_tensors_data_ptrs_at_indices_equal"] = lambda: helper(tensors, addresses, indices)
for name, check in checks.items():
    assert check()
    best = min(timeit.repeat(check, number=500, repeat=9)) / 500
    print(f"probe 512 tensors: {name}: {best * 1e6:.1f} us")
