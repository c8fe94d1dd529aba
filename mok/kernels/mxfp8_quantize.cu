// BF16 expert weights to MXFP8 as Transformer Engine quantises them (mok/quantize_reference.py has
// the rule and the TE sources it follows), both directions, every expert in one launch:
//   rowwise:    payload [E, R, C] E4M3, one E8M0 scale per 1x32 block of a row, scales S[R, C/32];
//   columnwise: payload [E, R, C] E4M3 (not transposed), one scale per 32x1 block of a column,
//               scales Scol[R/32, C], written as their transpose S'[C, R/32];
// the scales either in the tcgen05 128x4 layout (mok/layout.py: S[r, c] at
// ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4, Rp = roundup(rows,128),
// Cp = roundup(cols,4), padding bytes 0, expert e at e*Rp*Cp) or logical and compact
// (QF_LOGICAL: [E, R, C/32] and [E, R/32, C], no padding).
//
// A block of QTHREADS threads stays resident and converts unit after unit (unit u, u + gridDim.x,
// ...). A unit is one 128-row group of one expert's rows by QTILE_COLS columns: its tiles (32 rows
// x QTILE_COLS columns, at most 4, fewer where the rows end) are converted one after another. Each
// tile is copied into shared memory with cp.async while the block converts the one before, the
// next unit's first tile included, so every resident block keeps 16 KB of reads in flight. In a
// tile, thread (r, g) converts the 1x32 rowwise block g of row r; warp q takes rows 4q..4q+3 of
// every column for the columnwise direction, lane c eight columns (one 16-byte piece a row): the
// warps' maxima meet in shared memory, thread (q, c) turns column 8c+q's into its scale and
// reciprocal, and each lane then converts its 4 x 8 values. Payloads go straight to global memory
// (a rowwise thread writes its 32 bytes, a columnwise warp 256 contiguous bytes a row). Maxima are
// taken two BF16 values at a time (max.xorsign.abs.bf16x2).
// Scales in the 128x4 layout are stored as whole 4-byte groups (scales of 4 consecutive k blocks
// of one row), after the unit's last tile: a column's four columnwise codes (one a tile of the
// unit) gather in a register of the thread that makes them; a row's four rowwise codes meet by warp
// shuffles in the four lanes that made them, each of which keeps one tile's word, so four lanes
// store a whole 16-byte line of the layout. Bytes that no scale maps to are the layout's padding:
// the words carry zeros there (a block or tile past the matrix adds no code), so every byte of
// every output is written exactly once. Logical scales are stored byte by byte.
//
// Constants of the launch ABI come from mok/kernels/quantize.py as macros (NVRTC options, or g++
// -D in the CPU emulator, tests/emulator/emulate_quantize.py): none is defined here.

#if !defined(QTHREADS) || !defined(QMIN_BLOCKS) || !defined(QTILE_ROWS) || !defined(QTILE_COLS) || \
    !defined(QF_ROWWISE) || !defined(QF_COLWISE) || !defined(QF_POINTERS) || !defined(QF_RCP_SHIFT) ||  \
    !defined(QF_LOGICAL) || !defined(QF_FMA_ZERO)
#error "compile with the macros of mok/kernels/quantize.py (QuantizeConfig.macros)"
#endif

#define QCHUNKS (QTILE_COLS / 8)   // 16-byte chunks of a tile row of BF16
#define QGROUPS (QTILE_COLS / 32)  // 1x32 blocks of a tile row
static_assert(QTILE_ROWS == 32, "a tile is one 32-row block of the columnwise direction");
static_assert(QTHREADS == QTILE_COLS && QTILE_ROWS * QGROUPS == QTHREADS,
              "one thread per column of a tile and one per 1x32 block of it");
static_assert(QGROUPS == 8, "the read order of a row's blocks is chosen for 8 blocks a row");

// fp32(1/448) = 0x3B124925: TE's Quantized_Limits<fp8e4m3>::max_norm_rcp
#define QMAX_NORM_RCP 0x1.24924ap-9f

#ifndef MOK_EMULATE
template <class T>
__device__ __forceinline__ void store_global(unsigned char* p, const T v) {
  *reinterpret_cast<T*>(p) = v;
}
#endif

