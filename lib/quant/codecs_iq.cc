// The GGUF i-quants. IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks): each 4-bit
// code indexes a fixed table of 16 signed levels. IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and
// IQ1_M (256-element super-blocks): each code indexes a lattice grid of 8 (IQ2, IQ1) or 4 (IQ3)
// values (iq_grids.h), under a sub-block scale and per-element signs (IQ2, IQ3) or a shift (IQ1).
// Dequantization follows the gguf Python package in float32, operation for operation, so it is
// bit-identical to it. Every type quantizes as ggml does: IQ4_NL and IQ4_XS in quantize_iq4.cc, the
// lattice types in quantize_iq.cc and quantize_iq1.cc.
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"
#include "lib/quant/iq_grids.h"

namespace strata::quant {
namespace {

using internal::LoadU16;
using internal::LoadU32;

// The IQ4 levels, fixed by the format (codec_impl.h).
constexpr const int8_t *kLevels = internal::kIQ4Levels;

// Byte layouts (little-endian, no padding):
//   IQ4_NL (18):  f16 d | u8 qs[16]; element j < 16 = low nibble of qs[j], j + 16 = high nibble;
//                 x = d * level[q]
//   IQ4_XS (136): f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]; 8 sub-blocks of 32 with
//                 6-bit scales: low nibble = nibble (j % 2) of scales_l[j / 2], top two bits = bits
//                 2j.. of scales_h, stored +32; in sub-block j, element l < 16 is the low nibble of
//                 qs[16j + l] and l + 16 its high nibble; x = (d * (scale - 32)) * level[q]
constexpr int64_t kNlElems = 32;
constexpr int64_t kNlBytes = 18;
constexpr int64_t kXsElems = 256;
constexpr int64_t kXsBytes = 136;

void DequantizeIQ4_NL(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kNlElems, b += kNlBytes, dst += kNlElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(kLevels[qs[j] & 0x0f]);
      dst[j + 16] = d * static_cast<float>(kLevels[qs[j] >> 4]);
    }
  }
}

void DequantizeIQ4_XS(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kXsElems, b += kXsBytes, dst += kXsElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint16_t scales_h = LoadU16(b + 2);
    const uint8_t *scales_l = b + 4;
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 8; ++j) {
      const int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
      const int hi = (scales_h >> (2 * j)) & 3;
      const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
      const uint8_t *q = qs + 16 * j;
      float *y = dst + 32 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * static_cast<float>(kLevels[q[l] & 0x0f]);
        y[l + 16] = dl * static_cast<float>(kLevels[q[l] >> 4]);
      }
    }
  }
}

// ---- lattice i-quants ---------------------------------------------------------------------

// Byte layouts (little-endian, no padding; 256 elements a block):
//   IQ2_XXS (66): f16 d | 8 x (u32 a, u32 b) per 32 elements: the 4 bytes of a index the grid (8
//                 elements each); b holds 4 x 7-bit sign indices (bits 7c..) and the scale s in
//                 its top 4 bits; x = (d (0.5 + s) 0.25) g sign
//   IQ2_XS (74):  f16 d | u16 qs[32]: 9-bit grid index, 7-bit sign index | u8 scales[8]: a 4-bit
//                 scale per 16 elements (low nibble first)
//   IQ2_S (82):   f16 d | u8 qs[32] | u8 signs[32] | u8 qh[8] | u8 scales[8]: grid index qs[i] |
//                 2 bits of qh[i / 4] (bits 2 (i % 4)..) << 8; sign byte i for entry i
//   IQ3_XXS (98): f16 d | u8 qs[64] (4 elements each) | 8 x u32: 4 x 7-bit sign indices, scale in
//                 the top 4 bits; x = (d (0.5 + s) 0.5) g sign
//   IQ3_S (110):  f16 d | u8 qs[64] | u8 qh[8] | u8 signs[32] | u8 scales[4]: grid index qs[i] |
//                 bit i % 8 of qh[i / 8] << 8; x = (d (1 + 2 s)) g sign, a scale per 32 elements
//   IQ1_S (50):   f16 d | u8 qs[32] | u16 qh[8] per 32 elements: grid index qs[4 g + l] | 3 bits
//                 of qh[g] (bits 3 l..) << 8, scale s = bits 12..14, delta sign bit 15;
//                 x = (d (2 s + 1)) (g + delta), delta = +-0.125
//   IQ1_M (56):   u8 qs[32] | u8 qh[16] | u16 sc[4]: nibble i of qh (low first) gives entry i's
//                 grid index bits 8..10 and its delta sign (bit 3); sc holds 16 3-bit scales (bits
//                 3k.. of sc[k / 4], one per 16 elements) and, in its four top nibbles, the f16 d
//                 (sc[0]'s lowest); x = (d (2 s + 1)) (g + delta)
// Sign index k names the byte k | 0x80 when k has an odd number of set bits (an even count of
// minus signs in 8), bit j for element j.
constexpr int64_t kIqElems = 256;

