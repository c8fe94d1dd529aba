// 16-byte copies from global to shared memory without registers, shared by mok's kernels
// (included by name: NVRTC gets this folder as its include path, nvcc and the CPU emulator find it
// beside the source). tests/emulator/emulator.h has its own, which lands each copy at the wait.
#pragma once

#ifndef MOK_EMULATE
// 16 bytes global -> shared, visible to this thread after async_wait: without registers on sm_80+
// (cp.async), through them before.
__device__ __forceinline__ void async_copy16(unsigned char* dst, const unsigned char* src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#else
  *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
#endif
}
__device__ __forceinline__ void async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}
#endif