// TE's float_to_e8m0(amax * max_norm_rcp) (util/ptx.cuh; Blackwell's cvt.rp.satfinite.ue8m0x2.f32
// gives the same codes for the non-negative values it is used on).
__device__ __forceinline__ unsigned e8m0_code(float amax) {
  const float v = __fmul_rn(amax, QMAX_NORM_RCP);
  const unsigned u = __float_as_uint(v);
  const unsigned exponent = (u >> 23) & 0xFFu, mantissa = u & 0x7FFFFFu;
  if (exponent == 0xFFu) return mantissa ? 0xFFu : 0xFEu;  // NaN, +inf
  const bool up = mantissa > 0 && exponent != 0xFEu && !(exponent == 0 && mantissa <= 0x400000u);
  return exponent + (up ? 1u : 0u);
}

// TE's exp2f_rcp(code): QF_RCP_SHIFT is TE 2.9's (code 0 -> 1, else (254 - code) << 23: 254 -> 0,
// 255 -> -inf); otherwise the rule after TE PR 2647 (2^(127 - code); 254 -> 2^-127, 255 -> NaN).
__device__ __forceinline__ float e8m0_reciprocal(unsigned code, bool shift) {
  const unsigned bits = (254u - code) << 23;
  if (shift) return __uint_as_float(code == 0 ? 0x3F800000u : bits);
  return __uint_as_float(code == 255 ? 0x7FFFFFFFu : code == 254 ? 0x00400000u : bits);
}

// cvt.rn.satfinite.e4m3 of one fp32 in software: nearest even, +-448 beyond, NaN -> 0x7F.
__device__ __forceinline__ unsigned e4m3_satfinite(float f) {
  const unsigned u = __float_as_uint(f), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // 448 or more, infinity included
  if (a >= 0x3C800000u) return sign | (((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - 960u);  // normal: 2^-6 up
  return sign | (unsigned)rintf(__fmul_rn(__uint_as_float(a), 512.0f));  // subnormal: multiples of 2^-9
}

// Two payload bytes, lo in the low byte: TE's cvt.rn.satfinite.e4m3x2.f32 where the GPU has it.
__device__ __forceinline__ unsigned e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(MOK_EMULATE)
  unsigned short out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return e4m3_satfinite(lo) | e4m3_satfinite(hi) << 8;
#endif
}

// The addend of x * rcp + zero: -0 reproduces TE's generic kernel (mul.f32: a -0 product stays
// -0), +0 its specialized cast-only kernels (fma.rn.f32 with a +0 addend: an exactly zero product
// is +0). Either way one rounding of the exact result, as both kernels do.
__device__ __forceinline__ float product_addend(int flags) { return flags & QF_FMA_ZERO ? 0.0f : -0.0f; }

// Both halves of a word of two BF16 values scaled by their reciprocals, as two payload bytes.
// On sm_89+ the two products are one fma.rn.bf16x2: a reciprocal is a power of two, 0, -inf or
// NaN (all BF16 values), so a product is exact in BF16 wherever it is normal, as in fp32; one too
// small for that (below 2^-126) is an E4M3 zero of the same sign either way, and the addend's
// zero gives the same signed zeros (IEEE fma in both). The result is then widened to fp32 exactly.
// It relies on BF16 fma keeping subnormal operands (the PTX ISA: supported by default, and bf16
// has no .ftz form): a block holding +inf gets code 254, whose reciprocal 2^-127 is a BF16
// subnormal (tests/gpu's every-BF16-value case has such blocks). A NaN product may come back as
// any NaN (half-precision instructions return an unspecified NaN); the satfinite conversion
// makes every NaN, of either sign, the one E4M3 NaN 0x7F, as from fp32. The sm_89 gate is the
// e4m3x2 conversion's, which this path ends in.
__device__ __forceinline__ unsigned convert2(unsigned w, float rcp_lo, float rcp_hi, float zero) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(MOK_EMULATE)
  const unsigned rcp2 = (__float_as_uint(rcp_hi) & 0xFFFF0000u) | __float_as_uint(rcp_lo) >> 16;
  const unsigned zero2 = (__float_as_uint(zero) >> 16) * 0x10001u;
  unsigned p;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p) : "r"(w), "r"(rcp2), "r"(zero2));
  return e4m3x2(__uint_as_float(p << 16), __uint_as_float(p & 0xFFFF0000u));
#else
  return e4m3x2(__fmaf_rn(__uint_as_float(w << 16), rcp_lo, zero),
                __fmaf_rn(__uint_as_float(w & 0xFFFF0000u), rcp_hi, zero));
#endif
}

