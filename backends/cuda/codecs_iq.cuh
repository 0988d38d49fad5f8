// Device decoders of IQ4_NL and the lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S
// and IQ1_M (layouts in lib/quant/codecs_iq.cc), built on codecs.cuh's helpers. IQ4_NL's item is a
// block; the lattice types' item is sub-block j < 8 of a 256-element super-block, a group one
// 8-element grid entry (two 4-element ones for IQ3). Each weight is formed with the float32 operations
// of lib/quant's dequantize, in its order, each rounded on its own, so decoded weights are
// bit-identical. Where lib/quant negates a product (v * -1), the level is negated before the multiply:
// round-to-nearest is symmetric, so db * -l has the bits of (db * l) * -1 for every product not NaN.
#pragma once

#include <cstdint>
#include <iterator>

#include "backends/cuda/codecs.cuh"
#include "lib/quant/iq_grids.h"

namespace strata::cuda::dev {

// ---- IQ4_NL (18 bytes / 32): f16 d | u8 qs[16]; x = d * level ----------------------------------------
// As Q4_0: element l < 16 is the low nibble of qs[l], l + 16 its high nibble.
struct IQ4_NL {
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
    for (int k = 0; k < 8; ++k) w[k] = MulRn(it.d, Level(kIq4Levels, (ByteOf(v, k) >> shift) & 0x0f));
  }
};

// ---- the lattice grids ------------------------------------------------------------------------------
// lib/quant/iq_grids.h packs grid entry r in a uint16 of level indices (kBits an element); the
// decoders read an entry as its values, one signed byte an element (8 in a uint64, 4 in a uint32),
// expanded at compile time from those tables, which stay the one source. The expansion lives in
// device memory, read through L1 (the lanes of a warp index different entries, which constant memory
// would serialise), and on the host as a constexpr twin.
template <class W, size_t N>
struct GridTable {
  W e[N];
};

template <class W, int kBits, size_t N>
constexpr GridTable<W, N> ExpandGrid(const uint16_t (&grid)[N], const int8_t *levels) {
  static_assert(sizeof(W) * kBits == 16, "an entry's elements fill its uint16");
  GridTable<W, N> t{};
  for (size_t r = 0; r < N; ++r) {
    W v = 0;
    for (int j = 0; j < static_cast<int>(sizeof(W)); ++j) {
      const int l = (grid[r] >> (j * kBits)) & ((1 << kBits) - 1);
      v |= static_cast<W>(static_cast<uint8_t>(levels[l])) << (8 * j);
    }
    t.e[r] = v;
  }
  return t;
}

#ifdef __CUDA_ARCH__
#define STRATA_CUDA_GRID_ENTRY(name, r) Ldg(&grids::kDev##name.e[r])
#else
#define STRATA_CUDA_GRID_ENTRY(name, r) grids::kHost##name.e[r]
#endif
// Defines grids::kDev<name> and grids::kHost<name> from iq_grids.h's `src`, and Grid<name>(r): entry r.
#define STRATA_CUDA_GRID(name, W, src)                                                                   \
  namespace grids {                                                                                      \
  static_assert(sizeof(W) == ::strata::quant::internal::src##Elems, #src " entries");                    \
  [[maybe_unused]] __device__ const GridTable<W, std::size(::strata::quant::internal::src)> kDev##name = \
      ExpandGrid<W, ::strata::quant::internal::src##Bits>(::strata::quant::internal::src,                \
                                                          ::strata::quant::internal::src##Levels);       \
  [[maybe_unused]] constexpr GridTable<W, std::size(::strata::quant::internal::src)> kHost##name =       \
      ExpandGrid<W, ::strata::quant::internal::src##Bits>(::strata::quant::internal::src,                \
                                                          ::strata::quant::internal::src##Levels);       \
  }                                                                                                      \
  STRATA_HD W Grid##name(uint32_t r) { return STRATA_CUDA_GRID_ENTRY(name, r); }

STRATA_CUDA_GRID(IQ2XXS, uint64_t, kIQ2XXSGrid)
STRATA_CUDA_GRID(IQ2XS, uint64_t, kIQ2XSGrid)
STRATA_CUDA_GRID(IQ2S, uint64_t, kIQ2SGrid)
STRATA_CUDA_GRID(IQ3XXS, uint32_t, kIQ3XXSGrid)
STRATA_CUDA_GRID(IQ3S, uint32_t, kIQ3SGrid)
STRATA_CUDA_GRID(IQ1S, uint64_t, kIQ1SGrid)
#undef STRATA_CUDA_GRID
#undef STRATA_CUDA_GRID_ENTRY

// The sign byte of 7-bit sign index k: k, with bit 7 set when k has an odd number of set bits (an
// even count of minus signs in 8). Bit j signs element j.
STRATA_HD uint32_t SignByte(uint32_t k) {
#ifdef __CUDA_ARCH__
  return k | ((__popc(k) & 1u) << 7);
#else
  return k | ((static_cast<uint32_t>(__builtin_popcount(k)) & 1u) << 7);
#endif
}

// w[k] = db * element k of the grid values e (a signed byte each), negated where bit k of s is set.
STRATA_HD void PutSigned(uint64_t e, uint32_t s, float db, float w[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int v = static_cast<int8_t>(static_cast<uint8_t>(e >> (8 * k)));
    w[k] = MulRn(db, static_cast<float>(((s >> k) & 1u) != 0 ? -v : v));
  }
}

// w[k] = dl * (element k of the IQ1 grid values e + delta).
STRATA_HD void PutShifted(uint64_t e, float dl, float delta, float w[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float v = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(e >> (8 * k))));
    w[k] = MulRn(dl, AddRn(v, delta));
  }
}

