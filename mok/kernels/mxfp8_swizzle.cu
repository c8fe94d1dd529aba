// MXFP8 scale layout conversion for tcgen05 / cuBLAS ("128x4"), every job of a call in one launch.
//
// A job converts logical scale matrices S[R, C] (uint8, read at src + r*rs + c*cs) into the layout
// (dst, Rp*Cp bytes, Rp = roundup(R,128), Cp = roundup(C,4)):
//     S[r, c] -> ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4,   padding bytes 0,
// or copies n already-swizzled bytes (MODE_COPY). Jobs live in a device table; the grid walks the
// work units of all jobs (a unit = 128 rows x TILES_PER_UNIT 4-column tiles, or PARTS slabs of
// PART_TILES tiles converted side by side, or in 256-thread builds a whole slab of a rowwise job
// whose rows are 4-byte aligned and short enough; a columnwise job whose last chunk would be one
// tile gives it to the chunk before).
//
// A unit is staged in shared memory: loaded with 16-byte (or 4-, 1-byte) reads, zero-filled outside
// [R, C], then written as whole 512-byte tiles with one 16-byte store per thread (a slab unit is
// staged as it lies in memory, by 16-byte async copies: convert_slab). Transposed inputs
// (the columnwise buffer [M/32, K] read as its transpose) are read along their contiguous axis and
// transposed 4x4 bytes in registers.
//
// A second kernel, mxfp8_unswizzle_jobs, runs the exact inverse (FLAG_INVERSE jobs, at the end of
// this file): layout tiles back into logical matrices, the padding dropped.
//
// Compiled at first use by NVRTC (mok/kernels/launch.py); compile-checked on CPU CI.

#define ROWS 128                 // rows of one output slab
#ifndef TILES_PER_UNIT
#define TILES_PER_UNIT 16        // 4-column tiles per unit (config.py passes its value)
#endif
#ifndef THREADS
#define THREADS 128
#endif
#define PIECES (ROWS * TILES_PER_UNIT / 4 / THREADS)  // 16-byte pieces per thread
// Parts: a block of more than 128 threads can also convert PARTS units of one slab each at once,
// 128 threads and PART_TILES tiles a part, each part as a 128-thread block would (its own shared
// tile, its own barrier), where jobs.py says (FLAG_PARTS): columnwise jobs, and rowwise ones whose
// rows fit one part (at most PART_TILES tiles, like TE's 64-column matrices, which would leave half
// of a wide unit idle). So the 32 x 256 shape that suits rowwise jobs converts any job beside them
// in the same launch (docs/kernel-notes.md has why each launch takes the shape it does).
#define PART_THREADS (THREADS < 128 ? THREADS : 128)
#define PARTS (THREADS / PART_THREADS)
#define PART_TILES (TILES_PER_UNIT / PARTS)
static_assert(PARTS * PART_THREADS == THREADS && PARTS * PART_TILES == TILES_PER_UNIT,
              "a part is 128 threads (or the whole block) and a 128-row slab of PART_TILES tiles");
// This thread's part, and its index in the part (constants where the block is one part).
#define PART (PARTS > 1 ? (int)threadIdx.x / PART_THREADS : 0)
#define PART_THREAD (PARTS > 1 ? (int)threadIdx.x % PART_THREADS : (int)threadIdx.x)
// The shared row pitch of a unit W tiles wide: an odd number of words keeps tile reads
// conflict-free; columnwise units have room for one extra tile (see decode).
#define PITCH_OF(COLS, W) ((W) * 4 + ((COLS) ? 12 : 4))
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
#ifndef SLAB_BYTES
#define SLAB_BYTES 0  // shared bytes of a slab unit (FLAG_SLAB); 0: none in this build (config.py)
#endif
#define TILE_BYTES \
  MAX2(SLAB_BYTES, MAX2(ROWS * PITCH_OF(false, TILES_PER_UNIT), PARTS * ROWS * PITCH_OF(true, PART_TILES)))