// Eight BF16 values (a 16-byte chunk) scaled by rcp, as eight payload bytes.
__device__ __forceinline__ unsigned long long convert8(const uint4 v, float rcp, float zero) {
  const unsigned lo = convert2(v.x, rcp, rcp, zero) | convert2(v.y, rcp, rcp, zero) << 16;
  const unsigned hi = convert2(v.z, rcp, rcp, zero) | convert2(v.w, rcp, rcp, zero) << 16;
  return (unsigned long long)hi << 32 | lo;
}

// Per half of a word of two BF16 values: the larger of |acc|'s half and |w|'s half, where acc
// holds no NaN; a NaN of w is skipped, as TE's maxima (max.xorsign.abs.bf16x2, __hmax, fmaxf) skip
// it. The result's sign bits are unspecified: magnitude() clears them.
__device__ __forceinline__ unsigned amax2(unsigned acc, unsigned w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860 && !defined(MOK_EMULATE)
  unsigned out;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(acc), "r"(w));
  return out;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(MOK_EMULATE)
  unsigned out;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(acc & 0x7FFF7FFFu), "r"(w & 0x7FFF7FFFu));
  return out;
#else
  const unsigned m = w & 0x7FFF7FFFu;
  unsigned out = 0;
  for (int half = 0; half < 32; half += 16) {
    const unsigned a = acc >> half & 0x7FFFu, b = m >> half & 0xFFFFu;  // non-negative: ordered as integers
    out |= (b > 0x7F80u || a >= b ? a : b) << half;
  }
  return out;
#endif
}

// A word of amax2 maxima without its sign bits.
__device__ __forceinline__ unsigned magnitude(unsigned acc) { return acc & 0x7FFF7FFFu; }

// The larger of the two halves of a word of amax2 maxima, as fp32.
__device__ __forceinline__ float amax_of(unsigned acc) {
  acc = magnitude(acc);
  return fmaxf(__uint_as_float(acc << 16), __uint_as_float(acc & 0xFFFF0000u));
}

// What every tile of a launch shares: the matrices' shape, the flags, and the scale layouts'
// padded column counts and sizes (rowwise roundup(R,128) x roundup(C/32,4), columnwise
// roundup(C,128) x roundup(R/32,4), one a matrix).
struct QShape {
  int rows, cols, flags;
  unsigned row_blocks, col_tiles;  // an expert's tiles: R/32 x ceil(C/QTILE_COLS)
  unsigned units;                  // an expert's units: ceil(R/128) x ceil(C/QTILE_COLS)
  int row_cp, col_cp;
  long long row_layout, col_layout;
};

__device__ __forceinline__ QShape shape_of(int rows, int cols, int flags) {
  QShape S;
  S.rows = rows, S.cols = cols, S.flags = flags;
  S.row_blocks = rows / 32, S.col_tiles = (cols + QTILE_COLS - 1) / QTILE_COLS;
  S.units = (S.row_blocks + 3) / 4 * S.col_tiles;
  S.row_cp = (cols / 32 + 3) / 4 * 4, S.col_cp = (rows / 32 + 3) / 4 * 4;
  S.row_layout = (rows + 127LL) / 128 * 128 * S.row_cp, S.col_layout = (cols + 127LL) / 128 * 128 * S.col_cp;
  return S;
}

// One tile: expert e, rows [r0, r0 + 32) (row block rb), columns [c0, c0 + width); its first
// payload byte is at `first` of the payloads; `last`: the last tile of its unit.
struct QTile {
  int e, rb, r0, c0, width;
  long long first;
  bool last;
};

__device__ __forceinline__ bool last_of_unit(int rb, const QShape& S) {
  return (rb & 3) == 3 || rb + 1 == (int)S.row_blocks;
}

// The first tile of unit u (units in the order expert, 128-row group, columns).
__device__ __forceinline__ QTile tile_of(unsigned u, const QShape& S) {
  QTile T;
  const unsigned e = u / S.units, rest = u - e * S.units, group = rest / S.col_tiles;
  T.e = (int)e, T.rb = (int)group * 4, T.r0 = T.rb * 32, T.c0 = (int)(rest - group * S.col_tiles) * QTILE_COLS;
  T.width = min(QTILE_COLS, S.cols - T.c0);
  T.first = ((long long)T.e * S.rows + T.r0) * S.cols + T.c0;
  T.last = last_of_unit(T.rb, S);
  return T;
}