// (d * (0.5 + s)) * quarter_or_half: the IQ2 and IQ3_XXS sub-block scale, as lib/quant rounds it.
STRATA_HD float HalfStepScale(float d, uint32_t s, float f) { return MulRn(MulRn(d, AddRn(0.5f, static_cast<float>(s))), f); }

// ---- IQ2_XXS (66 bytes / 256): f16 d | 8 x (u8 grid[4] | u32 aux) --------------------------------------
// Item j is pair j: group c is grid entry grid[c] under sign index bits 7c.. of aux;
// db = (d * (0.5 + aux >> 28)) * 0.25; x = db * +-level.
struct IQ2_XXS {
  static constexpr int kAlign = 2;
  struct Item { uint2 q; float db; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 66;
    const uint2 q = Load8Unaligned(b + 2 + 8 * (item & 7));
    return {q, HalfStepScale(HalfBits(LoadU16(b)), q.y >> 28, 0.25f)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    PutSigned(GridIQ2XXS((it.q.x >> (8 * g)) & 0xffu), SignByte((it.q.y >> (7 * g)) & 127u), it.db, w);
  }
};

// ---- IQ2_XS (74 bytes / 256): f16 d | u16 qs[32] | u8 scales[8] ---------------------------------------
// Entry e: grid index bits 0..8 of qs[e], sign index bits 9..15; scale s = nibble (e / 2) % 2 of
// scales[e / 4]. Item j: entries 4j.. (a group each) and scales[j]; x = ((d * (0.5 + s)) * 0.25) * +-level.
struct IQ2_XS {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *q; float d; uint32_t sc; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 74;
    const int j = static_cast<int>(item & 7);
    return {b + 2 + 8 * j, HalfBits(LoadU16(b)), Ldg(b + 66 + j)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t q = LoadU16(it.q + 2 * g);
    const float db = HalfStepScale(it.d, (it.sc >> (4 * (g >> 1))) & 0x0fu, 0.25f);
    PutSigned(GridIQ2XS(q & 511u), SignByte(q >> 9), db, w);
  }
};

// ---- IQ2_S (82 bytes / 256): f16 d | u8 qs[32] | u8 signs[32] | u8 qh[8] | u8 scales[8] -----------------
// Entry e: grid index qs[e] | bits 2 (e % 4).. of qh[e / 4] << 8, sign byte signs[e], scale as IQ2_XS.
// Item j: entries 4j.., qh[j] and scales[j].
struct IQ2_S {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs, *signs; float d; uint32_t qh, sc; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 82;
    const int j = static_cast<int>(item & 7);
    return {b + 2 + 4 * j, b + 34 + 4 * j, HalfBits(LoadU16(b)), Ldg(b + 66 + j), Ldg(b + 74 + j)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t r = Ldg(it.qs + g) | (((it.qh >> (2 * g)) & 3u) << 8);
    const float db = HalfStepScale(it.d, (it.sc >> (4 * (g >> 1))) & 0x0fu, 0.25f);
    PutSigned(GridIQ2S(r), Ldg(it.signs + g), db, w);
  }
};

// ---- IQ3_XXS (98 bytes / 256): f16 d | u8 qs[64] | 8 x u32 aux -----------------------------------------
// Item j: qs[8j..] and aux[j]; group c: entries qs[8j + 2c] and qs[8j + 2c + 1] (4 elements each) under
// sign index bits 7c.. of aux; db = (d * (0.5 + aux >> 28)) * 0.5; x = db * +-level.
struct IQ3_XXS {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs; uint32_t aux; float db; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 98;
    const int j = static_cast<int>(item & 7);
    const uint32_t aux = LoadU16(b + 66 + 4 * j) | static_cast<uint32_t>(LoadU16(b + 68 + 4 * j)) << 16;
    return {b + 2 + 8 * j, aux, HalfStepScale(HalfBits(LoadU16(b)), aux >> 28, 0.5f)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t q = LoadU16(it.qs + 2 * g);
    const uint64_t e = GridIQ3XXS(q & 0xffu) | static_cast<uint64_t>(GridIQ3XXS(q >> 8)) << 32;
    PutSigned(e, SignByte((it.aux >> (7 * g)) & 127u), it.db, w);
  }
};

// ---- IQ3_S (110 bytes / 256): f16 d | u8 qs[64] | u8 qh[8] | u8 signs[32] | u8 scales[4] ---------------
// Entry e (4 elements): grid index qs[e] | bit e % 8 of qh[e / 8] << 8, signs nibble e % 2 of
// signs[e / 2]. Item j: entries 8j.., qh[j], scale s = nibble j % 2 of scales[j / 2]; group g: entries
// 8j + 2g and 8j + 2g + 1 under sign byte signs[4j + g]; x = (d * (1 + 2 s)) * +-level.
struct IQ3_S {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs, *signs; uint32_t qh; float db; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 110;
    const int j = static_cast<int>(item & 7);
    const int s = (Ldg(b + 106 + (j >> 1)) >> (4 * (j & 1))) & 0x0f;
    return {b + 2 + 8 * j, b + 74 + 4 * j, Ldg(b + 66 + j), MulRn(HalfBits(LoadU16(b)), static_cast<float>(1 + 2 * s))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t q = LoadU16(it.qs + 2 * g);
    const uint32_t r0 = (q & 0xffu) | (((it.qh >> (2 * g)) & 1u) << 8);
    const uint32_t r1 = (q >> 8) | (((it.qh >> (2 * g + 1)) & 1u) << 8);
    PutSigned(GridIQ3S(r0) | static_cast<uint64_t>(GridIQ3S(r1)) << 32, Ldg(it.signs + g), it.db, w);
  }
};

// ---- IQ1_S (50 bytes / 256): f16 d | u8 qs[32] | u16 qh[8] -------------------------------------------
// Item j: qh[j] (scale s = bits 12..14, delta sign bit 15); group l: grid index qs[4j + l] | bits
// 3l.. of qh[j] << 8; x = (d * (2 s + 1)) * (level + delta), delta = +-0.125.
struct IQ1_S {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs; uint32_t qh; float dl, delta; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 50;
    const int j = static_cast<int>(item & 7);
    const uint32_t qh = LoadU16(b + 34 + 2 * j);
    const float dl = MulRn(HalfBits(LoadU16(b)), static_cast<float>(2 * ((qh >> 12) & 7) + 1));
    return {b + 2 + 4 * j, qh, dl, (qh & 0x8000u) == 0 ? 0.125f : -0.125f};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t r = Ldg(it.qs + g) | (((it.qh >> (3 * g)) & 7u) << 8);
    PutShifted(GridIQ1S(r), it.dl, it.delta, w);
  }
};

