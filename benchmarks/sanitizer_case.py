"""A representative run of the kernel for compute-sanitizer (memcheck, racecheck, synccheck), under
each launch shape in turn (``default``: each launch's own; then 16x128 and 32x256 for every
launch), or the shapes named as arguments.

    compute-sanitizer --tool memcheck --report-api-errors no python benchmarks/sanitizer_case.py
    compute-sanitizer --tool racecheck python benchmarks/sanitizer_case.py
    compute-sanitizer --tool synccheck python benchmarks/sanitizer_case.py [default 16x128]

Public API only: mok.swizzle_mxfp8_scales(_many), mok.plan.work.run_work and mok.kernels' job API
(jobs.convert_job, jobs.copy_job, launch.Launch); a shape is chosen through MOK_KERNEL_SHAPE
(bench_swizzle.use_shape). Every job mode (rows 16/4/1-byte, padded slabs, rows wider than a slab,
columnwise transpose, gather, copy), per-expert pointer tables (conversions and copies of one size),
one mixed launch, and one inverse launch (every case's layout back into an output of the case's own
geometry, per-expert tables included); each result is checked against the torch reference, and the
inverse's outputs' buffers outside them for untouched bytes. Then the quantize kernel (BF16 to
MXFP8, mok.kernels.quantize): a grouped source and a per-expert pointer table, padded shapes, each
checked against the torch reference. Exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch
from bench_swizzle import use_shape  # this folder is on sys.path when run as a script

import mok
from mok.kernels.jobs import convert_job, copy_job
from mok.kernels.launch import Launch
from mok.layout import swizzle_reference
from mok.plan.work import ScaleWork, run_work

SHAPES = ["default", "16x128", "32x256"]


def _cases(g: torch.Generator, dev: str) -> list[torch.Tensor]:
    def rand(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(dev)

    return [
        rand(3, 160, 7),  # 1-byte rows
        rand(2, 200, 12),  # 4-byte rows
        rand(2, 300, 224),  # 16-byte rows
        rand(2, 300, 228)[:, :, :225],  # padded rows (TE's 2080x7200 kind): a 1-byte last piece
        rand(2, 130, 72)[:, :, :71],  # 4-byte rows, a last piece of a word and 3 bytes
        rand(2, 130, 48)[:, :, :38],  # 16-byte rows, a last piece of a word and 2 bytes
        rand(2 * 131 * 84 + 16)[12 : 12 + 2 * 131 * 84].view(2, 131, 84)[:, :, :82],  # slabs 12 and 8 bytes past 16
        rand(2, 130, 112)[:, :, :101],  # 16-byte rows a slab a unit, a partial last word
        rand(2, 130, 1040)[:, :, :1000],  # rows too wide for a slab unit
        rand(3 * 200 * 13 + 1)[1:].view(3, 200, 13)[:, :, :12],  # misaligned start
        rand(2, 40, 520)[:, :33, :500].transpose(1, 2),  # columnwise, ragged
        rand(2, 68, 7296)[:, :65, :7200].transpose(1, 2),  # columnwise, TE-padded
        rand(1, 90, 60)[:, ::3, ::2],  # gather
    ]


def _one_shape(shape: str, dev: str) -> None:
    use_shape(shape)
    g = torch.Generator().manual_seed(0)
    cases = _cases(g, dev)
    for scales in cases:
        if not torch.equal(
            mok.swizzle_mxfp8_scales(scales, backend="cuda"), mok.swizzle_mxfp8_scales(scales, backend="torch")
        ):
            raise SystemExit(f"{shape}: mismatch for shape {tuple(scales.shape)} strides {scales.stride()}")
    mats = [torch.randint(0, 256, (37 * i + 1, i % 9 + 1), dtype=torch.uint8, generator=g).to(dev) for i in range(40)]
    mats += [torch.randint(0, 256, (300, 228), dtype=torch.uint8, generator=g).to(dev)[:, :225] for _ in range(20)]
    for m, o in zip(mats, mok.swizzle_mxfp8_scales_many(mats, backend="cuda"), strict=True):
        if not torch.equal(o, mok.swizzle_mxfp8_scales(m, backend="torch")):
            raise SystemExit(f"{shape}: mismatch in swizzle_mxfp8_scales_many")
    src = torch.randint(0, 256, (40000,), dtype=torch.uint8, generator=g).to(dev)
    work = [
        (c, torch.full(mok.layout_shape(c.shape[1], c.shape[2], c.shape[0]), 0xAB, dtype=torch.uint8, device=dev))
        for c in cases
    ]
    copies = [(src, torch.zeros_like(src)), (src[3:], torch.zeros(src.numel() - 3, dtype=torch.uint8, device=dev))]
    experts = [torch.randint(0, 256, (33000,), dtype=torch.uint8, generator=g).to(dev) for _ in range(4)]
    copies += [(e, torch.zeros_like(e)) for e in experts]  # per-expert copies of one size: one indirect job
    jobs = [convert_job(s, o) for s, o in work] + [copy_job(s, d) for s, d in copies]
    Launch(jobs, torch.device(dev))()  # one mixed launch
    torch.cuda.synchronize()
    for s, o in work:
        if not torch.equal(o, swizzle_reference(s, torch.empty_like(o))):
            raise SystemExit(f"{shape}: mismatch in the mixed launch for shape {tuple(s.shape)}")
    if not all(torch.equal(s, d) for s, d in copies):
        raise SystemExit(f"{shape}: mismatch in a copy job")
    _inverse_launch(shape, cases + mats)
    use_shape("default")


def _inverse_launch(shape: str, scales: list[torch.Tensor]) -> None:
    """One inverse launch: each logical matrix's layout back into a buffer of its own (0xAB) seen
    through the matrix's own geometry (padded rows, transposes, gathers, misaligned starts); then
    the view must equal the matrix and the rest of the buffer must hold 0xAB."""
    batches = [s if s.dim() == 3 else s.unsqueeze(0) for s in scales]
    buffers = [torch.full((b.untyped_storage().nbytes(),), 0xAB, dtype=torch.uint8, device=b.device) for b in batches]
    outs = [buf.as_strided(b.shape, b.stride(), b.storage_offset()) for buf, b in zip(buffers, batches, strict=True)]
    layouts = [mok.swizzle_mxfp8_scales(b, backend="torch") for b in batches]
    run_work([ScaleWork(la, o, inverse=True) for la, o in zip(layouts, outs, strict=True)], backend="cuda")
    torch.cuda.synchronize()
    for b, buf in zip(batches, buffers, strict=True):
        want = torch.full_like(buf, 0xAB)
        want.as_strided(b.shape, b.stride(), b.storage_offset()).copy_(b)
        if not torch.equal(buf, want):
            raise SystemExit(f"{shape}: mismatch in the inverse launch for shape {tuple(b.shape)} strides {b.stride()}")


def _quantize_cases() -> None:
    """The quantize kernel over a grouped source and a per-expert table (rows not a multiple of
    128, so the layouts' padding is written too), against the torch reference; the last source has
    more 128-row units than an H200 holds blocks, so blocks convert several units (the double
    buffer continuing from one unit's last tile to the next unit's first)."""
    from mok.kernels.quantize import QuantizeLaunch, empty_outputs, run_reference

    g = torch.Generator().manual_seed(3)
    grouped = torch.randn(3, 96, 160, generator=g).to(torch.bfloat16).cuda()
    experts = [torch.randn(64, 96, generator=g).to(torch.bfloat16).cuda() for _ in range(2)]
    many = torch.randn(16, 544, 2080, generator=g).to(torch.bfloat16).cuda()  # 16 x 5 x 9 units
    for src, (e, r, c) in ((grouped, (3, 96, 160)), (experts, (2, 64, 96)), (many, (16, 544, 2080))):
        out, want = empty_outputs(e, r, c, "cuda"), empty_outputs(e, r, c, "cuda")
        for t in out:
            t.view(torch.uint8).fill_(0xAB)
        QuantizeLaunch(src, out)()
        run_reference(src, want)
        torch.cuda.synchronize()
        if not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(out, want, strict=True)):
            raise SystemExit(f"quantize: mismatch for {e} x [{r}, {c}] ({'table' if src is experts else 'grouped'})")


def main() -> None:
    for shape in sys.argv[1:] or SHAPES:  # shapes named on the command line, or all
        _one_shape(shape, "cuda")
        print(f"sanitizer case, shape {shape}: all results equal the torch reference")
    _quantize_cases()
    print("sanitizer case, quantize: all results equal the torch reference")


if __name__ == "__main__":
    main()
