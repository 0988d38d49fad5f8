// Device decoders of the 32-element "legacy" GGUF blocks Q4_0, Q4_1, Q5_0, Q5_1 (layouts in
// lib/quant/codecs_legacy.cc); an item is one block. Each weight is formed with the float32
// operations of lib/quant's dequantize, in its order, each rounded on its own, so decoded weights are
// bit-identical. Element l < 16 is the low nibble of qs[l], l + 16 its high nibble, so group g reads
// bytes 8 (g % 2).. and nibble g / 2; Q5 adds bit l of qh as the fifth bit.
#pragma once

#include "backends/cuda/codecs.cuh"

namespace strata::cuda::dev {

// Eight bytes at a 4-byte-aligned address.
STRATA_HD uint2 Load8Words(const uint8_t *p) { return make_uint2(LoadU32(p), LoadU32(p + 4)); }

// ---- Q4_0 (18 bytes / 32): f16 d | u8 qs[16]; x = d * (q - 8) ----------------------------------------
struct Q4_0 {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs; float d; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 18;
    return {b + 2, HalfBits(LoadU16(b))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Unaligned(it.qs + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = MulRn(it.d, static_cast<float>(static_cast<int>((ByteOf(v, k) >> shift) & 0x0f) - 8));
    }
  }
};

// ---- Q4_1 (20 bytes / 32): f16 d | f16 m | u8 qs[16]; x = d * q + m -----------------------------------
struct Q4_1 {
  static constexpr int kAlign = 4;
  struct Item { const uint8_t *qs; float d, m; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 20;
    const uint32_t dm = LoadU32(b);
    return {b + 4, HalfBits(static_cast<uint16_t>(dm & 0xffffu)), HalfBits(static_cast<uint16_t>(dm >> 16))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Words(it.qs + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = AddRn(MulRn(it.d, static_cast<float>((ByteOf(v, k) >> shift) & 0x0f)), it.m);
    }
  }
};

// ---- Q5_0 (22 bytes / 32): f16 d | u32 qh | u8 qs[16]; x = d * (q - 16) -------------------------------
// qh sits 2 bytes into a block of 22: read as two halves.
struct Q5_0 {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs; uint32_t qh; float d; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 22;
    const uint32_t qh = static_cast<uint32_t>(LoadU16(b + 2)) | static_cast<uint32_t>(LoadU16(b + 4)) << 16;
    return {b + 6, qh, HalfBits(LoadU16(b))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Unaligned(it.qs + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
    const uint32_t hb = it.qh >> (8 * g);  // bit k: the fifth bit of element 8g + k
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int q = static_cast<int>(((ByteOf(v, k) >> shift) & 0x0f) | (((hb >> k) & 1u) << 4));
      w[k] = MulRn(it.d, static_cast<float>(q - 16));
    }
  }
};

// ---- Q5_1 (24 bytes / 32): f16 d | f16 m | u32 qh | u8 qs[16]; x = d * q + m ------------------------
struct Q5_1 {
  static constexpr int kAlign = 4;
  struct Item { const uint8_t *qs; uint32_t qh; float d, m; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 24;
    const uint32_t dm = LoadU32(b);
    return {b + 8, LoadU32(b + 4), HalfBits(static_cast<uint16_t>(dm & 0xffffu)),
            HalfBits(static_cast<uint16_t>(dm >> 16))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Words(it.qs + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
    const uint32_t hb = it.qh >> (8 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t q = ((ByteOf(v, k) >> shift) & 0x0f) | (((hb >> k) & 1u) << 4);
      w[k] = AddRn(MulRn(it.d, static_cast<float>(q)), it.m);
    }
  }
};

}  // namespace strata::cuda::dev