// ---- IQ1_M (56 bytes / 256): u8 qs[32] | u8 qh[16] | u16 sc[4] -----------------------------------------
// f16 d in the top nibbles of sc (sc[0]'s lowest). Entry e: nibble e % 2 of qh[e / 2] holds grid index
// bits 8..10 and the delta sign (bit 3); scale s = bits 3k.. of sc[k / 4], k = e / 2. Item j: entries
// 4j.., qh[2j..2j+1] (entry 4j + g's nibble at bit 4g) and the scales of k = 2j, 2j + 1 (bits 6 (j %
// 2).. of sc[j / 2]); x = (d * (2 s + 1)) * (level + delta).
struct IQ1_M {
  static constexpr int kAlign = 4;
  struct Item { const uint8_t *qs; uint32_t qh, sc; float d; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 56;
    const int j = static_cast<int>(item & 7);
    const uint32_t s01 = LoadU32(b + 48), s23 = LoadU32(b + 52);  // sc[0] | sc[1] << 16, sc[2] | sc[3] << 16
    const uint32_t h = ((s01 >> 12) & 0x000fu) | ((s01 >> 24) & 0x00f0u) | ((s23 >> 4) & 0x0f00u) | ((s23 >> 16) & 0xf000u);
    const uint32_t sc = ((j < 4 ? s01 : s23) >> (16 * ((j >> 1) & 1) + 6 * (j & 1))) & 63u;
    return {b + 4 * j, LoadU16(b + 32 + 2 * j), sc, HalfBits(static_cast<uint16_t>(h))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint32_t nib = (it.qh >> (4 * g)) & 0x0fu;
    const uint32_t r = Ldg(it.qs + g) | ((nib & 7u) << 8);
    const float dl = MulRn(it.d, static_cast<float>(2 * ((it.sc >> (3 * (g >> 1))) & 7u) + 1));
    PutShifted(GridIQ1S(r), dl, (nib & 8u) == 0 ? 0.125f : -0.125f, w);
  }
};

}  // namespace strata::cuda::dev
