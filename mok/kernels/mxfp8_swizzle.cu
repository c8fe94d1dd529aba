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

// ---- load phase, MODE_ROWS: row r of the unit is src[(r0+r)*rs + c0 ...]
template <int VEC>
__device__ __forceinline__ void load_rows(unsigned char* tile, const unsigned char* src, long long rs,
                                          int r0, int c0, int rv, int cv) {
  constexpr int PER_ROW = UNIT_COLS / VEC;
  constexpr int ITEMS = ROWS * PER_ROW;
#pragma unroll 4
  for (int i = threadIdx.x; i < ITEMS; i += THREADS) {
    const int row = i / PER_ROW;
    const int col = (i % PER_ROW) * VEC;
    unsigned char* out = tile + row * PITCH + col;
    const unsigned char* in = src + (long long)(r0 + row) * rs + c0 + col;
    if (row < rv && col + VEC <= cv) {
      if (VEC == 16) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(in));
        unsigned* o = reinterpret_cast<unsigned*>(out);
        o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
      } else if (VEC == 4) {
        *reinterpret_cast<unsigned*>(out) = __ldg(reinterpret_cast<const unsigned*>(in));
      } else {
        out[0] = ld_byte(in);
      }
    } else {
#pragma unroll
      for (int b = 0; b < VEC; ++b) out[b] = (row < rv && col + b < cv) ? ld_byte(in + b) : 0;
    }
  }
}

// 4x4 byte transpose: in[x] holds bytes (column x, rows y..y+3); out[y] = row y across columns 0..3.
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

// ---- load phase, MODE_COLS: column c of the unit is src[(c0+c)*cs + r0 ...] (contiguous along r).
// Thread = (4 consecutive columns, 16 consecutive rows): four 16-byte reads, transposed in registers.
__device__ __forceinline__ void load_cols(unsigned char* tile, const unsigned char* src, long long cs,
                                          int r0, int c0, int rv, int cv, bool vec16) {
  const int q = threadIdx.x & 7;        // 16-row chunk: 8 lanes read 128 contiguous bytes
  const int cg = threadIdx.x >> 3;      // group of 4 columns (32 groups = 128 columns)
  const int row = q * 16;
  uint4 v[4];
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int col = cg * 4 + x;
    const unsigned char* in = src + (long long)(c0 + col) * cs + r0 + row;
    if (col < cv && vec16 && row + 16 <= rv) {
      v[x] = __ldg(reinterpret_cast<const uint4*>(in));
    } else {
      unsigned char b[16];
#pragma unroll
      for (int y = 0; y < 16; ++y) b[y] = (col < cv && row + y < rv) ? ld_byte(in + y) : 0;
      v[x] = make_uint4(b[0] | b[1] << 8 | b[2] << 16 | (unsigned)b[3] << 24,
                        b[4] | b[5] << 8 | b[6] << 16 | (unsigned)b[7] << 24,
                        b[8] | b[9] << 8 | b[10] << 16 | (unsigned)b[11] << 24,
                        b[12] | b[13] << 8 | b[14] << 16 | (unsigned)b[15] << 24);
    }
  }
  unsigned rowsw[16];
  transpose4(v[0].x, v[1].x, v[2].x, v[3].x, rowsw + 0);
  transpose4(v[0].y, v[1].y, v[2].y, v[3].y, rowsw + 4);
  transpose4(v[0].z, v[1].z, v[2].z, v[3].z, rowsw + 8);
  transpose4(v[0].w, v[1].w, v[2].w, v[3].w, rowsw + 12);
#pragma unroll
  for (int y = 0; y < 16; ++y) *reinterpret_cast<unsigned*>(tile + (row + y) * PITCH + cg * 4) = rowsw[y];
}

__device__ __forceinline__ void load_gather(unsigned char* tile, const unsigned char* src, long long rs,
                                            long long cs, int r0, int c0, int rv, int cv) {
  for (int i = threadIdx.x; i < ROWS * UNIT_COLS; i += THREADS) {
    const int row = i / UNIT_COLS, col = i % UNIT_COLS;
    tile[row * PITCH + col] =
        (row < rv && col < cv) ? ld_byte(src + (long long)(r0 + row) * rs + (long long)(c0 + col) * cs) : 0;
  }
}

