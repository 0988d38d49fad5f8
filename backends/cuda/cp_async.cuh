// cp.async: copies from global to shared memory that run while the thread goes on, grouped by
// commit and waited for by group count (sm_80 and later).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::dev {

// 16 bytes from global to shared memory, or zeros when !valid (src is then not read).
__device__ __forceinline__ void CpAsync16(void *dst, const void *src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 bytes, likewise (both addresses 4-byte aligned).
__device__ __forceinline__ void CpAsync4(void *dst, const void *src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of the thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace strata::cuda::dev
