// Device decoders of the GGUF block layouts (the layouts are documented in lib/quant/codecs_*.cc).
// Every decoder works on "items" of 32 consecutive elements and yields them 8 at a time; each weight
// is formed with the same float32 operations, in the same order, as quant::Codec::dequantize, each
// rounded on its own (MulRn/AddRn/SubRn: __fmul_rn etc., never fused), so decoded weights are
// bit-identical. The decoders compile for the host too, where each device intrinsic has a twin of the
// same result, so tests/cuda/codecs_host_test.cc checks them (built for the host by
// tests/cuda/host_decoders.cu) against lib/quant without a GPU.
// Q4_0, Q4_1, Q5_0 and Q5_1 live in codecs_legacy.cuh, IQ4_NL and the lattice i-quants in
// codecs_iq.cuh, TQ1_0 and TQ2_0 in codecs_ternary.cuh, all included below;
// STRATA_CUDA_DISPATCH_CODEC at the end names every decoder.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace strata::cuda::dev {

constexpr int kItemElems = 32;   // elements per item
constexpr int kGroupElems = 8;   // elements per Group() call
constexpr int kGroupsPerItem = 4;

// ---- host twins of the device intrinsics ----------------------------------------------------------
// A decoder's helpers are __host__ __device__ (STRATA_HD). On the device they are the intrinsics
// (read-only cached loads, funnel shifts, byte permutes, separately rounded float operations); on the
// host the same values from plain C++. Host code that runs the decoders must compile without
// floating-point contraction (-ffp-contract=off), as lib/quant does.
#define STRATA_HD __host__ __device__ __forceinline__

template <class T>
STRATA_HD T Ldg(const T *p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
STRATA_HD float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HD float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HD float SubRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
STRATA_HD float BitsAsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
// __byte_perm(x, y, s) for selectors whose nibbles are below 8 (no sign replication).
STRATA_HD uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = static_cast<uint64_t>(y) << 32 | x;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * k)) & 7))) & 0xffu) << (8 * k);
  return r;
#endif
}

STRATA_HD float HalfBits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
STRATA_HD uint16_t LoadU16(const uint8_t *p) { return Ldg(reinterpret_cast<const unsigned short *>(p)); }
STRATA_HD uint32_t LoadU32(const uint8_t *p) { return Ldg(reinterpret_cast<const unsigned int *>(p)); }

// Eight bytes from any address: the aligned words that cover them, realigned with funnel shifts.
// The third word is read only when the bytes straddle it; a word holding at least one byte of the
// buffer never crosses the allocation's end.
STRATA_HD uint2 Load8Unaligned(const uint8_t *p) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const auto *w = reinterpret_cast<const unsigned int *>(a & ~uintptr_t{3});
  const unsigned sh = static_cast<unsigned>(a & 3) * 8;
  const uint32_t w0 = Ldg(w), w1 = Ldg(w + 1);
  const uint32_t w2 = sh != 0 ? Ldg(w + 2) : 0u;
  return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
#else
  uint2 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
STRATA_HD uint2 Load8Aligned(const uint8_t *p) { return Ldg(reinterpret_cast<const uint2 *>(p)); }
STRATA_HD uint32_t ByteOf(uint2 v, int k) {  // k is a compile-time constant
  return ((k < 4 ? v.x : v.y) >> (8 * (k & 3))) & 0xffu;
}

// A signed 4-bit-indexed table of 16 int8 levels held in four words; __byte_perm selects a byte
// without the serialisation a divergent constant-memory index would cause.
struct Levels16 {
  uint32_t w0, w1, w2, w3;
};
constexpr uint32_t Pack4(int a, int b, int c, int d) {
  return static_cast<uint32_t>(static_cast<uint8_t>(a)) | static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24;
}
STRATA_HD float Level(Levels16 t, uint32_t q) {
  const uint32_t lo = (q & 8) ? t.w2 : t.w0, hi = (q & 8) ? t.w3 : t.w1;
  return static_cast<float>(static_cast<int8_t>(BytePerm(lo, hi, q & 7)));
}
// IQ4_NL / IQ4_XS levels (ggml's kvalues_iq4nl) and MXFP4's doubled E2M1 levels.
constexpr Levels16 kIq4Levels = {Pack4(-127, -104, -83, -65), Pack4(-49, -35, -22, -10), Pack4(1, 13, 25, 38),
                                 Pack4(53, 69, 89, 113)};
