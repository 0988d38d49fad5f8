// KV cache rows on the device in the cache's types (model::KvType): one value read from a stored row,
// and a row encoded by a block of threads. Bytes and values are EncodeKvRow's and DecodeKvCols' on the
// host (lib/model/backend.cc): f16 round to nearest even; q8_0 ggml's block_q8_0, d = amax / 127
// rounded to f16, q = round-half-away(x (1 / d)), a partial last block zero-padded.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "lib/model/backend.h"

namespace strata::cuda::dev {

// Bytes of a row of width values stored in type t (model::KvRowBytes, callable on the device).
__device__ __forceinline__ int64_t KvRowBytesDev(model::KvType t, int width) {
  return t == model::KvType::kF16    ? static_cast<int64_t>(width) * 2
         : t == model::KvType::kQ8_0 ? static_cast<int64_t>((width + model::kKvQ8Elems - 1) / model::kKvQ8Elems) *
                                           model::kKvQ8Bytes
                                     : static_cast<int64_t>(width) * 4;
}

// Value c of a row stored in type t: exact for f32 and f16, q d (one float product) for q8_0.
__device__ __forceinline__ float KvLoad(model::KvType t, const uint8_t *row, int c) {
  if (t == model::KvType::kF16) return __half2float(reinterpret_cast<const __half *>(row)[c]);
  if (t == model::KvType::kQ8_0) {
    const uint8_t *b = row + static_cast<int64_t>(c / model::kKvQ8Elems) * model::kKvQ8Bytes;
    const float d = __half2float(*reinterpret_cast<const __half *>(b));  // blocks are 2-byte aligned
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + c % model::kKvQ8Elems])), d);
  }
  return reinterpret_cast<const float *>(row)[c];
}

// Values c .. c + 3 of a row stored in type t (c % 4 == 0, c + 3 within the row): KvLoad's values,
// read as one 16-byte (f32) or 8-byte (f16) load where the address is aligned for it; q8_0 reads the
// block's scale once and the four codes as two half-words (blocks are only 2-byte aligned).
__device__ __forceinline__ float4 KvLoad4(model::KvType t, const uint8_t *row, int c) {
  if (t == model::KvType::kF16) {
    const __half *p = reinterpret_cast<const __half *>(row) + c;
    if ((reinterpret_cast<uintptr_t>(p) & 7u) == 0) {
      const uint2 w = *reinterpret_cast<const uint2 *>(p);
      const float2 lo = __half22float2(*reinterpret_cast<const __half2 *>(&w.x));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2 *>(&w.y));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
    return make_float4(__half2float(p[0]), __half2float(p[1]), __half2float(p[2]), __half2float(p[3]));
  }
  if (t == model::KvType::kQ8_0) {
    const uint8_t *b = row + static_cast<int64_t>(c / model::kKvQ8Elems) * model::kKvQ8Bytes;
    const float d = __half2float(*reinterpret_cast<const __half *>(b));
    const uint16_t *w = reinterpret_cast<const uint16_t *>(b + 2 + c % model::kKvQ8Elems);
    const uint32_t lo = w[0], hi = w[1];
    auto code = [](uint32_t x) { return static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(x & 0xffu))); };
    return make_float4(__fmul_rn(code(lo), d), __fmul_rn(code(lo >> 8), d), __fmul_rn(code(hi), d),
                       __fmul_rn(code(hi >> 8), d));
  }
  const float *p = reinterpret_cast<const float *>(row) + c;
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) return *reinterpret_cast<const float4 *>(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}

// dst (KvRowBytes(t, width) bytes) = src (width floats) in type t, by the whole block (blockDim.x a
// multiple of 32; every thread must call it). q8_0: a warp a block of 32 values.
__device__ __forceinline__ void EncodeKvRowDev(model::KvType t, const float *src, int width, uint8_t *dst) {
  if (t == model::KvType::kF32) {
    float *d = reinterpret_cast<float *>(dst);
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = src[i];
  } else if (t == model::KvType::kF16) {
    __half *d = reinterpret_cast<__half *>(dst);
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = __float2half_rn(src[i]);
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int nb = (width + model::kKvQ8Elems - 1) / model::kKvQ8Elems;
    for (int b = warp; b < nb; b += warps) {
      const int i = b * model::kKvQ8Elems + lane;
      const float x = i < width ? src[i] : 0.f;
      float amax = fabsf(x);
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      // IEEE division and product, as the host codec's amax / 127.0f, 1.0f / d and x * id.
      const float d = __fdiv_rn(amax, 127.0f);
      const float id = d == 0.f ? 0.f : __fdiv_rn(1.0f, d);
      uint8_t *blk = dst + static_cast<int64_t>(b) * model::kKvQ8Bytes;
      if (lane == 0) *reinterpret_cast<__half *>(blk) = __float2half_rn(d);
      const float r = roundf(__fmul_rn(x, id));
      // NaN gives 0, as the host codec.
      const int q = r >= 127.f ? 127 : (r <= -127.f ? -127 : (r == r ? static_cast<int>(r) : 0));
      blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

}  // namespace strata::cuda::dev