// Resident blocks per SM the register allocation is made for: 10 x 128 threads (48 registers a
// thread) rather than 8 (64): more loads in flight per SM, which hides each block's start (its
// addresses, and for per-expert jobs the pointer-table load; docs/kernel-notes.md).
#define MIN_BLOCKS (1280 / THREADS)
static_assert(PIECES % 4 == 0 && PIECES >= 4, "columnwise reads take 4 columns per thread");
// The ABI shared with mok/kernels/jobs.py (COPY_CHUNK, MODE_*, FLAG_*) comes from
// mok/kernels/abi.py as macros on every compile: a compile without them stops here.
#if !defined(COPY_CHUNK) || !defined(MODE_ROWS) || !defined(MODE_COLS) || !defined(MODE_GATHER) || \
    !defined(MODE_COPY) || !defined(FLAG_INDIRECT) || !defined(FLAG_JOIN_LAST) || !defined(FLAG_PARTS) || \
    !defined(FLAG_SLAB) || !defined(FLAG_INVERSE)
#error "compile through mok.kernels: the ABI macros come from mok/kernels/abi.py (KernelConfig.macros())"
#endif

// One job: `experts` matrices [rows, cols], expert e read at src + e*es, written at dst + e*Rp*Cp.
struct Job {
  long long src, dst, rs, cs, es, rows, cols, experts, flags, unit_begin;
};

__device__ __forceinline__ unsigned char ld_byte(const unsigned char* p) { return __ldg(p); }

__device__ __forceinline__ uint4 pack16(const unsigned char* b) {
  return make_uint4(b[0] | b[1] << 8 | b[2] << 16 | (unsigned)b[3] << 24,
                    b[4] | b[5] << 8 | b[6] << 16 | (unsigned)b[7] << 24,
                    b[8] | b[9] << 8 | b[10] << 16 | (unsigned)b[11] << 24,
                    b[12] | b[13] << 8 | b[14] << 16 | (unsigned)b[15] << 24);
}

// One unit of work: 128 rows x up to 128 scale columns of one expert of one job.
struct Unit {
  const unsigned char* src;  // this expert's S[0, 0]
  unsigned char* dst;        // the unit's first output tile
  long long rs, cs;  // strides; for MODE_COPY the unit's byte range [rs, cs)
  int mode, vec, r0, c0, rv, cv, ntiles;
  bool by_parts;  // converted by parts (this thread's part's unit)
  bool slab;      // a whole slab, staged as the contiguous bytes it is (convert_slab)
};

