// MXFP8 scale layout conversion for tcgen05 / cuBLAS ("128x4"), every job of a call in one launch.
//
// A job converts logical scale matrices S[R, C] (uint8, read at src + r*rs + c*cs) into the layout
// (dst, Rp*Cp bytes, Rp = roundup(R,128), Cp = roundup(C,4)):
//     S[r, c] -> ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4,   padding bytes 0,
// or copies n already-swizzled bytes (MODE_COPY). Jobs live in a device table; the grid walks the
// work units of all jobs (a unit = 128 rows x up to 128 scale columns = up to 32 output tiles).
//
// A unit is staged in shared memory: loaded with 16-byte (or 4-, 1-byte) reads, zero-filled outside
// [R, C], then written as whole 512-byte tiles with one 16-byte store per thread. Transposed inputs
// (the columnwise buffer [M/32, K] read as its transpose) are read along their contiguous axis and
// transposed 4x4 bytes in registers.
//
// Compiled at first use by NVRTC (mok/kernels/launcher.py); compile-checked on CPU CI.

#define ROWS 128                 // rows of one output slab
#ifndef TILES_PER_UNIT
#define TILES_PER_UNIT 16        // 4-column tiles per unit (launcher.py passes its value)
#endif
#ifndef THREADS
#define THREADS 128
#endif
#define UNIT_COLS (TILES_PER_UNIT * 4)
#define PITCH (UNIT_COLS + 4)    // shared row pitch: an odd number of words keeps tile reads conflict-free
#define PER_ROW (UNIT_COLS / 16) // 16-byte pieces per unit row
#define PIECES (ROWS * PER_ROW / THREADS)  // 16-byte pieces per thread
#define MIN_BLOCKS (1024 / THREADS)        // 64 registers a thread
static_assert(PIECES % 4 == 0 && PIECES >= 4, "columnwise reads take 4 columns per thread");
#define COPY_CHUNK 16384

#define MODE_ROWS 0       // cs == 1: rows contiguous
#define MODE_COLS 1       // rs == 1: columns contiguous (a transposed view)
#define MODE_GATHER 2     // any strides, byte by byte
#define MODE_COPY 3       // already in the layout: copy R bytes (C unused)
#define FLAG_INDIRECT (1 << 16)  // src and dst are device arrays of per-expert addresses

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
  if (U.mode == MODE_COPY) {
    U.src = reinterpret_cast<const unsigned char*>(job.src);
    U.dst = reinterpret_cast<unsigned char*>(job.dst);
    U.rs = local * COPY_CHUNK;
    U.cs = min(U.rs + (long long)COPY_CHUNK, job.rows);
    U.r0 = U.c0 = U.rv = U.cv = U.ntiles = 0;
    return U;
  }
  const int R = (int)job.rows, C = (int)job.cols;
  const int tiles = (C + 3) / 4;            // Cp / 4
  const int slabs = (R + ROWS - 1) / ROWS;  // Rp / 128
  const int chunks = (tiles + TILES_PER_UNIT - 1) / TILES_PER_UNIT;
  const long long per_expert = (long long)slabs * chunks;
  const long long e = local / per_expert;
  const int rem = (int)(local - e * per_expert);
  const int rb = rem / chunks;
  const int t0 = (rem % chunks) * TILES_PER_UNIT;
  U.ntiles = min(TILES_PER_UNIT, tiles - t0);
  U.r0 = rb * ROWS;
  U.c0 = t0 * 4;
  U.rv = min(ROWS, R - U.r0);
  U.cv = min(UNIT_COLS, C - U.c0);
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

