// Entry point of the CPU emulation of mxfp8_quantize.cu (tests/emulator/emulate_quantize.py), on the
// shim of emulator.h: one std::thread per CUDA thread, shared memory poisoned before each block,
// every source read checked against the launch's source tensors and every global write against
// its output buffers. The ABI macros come from the g++ command line (QuantizeConfig.macros).
#include <cmath>
#include <cstring>
#include <memory>

#include "emulator.h"

// The CUDA intrinsics the kernel uses, with their IEEE meaning (no fast math here: g++ keeps
// subnormals and rounds to nearest even, as the kernel's __fmul_rn does on the device).
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

#include "mxfp8_quantize.cu"

// Built with -fsanitize=alignment and linked without its runtime: a misaligned access (which the
// GPU would fault on) comes here and counts as an error.
#define EMU_HIDDEN extern "C" __attribute__((visibility("hidden")))
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1(void*, void*) { emu_fail("misaligned access"); }
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1_abort(void*, void*) {
  emu_fail("misaligned access");
  std::abort();
}

// args: the kernel's 11 arguments in order (quantize.kernel_arguments); readable / writable: n / m
// [lo, hi) address pairs, the bytes the launch may read (sources) and write (outputs).
extern "C" int mok_emulate_quantize(const long long* args, int grid, const long long* readable, int n,
                                    const long long* writable, int m) {
  emu_begin(readable, n, writable, m);
  gridDim.x = grid;
  EmuBarrier sync(QTHREADS);
  emu_sync = &sync;
  auto out = [&](int i) { return reinterpret_cast<unsigned char*>(args[i]); };
  std::vector<std::thread> threads;  // one block's threads, which run every block in turn
  for (int t = 0; t < QTHREADS; ++t)
    threads.emplace_back([=, &sync] {
      threadIdx.x = t;
      for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        if (t == 0) std::memset(__start_emu_shared, 0x5A, __stop_emu_shared - __start_emu_shared);
        sync.arrive_and_wait();  // shared memory is garbage (as on the device) when the block starts
        mxfp8_quantize(static_cast<unsigned long long>(args[0]), args[1], args[2], out(3), out(4), out(5), out(6),
                       static_cast<int>(args[7]), static_cast<int>(args[8]), static_cast<int>(args[9]),
                       static_cast<int>(args[10]));
        sync.arrive_and_wait();
      }
    });
  for (auto& th : threads) th.join();
  return emu_errors.load();
}