__device__ __forceinline__ Unit decode(const Job* __restrict__ jobs, int njobs, long long u) {
  int lo = 0, hi = njobs - 1;  // the last job whose first unit is <= u
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (jobs[mid].unit_begin <= u) lo = mid; else hi = mid - 1;
  }
  const Job& job = jobs[lo];
  const long long local = u - job.unit_begin;
  Unit U;
  U.mode = (int)(job.flags & 0xff);
  U.vec = (int)((job.flags >> 8) & 0xff);
  U.rs = job.rs;
  U.cs = job.cs;
  U.by_parts = PARTS > 1 && (job.flags & FLAG_PARTS);
  U.slab = SLAB_BYTES > 0 && (job.flags & FLAG_SLAB);
  if (U.mode == MODE_COPY) {
    long long chunk = local;
    U.src = reinterpret_cast<const unsigned char*>(job.src);
    U.dst = reinterpret_cast<unsigned char*>(job.dst);
    if (job.flags & FLAG_INDIRECT) {  // per-expert copies of one size: a pointer table, as below
      const long long per_expert = (job.rows + COPY_CHUNK - 1) / COPY_CHUNK;
      const long long e = local / per_expert;
      chunk = local - e * per_expert;
      U.src = reinterpret_cast<const unsigned char*>(reinterpret_cast<const long long*>(job.src)[e]);
      U.dst = reinterpret_cast<unsigned char*>(reinterpret_cast<const long long*>(job.dst)[e]);
    }
    U.rs = chunk * COPY_CHUNK;
    U.cs = min(U.rs + (long long)COPY_CHUNK, job.rows);
    U.r0 = U.c0 = U.rv = U.cv = U.ntiles = 0;
    return U;
  }
  const int R = (int)job.rows, C = (int)job.cols;
  const int tiles = (C + 3) / 4;            // Cp / 4
  const int slabs = (R + ROWS - 1) / ROWS;  // Rp / 128
  const int width = U.slab ? tiles : U.by_parts ? PART_TILES : TILES_PER_UNIT;  // tiles per unit (of a part)
  // A columnwise job whose last chunk would be one tile (TE's 65 columns, M = 2080) gives that
  // tile to the chunk before it: one unit of width + 1 tiles, not a whole block started for 512
  // bytes.
  const bool extra = (job.flags & FLAG_JOIN_LAST) != 0;
  const int chunks = (tiles + width - 1) / width - extra;
  const long long per_expert = (long long)slabs * chunks;
  const long long sub = U.by_parts ? local * PARTS + PART : local;  // this part's
  if (sub >= per_expert * job.experts) {  // a part past the job's last unit: nothing to do
    U.src = nullptr;
    U.dst = nullptr;
    U.r0 = U.c0 = U.rv = U.cv = U.ntiles = 0;
    return U;
  }
  const long long e = sub / per_expert;
  const int rem = (int)(sub - e * per_expert);
  const int rb = rem / chunks;
  const int t0 = (rem % chunks) * width;
  U.ntiles = min(width, tiles - t0);
  U.r0 = rb * ROWS;
  U.c0 = t0 * 4;
  U.rv = min(ROWS, R - U.r0);
  U.cv = min(width * 4, C - U.c0);
  if (extra && t0 + width + 1 == tiles) {
    U.ntiles = width + 1;
    U.cv = C - U.c0;
  }
  if (job.flags & FLAG_INDIRECT) {  // separate per-expert tensors of one shape: a pointer table
    U.src = reinterpret_cast<const unsigned char*>(reinterpret_cast<const long long*>(job.src)[e]);
    U.dst = reinterpret_cast<unsigned char*>(reinterpret_cast<const long long*>(job.dst)[e]);
  } else {                           // a batch: expert e at a fixed stride
    U.src = reinterpret_cast<const unsigned char*>(job.src + e * job.es);
    U.dst = reinterpret_cast<unsigned char*>(job.dst) + e * slabs * tiles * 512LL;  // Rp*Cp
  }
  U.dst += ((long long)rb * tiles + t0) * 512;
  return U;
}

