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

// Adds row[m] · x[t] into acc[m][t] for R rows of the same shape and NT tokens (x rows `cols`
// apart). Each row is walked in groups of 8 elements, lane `lane` taking groups lane, lane + 32,
// ...: neighbouring lanes read neighbouring bytes, so each load instruction of the warp covers one
// contiguous span of a row (coalesced). The R rows are walked together so their loads are in flight
// at once; a (row, token) sum is formed in the same order for every R and NT.
template <class C, int NT, int R>
__device__ __forceinline__ void RowDots(const uint8_t *const (&rows)[R], const float *x, int64_t cols, int lane,
                                        float (&acc)[R][NT]) {
  const int64_t n_groups = cols / kGroupElems;
  // More groups in flight where few tokens and rows leave registers to spare (decode).
#pragma unroll(NT * R <= 2 ? 4 : 2)
  for (int64_t gi = lane; gi < n_groups; gi += 32) {
    const int g = static_cast<int>(gi % kGroupsPerItem);
    float w[R][8];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const typename C::Item item = C::Prepare(rows[m], gi / kGroupsPerItem);
      C::Group(item, g, w[m]);
    }
    const float *xg = x + gi * kGroupElems;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 a = __ldg(reinterpret_cast<const float4 *>(xg + t * cols));
      const float4 b = __ldg(reinterpret_cast<const float4 *>(xg + t * cols + 4));
#pragma unroll
      for (int m = 0; m < R; ++m) {
        float s = acc[m][t];
        s = fmaf(w[m][0], a.x, s); s = fmaf(w[m][1], a.y, s); s = fmaf(w[m][2], a.z, s); s = fmaf(w[m][3], a.w, s);
        s = fmaf(w[m][4], b.x, s); s = fmaf(w[m][5], b.y, s); s = fmaf(w[m][6], b.z, s); s = fmaf(w[m][7], b.w, s);
        acc[m][t] = s;
      }
    }
  }
}

// One row: RowDots over R = 1.
template <class C, int NT>
__device__ __forceinline__ void RowDot(const uint8_t *row, const float *x, int64_t cols, int lane, float (&acc)[NT]) {
  const uint8_t *const rows[1] = {row};
  RowDots<C, NT, 1>(rows, x, cols, lane, reinterpret_cast<float(&)[1][NT]>(acc));
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

// h (NT, rows) row r = silu(gate row r · x) * (up row r · x) for NT tokens, gate and up rows read
// together: the fused first half of an expert (GemvSwiGluKernel and the grouped kernels).
template <class C, int NT>
__device__ __forceinline__ void SwiGluRow(const uint8_t *wg, const uint8_t *wu, int64_t r, int64_t rows, int64_t cols,
                                          const float *x, float *h, int lane) {
  float acc[2][NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[0][t] = acc[1][t] = 0.f;
  const uint8_t *const rows2[2] = {wg, wu};
  RowDots<C, NT, 2>(rows2, x, cols, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float g = WarpSum(acc[0][t]), u = WarpSum(acc[1][t]);
    if (lane == 0) h[t * rows + r] = SiluMul(g, u);
  }
}

}  // namespace strata::cuda::dev