constexpr Levels16 kMxfp4Levels = {Pack4(0, 1, 2, 3), Pack4(4, 6, 8, 12), Pack4(0, -1, -2, -3),
                                   Pack4(-4, -6, -8, -12)};

// ---- F32 / F16 / BF16: an item is 32 consecutive values -------------------------------------------
struct F32 {
  static constexpr int kAlign = 16;
  struct Item { const uint8_t *p; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) { return {row + item * 128}; }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const float4 a = Ldg(reinterpret_cast<const float4 *>(it.p + 32 * g));
    const float4 b = Ldg(reinterpret_cast<const float4 *>(it.p + 32 * g + 16));
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
  }
};

struct F16 {
  static constexpr int kAlign = 16;
  struct Item { const uint8_t *p; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) { return {row + item * 64}; }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint4 v = Ldg(reinterpret_cast<const uint4 *>(it.p + 16 * g));
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = HalfBits(static_cast<uint16_t>(u[k] & 0xffffu));
      w[2 * k + 1] = HalfBits(static_cast<uint16_t>(u[k] >> 16));
    }
  }
};

struct BF16 {
  static constexpr int kAlign = 16;
  struct Item { const uint8_t *p; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) { return {row + item * 64}; }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint4 v = Ldg(reinterpret_cast<const uint4 *>(it.p + 16 * g));
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = BitsAsFloat(u[k] << 16);
      w[2 * k + 1] = BitsAsFloat(u[k] & 0xffff0000u);
    }
  }
};

// ---- Q8_0 (34 bytes / 32): f16 d | i8 qs[32]; x = q * d -------------------------------------------
struct Q8_0 {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *qs; float d; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 34;
    return {b + 2, HalfBits(LoadU16(b))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Unaligned(it.qs + 8 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = MulRn(static_cast<float>(static_cast<int8_t>(ByteOf(v, k))), it.d);
    }
  }
};

// The 6-bit scale and min of sub-block j < 8 of a Q4_K super-block (lib/quant's packing over the 12
// scale bytes), from the block's first 16 bytes h (x: f16 d | f16 dmin; y, z, w: the scale bytes).
STRATA_HD void K4ScaleMin(const uint4 &h, int j, uint32_t *sc, uint32_t *mn) {
  const int sh = 8 * (j & 3);
  const uint32_t y = (h.y >> sh) & 0xffu, z = (h.z >> sh) & 0xffu, w = (h.w >> sh) & 0xffu;
  *sc = j < 4 ? y & 63u : (w & 15u) | ((y >> 6) << 4);
  *mn = j < 4 ? z & 63u : (w >> 4) | ((z >> 6) << 4);
}

// d * sc and dmin * m of sub-block j < 8 of a Q4_K or Q5_K super-block at b (f16 d | f16 dmin | u8
// scales[12] ..., lib/quant's KScaleMin packing), each product rounded on its own.
STRATA_HD void KSubScale(const uint8_t *b, int j, float *dl, float *ml) {
  const float d = HalfBits(LoadU16(b)), dmin = HalfBits(LoadU16(b + 2));
  const uint8_t *s = b + 4;
  int sc, m;
  if (j < 4) {
    sc = Ldg(s + j) & 0x3f;
    m = Ldg(s + j + 4) & 0x3f;
  } else {
    const int sj4 = Ldg(s + j + 4);
    sc = (sj4 & 0x0f) | ((Ldg(s + j - 4) >> 2) & 0x30);
    m = (sj4 >> 4) | ((Ldg(s + j) >> 2) & 0x30);
  }
  *dl = MulRn(d, static_cast<float>(sc));
  *ml = MulRn(dmin, static_cast<float>(m));
}

