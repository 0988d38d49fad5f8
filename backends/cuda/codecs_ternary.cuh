// Device decoders of the ternary codecs TQ1_0 and TQ2_0 (layouts in lib/quant/codecs_ternary.cc),
// built on codecs.cuh's helpers: an item is sub-block j < 8 of a 256-element block, each weight
// d * (trit - 1) formed as lib/quant forms it (one rounded product), so decoded weights are
// bit-identical.
#pragma once

#include <cstdint>

#include "backends/cuda/codecs.cuh"

namespace strata::cuda::dev {

// Trit k < 5 of a TQ1_0 byte: ((byte * 3^k mod 256) * 3) >> 8.
STRATA_HD int Trit(uint32_t byte, int k) {
  constexpr uint64_t kPow3 = 0x51'1b'09'03'01ull;  // 3^k in byte k
  const uint32_t shifted = (byte * static_cast<uint32_t>((kPow3 >> (8 * k)) & 0xffu)) & 0xffu;
  return static_cast<int>((shifted * 3) >> 8);
}

// ---- TQ1_0 (54 bytes / 256): u8 qs[48] | u8 qh[4] | f16 d; x = d * (trit - 1) -------------------------
// Items 0..4: element l of item k is trit k of qs[l]. Elements 160 + 16k + m (k < 5, m < 16) are trit
// k of qs[32 + m]: groups 0..9 of that stretch (items 5, 6 and the first half of 7), 8 bytes each.
// Elements 240 + 4k + m (k < 4, m < 4) are trit k of qh[m]: item 7's groups 2 and 3, trits 2 (g - 2)
// and 2 (g - 2) + 1 of the four qh bytes.
struct TQ1_0 {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *b; float d; int j; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 54;
    return {b, HalfBits(LoadU16(b + 52)), static_cast<int>(item & 7)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const int i = 4 * (it.j - 5) + g;  // group of the stretch at qs[32..] (j >= 5)
    const bool tail = it.j == 7 && g >= 2;
    int off = it.j < 5 ? 8 * g : 32 + 8 * (i & 1);
    int k0 = it.j < 5 ? it.j : i >> 1;
    if (tail) {  // the 8 bytes 46..53, whose bytes 2..5 are qh: one load that stays in the block
      off = 46;
      k0 = 2 * (g - 2);
    }
    const int k1 = tail ? k0 + 1 : k0;
    uint2 v = Load8Unaligned(it.b + off);
    if (tail) {
      const uint32_t qh = (v.x >> 16) | (v.y << 16);
      v = make_uint2(qh, qh);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = MulRn(it.d, static_cast<float>(Trit(ByteOf(v, k), k < 4 ? k0 : k1) - 1));
    }
  }
};

// ---- TQ2_0 (66 bytes / 256): u8 qs[64] | f16 d; x = d * (q - 1) -------------------------------------
// Item j = 4h + k: element l < 32 is bits 2k.. of qs[32h + l].
struct TQ2_0 {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *q; float d; int shift; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 66;
    const int j = static_cast<int>(item & 7);
    return {b + 32 * (j >> 2), HalfBits(LoadU16(b + 64)), 2 * (j & 3)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Unaligned(it.q + 8 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = MulRn(it.d, static_cast<float>(static_cast<int>((ByteOf(v, k) >> it.shift) & 3) - 1));
    }
  }
};

}  // namespace strata::cuda::dev
