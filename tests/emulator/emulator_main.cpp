// Entry point of the CPU emulation of the kernel (see emulator.h, emulate.py).
#include <memory>

#include "emulator.h"
#include "mxfp8_swizzle.cu"

// Built with -fsanitize=alignment and linked without its runtime: a misaligned access (which the
// GPU would fault on) comes here and counts as an error (hidden: never a loaded libubsan's). The
// _abort form (-fno-sanitize-recover builds) must not return.
#define EMU_HIDDEN extern "C" __attribute__((visibility("hidden")))
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1(void*, void*) { emu_fail("misaligned access"); }
EMU_HIDDEN void __ubsan_handle_type_mismatch_v1_abort(void*, void*) {
  emu_fail("misaligned access");
  std::abort();
}

// readable: n [lo, hi) address pairs, the source bytes the launch may read; writable: m pairs, the
// output bytes the inverse kernel may write (emulator.h). inverse: run mxfp8_unswizzle_jobs.
extern "C" int mok_emulate(const Job* jobs, int njobs, long long total, int grid, const long long* readable, int n,
                           const long long* writable, int m, int inverse) {
  emu_begin(readable, n, writable, m);
  gridDim.x = grid;
  EmuBarrier sync(THREADS);
  emu_sync = &sync;
  std::vector<std::unique_ptr<EmuBarrier>> parts;  // named barriers 1..PARTS
  emu_named.clear();
  for (int i = 0; i < PARTS; ++i) emu_named.push_back(parts.emplace_back(new EmuBarrier(PART_THREADS)).get());
  emu_named_count = PART_THREADS;
  std::vector<std::thread> threads;  // one block's threads, which run every block in turn
  for (int t = 0; t < THREADS; ++t)
    threads.emplace_back([=, &sync] {
      threadIdx.x = t;
      for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        if (t == 0) std::memset(__start_emu_shared, 0x5A, __stop_emu_shared - __start_emu_shared);
        sync.arrive_and_wait();  // shared memory is garbage (as on the device) when the block starts
        if (inverse) {
          mxfp8_unswizzle_jobs(jobs, njobs, total);
        } else {
          mxfp8_swizzle_jobs(jobs, njobs, total);
        }
        if (!emu_copies.empty()) emu_fail("cp.async never waited for");
        sync.arrive_and_wait();  // the block is done with its shared memory before the next starts
      }
    });
  for (auto& th : threads) th.join();
  return emu_errors.load();
}