// The first n (1..15) bytes at a 4-byte aligned address, zero above (a padded row's last piece):
// whole words with 4-byte loads, the last 1-3 bytes with one 1- or 2-byte load, zero-extended, so
// nothing waits on assembling bytes (16 predicated byte loads were slower; docs/kernel-notes.md).
__device__ __forceinline__ uint4 partial_words(const unsigned char* in, const int n) {
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int b = n - 4 * i;  // bytes of word i inside the matrix
    const unsigned char* q = in + 4 * i;
    const unsigned short* h = reinterpret_cast<const unsigned short*>(q);
    w[i] = b >= 4   ? __ldg(reinterpret_cast<const unsigned*>(q))
           : b == 3 ? (unsigned)__ldg(h) | (unsigned)ld_byte(q + 2) << 16
           : b == 2 ? (unsigned)__ldg(h)
           : b == 1 ? (unsigned)ld_byte(q)
                    : 0u;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- fetch: each thread reads its PIECES x 16 bytes of the unit into registers, zero outside
// [R, C]; every load is issued before any is used. N threads convert the unit (the block, or a
// part), W tiles wide; t is the thread's index among them. Rows and gather: piece p is item
// t+N*p, row item/(W/4), columns 16*(item%(W/4))..+15. Columns: piece 4g+x is column
// 4*(t/8 + g*N/8)+x, rows 16*(t%8)..+15 (contiguous in memory).
template <int N>
__device__ __forceinline__ int thread_in_unit() {
  return N == THREADS ? (int)threadIdx.x : PART_THREAD;
}

// Piece p of thread t among the N threads of a unit W tiles wide (rows and gather): item t+N*p is
// row item/(W/4), columns 16*(item%(W/4))..+15 of the unit.
struct Piece {
  int row, col;
};
template <int N, int W>
__device__ __forceinline__ Piece piece(const int t, const int p) {
  const int item = t + p * N;
  return {item / (W / 4), (item % (W / 4)) * 16};
}

template <bool COLS, int N, int W>
__device__ __forceinline__ void fetch(const Unit& U, uint4 (&v)[PIECES]) {
  static_assert(ROWS * W / 4 == PIECES * N, "every thread of a unit reads PIECES 16-byte pieces");
  const int t = thread_in_unit<N>();
  if (COLS) {
    const int row = (t & 7) * 16;
#pragma unroll
    for (int p = 0; p < PIECES; ++p) {
      const int col = ((t >> 3) + (N / 8) * (p >> 2)) * 4 + (p & 3);
      const unsigned char* in = U.src + (long long)(U.c0 + col) * U.cs + U.r0 + row;
      if (col >= U.cv) {  // past the matrix (a unit's last, partial tile): zeros, no loads
        v[p] = make_uint4(0, 0, 0, 0);
      } else if (U.vec == 16 && row + 16 <= U.rv) {
        v[p] = __ldg(reinterpret_cast<const uint4*>(in));
      } else {
        unsigned char b[16];
#pragma unroll
        for (int y = 0; y < 16; ++y) b[y] = (col < U.cv && row + y < U.rv) ? ld_byte(in + y) : 0;
        v[p] = pack16(b);
      }
    }
    return;
  }
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const auto [row, col] = piece<N, W>(t, p);
    const bool full = row < U.rv && col + 16 <= U.cv;
    if (U.mode == MODE_ROWS && full && U.vec == 16) {
      v[p] = __ldg(reinterpret_cast<const uint4*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col));
    } else if (U.mode == MODE_ROWS && full && U.vec == 4) {
      const unsigned* in = reinterpret_cast<const unsigned*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col);
      v[p] = make_uint4(__ldg(in), __ldg(in + 1), __ldg(in + 2), __ldg(in + 3));
    } else if (row >= U.rv || col >= U.cv) {  // padding rows, a short unit's tail: zeros, no loads
      v[p] = make_uint4(0, 0, 0, 0);
    } else if (U.mode == MODE_ROWS && U.vec >= 4) {  // the partial last piece of an aligned row
      v[p] = partial_words(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col, U.cv - col);
    } else {
      unsigned char b[16];
#pragma unroll
      for (int y = 0; y < 16; ++y) {
        const bool ok = row < U.rv && col + y < U.cv;
        b[y] = ok ? ld_byte(U.src + (long long)(U.r0 + row) * U.rs + (long long)(U.c0 + col + y) * U.cs) : 0;
      }
      v[p] = pack16(b);
    }
  }
}

// Word x (0-3, a constant once unrolled) of a 16-byte value.
__device__ __forceinline__ unsigned word(const uint4 v, const int x) {
  return x == 0 ? v.x : x == 1 ? v.y : x == 2 ? v.z : v.w;
}

// 4x4 byte transpose: w_x holds bytes (column x, rows y..y+3); out[y] = row y across columns 0..3.
__device__ __forceinline__ void transpose4(const unsigned w0, const unsigned w1, const unsigned w2,
                                           const unsigned w3, unsigned* out) {
  const unsigned t0 = __byte_perm(w0, w1, 0x5140);
  const unsigned t1 = __byte_perm(w2, w3, 0x5140);
  const unsigned t2 = __byte_perm(w0, w1, 0x7362);
  const unsigned t3 = __byte_perm(w2, w3, 0x7362);
  out[0] = __byte_perm(t0, t1, 0x5410);
  out[1] = __byte_perm(t0, t1, 0x7632);
  out[2] = __byte_perm(t2, t3, 0x5410);
  out[3] = __byte_perm(t2, t3, 0x7632);
}