// The tile after T in T's unit (T is not the unit's last).
__device__ __forceinline__ QTile next_in_unit(QTile T, const QShape& S) {
  T.rb += 1, T.r0 += 32, T.first += 32LL * S.cols;
  T.last = last_of_unit(T.rb, S);
  return T;
}

#include "async_copy.cuh"

// The 16-byte piece k (values 8k..8k+7) of row r of a tile in shared memory. Pieces are stored
// with bits 0-1 of k XORed with bits 3-4, so that the 8 threads converting a row's 1x32 blocks
// (pieces 4g..4g+3 for g = 0..7, one piece a step) read 8 distinct bank groups at every step,
// while a warp reading one piece of each of a row's 32 still reads all 32 bank groups.
__device__ __forceinline__ int piece_offset(int r, int k) { return r * (QTILE_COLS * 2) + (k ^ ((k >> 3) & 3)) * 16; }

// Starts copying tile T's BF16 values into `tile` (piece_offset); they are there once this
// thread's async_wait and a barrier have passed. src: see the kernel. Thread t copies piece t % 32
// of rows t / 32 + 8j: one bounds test and one address for its four copies.
#define QROW_STEP (QTHREADS / QCHUNKS)  // rows between one thread's copies
static_assert(QTHREADS % QCHUNKS == 0 && QTILE_ROWS % QROW_STEP == 0, "whole rows of pieces a step");
__device__ __forceinline__ void load_tile(const QTile& T, unsigned long long src, long long expert_stride,
                                          long long row_stride, int flags, unsigned char* tile) {
  const int r = threadIdx.x / QCHUNKS, k = threadIdx.x % QCHUNKS;
  if (k * 8 >= T.width) return;
  const unsigned char* x = (flags & QF_POINTERS)
                               ? reinterpret_cast<const unsigned char*>(reinterpret_cast<const long long*>(src)[T.e])
                               : reinterpret_cast<const unsigned char*>(src) + 2 * T.e * expert_stride;
  const unsigned char* from = x + 2 * ((long long)(T.r0 + r) * row_stride + T.c0) + k * 16;
  const long long step = 2 * QROW_STEP * row_stride;
  unsigned char* to = tile + piece_offset(r, k);
#pragma unroll
  for (int j = 0; j < QTILE_ROWS / QROW_STEP; ++j)
    async_copy16(to + j * QROW_STEP * (QTILE_COLS * 2), from + j * step);
}

// Thread (r, g)'s 1x32 block g of the tile's row r (pieces 4g..4g+3): its payload stored, its
// scale code returned.
__device__ __forceinline__ unsigned rowwise_block(const QTile& T, const QShape& S, int r, int g,
                                                  const unsigned char* tile, unsigned char* data) {
  unsigned acc = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 v = *reinterpret_cast<const uint4*>(tile + piece_offset(r, 4 * g + k));
    acc = amax2(amax2(amax2(amax2(acc, v.x), v.y), v.z), v.w);
  }
  const unsigned code = e8m0_code(amax_of(acc));
  const float rcp = e8m0_reciprocal(code, S.flags & QF_RCP_SHIFT), zero = product_addend(S.flags);
  unsigned char* to = data + T.first + (r * S.cols + g * 32);
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // read again: fewer registers held than keeping the 64 bytes
    const uint4* in = reinterpret_cast<const uint4*>(tile);
    const unsigned long long lo = convert8(in[piece_offset(r, 4 * g + 2 * half) / 16], rcp, zero);
    const unsigned long long hi = convert8(in[piece_offset(r, 4 * g + 2 * half + 1) / 16], rcp, zero);
    store_global(to + 16 * half, make_uint4((unsigned)lo, (unsigned)(lo >> 32), (unsigned)hi, (unsigned)(hi >> 32)));
  }
  return code;
}

