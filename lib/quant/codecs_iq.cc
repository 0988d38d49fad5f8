// The non-linear 4-bit GGUF codecs IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks):
// each 4-bit code indexes a fixed table of 16 signed levels. Dequantization follows the gguf Python
// package in float32 (IQ4_XS: d * scale first, then times the level), so it is bit-identical to it.
#include <cstdint>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

using internal::LoadU16;

// The IQ4 levels, fixed by the format (ggml's kvalues_iq4nl).
constexpr int8_t kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                1,    13,   25,  38,  53,  69,  89,  113};

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

float DotIQ4_NL(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeIQ4_NL, kNlElems, kNlBytes, row, x, n);
}
float DotIQ4_XS(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeIQ4_XS, kXsElems, kXsBytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecIQ4_NL = {TypeId::kIQ4_NL, "IQ4_NL", kNlElems, kNlBytes,
                            &DequantizeIQ4_NL, nullptr, &DotIQ4_NL};
const Codec kCodecIQ4_XS = {TypeId::kIQ4_XS, "IQ4_XS", kXsElems, kXsBytes,
                            &DequantizeIQ4_XS, nullptr, &DotIQ4_XS};
}  // namespace internal

}  // namespace strata::quant
