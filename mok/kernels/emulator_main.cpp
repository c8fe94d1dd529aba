// Entry point of the CPU emulation of the kernel (see emulator.h, emulate.py).
#include <memory>

#include "emulator.h"
#include "mxfp8_swizzle.cu"

extern "C" int mok_emulate(const Job* jobs, int njobs, long long total, int grid) {
  emu_errors = 0;
  gridDim.x = grid;
  std::barrier<> sync(THREADS);
  emu_sync = &sync;
  std::vector<std::unique_ptr<std::barrier<>>> parts;  // named barriers 1..PARTS
  emu_named.clear();
  for (int i = 0; i < PARTS; ++i) emu_named.push_back(parts.emplace_back(new std::barrier<>(PART_THREADS)).get());
  emu_named_count = PART_THREADS;
  std::vector<std::thread> threads;  // one block's threads, which run every block in turn
  for (int t = 0; t < THREADS; ++t)
    threads.emplace_back([=, &sync] {
      threadIdx.x = t;
      for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        if (t == 0 && __start_emu_shared) std::memset(__start_emu_shared, 0x5A, __stop_emu_shared - __start_emu_shared);
        sync.arrive_and_wait();  // shared memory is garbage (as on the device) when the block starts
        mxfp8_swizzle_jobs(jobs, njobs, total);
        if (!emu_copies.empty()) emu_fail("cp.async never waited for");
        sync.arrive_and_wait();  // the block is done with its shared memory before the next starts
      }
    });
  for (auto& th : threads) th.join();
  return emu_errors.load();
}