inline uint8_t SignByte(uint32_t k) { return static_cast<uint8_t>(k | ((__builtin_popcount(k) & 1) << 7)); }

// Element j of entry r of a packed grid, as a float.
template <const uint16_t *kGrid, int kBits, const int8_t *kLevels>
inline float GridValue(uint32_t r, int j) {
  return static_cast<float>(kLevels[(kGrid[r] >> (j * kBits)) & ((1 << kBits) - 1)]);
}
#define STRATA_IQ_GRID(name) name, name##Bits, name##Levels

// 8 elements of grid entry r at y, times db, then signed by sign byte s.
template <const uint16_t *kGrid, int kBits, const int8_t *kLevels, int kElems>
inline void PutSigned(float *y, uint32_t r, float db, uint8_t s) {
  for (int j = 0; j < kElems; ++j) {
    const float v = db * GridValue<kGrid, kBits, kLevels>(r, j);
    y[j] = (s >> j) & 1 ? v * -1.0f : v;
  }
}

void DequantizeIQ2_XXS(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 66, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    for (int g = 0; g < 8; ++g) {
      const uint8_t *q = b + 2 + 8 * g;
      const uint32_t aux = LoadU32(q + 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int c = 0; c < 4; ++c) {
        PutSigned<STRATA_IQ_GRID(internal::kIQ2XXSGrid), 8>(dst + 32 * g + 8 * c, q[c], db,
                                                            SignByte((aux >> (7 * c)) & 127));
      }
    }
  }
}

void DequantizeIQ2_XS(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 74, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    for (int e = 0; e < 32; ++e) {
      const uint16_t q = LoadU16(b + 2 + 2 * e);
      const int s = (b[66 + e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
      const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
      PutSigned<STRATA_IQ_GRID(internal::kIQ2XSGrid), 8>(dst + 8 * e, q & 511, db, SignByte(q >> 9));
    }
  }
}

void DequantizeIQ2_S(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 82, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
    for (int e = 0; e < 32; ++e) {
      const uint32_t r = qs[e] | (((qh[e / 4] >> (2 * (e % 4))) & 3u) << 8);
      const int s = (scales[e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
      const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
      PutSigned<STRATA_IQ_GRID(internal::kIQ2SGrid), 8>(dst + 8 * e, r, db, signs[e]);
    }
  }
}

void DequantizeIQ3_XXS(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 98, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2;
    for (int g = 0; g < 8; ++g) {
      const uint32_t aux = LoadU32(b + 66 + 4 * g);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      for (int c = 0; c < 4; ++c) {
        const uint8_t s = SignByte((aux >> (7 * c)) & 127);
        float *y = dst + 32 * g + 8 * c;
        PutSigned<STRATA_IQ_GRID(internal::kIQ3XXSGrid), 4>(y, qs[8 * g + 2 * c], db, s);
        PutSigned<STRATA_IQ_GRID(internal::kIQ3XXSGrid), 4>(y + 4, qs[8 * g + 2 * c + 1], db, s >> 4);
      }
    }
  }
}

void DequantizeIQ3_S(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 110, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
    for (int e = 0; e < 64; ++e) {
      const uint32_t r = qs[e] | (((qh[e / 8] >> (e % 8)) & 1u) << 8);
      const int s = (scales[e / 16] >> (4 * ((e / 8) % 2))) & 0x0f;
      const float db = d * static_cast<float>(1 + 2 * s);
      PutSigned<STRATA_IQ_GRID(internal::kIQ3SGrid), 4>(dst + 4 * e, r, db, signs[e / 2] >> (4 * (e % 2)));
    }
  }
}

