"""A representative run of the kernel for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck python benchmarks/sanitizer_case.py
    compute-sanitizer --tool racecheck python benchmarks/sanitizer_case.py

Every job mode (rows 16/4/1-byte, columnwise transpose, gather, copy), padded shapes and a
many-expert launch; each result is checked against the torch reference. Exits non-zero on a
mismatch.
"""

from __future__ import annotations

import torch

import mok
from mok.kernels import launcher


def main() -> None:
    g = torch.Generator().manual_seed(0)
    dev = "cuda"
    cases = [
        torch.randint(0, 256, (3, 160, 7), dtype=torch.uint8, generator=g).to(dev),  # 1-byte rows
        torch.randint(0, 256, (2, 200, 12), dtype=torch.uint8, generator=g).to(dev),  # 4-byte rows
        torch.randint(0, 256, (2, 300, 224), dtype=torch.uint8, generator=g).to(dev),  # 16-byte rows
        torch.randint(0, 256, (2, 40, 520), dtype=torch.uint8, generator=g).to(dev)[:, :33, :500].transpose(1, 2),
        torch.randint(0, 256, (1, 90, 60), dtype=torch.uint8, generator=g).to(dev)[:, ::3, ::2],  # gather
    ]
    for scales in cases:
        fast = mok.swizzle_mxfp8_scales(scales, backend="cuda")
        if not torch.equal(fast, mok.swizzle_mxfp8_scales(scales, backend="torch")):
            raise SystemExit(f"mismatch for shape {tuple(scales.shape)} strides {scales.stride()}")
    mats = [torch.randint(0, 256, (37 * i + 1, i % 9 + 1), dtype=torch.uint8, generator=g).to(dev) for i in range(40)]
    for m, o in zip(mats, mok.swizzle_mxfp8_scales_many(mats, backend="cuda"), strict=True):
        if not torch.equal(o, mok.swizzle_mxfp8_scales(m, backend="torch")):
            raise SystemExit("mismatch in swizzle_mxfp8_scales_many")
    src = torch.randint(0, 256, (40000,), dtype=torch.uint8, generator=g).to(dev)
    dst = torch.empty_like(src)
    launcher.launch_jobs([launcher.copy_job(src, dst)], src.device)
    torch.cuda.synchronize()
    if not torch.equal(src, dst):
        raise SystemExit("mismatch in copy job")
    print("sanitizer case: all results equal the torch reference")


if __name__ == "__main__":
    main()