// ---- Q4_K (144 bytes / 256): f16 d | f16 dmin | u8 scales[12] | u8 qs[128] ------------------------
// Item j (sub-block of 32) reads nibble j % 2 of qs[32 (j / 2) ..]; x = (d * sc) * q - dmin * m.
struct Q4_K {
  static constexpr int kAlign = 8;
  struct Item { const uint8_t *q; float dl, ml; int shift; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 144;
    const int j = static_cast<int>(item & 7);
    float dl, ml;
    KSubScale(b, j, &dl, &ml);
    return {b + 16 + 32 * (j >> 1), dl, ml, 4 * (j & 1)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Aligned(it.q + 8 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float p = MulRn(it.dl, static_cast<float>((ByteOf(v, k) >> it.shift) & 0x0f));
      w[k] = SubRn(p, it.ml);
    }
  }
};

// ---- Q6_K (210 bytes / 256): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d -----------------------
// Item j = 4h + k (h < 2, k < 4): element l < 32 takes nibble k / 2 of ql[64h + 32 (k % 2) + l] and
// bits 2k.. of qh[32h + l]; scale scales[2j + l / 16]; x = (d * scale) * (q - 32).
struct Q6_K {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *ql, *qh; float dl0, dl1; int lo_shift, hi_shift; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 210;
    const int j = static_cast<int>(item & 7), h = j >> 2, k = j & 3;
    const float d = HalfBits(LoadU16(b + 208));
    const auto *scales = reinterpret_cast<const int8_t *>(b + 192);
    return {b + 64 * h + 32 * (k & 1), b + 128 + 32 * h, MulRn(d, static_cast<float>(Ldg(scales + 2 * j))),
            MulRn(d, static_cast<float>(Ldg(scales + 2 * j + 1))), 4 * (k >> 1), 2 * k};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 lo = Load8Unaligned(it.ql + 8 * g), hi = Load8Unaligned(it.qh + 8 * g);
    const float dl = g < 2 ? it.dl0 : it.dl1;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int q = static_cast<int>(((ByteOf(lo, k) >> it.lo_shift) & 0x0f) | (((ByteOf(hi, k) >> it.hi_shift) & 3) << 4));
      w[k] = MulRn(dl, static_cast<float>(q - 32));
    }
  }
};

// ---- Q5_K (176 bytes / 256): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128] ------------
// As Q4_K (item j: nibble j % 2 of qs[32 (j / 2) ..]) plus a fifth bit, bit j of qh[l];
// x = (d * sc) * q - dmin * m.
struct Q5_K {
  static constexpr int kAlign = 8;
  struct Item { const uint8_t *q, *qh; float dl, ml; int shift, bit; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 176;
    const int j = static_cast<int>(item & 7);
    float dl, ml;
    KSubScale(b, j, &dl, &ml);
    return {b + 48 + 32 * (j >> 1), b + 16, dl, ml, 4 * (j & 1), j};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 lo = Load8Aligned(it.q + 8 * g), hi = Load8Aligned(it.qh + 8 * g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t q = ((ByteOf(lo, k) >> it.shift) & 0x0f) | (((ByteOf(hi, k) >> it.bit) & 1) << 4);
      w[k] = SubRn(MulRn(it.dl, static_cast<float>(q)), it.ml);
    }
  }
};

