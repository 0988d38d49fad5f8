// Kernel launches with programmatic dependent launch (sm_90 and later): a kernel queued with
// Launch() may be started by the GPU while the kernel before it on the stream is still running, so
// its launch and block scheduling overlap that kernel instead of following it. Every kernel
// launched so calls AwaitPrior() before its first access to device memory (before any read and any
// write, so neither a value the previous kernel writes nor one it reads is touched early); the
// wait returns once every earlier kernel of the stream has finished and its writes are visible,
// which keeps the ordering of a plain launch for all that follows it. Weights, which no kernel
// writes, may be prefetched before the wait (dev::PrefetchL2, gemv.cuh). Outside an early launch,
// and on older GPUs, the wait is a no-op.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/device.h"

namespace strata::cuda {

// kernel<<<grid, block, smem, stream>>>(args...), started early when EarlyLaunch() holds. The
// kernel must begin with dev::AwaitPrior(). Returns the launch's error (also left for
// cudaGetLastError, as a <<<>>> launch leaves it).
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args &&...args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = EarlyLaunch() ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

namespace dev {

// Waits for the stream's earlier kernels (see above), then lets the next kernel of the stream be
// started early: its blocks can take free multiprocessor slots and wait there in turn. Every thread
// calls it first thing.
__device__ __forceinline__ void AwaitPrior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// AwaitPrior without letting the next kernel start early: for a kernel that may wait long (its
// successor's blocks would sit on the multiprocessors all that time); the next one starts when it
// ends.
__device__ __forceinline__ void AwaitPriorOnly() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The device's nanosecond clock (%globaltimer), the same on every multiprocessor.
__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace dev
}  // namespace strata::cuda