// ---- fetch: each thread reads its PIECES x 16 bytes of the unit into registers, zero outside
// [R, C]; every load is issued before any is used. Rows and gather: piece p is item t+THREADS*p,
// row item/PER_ROW, columns 16*(item%PER_ROW)..+15. Columns: piece 4g+x is column
// 4*(t/8 + g*THREADS/8)+x, rows 16*(t%8)..+15 (contiguous in memory).
__device__ __forceinline__ void fetch(const Unit& U, uint4 (&v)[PIECES]) {
  const int t = threadIdx.x;
  if (U.mode == MODE_COLS) {
    const int row = (t & 7) * 16;
#pragma unroll
    for (int p = 0; p < PIECES; ++p) {
      const int col = ((t >> 3) + (THREADS / 8) * (p >> 2)) * 4 + (p & 3);
      const unsigned char* in = U.src + (long long)(U.c0 + col) * U.cs + U.r0 + row;
      if (col < U.cv && U.vec == 16 && row + 16 <= U.rv) {
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
    const int item = t + p * THREADS;
    const int row = item / PER_ROW, col = (item % PER_ROW) * 16;
    const bool full = row < U.rv && col + 16 <= U.cv;
    if (U.mode == MODE_ROWS && full && U.vec == 16) {
      v[p] = __ldg(reinterpret_cast<const uint4*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col));
    } else if (U.mode == MODE_ROWS && full && U.vec == 4) {
      const unsigned* in = reinterpret_cast<const unsigned*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col);
      v[p] = make_uint4(__ldg(in), __ldg(in + 1), __ldg(in + 2), __ldg(in + 3));
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

// ---- deposit: the registers into the shared tile, row-major [128][PITCH].
__device__ __forceinline__ void deposit(const Unit& U, const uint4 (&v)[PIECES], unsigned char* tile) {
  const int t = threadIdx.x;
  if (U.mode == MODE_COLS) {
    const int row = (t & 7) * 16;
#pragma unroll
    for (int g = 0; g < PIECES / 4; ++g) {
      const int cg = (t >> 3) + (THREADS / 8) * g;
      const uint4* w = v + 4 * g;
      unsigned rows[16];
      transpose4(w[0].x, w[1].x, w[2].x, w[3].x, rows + 0);
      transpose4(w[0].y, w[1].y, w[2].y, w[3].y, rows + 4);
      transpose4(w[0].z, w[1].z, w[2].z, w[3].z, rows + 8);
      transpose4(w[0].w, w[1].w, w[2].w, w[3].w, rows + 12);
#pragma unroll
      for (int y = 0; y < 16; ++y) *reinterpret_cast<unsigned*>(tile + (row + y) * PITCH + cg * 4) = rows[y];
    }
    return;
  }
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const int item = t + p * THREADS;
    unsigned* o = reinterpret_cast<unsigned*>(tile + (item / PER_ROW) * PITCH + (item % PER_ROW) * 16);
    o[0] = v[p].x;
    o[1] = v[p].y;
    o[2] = v[p].z;
    o[3] = v[p].w;
  }
}

// ---- write: whole 512-byte tiles, one 16-byte store per thread (a warp writes 512 contiguous bytes).
__device__ __forceinline__ void write_tiles(const Unit& U, const unsigned char* tile) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = warp; t < U.ntiles; t += THREADS / 32) {
    uint4 o;
    o.x = *reinterpret_cast<const unsigned*>(tile + (lane) * PITCH + t * 4);
    o.y = *reinterpret_cast<const unsigned*>(tile + (32 + lane) * PITCH + t * 4);
    o.z = *reinterpret_cast<const unsigned*>(tile + (64 + lane) * PITCH + t * 4);
    o.w = *reinterpret_cast<const unsigned*>(tile + (96 + lane) * PITCH + t * 4);
    *reinterpret_cast<uint4*>(U.dst + t * 512 + lane * 16) = o;
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

// One block per unit: many small independent blocks per SM keep enough reads in flight.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
mxfp8_swizzle_jobs(const Job* __restrict__ jobs, int njobs, long long total_units) {
  __shared__ __align__(16) unsigned char tile[ROWS * PITCH];
  for (long long u = blockIdx.x; u < total_units; u += gridDim.x) {
    const Unit U = decode(jobs, njobs, u);
    if (U.mode == MODE_COPY) {
      copy_unit(U);
      continue;
    }
    uint4 v[PIECES];
    fetch(U, v);
    __syncthreads();  // the previous unit's tile reads are done
    deposit(U, v, tile);
    __syncthreads();
    write_tiles(U, tile);
  }
}
