// MXFP8 export (mok.export_mxfp8): a whole layer weight's export, every expert, payload and
// scales, both directions, in ONE launch.
//
// A job (a row of the device descriptor table mok/kernels/export_jobs.py writes) is one of:
//   EX_PAYLOAD      payload rows: dst[e][n][c] for n < out_rows, c < out_cols is
//                   src[e][perm(n)][c] inside [rows, cols], else 0 (FlashInfer's zero padding);
//                   perm is the identity, or with EX_SHUFFLE FlashInfer's row shuffle within blocks
//                   of 32 (row n takes row (n % 8) * 4 + (n % 32) / 8 of its block).
//   EX_SCALE_*      the view's scales, in the 128x4 layout (mok/layout.py), tile by tile: the word
//                   of lane l, group i of tile (b, g) holds scales c = 4g..4g+3 (byte c % 4) of
//                   logical row r = 128b + 32i + l. BYTES writes byte (r, c) at r*dst_rs + c*dst_cs
//                   (compact rowwise: [R, C]; compact columnwise: TE's [C, R] orientation);
//                   WORDS writes word (r, g) whole at r*dst_rs + g*dst_cs (DeepGEMM's packed,
//                   MN-major int32); TILES writes the tile whole with its lanes permuted (dst lane
//                   y*8 + x takes src lane x*4 + y: TRT-LLM's Major-K scales are the layout with
//                   FlashInfer's row shuffle applied to its lanes). Only r < R, c < C are written
//                   by BYTES and WORDS: an output's own padding (DeepGEMM's aligned rows) is left
//                   as the caller allocated it. The layout's padding (r >= R or c >= C) is never
//                   copied: TE's own GEMM-layout scales (2.12+) hold there whatever TE left, and
//                   the owners' references write 0. WORDS writes a row's last word's bytes past C
//                   as 0, TILES every byte of an edge tile's rows past R or columns past C as 0:
//                   a mask decided per tile (interior tiles are copied as they are).
// Expert e reads src + e*src_es (a grouped weight), or with EX_INDIRECT the e-th address of the
// device array at src (a split view's own pointer table, which a refresh rewrites in place when TE
// moves a buffer: a prepared launch, and a CUDA graph that captured it, follow), and writes
// dst + e*dst_es.
//
// Work is split into units: EX_UNIT_PIECES 16-byte pieces of one expert's payload rows (row-major
// over the output), or EX_UNIT_TILES 512-byte tiles of one expert's scales; one block a unit, every
// load of a thread issued before its first store, so that thousands of small independent blocks
// keep enough bytes in flight for a copy's bandwidth. No shared memory and no barrier: nothing is
// exchanged between threads.
//
// Access widths: the host gives the widest source and output access (16, 4 or 1 bytes) the job's
// strides and output addresses allow; a source address read from a pointer table is checked again
// here, per expert, since TE may hand a refreshed view a buffer of another alignment.
//
// Compiled at first use by NVRTC (mok/kernels/export_launch.py); compile-checked on CPU CI and run
// by the CPU emulator (tests/emulator/emulate_export.py).

#if !defined(EX_PAYLOAD) || !defined(EX_SCALE_BYTES) || !defined(EX_SCALE_WORDS) || !defined(EX_SCALE_TILES) || \
    !defined(EX_INDIRECT) || !defined(EX_SHUFFLE) || !defined(EX_SRC_VEC_SHIFT) || !defined(EX_DST_VEC_SHIFT)
#error "compile through mok.kernels: the ABI macros come from mok/kernels/abi.py (ExportConfig.macros())"
#endif
#if !defined(EX_THREADS) || !defined(EX_UNIT_PIECES) || !defined(EX_UNIT_TILES)
#error "compile through mok.kernels: the kernel's shape comes from ExportConfig.macros()"
#endif

#define EX_PIECES_PER_THREAD (EX_UNIT_PIECES / EX_THREADS)
#define EX_WARPS (EX_THREADS / 32)
#define EX_TILES_PER_WARP (EX_UNIT_TILES / EX_WARPS)
static_assert(EX_PIECES_PER_THREAD * EX_THREADS == EX_UNIT_PIECES, "a payload unit is whole pieces a thread");
static_assert(EX_TILES_PER_WARP * EX_WARPS == EX_UNIT_TILES && EX_THREADS % 32 == 0, "a scale unit is whole tiles a warp");

// One job, in int64 words (export_jobs.ExportJob, field for field).
struct ExportJob {
  long long src, src_es, src_rs;  // expert 0's source (or the pointer table), bytes between experts, rows
  long long dst, dst_es, dst_rs, dst_cs;  // expert 0's output, bytes between experts, rows, columns
  long long rows, cols;                   // payload [N, K]; scales the logical [R, C]
  long long out_rows, out_cols;           // payload: the output's [Np, Kp] (unused for scales)
  long long experts, flags, unit_begin;
};

#ifndef MOK_EMULATE  // emulator.h has its own, which checks each write against the launch's outputs
template <class T>
__device__ __forceinline__ void store_global(unsigned char* p, const T v) {
  *reinterpret_cast<T*>(p) = v;
}
#endif