// ---- Q2_K (84 bytes / 256): u8 scales[16] | u8 qs[64] | f16 d | f16 dmin ----------------------------
// Item j = 4h + k (h < 2, k < 4): element l < 32 is bits 2k.. of qs[32h + l], in sub-block 2j + l / 16
// whose byte holds sc (low nibble) and m (high); x = (d * sc) * q - dmin * m.
struct Q2_K {
  static constexpr int kAlign = 4;
  struct Item { const uint8_t *q; float dl0, ml0, dl1, ml1; int shift; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 84;
    const int j = static_cast<int>(item & 7);
    const uint32_t dd = LoadU32(b + 80);
    const float d = HalfBits(static_cast<uint16_t>(dd & 0xffffu)), dmin = HalfBits(static_cast<uint16_t>(dd >> 16));
    const uint32_t s = LoadU16(b + 2 * j);  // the scale bytes of sub-blocks 2j and 2j + 1
    return {b + 16 + 32 * (j >> 2),
            MulRn(d, static_cast<float>(s & 0x0fu)),
            MulRn(dmin, static_cast<float>((s >> 4) & 0x0fu)),
            MulRn(d, static_cast<float>((s >> 8) & 0x0fu)),
            MulRn(dmin, static_cast<float>(s >> 12)),
            2 * (j & 3)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = make_uint2(LoadU32(it.q + 8 * g), LoadU32(it.q + 8 * g + 4));
    const float dl = g < 2 ? it.dl0 : it.dl1, ml = g < 2 ? it.ml0 : it.ml1;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = SubRn(MulRn(dl, static_cast<float>((ByteOf(v, k) >> it.shift) & 3)), ml);
    }
  }
};