// ---- deposit: the registers into the unit's shared tile, row-major [128][PITCH_OF(COLS, W)].
template <bool COLS, int N, int W>
__device__ __forceinline__ void deposit(const Unit& U, const uint4 (&v)[PIECES], unsigned char* tile) {
  constexpr int P = PITCH_OF(COLS, W);
  const int t = thread_in_unit<N>();
  if (COLS) {
    const int row = (t & 7) * 16;
#pragma unroll
    for (int g = 0; g < PIECES / 4; ++g) {
      const int cg = (t >> 3) + (N / 8) * g;
      if (cg >= U.ntiles) continue;  // a 4-column group write_tiles never reads (a short unit)
      const uint4* w = v + 4 * g;
      unsigned rows[16];
      transpose4(w[0].x, w[1].x, w[2].x, w[3].x, rows + 0);
      transpose4(w[0].y, w[1].y, w[2].y, w[3].y, rows + 4);
      transpose4(w[0].z, w[1].z, w[2].z, w[3].z, rows + 8);
      transpose4(w[0].w, w[1].w, w[2].w, w[3].w, rows + 12);
#pragma unroll
      for (int y = 0; y < 16; ++y) *reinterpret_cast<unsigned*>(tile + (row + y) * P + cg * 4) = rows[y];
    }
    return;
  }
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const auto [row, col] = piece<N, W>(t, p);
    if (col >= U.ntiles * 4) continue;  // columns write_tiles never reads (a short unit)
    unsigned* o = reinterpret_cast<unsigned*>(tile + row * P + col);
    o[0] = v[p].x;
    o[1] = v[p].y;
    o[2] = v[p].z;
    o[3] = v[p].w;
  }
}

// ---- write: whole 512-byte tiles, one 16-byte store per thread (a warp writes 512 contiguous bytes).
template <int P, int N>  // the shared row pitch and the threads of the unit
__device__ __forceinline__ void write_tiles(const Unit& U, const unsigned char* tile) {
  const int lane = threadIdx.x & 31, warp = thread_in_unit<N>() >> 5;
  for (int t = warp; t < U.ntiles; t += N / 32) {
    uint4 o;
    o.x = *reinterpret_cast<const unsigned*>(tile + (lane) * P + t * 4);
    o.y = *reinterpret_cast<const unsigned*>(tile + (32 + lane) * P + t * 4);
    o.z = *reinterpret_cast<const unsigned*>(tile + (64 + lane) * P + t * 4);
    o.w = *reinterpret_cast<const unsigned*>(tile + (96 + lane) * P + t * 4);
    *reinterpret_cast<uint4*>(U.dst + t * 512 + lane * 16) = o;
  }
}

// The barrier of the N threads converting a unit: the block's, or this part's own (named barrier
// 1 + part), so a part waits for its own loads only.
template <int N>
__device__ __forceinline__ void unit_sync() {
  if (N == THREADS) {
    __syncthreads();
  } else {
#ifdef MOK_EMULATE
    emu_named_sync(1 + PART, N);
#else
    // immediate ids: a register id makes ptxas reserve all 16 of the block's barriers
    static_assert(PARTS <= 2, "named barriers 1 and 2");
    if (PART == 0) {
      asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory");
    } else {
      asm volatile("bar.sync 2, %0;" ::"n"(N) : "memory");
    }
#endif
  }
}

__device__ __forceinline__ void copy_unit(const Unit& U) {
  const long long begin = U.rs, end = U.cs;
  if (U.vec == 16) {
    for (long long i = begin + threadIdx.x * 16; i + 16 <= end; i += THREADS * 16)
      *reinterpret_cast<uint4*>(U.dst + i) = __ldg(reinterpret_cast<const uint4*>(U.src + i));
    const long long tail = begin + ((end - begin) / 16) * 16;
    for (long long i = tail + threadIdx.x; i < end; i += THREADS) U.dst[i] = ld_byte(U.src + i);
  } else {
    for (long long i = begin + threadIdx.x; i < end; i += THREADS) U.dst[i] = ld_byte(U.src + i);
  }
}