__device__ __forceinline__ void copy_unit(const Job& job, long long local) {
  const long long n = job.rows;
  const long long begin = local * COPY_CHUNK;
  const long long end = min(begin + (long long)COPY_CHUNK, n);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(job.src);
  unsigned char* dst = reinterpret_cast<unsigned char*>(job.dst);
  if (((job.flags >> 8) & 0xff) == 16) {
    for (long long i = begin + threadIdx.x * 16; i + 16 <= end; i += THREADS * 16)
      *reinterpret_cast<uint4*>(dst + i) = __ldg(reinterpret_cast<const uint4*>(src + i));
    const long long tail = begin + ((end - begin) / 16) * 16;
    for (long long i = tail + threadIdx.x; i < end; i += THREADS) dst[i] = ld_byte(src + i);
  } else {
    for (long long i = begin + threadIdx.x; i < end; i += THREADS) dst[i] = ld_byte(src + i);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 4)
mxfp8_swizzle_jobs(const Job* __restrict__ jobs, int njobs, long long total_units) {
  __shared__ __align__(16) unsigned char tile[ROWS * PITCH];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (long long u = blockIdx.x; u < total_units; u += gridDim.x) {
    int lo = 0, hi = njobs - 1;  // the last job whose first unit is <= u
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (jobs[mid].unit_begin <= u) lo = mid; else hi = mid - 1;
    }
    const Job job = jobs[lo];
    const long long local = u - job.unit_begin;
    const int mode = (int)(job.flags & 0xff);
    if (mode == MODE_COPY) {
      copy_unit(job, local);
      continue;
    }
    const int R = (int)job.rows, C = (int)job.cols;
    const int tiles = (C + 3) / 4;  // Cp / 4
    const int slabs = (R + ROWS - 1) / ROWS;  // Rp / 128
    const int chunks = (tiles + TILES_PER_UNIT - 1) / TILES_PER_UNIT;
    const long long per_expert = (long long)slabs * chunks;
    const long long e = local / per_expert;
    const int rem = (int)(local - e * per_expert);
    const int rb = rem / chunks;
    const int t0 = (rem % chunks) * TILES_PER_UNIT;
    const int ntiles = min(TILES_PER_UNIT, tiles - t0);
    const int r0 = rb * ROWS, c0 = t0 * 4;
    const int rv = min(ROWS, R - r0), cv = min(UNIT_COLS, C - c0);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(job.src + e * job.es);
    __syncthreads();  // the previous unit's tile reads are done
    if (mode == MODE_ROWS) {
      const int vec = (int)((job.flags >> 8) & 0xff);
      if (vec == 16) load_rows<16>(tile, src, job.rs, r0, c0, rv, cv);
      else if (vec == 4) load_rows<4>(tile, src, job.rs, r0, c0, rv, cv);
      else load_rows<1>(tile, src, job.rs, r0, c0, rv, cv);
    } else if (mode == MODE_COLS) {
      load_cols(tile, src, job.cs, r0, c0, rv, cv, ((job.flags >> 8) & 0xff) == 16);
    } else {
      load_gather(tile, src, job.rs, job.cs, r0, c0, rv, cv);
    }
    __syncthreads();
    unsigned char* dst = reinterpret_cast<unsigned char*>(job.dst) + e * slabs * tiles * 512LL +  // expert e: Rp*Cp
                         ((long long)rb * tiles + t0) * 512;
    for (int t = warp; t < ntiles; t += THREADS / 32) {
      uint4 o;
      o.x = *reinterpret_cast<const unsigned*>(tile + (lane) * PITCH + t * 4);
      o.y = *reinterpret_cast<const unsigned*>(tile + (32 + lane) * PITCH + t * 4);
      o.z = *reinterpret_cast<const unsigned*>(tile + (64 + lane) * PITCH + t * 4);
      o.w = *reinterpret_cast<const unsigned*>(tile + (96 + lane) * PITCH + t * 4);
      *reinterpret_cast<uint4*>(dst + t * 512 + lane * 16) = o;
    }
  }
}