// Scale i < 16 of a Q3_K super-block, its 12 bytes at s (lib/quant's Q3Scale): low nibble from byte
// i (i < 8) or the high nibble of byte i - 8, top two bits from bits 2 (i / 4).. of byte 8 + i % 4;
// stored +32.
STRATA_HD int Q3Scale(const uint8_t *s, int i) {
  const int lo = i < 8 ? (Ldg(s + i) & 0x0f) : (Ldg(s + i - 8) >> 4);
  const int hi = (Ldg(s + 8 + (i & 3)) >> (2 * (i >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---- Q3_K (110 bytes / 256): u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d ----------------------
// Item j = 4h + k: element l < 32 has low bits 2k.. of qs[32h + l] and, as bit j of hmask[l], a
// third bit whose CLEAR state subtracts 4; scale of sub-block 2j + l / 16; x = (d * scale) * q.
struct Q3_K {
  static constexpr int kAlign = 2;
  struct Item { const uint8_t *q, *hm; float dl0, dl1; int shift, bit; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 110;
    const int j = static_cast<int>(item & 7);
    const float d = HalfBits(LoadU16(b + 108));
    return {b + 32 + 32 * (j >> 2), b,
            MulRn(d, static_cast<float>(Q3Scale(b + 96, 2 * j))),
            MulRn(d, static_cast<float>(Q3Scale(b + 96, 2 * j + 1))),
            2 * (j & 3), j};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 lo = Load8Unaligned(it.q + 8 * g), hm = Load8Unaligned(it.hm + 8 * g);
    const float dl = g < 2 ? it.dl0 : it.dl1;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int q = static_cast<int>((ByteOf(lo, k) >> it.shift) & 3) - (((ByteOf(hm, k) >> it.bit) & 1) ? 0 : 4);
      w[k] = MulRn(dl, static_cast<float>(q));
    }
  }
};

// ---- IQ4_XS (136 bytes / 256): f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128] -----------------
// Item j: 6-bit scale (nibble j % 2 of scales_l[j / 2], bits 2j.. of scales_h), stored +32; element
// l < 16 is the low nibble of qs[16j + l], l + 16 its high nibble; x = (d * (scale - 32)) * level.
struct IQ4_XS {
  static constexpr int kAlign = 8;
  struct Item { const uint8_t *q; float dl; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + (item >> 3) * 136;
    const int j = static_cast<int>(item & 7);
    const float d = HalfBits(LoadU16(b));
    const int lo = (Ldg(b + 4 + (j >> 1)) >> (4 * (j & 1))) & 0x0f;
    const int hi = (LoadU16(b + 2) >> (2 * j)) & 3;
    return {b + 8 + 16 * j, MulRn(d, static_cast<float>((lo | (hi << 4)) - 32))};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Aligned(it.q + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = MulRn(it.dl, Level(kIq4Levels, (ByteOf(v, k) >> shift) & 0x0f));
  }
};

// ---- MXFP4 (17 bytes / 32): u8 e | u8 qs[16]; x = 2^(e - 128) * doubled E2M1 level ----------------
struct MXFP4 {
  static constexpr int kAlign = 1;
  struct Item { const uint8_t *qs; float d; };
  __host__ __device__ static Item Prepare(const uint8_t *row, int64_t item) {
    const uint8_t *b = row + item * 17;
    const uint32_t e = Ldg(b);
    // 2^(e - 128): subnormal for e < 2, as lib/quant/codecs_mxfp4.cc forms it.
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (e - 1u) << 23;
    return {b + 1, BitsAsFloat(bits)};
  }
  __host__ __device__ static void Group(const Item &it, int g, float w[8]) {
    const uint2 v = Load8Unaligned(it.qs + 8 * (g & 1));
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = MulRn(it.d, Level(kMxfp4Levels, (ByteOf(v, k) >> shift) & 0x0f));
  }
};

}  // namespace strata::cuda::dev

// Q4_0, Q4_1, Q5_0, Q5_1; IQ4_NL and the lattice i-quants; TQ1_0, TQ2_0: built on the helpers above.
#include "backends/cuda/codecs_iq.cuh"
#include "backends/cuda/codecs_legacy.cuh"
#include "backends/cuda/codecs_ternary.cuh"

// Runs the statements with `C` naming the decoder of `type`; evaluates to false for a type without one.
#define STRATA_CUDA_DISPATCH_CODEC(type, ...)                                            \
  [&]() -> bool {                                                                        \
    switch (type) {                                                                      \
      case ::strata::quant::TypeId::kF32: { using C = ::strata::cuda::dev::F32; __VA_ARGS__; return true; }     \
      case ::strata::quant::TypeId::kF16: { using C = ::strata::cuda::dev::F16; __VA_ARGS__; return true; }     \
      case ::strata::quant::TypeId::kBF16: { using C = ::strata::cuda::dev::BF16; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ4_0: { using C = ::strata::cuda::dev::Q4_0; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ4_1: { using C = ::strata::cuda::dev::Q4_1; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ5_0: { using C = ::strata::cuda::dev::Q5_0; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ5_1: { using C = ::strata::cuda::dev::Q5_1; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ8_0: { using C = ::strata::cuda::dev::Q8_0; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ2_K: { using C = ::strata::cuda::dev::Q2_K; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ3_K: { using C = ::strata::cuda::dev::Q3_K; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ4_K: { using C = ::strata::cuda::dev::Q4_K; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ5_K: { using C = ::strata::cuda::dev::Q5_K; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kQ6_K: { using C = ::strata::cuda::dev::Q6_K; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kIQ4_XS: { using C = ::strata::cuda::dev::IQ4_XS; __VA_ARGS__; return true; } \
      case ::strata::quant::TypeId::kMXFP4: { using C = ::strata::cuda::dev::MXFP4; __VA_ARGS__; return true; }  \
      case ::strata::quant::TypeId::kIQ4_NL: { using C = ::strata::cuda::dev::IQ4_NL; __VA_ARGS__; return true; } \
      case ::strata::quant::TypeId::kIQ2_XXS: { using C = ::strata::cuda::dev::IQ2_XXS; __VA_ARGS__; return true; } \
      case ::strata::quant::TypeId::kIQ2_XS: { using C = ::strata::cuda::dev::IQ2_XS; __VA_ARGS__; return true; } \
      case ::strata::quant::TypeId::kIQ2_S: { using C = ::strata::cuda::dev::IQ2_S; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kIQ3_XXS: { using C = ::strata::cuda::dev::IQ3_XXS; __VA_ARGS__; return true; } \
      case ::strata::quant::TypeId::kIQ3_S: { using C = ::strata::cuda::dev::IQ3_S; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kIQ1_S: { using C = ::strata::cuda::dev::IQ1_S; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kIQ1_M: { using C = ::strata::cuda::dev::IQ1_M; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kTQ1_0: { using C = ::strata::cuda::dev::TQ1_0; __VA_ARGS__; return true; }   \
      case ::strata::quant::TypeId::kTQ2_0: { using C = ::strata::cuda::dev::TQ2_0; __VA_ARGS__; return true; }   \
      default: return false;                                                             \
    }                                                                                    \
  }()