// One unit through registers and the shared tile, compiled once per kind of unit (columnwise, or
// rowwise and gather; whole-block or by parts) and never inlined: each gets its own register
// allocation and load schedule, so a change to one path cannot slow the other
// (docs/kernel-notes.md). Every thread of the block calls the same one (parts may have
// different units, or none).
template <bool COLS, int N, int W>
__device__ __noinline__ void convert_unit(const Unit U, unsigned char* tile) {
  constexpr int P = PITCH_OF(COLS, W);
  if (N != THREADS) tile += PART * (ROWS * P);  // this part's tile
  uint4 v[PIECES];
  fetch<COLS, N, W>(U, v);
  // The block's previous unit's tile reads are done (whatever its parts were). Kept where the
  // block had no unit before: every rowwise case is slower without it (likely because it also
  // keeps the compiler from interleaving the loads with the shared stores; docs/kernel-notes.md).
  __syncthreads();
  deposit<COLS, N, W>(U, v, tile);
  if (COLS && U.ntiles > W) {  // the extra tile, by the same registers
    Unit X = U;
    X.c0 += W * 4;
    X.cv -= W * 4;
    X.ntiles -= W;
    fetch<COLS, N, W>(X, v);
    deposit<COLS, N, W>(X, v, tile + W * 4);
  }
  unit_sync<N>();
  write_tiles<P, N>(U, tile);
}

#if SLAB_BYTES > 0
#include "async_copy.cuh"

// The bytes of the output word at column c (c < cv) that lie inside the matrix; those past cv are 0.
__device__ __forceinline__ unsigned keep_below(const int cv, const int c) {
  return c + 4 <= cv ? ~0u : (1u << 8 * (cv - c)) - 1;
}