// The rowwise scales in the layout: S[row, col] for col = c0/32 + 4i .. c0/32 + 4i + 3 (a 4-byte
// group) of the unit's rows 32k + r, k = 0..3, are the 16-byte line of the tile's part, from r0
// and c0 (a multiple of 8 blocks), plus the thread's, r*16 (mok/layout.py's formula split in two).
// The codes of threads (r, 4i..4i+3), neighbouring lanes of one warp, meet in all four by shuffles
// (every lane takes part; a block past the matrix's columns has code 0, the layout's padding);
// thread (r, 4i + k) keeps tile k's word in `word` and stores it after the unit's last tile, zero
// for a tile past the matrix's rows, so the four store the whole line at once.
__device__ __forceinline__ void rowwise_words(const QTile& T, const QShape& S, unsigned code, unsigned char* scales,
                                              unsigned& word) {
  const int r = threadIdx.x / QGROUPS, g = threadIdx.x % QGROUPS;
  unsigned gathered = code << 8 * (g & 3);
  gathered |= __shfl_xor_sync(0xFFFFFFFFu, gathered, 1);
  gathered |= __shfl_xor_sync(0xFFFFFFFFu, gathered, 2);
  if ((g & 3) == (T.rb & 3)) word = gathered;
  if (!T.last || (g & ~3) * 32 >= T.width) return;
  store_global(scales + T.e * S.row_layout +
                   ((T.r0 >> 7) * (long long)(S.row_cp >> 2) + (T.c0 >> 7) + (g >> 2)) * 512 + r * 16 + (g & 3) * 4,
               word);
  word = 0;  // the next unit's tiles past the matrix's rows store zeros
}

// Thread (r, g) converts the 1x32 block g of the tile's row r; a block past the matrix's columns
// has no payload and code 0.
__device__ __forceinline__ void rowwise_tile(const QTile& T, const QShape& S, const unsigned char* tile,
                                             unsigned char* data, unsigned char* scales, unsigned& word) {
  const int r = threadIdx.x / QGROUPS, g = threadIdx.x % QGROUPS;
  unsigned code = 0;
  if (g * 32 < T.width) code = rowwise_block(T, S, r, g, tile, data);
  if (!(S.flags & QF_LOGICAL)) {
    rowwise_words(T, S, code, scales, word);
  } else if (g * 32 < T.width) {
    const int blocks = S.cols / 32;
    store_global(scales + ((long long)T.e * S.rows + T.r0) * blocks + T.c0 / 32 + (r * blocks + g),
                 (unsigned char)code);
  }
}

// Columnwise, warp q takes rows 4q..4q+3 and lane c columns 8c..8c+7 (one 16-byte piece a row).
#define QWARPS (QTHREADS / 32)
static_assert(QWARPS * 4 == QTILE_ROWS && QCHUNKS == 32, "a warp a 4-row quarter, a lane a 16-byte piece");

// Step 1: each lane's maxima of its 4 rows, two columns a word, to partial[q][word][c].
__device__ __forceinline__ void columnwise_maxima(const QTile& T, const unsigned char* tile, unsigned* partial) {
  const int q = threadIdx.x / 32, c = threadIdx.x % 32;
  if (c * 8 >= T.width) return;
  uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(tile + piece_offset(4 * q + i, c));
    acc = make_uint4(amax2(acc.x, v.x), amax2(acc.y, v.y), amax2(acc.z, v.z), amax2(acc.w, v.w));
  }
  unsigned* to = partial + q * 128 + c;
  to[0] = acc.x, to[32] = acc.y, to[64] = acc.z, to[96] = acc.w;
}

// Step 2: thread (q, c) makes column j = 8c+q's scale from the 8 quarters' maxima; its reciprocal
// goes to rcps[j]. The scale is S'[c0 + j, rb] of the transposed layout. Logical scales are stored
// at once; in the layout the code joins the thread's `word` as byte rb % 4, and after the unit's
// last tile the word (S'[c0 + j, 4(rb/4) .. 4(rb/4) + 3], zero where a row block is past the
// matrix) is stored: the tile's part (c0 is a multiple of 256) plus the thread's, from j. Columns
// past the matrix's own up to the layout's padded count store zero words.
__device__ __forceinline__ void columnwise_scale(const QTile& T, const QShape& S, const unsigned* partial,
                                                 float* rcps, unsigned char* scales, unsigned& word) {
  const int q = threadIdx.x / 32, c = threadIdx.x % 32, j = 8 * c + q;
  if (c * 8 < T.width) {
    unsigned acc = 0;
#pragma unroll
    for (int quarter = 0; quarter < QWARPS; ++quarter) acc = amax2(acc, partial[quarter * 128 + (q >> 1) * 32 + c]);
    acc = magnitude(acc);
    const unsigned code = e8m0_code(__uint_as_float(q & 1 ? acc & 0xFFFF0000u : acc << 16));
    rcps[j] = e8m0_reciprocal(code, S.flags & QF_RCP_SHIFT);
    if (S.flags & QF_LOGICAL) {
      store_global(scales + ((long long)T.e * S.row_blocks + T.rb) * S.cols + T.c0 + j, (unsigned char)code);
      return;
    }
    word |= code << 8 * (T.rb & 3);
  }
  if (!T.last || (S.flags & QF_LOGICAL) || j >= ((T.width + 127) & ~127)) return;
  const int quads = S.col_cp >> 2;
  store_global(scales + T.e * S.col_layout + ((T.c0 >> 7) * (long long)quads + (T.rb >> 2)) * 512 +
                   ((j >> 7) * quads * 512 + (j & 31) * 16 + ((j & 127) >> 5) * 4),
               word);
  word = 0;  // the next unit's row blocks past the matrix store zeros
}