__device__ __forceinline__ unsigned word_of(const uint4 v, const int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The widest access (16, 4, 1) at most `vec` that address p allows.
__device__ __forceinline__ int width_at(const unsigned char* p, const int vec) {
  const unsigned a = (unsigned)(reinterpret_cast<unsigned long long>(p) & 15);
  return (vec >= 16 && a == 0) ? 16 : (vec >= 4 && (a & 3) == 0) ? 4 : 1;
}

// 16 bytes at p, read as `vec`-byte accesses (p is `vec`-aligned).
__device__ __forceinline__ uint4 load16(const unsigned char* p, const int vec) {
  if (vec == 16) return __ldg(reinterpret_cast<const uint4*>(p));
  if (vec == 4) {
    const unsigned* q = reinterpret_cast<const unsigned*>(p);
    return make_uint4(__ldg(q), __ldg(q + 1), __ldg(q + 2), __ldg(q + 3));
  }
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = (unsigned)__ldg(p + 4 * i) | (unsigned)__ldg(p + 4 * i + 1) << 8 | (unsigned)__ldg(p + 4 * i + 2) << 16 |
           (unsigned)__ldg(p + 4 * i + 3) << 24;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The first n (0..16) bytes at p, byte by byte, zero above: a row's last, partial piece.
__device__ __forceinline__ uint4 load_bytes(const unsigned char* p, const int n) {
  unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int y = 0; y < 16; ++y)
    if (y < n) w[y >> 2] |= (unsigned)__ldg(p + y) << 8 * (y & 3);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The first n (1..16) bytes of v at p: whole `vec`-byte stores where they fit, bytes after.
__device__ __forceinline__ void store16(unsigned char* p, const uint4 v, const int n, const int vec) {
  if (vec == 16 && n == 16) {
    store_global(p, v);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned w = word_of(v, i);
    const int b = n - 4 * i;  // bytes of word i to write
    if (vec >= 4 && b >= 4) {
      store_global(p + 4 * i, w);
      continue;
    }
#pragma unroll
    for (int y = 0; y < 4; ++y)
      if (y < b) store_global(p + 4 * i + y, (unsigned char)(w >> 8 * y));
  }
}

// This expert's source: the table's entry (EX_INDIRECT) or the batch's slice. The table is mok's
// own memory, read with a plain load (not the read-only path: a refresh rewrites it between calls).
__device__ __forceinline__ const unsigned char* source_of(const ExportJob& J, const long long e) {
  if (J.flags & EX_INDIRECT)
    return reinterpret_cast<const unsigned char*>(reinterpret_cast<const long long*>(J.src)[e]);
  return reinterpret_cast<const unsigned char*>(J.src + e * J.src_es);
}

// ---- Payload: pieces first .. first + EX_UNIT_PIECES of the expert's output, row-major over
// [out_rows, ceil(out_cols / 16)] pieces.
__device__ __forceinline__ void payload_unit(const ExportJob& J, const long long e, const long long unit) {
  const unsigned char* src = source_of(J, e);
  unsigned char* dst = reinterpret_cast<unsigned char*>(J.dst + e * J.dst_es);
  const int svec = width_at(src, (int)((J.flags >> EX_SRC_VEC_SHIFT) & 0xff));
  const int dvec = (int)((J.flags >> EX_DST_VEC_SHIFT) & 0xff);
  const bool shuffle = (J.flags & EX_SHUFFLE) != 0;
  const unsigned per_row = (unsigned)((J.out_cols + 15) / 16);
  const long long total = J.out_rows * per_row;
  const long long first = unit * EX_UNIT_PIECES;
  const int count = (int)min((long long)EX_UNIT_PIECES, total - first);
  const int K = (int)J.cols, Kp = (int)J.out_cols;
  uint4 v[EX_PIECES_PER_THREAD];
#pragma unroll
  for (int p = 0; p < EX_PIECES_PER_THREAD; ++p) {
    const int q = (int)threadIdx.x + p * EX_THREADS;
    v[p] = make_uint4(0, 0, 0, 0);
    if (q >= count) continue;
    const unsigned piece = (unsigned)(first + q);
    const unsigned n = piece / per_row;
    const int c = (int)(piece - n * per_row) * 16;
    const unsigned row = shuffle ? (n & ~31u) | (n & 7u) << 2 | (n >> 3 & 3u) : n;
    if (n >= (unsigned)J.rows || c >= K) continue;  // padding rows and columns: zeros
    const unsigned char* in = src + (long long)row * J.src_rs + c;
    v[p] = c + 16 <= K ? load16(in, svec) : load_bytes(in, K - c);
  }
#pragma unroll
  for (int p = 0; p < EX_PIECES_PER_THREAD; ++p) {
    const int q = (int)threadIdx.x + p * EX_THREADS;
    if (q >= count) continue;
    const unsigned piece = (unsigned)(first + q);
    const unsigned n = piece / per_row;
    const int c = (int)(piece - n * per_row) * 16;
    store16(dst + (long long)n * J.dst_rs + c, v[p], min(16, Kp - c), dvec);
  }
}

// ---- Scales: tiles first .. first + EX_UNIT_TILES of the expert's layout, a warp a tile, each
// lane its 16-byte line (rows l, 32 + l, 64 + l, 96 + l of the tile's 4 columns).
__device__ __forceinline__ void scale_unit(const ExportJob& J, const long long e, const long long unit) {
  const unsigned char* src = source_of(J, e);
  unsigned char* dst = reinterpret_cast<unsigned char*>(J.dst + e * J.dst_es);
  const int svec = width_at(src, (int)((J.flags >> EX_SRC_VEC_SHIFT) & 0xff));
  const int dvec = (int)((J.flags >> EX_DST_VEC_SHIFT) & 0xff);
  const int kind = (int)(J.flags & 0xff);
  const int R = (int)J.rows, C = (int)J.cols;
  const int per_row = (C + 3) / 4;  // tiles of a 128-row slab: Cp / 4
  const long long total = (long long)((R + 127) / 128) * per_row;
  const long long first = unit * EX_UNIT_TILES;
  const int count = (int)min((long long)EX_UNIT_TILES, total - first);
  const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
  uint4 v[EX_TILES_PER_WARP];
#pragma unroll
  for (int j = 0; j < EX_TILES_PER_WARP; ++j) {
    const int t = warp + j * EX_WARPS;
    v[j] = t < count ? load16(src + (first + t) * 512 + lane * 16, svec) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < EX_TILES_PER_WARP; ++j) {
    const int t = warp + j * EX_WARPS;
    if (t >= count) continue;
    const long long tile = first + t;
    const int b = (int)(tile / per_row), g = (int)(tile - (long long)b * per_row);
    // the bytes of scales c < C of this tile's columns; all four but in the last column of tiles
    const unsigned cmask = 4 * g + 4 <= C ? ~0u : (1u << 8 * (C - 4 * g)) - 1u;
    if (kind == EX_SCALE_TILES) {  // lane x*4 + y goes to lane y*8 + x
      uint4 w = v[j];
      if (128 * b + 128 > R || cmask != ~0u) {  // an edge tile: its padding written 0, not copied
        const int r = 128 * b + lane;
        w.x = r < R ? w.x & cmask : 0u;
        w.y = r + 32 < R ? w.y & cmask : 0u;
        w.z = r + 64 < R ? w.z & cmask : 0u;
        w.w = r + 96 < R ? w.w & cmask : 0u;
      }
      store16(dst + tile * 512 + ((lane & 3) * 8 + (lane >> 2)) * 16, w, 16, dvec);
      continue;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 128 * b + 32 * i + lane;
      if (r >= R) continue;
      const unsigned w = word_of(v[j], i);
      if (kind == EX_SCALE_WORDS) {  // whole words, the bytes past C written 0 (the layout's padding)
        store_global(dst + (long long)r * J.dst_rs + (long long)g * J.dst_cs, w & cmask);
        continue;
      }
      unsigned char* out = dst + (long long)r * J.dst_rs + (long long)(4 * g) * J.dst_cs;
      if (J.dst_cs == 1 && dvec >= 4 && 4 * g + 4 <= C) {  // four consecutive scales of a row
        store_global(out, w);
        continue;
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
        if (4 * g + x < C) store_global(out + x * J.dst_cs, (unsigned char)(w >> 8 * x));
    }
  }
}

// Resident blocks an SM the registers are allocated for: 1024 threads (64 registers a thread, no
// spills), each with its eight 16-byte loads in flight: far more bytes in flight than an SM needs to
// keep its share of DRAM busy, so more blocks would buy nothing a copy does not have.
#define EX_MIN_BLOCKS (1024 / EX_THREADS)

// One block a unit (the loop runs again only past the largest grid). The jobs of one export are a
// handful (a payload and a scale job a direction): a linear search finds a unit's.
extern "C" __global__ void __launch_bounds__(EX_THREADS, EX_MIN_BLOCKS)
mxfp8_export_jobs(const ExportJob* __restrict__ jobs, int njobs, long long total_units) {
  for (long long u = blockIdx.x; u < total_units; u += gridDim.x) {
    int k = 0;
    while (k + 1 < njobs && jobs[k + 1].unit_begin <= u) ++k;
    const ExportJob J = jobs[k];
    const long long local = u - J.unit_begin;
    const long long per_expert = (J.flags & 0xff) == EX_PAYLOAD
                                     ? (J.out_rows * ((J.out_cols + 15) / 16) + EX_UNIT_PIECES - 1) / EX_UNIT_PIECES
                                     : (((J.rows + 127) / 128) * ((J.cols + 3) / 4) + EX_UNIT_TILES - 1) / EX_UNIT_TILES;
    const long long e = local / per_expert;
    if ((J.flags & 0xff) == EX_PAYLOAD) {
      payload_unit(J, e, local - e * per_expert);
    } else {
      scale_unit(J, e, local - e * per_expert);
    }
  }
}