void DequantizeIQ1_S(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 50, dst += kIqElems) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2;
    for (int g = 0; g < 8; ++g) {
      const uint16_t qh = LoadU16(b + 34 + 2 * g);
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) == 0 ? 0.125f : -0.125f;
      for (int l = 0; l < 4; ++l) {
        const uint32_t r = qs[4 * g + l] | (((qh >> (3 * l)) & 7u) << 8);
        float *y = dst + 32 * g + 8 * l;
        for (int j = 0; j < 8; ++j) {
          y[j] = dl * (GridValue<STRATA_IQ_GRID(internal::kIQ1SGrid)>(r, j) + delta);
        }
      }
    }
  }
}
void DequantizeIQ1_M(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kIqElems, b += 56, dst += kIqElems) {
    const uint8_t *qs = b, *qh = b + 32;
    uint16_t sc[4];
    for (int k = 0; k < 4; ++k) sc[k] = LoadU16(b + 48 + 2 * k);
    const float d = HalfToFloat(IQ1_MScaleBits(b));
    for (int e = 0; e < 32; ++e) {
      const int nib = (qh[e / 2] >> (4 * (e % 2))) & 0x0f;
      const uint32_t r = qs[e] | (static_cast<uint32_t>(nib & 7) << 8);
      const float delta = (nib & 8) == 0 ? 0.125f : -0.125f;
      const int k = e / 2;
      const float dl = d * static_cast<float>(2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1);
      float *y = dst + 8 * e;
      for (int j = 0; j < 8; ++j) y[j] = dl * (GridValue<STRATA_IQ_GRID(internal::kIQ1SGrid)>(r, j) + delta);
    }
  }
}
#undef STRATA_IQ_GRID

template <void (*Dequantize)(const void *, float *, int64_t), int64_t kBytes>
float DotIq(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(Dequantize, kIqElems, kBytes, row, x, n);
}

float DotIQ4_NL(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeIQ4_NL, kNlElems, kNlBytes, row, x, n);
}
float DotIQ4_XS(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeIQ4_XS, kXsElems, kXsBytes, row, x, n);
}

}  // namespace

uint16_t IQ1_MScaleBits(const uint8_t *block) {
  uint16_t h = 0;
  for (int k = 0; k < 4; ++k) h = static_cast<uint16_t>(h | ((LoadU16(block + 48 + 2 * k) >> 12) << (4 * k)));
  return h;
}

void SetIQ1_MScaleBits(uint8_t *block, uint16_t h) {
  for (int k = 0; k < 4; ++k) {
    const uint16_t sc = static_cast<uint16_t>((LoadU16(block + 48 + 2 * k) & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
    std::memcpy(block + 48 + 2 * k, &sc, 2);
  }
}

namespace internal {
const Codec kCodecIQ4_NL = {TypeId::kIQ4_NL, "IQ4_NL", kNlElems, kNlBytes,
                            &DequantizeIQ4_NL, &QuantizeIQ4_NL, &DotIQ4_NL, &QuantizeIQ4_NLWeighted};
const Codec kCodecIQ4_XS = {TypeId::kIQ4_XS, "IQ4_XS", kXsElems, kXsBytes,
                            &DequantizeIQ4_XS, &QuantizeIQ4_XS, &DotIQ4_XS, &QuantizeIQ4_XSWeighted};
const Codec kCodecIQ2_XXS = {TypeId::kIQ2_XXS, "IQ2_XXS", kIqElems, 66, &DequantizeIQ2_XXS, nullptr,
                             &DotIq<&DequantizeIQ2_XXS, 66>, &QuantizeIQ2_XXSWeighted};
const Codec kCodecIQ2_XS = {TypeId::kIQ2_XS, "IQ2_XS", kIqElems, 74, &DequantizeIQ2_XS, nullptr,
                             &DotIq<&DequantizeIQ2_XS, 74>, &QuantizeIQ2_XSWeighted};
const Codec kCodecIQ2_S = {TypeId::kIQ2_S, "IQ2_S", kIqElems, 82, &DequantizeIQ2_S, &QuantizeIQ2_S,
                             &DotIq<&DequantizeIQ2_S, 82>, &QuantizeIQ2_SWeighted};
const Codec kCodecIQ3_XXS = {TypeId::kIQ3_XXS, "IQ3_XXS", kIqElems, 98, &DequantizeIQ3_XXS, &QuantizeIQ3_XXS,
                             &DotIq<&DequantizeIQ3_XXS, 98>, &QuantizeIQ3_XXSWeighted};
const Codec kCodecIQ3_S = {TypeId::kIQ3_S, "IQ3_S", kIqElems, 110, &DequantizeIQ3_S, &QuantizeIQ3_S,
                             &DotIq<&DequantizeIQ3_S, 110>, &QuantizeIQ3_SWeighted};
const Codec kCodecIQ1_S = {TypeId::kIQ1_S, "IQ1_S", kIqElems, 50, &DequantizeIQ1_S, nullptr,
                             &DotIq<&DequantizeIQ1_S, 50>, &QuantizeIQ1_SWeighted};
const Codec kCodecIQ1_M = {TypeId::kIQ1_M, "IQ1_M", kIqElems, 56, &DequantizeIQ1_M, &QuantizeIQ1_M,
                             &DotIq<&DequantizeIQ1_M, 56>, &QuantizeIQ1_MWeighted};
}  // namespace internal

}  // namespace strata::quant
