// MXFP8 scale layout conversion for tcgen05 / cuBLAS ("128x4"), every job of a call in one launch.
//
// A job converts one logical scale matrix S[R, C] (uint8, read at src + r*rs + c*cs) into the layout
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
#define TILES_PER_UNIT 32        // 4-column tiles per unit
#define UNIT_COLS (TILES_PER_UNIT * 4)
#define PITCH (UNIT_COLS + 4)    // shared row pitch: 33 words keeps the tile reads conflict-free
#define THREADS 256
#define COPY_CHUNK 16384

#define MODE_ROWS 0       // cs == 1: rows contiguous
#define MODE_COLS 1       // rs == 1: columns contiguous (a transposed view)
#define MODE_GATHER 2     // any strides, byte by byte
#define MODE_COPY 3       // already in the layout: copy R bytes (C unused)

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
  U.src = reinterpret_cast<const unsigned char*>(job.src + e * job.es);
  U.dst = reinterpret_cast<unsigned char*>(job.dst) + e * slabs * tiles * 512LL +  // expert e: Rp*Cp
          ((long long)rb * tiles + t0) * 512;
  return U;
}

// ---- fetch: each thread reads its 64 bytes of the unit into registers (4 x 16 bytes), zero
// outside [R, C]. Rows and gather: piece i is row (t+256i)/8, columns 16*((t+256i)%8)..+15.
// Columns: piece x is column 4*(t/8)+x, rows 16*(t%8)..+15 (contiguous in memory).
__device__ __forceinline__ void fetch(const Unit& U, uint4 (&v)[4]) {
  const int t = threadIdx.x;
  if (U.mode == MODE_COLS) {
    const int row = (t & 7) * 16, cg = t >> 3;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int col = cg * 4 + x;
      const unsigned char* in = U.src + (long long)(U.c0 + col) * U.cs + U.r0 + row;
      if (col < U.cv && U.vec == 16 && row + 16 <= U.rv) {
        v[x] = __ldg(reinterpret_cast<const uint4*>(in));
      } else {
        unsigned char b[16];
#pragma unroll
        for (int y = 0; y < 16; ++y) b[y] = (col < U.cv && row + y < U.rv) ? ld_byte(in + y) : 0;
        v[x] = pack16(b);
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int item = t + i * THREADS;
    const int row = item >> 3, col = (item & 7) * 16;
    const bool full = row < U.rv && col + 16 <= U.cv;
    if (U.mode == MODE_ROWS && full && U.vec == 16) {
      v[i] = __ldg(reinterpret_cast<const uint4*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col));
    } else if (U.mode == MODE_ROWS && full && U.vec == 4) {
      const unsigned* in = reinterpret_cast<const unsigned*>(U.src + (long long)(U.r0 + row) * U.rs + U.c0 + col);
      v[i] = make_uint4(__ldg(in), __ldg(in + 1), __ldg(in + 2), __ldg(in + 3));
    } else {
      unsigned char b[16];
#pragma unroll
      for (int y = 0; y < 16; ++y) {
        const bool ok = row < U.rv && col + y < U.cv;
        b[y] = ok ? ld_byte(U.src + (long long)(U.r0 + row) * U.rs + (long long)(U.c0 + col + y) * U.cs) : 0;
      }
      v[i] = pack16(b);
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
__device__ __forceinline__ void deposit(const Unit& U, const uint4 (&v)[4], unsigned char* tile) {
  const int t = threadIdx.x;
  if (U.mode == MODE_COLS) {
    const int row = (t & 7) * 16, cg = t >> 3;
    unsigned rows[16];
    transpose4(v[0].x, v[1].x, v[2].x, v[3].x, rows + 0);
    transpose4(v[0].y, v[1].y, v[2].y, v[3].y, rows + 4);
    transpose4(v[0].z, v[1].z, v[2].z, v[3].z, rows + 8);
    transpose4(v[0].w, v[1].w, v[2].w, v[3].w, rows + 12);
#pragma unroll
    for (int y = 0; y < 16; ++y) *reinterpret_cast<unsigned*>(tile + (row + y) * PITCH + cg * 4) = rows[y];
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int item = t + i * THREADS;
    unsigned* o = reinterpret_cast<unsigned*>(tile + (item >> 3) * PITCH + (item & 7) * 16);
    o[0] = v[i].x;
    o[1] = v[i].y;
    o[2] = v[i].z;
    o[3] = v[i].w;
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

// Persistent blocks walk the units of all jobs. The next unit's loads are issued before the
// current unit's tiles are written, so reads stay in flight while the block stores.
extern "C" __global__ void __launch_bounds__(THREADS, 3)
mxfp8_swizzle_jobs(const Job* __restrict__ jobs, int njobs, long long total_units) {
  __shared__ __align__(16) unsigned char tile[ROWS * PITCH];
  long long u = blockIdx.x;
  if (u >= total_units) return;
  Unit U = decode(jobs, njobs, u);
  uint4 v[4];
  if (U.mode != MODE_COPY) fetch(U, v);
  while (true) {
    const long long next = u + gridDim.x;
    if (U.mode == MODE_COPY) {
      copy_unit(U);
      if (next >= total_units) return;
      u = next;
      U = decode(jobs, njobs, u);
      if (U.mode != MODE_COPY) fetch(U, v);
      continue;
    }
    __syncthreads();  // the previous unit's tile reads are done
    deposit(U, v, tile);
    __syncthreads();
    Unit N;
    const bool more = next < total_units;
    if (more) {
      N = decode(jobs, njobs, next);
      if (N.mode != MODE_COPY) fetch(N, v);  // in flight during the writes below
    }
    write_tiles(U, tile);
    if (!more) return;
    u = next;
    U = N;
  }
}