// A slab unit (FLAG_SLAB): all 128 rows and every tile of a rowwise job whose rows are 4-byte
// aligned (TE's padded rows: 225 bytes at a 228-byte stride) or 16-byte aligned. The slab is ONE
// contiguous byte range whatever C is, so it is staged as it lies, with aligned 16-byte copies (the
// short head and tail byte by byte), at the same address modulo 16, then read back masked to
// [rv, cv): a 4-byte shared read an output word, or for 16-byte aligned rows a 16-byte read a row
// that serves four tiles. Staged without registers, a slab keeps DRAM busy where four 4-byte
// register loads a piece had the L1 re-read every line, and a per-expert launch needs half the
// blocks, each waiting for its expert's addresses (docs/kernel-notes.md). jobs.py sees that
// the slab fits (Job._slab).
__device__ __noinline__ void convert_slab(const Unit U, unsigned char* tile) {
  const unsigned char* base = U.src + (long long)U.r0 * U.rs;  // S[r0, 0]
  const int d = (int)(reinterpret_cast<unsigned long long>(base) & 15);
  const int end = d + (U.rv - 1) * (int)U.rs + U.cv;  // staged bytes are tile[d, end)
  const int whole_begin = (d + 15) & ~15, whole_end = end & ~15;
  const unsigned char* from = base - d;  // tile[i] mirrors from[i]
  __syncthreads();                       // the block's previous unit's tile reads are done
  for (int i = whole_begin + 16 * (int)threadIdx.x; i < whole_end; i += 16 * THREADS)
    async_copy16(tile + i, from + i);
  if (threadIdx.x < 32) {  // the head [d, whole_begin) and the tail [whole_end, end): < 16 bytes each
    const bool head = threadIdx.x < 16;
    const int i = (head ? d : max(whole_end, whole_begin)) + ((int)threadIdx.x & 15);
    if (i < (head ? min(whole_begin, end) : end)) tile[i] = ld_byte(from + i);
  }
  async_wait();
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const unsigned char* s = tile + d;
  if (U.vec == 16) {  // 16-byte aligned rows: one 16-byte shared read a row serves four tiles
    for (int item = threadIdx.x; item < ((U.ntiles + 3) / 4) * 32; item += THREADS) {
      const int j = item >> 5;
      uint4 v[4];
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int r = lane + 32 * g;
        v[g] = r < U.rv ? *reinterpret_cast<const uint4*>(s + r * (int)U.rs + 16 * j) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int c = 16 * j + 4 * x;
        if (c >= U.ntiles * 4) break;
        const unsigned keep = keep_below(U.cv, c);
        *reinterpret_cast<uint4*>(U.dst + (4 * j + x) * 512 + lane * 16) =
            make_uint4(word(v[0], x) & keep, word(v[1], x) & keep, word(v[2], x) & keep, word(v[3], x) & keep);
      }
    }
    return;
  }
  for (int t = threadIdx.x >> 5; t < U.ntiles; t += THREADS / 32) {  // 4-byte aligned rows
    const int c = 4 * t;
    const unsigned keep = keep_below(U.cv, c);
    unsigned w[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int r = lane + 32 * g;
      w[g] = r < U.rv ? *reinterpret_cast<const unsigned*>(s + r * (int)U.rs + c) & keep : 0u;
    }
    *reinterpret_cast<uint4*>(U.dst + t * 512 + lane * 16) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
#endif

__device__ __forceinline__ void convert(const Unit& U, unsigned char* tile) {
  if (U.mode == MODE_COLS) {
    convert_unit<true, PART_THREADS, PART_TILES>(U, tile);
#if SLAB_BYTES > 0
  } else if (U.slab) {
    convert_slab(U, tile);
#endif
  } else if (PARTS > 1 && U.by_parts) {  // PARTS > 1: no second rowwise body for one-part blocks
    convert_unit<false, PART_THREADS, PART_TILES>(U, tile);
  } else {
    convert_unit<false, THREADS, TILES_PER_UNIT>(U, tile);
  }
}

// One block per unit (the loop runs again only past the largest grid): many small independent
// blocks per SM keep enough reads in flight.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
mxfp8_swizzle_jobs(const Job* __restrict__ jobs, int njobs, long long total_units) {
  __shared__ __align__(16) unsigned char tile[TILE_BYTES];
  for (long long u = blockIdx.x; u < total_units; u += gridDim.x) {
    const Unit U = decode(jobs, njobs, u);
    if (U.mode == MODE_COPY) {
      copy_unit(U);
      continue;
    }
    convert(U, tile);
  }
}

// ---- The inverse: layout tiles back into logical S[R, C] (FLAG_INVERSE jobs; a launch runs
// either kernel, never both). An inverse job's row reads as a forward one's, so decode serves it
// unchanged: src, rs, cs, es and rows x cols describe the logical matrices (written here), dst the
// layout (read here), mode and vec the logical side (rows or columns contiguous, or neither, and
// the widest store its address and strides allow). Its units are always 128 rows x TILES_PER_UNIT
// tiles of the whole block (jobs.py sets none of FLAG_PARTS, FLAG_SLAB, FLAG_JOIN_LAST).

#ifndef MOK_EMULATE  // emulator.h has its own, which checks each write against the launch's outputs
template <class T>
__device__ __forceinline__ void store_global(unsigned char* p, const T v) {
  *reinterpret_cast<T*>(p) = v;
}
#endif

// The first n (1..16) bytes of v at p: one 16-byte store where vec allows and n is 16, whole words
// where vec >= 4 (consecutive bytes), the rest byte by byte at p, p + step, p + 2*step, ...
__device__ __forceinline__ void store_piece(unsigned char* p, const uint4 v, const int n, const int vec,
                                            const long long step) {
  if (vec == 16 && n == 16) {
    store_global(p, v);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned w = word(v, i);
    const int b = n - 4 * i;  // bytes of word i inside the matrix
    if (vec >= 4 && b >= 4) {
      store_global(p + 4 * i, w);
      continue;
    }
#pragma unroll
    for (int y = 0; y < 4; ++y)
      if (y < b) store_global(p + (4 * i + y) * step, (unsigned char)(w >> 8 * y));
  }
}

// ---- One inverse unit: its whole tiles read with one 16-byte load a lane (piece i is line i%32
// of tile i/32: rows i%32 + 0, 32, 64, 96 of that tile's 4 columns), every load issued before any
// is used; staged as rows in the shared tile [128][PITCH_OF(false, W)] (an odd number of words:
// the deposit is conflict-free); then written inside [rv, cv) only: rows-contiguous (and gather)
// outputs a 16-byte piece of a row a thread, as fetch reads them; columns-contiguous outputs 16 rows
// of 4 columns a thread, read as row words and transposed 4x4 bytes in registers (transpose4 is
// its own inverse), one 16-byte store a column.
template <int W>
__device__ __forceinline__ void restore_unit(const Unit& U, unsigned char* tile) {
  constexpr int P = PITCH_OF(false, W);
  const int t = threadIdx.x;
  uint4 v[PIECES];
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const int i = t + p * THREADS;
    v[p] = i / 32 < U.ntiles ? __ldg(reinterpret_cast<const uint4*>(U.dst + 16LL * i)) : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();  // the block's previous unit's tile reads are done
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const int i = t + p * THREADS, line = i % 32, c = (i / 32) * 4;
    if (i / 32 >= U.ntiles) continue;
#pragma unroll
    for (int g = 0; g < 4; ++g) *reinterpret_cast<unsigned*>(tile + (line + 32 * g) * P + c) = word(v[p], g);
  }
  __syncthreads();
  unsigned char* out = const_cast<unsigned char*>(U.src);  // the logical matrix: written by the inverse
  if (U.mode == MODE_COLS) {
    const int row = (t & 7) * 16;
    if (row >= U.rv) return;
#pragma unroll
    for (int g = 0; g < PIECES / 4; ++g) {
      const int cg = (t >> 3) + (THREADS / 8) * g;  // this thread's 4-column group
      if (cg * 4 >= U.cv) break;
      unsigned rows[16], cols[16];  // rows[y]: row + y across the group; cols[4q + x]: column x, rows 4q..4q+3
#pragma unroll
      for (int y = 0; y < 16; ++y) rows[y] = *reinterpret_cast<const unsigned*>(tile + (row + y) * P + cg * 4);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        transpose4(rows[4 * q], rows[4 * q + 1], rows[4 * q + 2], rows[4 * q + 3], cols + 4 * q);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int c = cg * 4 + x;
        if (c >= U.cv) break;
        const uint4 column = make_uint4(cols[x], cols[4 + x], cols[8 + x], cols[12 + x]);  // rows row..row+15
        store_piece(out + (long long)(U.c0 + c) * U.cs + U.r0 + row, column, min(16, U.rv - row), U.vec, 1);
      }
    }
    return;
  }
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const auto [row, col] = piece<THREADS, W>(t, p);
    if (row >= U.rv || col >= U.cv) continue;
    const unsigned* s = reinterpret_cast<const unsigned*>(tile + row * P + col);
    unsigned char* o = out + (long long)(U.r0 + row) * U.rs + (long long)(U.c0 + col) * U.cs;
    store_piece(o, make_uint4(s[0], s[1], s[2], s[3]), min(16, U.cv - col), U.vec, U.cs);
  }
}

// One block per unit, as mxfp8_swizzle_jobs.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
mxfp8_unswizzle_jobs(const Job* __restrict__ jobs, int njobs, long long total_units) {
  __shared__ __align__(16) unsigned char rows_tile[ROWS * PITCH_OF(false, TILES_PER_UNIT)];
  for (long long u = blockIdx.x; u < total_units; u += gridDim.x)
    restore_unit<TILES_PER_UNIT>(decode(jobs, njobs, u), rows_tile);
}
