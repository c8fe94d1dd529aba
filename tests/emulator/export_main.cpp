// Entry point of the CPU emulation of mxfp8_export.cu (tests/emulator/emulate_export.py), on the
// shim of emulator.h: one std::thread per CUDA thread, every source read (__ldg) checked against
// the launch's input tensors, every global write (store_global) against its output buffers, every
// access for alignment. The kernel shares nothing between threads (no shared memory, no barrier),
// so each thread runs its part of every block in turn. The ABI macros come from the g++ command
// line (ExportConfig.macros).
#include "emulator.h"
#include "mxfp8_export.cu"

// Built with -fsanitize=alignment and linked without its runtime: a misaligned access (which the
// GPU would fault on) comes here and counts as an error.
#define EMU_HIDDEN extern "C" __attribute__((visibility("hidden")))
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1(void*, void*) { emu_fail("misaligned access"); }
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1_abort(void*, void*) {
  emu_fail("misaligned access");
  std::abort();
}

// jobs: the descriptor table (export_jobs.describe); readable / writable: n / m [lo, hi) address
// pairs, the bytes the launch may read (inputs) and write (outputs).
extern "C" int mok_emulate_export(const ExportJob* jobs, int njobs, long long total, int grid,
                                  const long long* readable, int n, const long long* writable, int m) {
  emu_begin(readable, n, writable, m);
  gridDim.x = grid;
  std::vector<std::thread> threads;
  for (int t = 0; t < EX_THREADS; ++t)
    threads.emplace_back([=] {
      threadIdx.x = t;
      for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        mxfp8_export_jobs(jobs, njobs, total);
      }
    });
  for (auto& th : threads) th.join();
  return emu_errors.load();
}
