// Entry point of the CPU emulation of the bulk kernel (see emulator.h, emulate.py).
#include "emulator.h"
#include "mxfp8_swizzle.cu"

extern "C" int mok_emulate(const Job* jobs, int njobs, long long total, int grid) {
  emu_errors = 0;
  gridDim.x = grid;
  for (int b = 0; b < grid; ++b) {
    blockIdx.x = b;
    std::barrier<> sync(THREADS);
    emu_sync = &sync;
    std::vector<std::thread> threads;
    for (int t = 0; t < THREADS; ++t)
      threads.emplace_back([=] {
        threadIdx.x = t;
        mxfp8_swizzle_jobs(jobs, njobs, total);
      });
    for (auto& th : threads) th.join();
  }
  return emu_errors.load();
}
