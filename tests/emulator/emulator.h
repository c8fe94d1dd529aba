// Host shim that runs mxfp8_swizzle.cu on the CPU (tests/emulator/emulate.py): one std::thread per
// CUDA thread, a barrier that fails after a timeout (EmuBarrier) for __syncthreads, static
// (block-wide) storage for __shared__ variables; cp.async copies are checked (16-byte aligned,
// inside shared memory) and land at the issuing thread's wait. Source-tensor reads (__ldg,
// cp.async; not the descriptor tables) are checked against the launch's source tensors, the
// inverse kernel's writes (store_global) against its output tensors, and every access for
// alignment (-fsanitize=alignment, handled in emulator_main.cpp).
// It tests the addressing, planning and staging logic; not timing, not the hardware.
#pragma once
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define MOK_EMULATE 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One instance for the block's threads (blocks run one after another), in a section of its own
// that emulator_main.cpp poisons before each block: a read of a byte no thread wrote shows.
#define __shared__ __attribute__((section("emu_shared"))) static
// The linker's bounds of it.
extern "C" unsigned char __start_emu_shared[], __stop_emu_shared[];

struct alignas(16) uint4 { unsigned x, y, z, w; };  // as CUDA's: a misaligned 16-byte access shows
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct alignas(8) uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct alignas(16) float4 { float x, y, z, w; };
struct Dim3 { unsigned x; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 gridDim;
using std::max;
using std::min;

std::atomic<int> emu_errors{0};
inline void emu_fail(const char* what) {  // counted; the first few printed
  if (emu_errors++ < 20) std::fprintf(stderr, "emulator: %s\n", what);
}
// A barrier that fails instead of hanging. A thread that waits more than emu_wait_ms for the
// others (some thread skipped a __syncthreads or a full-mask shuffle: a hang or undefined
// behaviour on the device) counts an error and breaks every barrier of the launch, so the launch
// returns and its test fails. A test that plants such a kernel shortens the wait (ctypes).
extern "C" {
int emu_wait_ms = 20000;
}
std::atomic<bool> emu_broken{false};
class EmuBarrier {
 public:
  explicit EmuBarrier(int n) : n_(n) {}
  void reset() { arrived_ = 0; }
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    if (emu_broken) return;
    const unsigned long generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(emu_wait_ms);
    while (generation_ == generation && !emu_broken) {  // polled: another barrier may break the launch
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      if (generation_ == generation && std::chrono::steady_clock::now() > deadline) {
        if (!emu_broken.exchange(true)) emu_fail("a barrier timed out: some thread of the block never arrived");
        return;
      }
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  unsigned long generation_ = 0;
};

// Warp shuffles with a full mask: the lanes of a warp (threads 32w..32w+31) meet at a barrier of
// their own, so every lane must take part, as the hardware requires (a lane that does not breaks
// the launch, above). Any 4-byte type, moved as its bits (as the device's shuffles of int,
// unsigned and float).
struct EmuWarp {
  EmuBarrier met{32};
  unsigned values[32];
};
EmuWarp emu_warps[32];  // up to 1024 threads a block
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>, "emulated shuffles move 4-byte values");
  if (mask != 0xFFFFFFFFu) emu_fail("warp shuffle with a partial mask");
  EmuWarp& w = emu_warps[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32, src = lane ^ static_cast<unsigned>(lane_mask);
  w.values[lane] = std::bit_cast<unsigned>(v);
  w.met.arrive_and_wait();
  const unsigned out = src < 32 ? w.values[src] : std::bit_cast<unsigned>(v);
  w.met.arrive_and_wait();  // every lane has read before any lane's next shuffle writes
  return std::bit_cast<T>(out);
}

// The source bytes a launch may read, [lo, hi) each (registered by emulate.py through
// mok_emulate): a read outside them would be outside the tensors the kernel was given, which on
// the device may be unallocated memory.
std::vector<std::pair<const unsigned char*, const unsigned char*>> emu_readable;
inline void emu_check_read(const void* p, unsigned long n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (const auto& r : emu_readable)
    if (b >= r.first && b + n <= r.second) return;
  emu_fail("read outside the launch's source tensors");
}
template <class T> inline T __ldg(const T* p) {
  emu_check_read(p, sizeof(T));
  return *p;
}
// The output bytes the inverse kernel may write, [lo, hi) each (the spans of its logical outputs;
// bytes between their rows are caught by the comparison, emulate.py).
std::vector<std::pair<unsigned char*, unsigned char*>> emu_writable;
template <class T> inline void store_global(unsigned char* p, const T v) {
  bool inside = false;
  for (const auto& r : emu_writable) inside = inside || (p >= r.first && p + sizeof(T) <= r.second);
  if (!inside) emu_fail("write outside the launch's output tensors");
  else *reinterpret_cast<T*>(p) = v;
}

// A launch's start: no errors yet, and the n [lo, hi) address pairs it may read and the m it may
// write (what the checks above compare each access with).
inline void emu_begin(const long long* readable, int n, const long long* writable, int m) {
  emu_errors = 0;
  emu_broken = false;
  for (EmuWarp& w : emu_warps) w.met.reset();
  emu_readable.clear();
  for (int i = 0; i < n; ++i)
    emu_readable.emplace_back(reinterpret_cast<const unsigned char*>(readable[2 * i]),
                              reinterpret_cast<const unsigned char*>(readable[2 * i + 1]));
  emu_writable.clear();
  for (int i = 0; i < m; ++i)
    emu_writable.emplace_back(reinterpret_cast<unsigned char*>(writable[2 * i]),
                              reinterpret_cast<unsigned char*>(writable[2 * i + 1]));
}

inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

EmuBarrier* emu_sync = nullptr;
#define __syncthreads() emu_sync->arrive_and_wait()
// Named barriers 1..n (bar.sync id, count): one EmuBarrier per part of the block.
std::vector<EmuBarrier*> emu_named;
int emu_named_count = 0;
inline void emu_named_sync(int id, int count) {
  if (id < 1 || id > (int)emu_named.size() || count != emu_named_count) {
    std::fprintf(stderr, "emulator: bar.sync %d, %d: no such named barrier\n", id, count);
    std::abort();  // a thread that waits on the wrong barrier would hang the block
  }
  emu_named[id - 1]->arrive_and_wait();
}

// cp.async (16 bytes, global -> shared): checked for alignment and bounds, and landed only at this
// thread's async_wait, so a read before the wait (or by another thread before a barrier) sees the
// poisoned shared memory.
struct EmuCopy { unsigned char* dst; const unsigned char* src; };
thread_local std::vector<EmuCopy> emu_copies;
inline void async_copy16(unsigned char* dst, const unsigned char* src) {
  if (reinterpret_cast<unsigned long long>(dst) % 16 || reinterpret_cast<unsigned long long>(src) % 16)
    emu_fail("cp.async of 16 bytes misaligned");
  if (dst < __start_emu_shared || dst + 16 > __stop_emu_shared)
    emu_fail("cp.async outside shared memory");
  emu_check_read(src, 16);
  emu_copies.push_back({dst, src});
}
inline void async_wait() {
  for (const EmuCopy& c : emu_copies) std::memcpy(c.dst, c.src, 16);
  emu_copies.clear();
}
