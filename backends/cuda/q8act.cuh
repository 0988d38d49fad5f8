// 8-bit activations on the device: the layout of a quantized row and the quantizing of one 256-element
// stretch of it, shared by the quantizing kernel (gemv_q8.cu) and the kernel that routes, groups
// and quantizes a few tokens in one launch (grouped.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::dev {

// Row r of xq: codes, then block scales, then sums (block32: int32 per block; block256: int16 per
// 16 elements).
struct XRow {
  const int8_t *q;
  const float *d;
  const void *s;
};

__device__ __forceinline__ XRow RowOf(const uint8_t *xq, int64_t row_bytes, int64_t cols, int block, int64_t r) {
  const uint8_t *p = xq + r * row_bytes;
  return {reinterpret_cast<const int8_t *>(p), reinterpret_cast<const float *>(p + cols),
          p + cols + (cols / block) * 4};
}

// The code and scale of element v in its block of kBlock (32: a warp; 256: the thread block), as lib's
// QuantizeBlock: q = nearbyint(v * (127 / amax)) clamped to +-127, d = amax / 127 (0 for a zero block).
// Every thread of a kBlock == 256 block must call it (a barrier).
template <int kBlock>
__device__ __forceinline__ void QuantizeOne(float v, float *warp_max, int *q, float *d) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (kBlock == 256) {
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = warp_max[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
  }
  *q = 0;
  *d = 0.f;
  if (amax > 0.f) {
    const float id = __fdiv_rn(127.f, amax);
    const float rq = rintf(__fmul_rn(v, id));
    *q = rq >= 127.f ? 127 : (rq <= -127.f ? -127 : static_cast<int>(rq));
    *d = __fdiv_rn(amax, 127.f);
  }
}

// Elements 256 c .. 256 c + 255 of row r of x (n rows of cols) into xq (rows of row_bytes), a thread
// an element on a block of 256 threads (every thread calls it: block256 takes a barrier). Block32: a
// warp a block; block256: the whole thread block one block. warp_max: 8 floats of shared memory.
template <int kBlock>
__device__ __forceinline__ void QuantizeStretch(const float *__restrict__ x, int64_t cols, uint8_t *xq,
                                                int64_t row_bytes, int64_t r, int64_t c, float *warp_max) {
  const int64_t i = c * 256 + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (kBlock == 32 && c * 256 + 32 * warp >= cols) return;  // warp-uniform
  int q;
  float d;
  QuantizeOne<kBlock>(i < cols ? x[r * cols + i] : 0.f, warp_max, &q, &d);
  const XRow row = RowOf(xq, row_bytes, cols, kBlock, r);
  if (i < cols) const_cast<int8_t *>(row.q)[i] = static_cast<int8_t>(q);
  if (kBlock == 32) {
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      const_cast<float *>(row.d)[i / 32] = d;
      static_cast<int32_t *>(const_cast<void *>(row.s))[i / 32] = s;
    }
  } else {
    int s = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);  // within each 16 lanes
    if ((lane & 15) == 0) static_cast<int16_t *>(const_cast<void *>(row.s))[i / 16] = static_cast<int16_t>(s);
    if (threadIdx.x == 0) const_cast<float *>(row.d)[i / 256] = d;
  }
}

}  // namespace strata::cuda::dev