// Step 3: lane c converts its 4 rows x 8 columns with their reciprocals (8 payload bytes a row).
__device__ __forceinline__ void columnwise_convert(const QTile& T, const QShape& S, const unsigned char* tile,
                                                   const float* rcps, unsigned char* data) {
  const int q = threadIdx.x / 32, c = threadIdx.x % 32;
  if (c * 8 >= T.width) return;
  const float4 lo = reinterpret_cast<const float4*>(rcps)[2 * c], hi = reinterpret_cast<const float4*>(rcps)[2 * c + 1];
  const float zero = product_addend(S.flags);
  unsigned char* to = data + T.first + (4 * q * S.cols + c * 8);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(tile + piece_offset(4 * q + i, c));
    const unsigned a = convert2(v.x, lo.x, lo.y, zero) | convert2(v.y, lo.z, lo.w, zero) << 16;
    const unsigned b = convert2(v.z, hi.x, hi.y, zero) | convert2(v.w, hi.z, hi.w, zero) << 16;
    store_global(to + i * S.cols, make_uint2(a, b));
  }
}

// src: expert 0's x[0][0] (grouped: expert e at src + 2*e*expert_stride) or, with QF_POINTERS, a
// device array of `experts` addresses; rows are row_stride elements apart. Every address and
// row_stride*2 must be multiples of 16 (quantize.py checks them). tiles = E * R/32 * ceil(C/TILE),
// below 2^31, as is R/32 * ceil(C/TILE) * E (quantize.py checks it); the units are E * ceil(R/128)
// * ceil(C/TILE), no more. Any grid converts every tile.
extern "C" __global__ void __launch_bounds__(QTHREADS, QMIN_BLOCKS)
    mxfp8_quantize(const unsigned long long src, const long long expert_stride, const long long row_stride,
                   unsigned char* row_data, unsigned char* row_scales, unsigned char* col_data,
                   unsigned char* col_scales, const int rows, const int cols, const int flags, const int tiles) {
  __shared__ __align__(16) unsigned char tiles_in[2][QTILE_ROWS * QTILE_COLS * 2];  // BF16, double buffered
  __shared__ unsigned partial[QWARPS * 128];                                      // columnwise quarter maxima
  __shared__ __align__(16) float rcps[QTILE_COLS];                                // columnwise reciprocals
  const QShape S = shape_of(rows, cols, flags);
  const unsigned units = (unsigned)tiles / (S.row_blocks * S.col_tiles) * S.units;
  unsigned u = blockIdx.x;  // units < 2^31, so u + gridDim.x < 2^32
  if (u >= units) return;
  QTile T = tile_of(u, S);
  load_tile(T, src, expert_stride, row_stride, flags, tiles_in[0]);
  unsigned row_word = 0, col_word = 0;  // scale codes of the unit so far (rowwise_words, columnwise_scale)
  for (int b = 0;; b ^= 1) {
    async_wait();
    __syncthreads();  // tile T has landed, and the previous tile's readers are done with the other buffer
    const bool more = !T.last || u + gridDim.x < units;
    QTile N = T;
    if (!T.last) {
      N = next_in_unit(T, S);
    } else if (more) {
      u += gridDim.x;
      N = tile_of(u, S);
    }
    if (more) load_tile(N, src, expert_stride, row_stride, flags, tiles_in[b ^ 1]);
    const unsigned char* tile = tiles_in[b];
    if (flags & QF_ROWWISE) rowwise_tile(T, S, tile, row_data, row_scales, row_word);
    if (flags & QF_COLWISE) {
      columnwise_maxima(T, tile, partial);
      __syncthreads();
      columnwise_scale(T, S, partial, rcps, col_scales, col_word);
      __syncthreads();
      columnwise_convert(T, S, tile, rcps, col_data);
    }
    if (!more) break;
    T = N;
  }
}
