// The dequantize-GEMV building blocks shared by the per-matrix kernels (matmul.cu) and the grouped
// expert kernels (grouped.cu): one warp per output row, a fixed per-lane order of fused
// multiply-adds and a fixed butterfly across lanes, so a (row, token) result is the same bits
// whichever kernel, batch or chunk of tokens it is computed in.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/codecs.cuh"

namespace strata::cuda::dev {

constexpr int kGemvWarps = 8;  // rows per block: the warps of a block share x through L1

// Adds row · x[t] into acc[t] for NT tokens (x rows `cols` apart). The row is walked in groups of
// 8 elements, lane `lane` taking groups lane, lane + 32, ...: neighbouring lanes read neighbouring
// bytes, so each load instruction of the warp covers one contiguous span of the row (coalesced).
// A token's sum is formed in the same order for every NT.
template <class C, int NT>
__device__ __forceinline__ void RowDot(const uint8_t *row, const float *x, int64_t cols, int lane, float (&acc)[NT]) {
  const int64_t n_groups = cols / kGroupElems;
#pragma unroll 2
  for (int64_t gi = lane; gi < n_groups; gi += 32) {
    const typename C::Item item = C::Prepare(row, gi / kGroupsPerItem);
    const int g = static_cast<int>(gi % kGroupsPerItem);
    float w[8];
    C::Group(item, g, w);
    const float *xg = x + gi * kGroupElems;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 a = __ldg(reinterpret_cast<const float4 *>(xg + t * cols));
      const float4 b = __ldg(reinterpret_cast<const float4 *>(xg + t * cols + 4));
      float s = acc[t];
      s = fmaf(w[0], a.x, s); s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
      s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s); s = fmaf(w[7], b.w, s);
      acc[t] = s;
    }
  }
}

// Combines the lanes' partial sums in a fixed butterfly order (every lane gets the total).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// silu(g) * u as the CPU backend forms it: (g / (1 + exp(-g))) * u, exp in double so it rounds as
// glibc's expf does.
__device__ __forceinline__ float SiluMul(float g, float u) {
  return (g / (1.0f + static_cast<float>(exp(-static_cast<double>(g))))) * u;
}

}  // namespace strata::cuda::dev
