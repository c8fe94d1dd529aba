// Host shim that runs mxfp8_swizzle.cu on the CPU, every variant (mok/kernels/emulate.py): one
// std::thread per CUDA thread, std::barrier for __syncthreads, static (block-wide) storage for
// __shared__ variables, and an mbarrier / bulk-copy model that checks the copy engine's rules
// (16-byte aligned addresses and sizes, in-bounds shared memory) and completes a phase only when
// its arrival and every byte have come in; cp.async copies land at the issuing thread's wait.
// Source-tensor reads (__ldg, cp.async, bulk copies; not the descriptor tables) are checked
// against the launch's source tensors, and every access for alignment
// (-fsanitize=alignment, handled in emulator_main.cpp).
// It tests the addressing, planning, staging and pipeline logic; not timing, not the hardware.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#define MOK_EMULATE 1
#define __CUDA_ARCH__ 900
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
// The linker's bounds of it; weak: a build with no __shared__ variable (bulk) has no such section.
extern "C" __attribute__((weak)) unsigned char __start_emu_shared[], __stop_emu_shared[];

struct alignas(16) uint4 { unsigned x, y, z, w; };  // as CUDA's: a misaligned 16-byte access shows
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct Dim3 { unsigned x; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 gridDim;
using std::max;
using std::min;

std::atomic<int> emu_errors{0};
inline void emu_fail(const char* what) {
  std::fprintf(stderr, "emulator: %s\n", what);
  emu_errors++;
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
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

std::barrier<>* emu_sync = nullptr;
#define __syncthreads() emu_sync->arrive_and_wait()
// Named barriers 1..n (bar.sync id, count): one std::barrier per part of the block.
std::vector<std::barrier<>*> emu_named;
int emu_named_count = 0;
inline void emu_named_sync(int id, int count) {
  if (id < 1 || id > (int)emu_named.size() || count != emu_named_count) {
    std::fprintf(stderr, "emulator: bar.sync %d, %d: no such named barrier\n", id, count);
    std::abort();  // a thread that waits on the wrong barrier would hang the block
  }
  emu_named[id - 1]->arrive_and_wait();
}

#ifndef STAGE_BYTES
#define STAGE_BYTES 32768
#endif
alignas(128) unsigned char emu_stages[2 * STAGE_BYTES];
unsigned long long emu_bar_words[2];
struct EmuBar { long pending = 1, tx = 0; unsigned phase = 0; };
EmuBar emu_bars[2];
std::mutex emu_mutex;

inline unsigned char* emulated_stages() { return emu_stages; }
inline unsigned long long* emulated_bars() { return emu_bar_words; }
inline EmuBar& emu_bar(unsigned long long* bar) { return emu_bars[bar - emu_bar_words]; }
inline void emu_settle(EmuBar& b) {
  if (b.tx < -(1 << 20) || b.tx > (1 << 20)) emu_fail("tx-count out of range");
  if (b.pending == 0 && b.tx == 0) {
    b.phase ^= 1;
    b.pending = 1;
  }
}
inline void mbar_init(unsigned long long* bar) {
  std::lock_guard<std::mutex> g(emu_mutex);
  emu_bar(bar) = EmuBar{};
}
inline void mbar_init_fence() {}
inline void proxy_fence() {}
inline void mbar_expect(unsigned long long* bar, unsigned bytes) {
  std::lock_guard<std::mutex> g(emu_mutex);
  EmuBar& b = emu_bar(bar);
  if (b.pending != 1) emu_fail("arrive on a barrier with no pending arrival");
  b.tx += bytes;
  b.pending -= 1;
  emu_settle(b);
}
inline void mbar_wait(unsigned long long* bar, unsigned parity) {
  for (;;) {
    {
      std::lock_guard<std::mutex> g(emu_mutex);
      if (emu_bar(bar).phase != parity) return;
    }
    std::this_thread::yield();
  }
}
// cp.async (16 bytes, global -> shared): checked for alignment and bounds, and landed only at this
// thread's async_wait, so a read before the wait (or by another thread before a barrier) sees the
// poisoned shared memory.
struct EmuCopy { unsigned char* dst; const unsigned char* src; };
thread_local std::vector<EmuCopy> emu_copies;
inline void async_copy16(unsigned char* dst, const unsigned char* src) {
  if (reinterpret_cast<unsigned long long>(dst) % 16 || reinterpret_cast<unsigned long long>(src) % 16)
    emu_fail("cp.async of 16 bytes misaligned");
  if (__start_emu_shared && (dst < __start_emu_shared || dst + 16 > __stop_emu_shared))
    emu_fail("cp.async outside shared memory");
  emu_check_read(src, 16);
  emu_copies.push_back({dst, src});
}
inline void async_wait() {
  for (const EmuCopy& c : emu_copies) std::memcpy(c.dst, c.src, 16);
  emu_copies.clear();
}

inline void bulk_load(unsigned char* dst, const unsigned char* src, unsigned bytes, unsigned long long* bar) {
  if (bytes == 0 || bytes % 16) emu_fail("bulk copy size not a positive multiple of 16");
  if ((dst - emu_stages) % 16 || reinterpret_cast<unsigned long long>(src) % 16) emu_fail("bulk copy misaligned");
  if (dst < emu_stages || dst + bytes > emu_stages + sizeof(emu_stages)) emu_fail("bulk copy outside shared memory");
  emu_check_read(src, bytes);
  const long stage = (dst - emu_stages) / STAGE_BYTES;
  if ((dst + bytes - 1 - emu_stages) / STAGE_BYTES != stage) emu_fail("bulk copy crosses a stage");
  if (stage != bar - emu_bar_words) emu_fail("bulk copy completes on the other stage's barrier");
  std::memcpy(dst, src, bytes);
  std::lock_guard<std::mutex> g(emu_mutex);
  emu_bar(bar).tx -= bytes;
  emu_settle(emu_bar(bar));
}
