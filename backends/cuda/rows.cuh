// Row normalisation shared by the RMSNorm kernels (ops.cu) and the fused q/k norm + RoPE kernel
// (forward_ops.cu): one block per row, each thread taking elements i = threadIdx.x + m blockDim.x
// in ascending m, so every kernel forms a row's sum of squares, and so its output, with the same
// bits for the same row length.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::dev {

// Elements a thread holds in registers; rows longer than kRowMaxPer * 1024 take a looping path.
constexpr int kRowMaxPer = 8;

// Threads of the block that normalises a row of n floats: about 4 elements each, 32 to 1024, a
// whole number of warps.
inline int RowThreads(int64_t n) {
  int64_t t = (n + 3) / 4;
  t = (t + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

__device__ __forceinline__ float RowBlockSum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? red[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// y = x / rms(x) * weight over one row of n (x += add first when add is not null, x written back);
// y may alias x. As transformers does in float32 (and the CPU backend): x * rsqrt(mean(x^2) + eps)
// * weight. red: 32 floats of shared memory. Every thread of the block must call it.
__device__ __forceinline__ void NormRow(float *x, const float *add, const float *weight, int64_t n, float eps, float *y,
                                        float *red) {
  const int tid = threadIdx.x, bd = blockDim.x;
  float ss = 0.f;
  if (n <= static_cast<int64_t>(kRowMaxPer) * bd) {
    // Every load first, the weights' too (one round trip), then the squares in element order.
    float v[kRowMaxPer], wv[kRowMaxPer];
#pragma unroll
    for (int m = 0; m < kRowMaxPer; ++m) {
      const int64_t i = tid + static_cast<int64_t>(m) * bd;
      v[m] = i < n ? x[i] : 0.f;
      wv[m] = i < n ? weight[i] : 0.f;
      if (add != nullptr && i < n) v[m] = __fadd_rn(v[m], add[i]);
    }
#pragma unroll
    for (int m = 0; m < kRowMaxPer; ++m) {
      const int64_t i = tid + static_cast<int64_t>(m) * bd;
      if (i < n) ss = fmaf(v[m], v[m], ss);
    }
    ss = RowBlockSum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
    for (int m = 0; m < kRowMaxPer; ++m) {
      const int64_t i = tid + static_cast<int64_t>(m) * bd;
      if (i >= n) continue;
      if (add != nullptr) x[i] = v[m];
      y[i] = wv[m] * (v[m] * inv);
    }
    return;
  }
  for (int64_t i = tid; i < n; i += bd) {
    float v = x[i];
    if (add != nullptr) {
      v = __fadd_rn(v, add[i]);
      x[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  ss = RowBlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = tid; i < n; i += bd) y[i] = weight[i] * (x[i] * inv);
}

}  // namespace strata::cuda::dev
