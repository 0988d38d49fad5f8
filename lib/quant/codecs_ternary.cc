// The ternary GGUF codecs TQ1_0 and TQ2_0 (BitNet b1.58 and TriLM weights): 256 values in {-1, 0, 1}
// under one f16 scale. Dequantization follows the gguf Python package in float32, so it is
// bit-identical to it; the quantizers are byte-identical to ggml's, which ignores importance weights.
#include <cmath>
#include <cstdint>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

using internal::LoadU16;
using internal::StoreU16;

constexpr int64_t kQK = 256;

// Byte layouts (little-endian, no padding):
//   TQ1_0 (54): u8 qs[48] | u8 qh[4] | f16 d. Trits packed five to a byte as a base-3 fraction of
//               256 (byte = ceil(t * 256 / 243), t the trits read most significant first): byte m
//               < 32 holds elements m + 32k (k < 5), byte 32 + m (m < 16) elements 160 + m + 16k,
//               qh[m] (m < 4) four trits, elements 240 + m + 4k, in its top four trit places.
//               Trit k of byte b is ((b * 3^k mod 256) * 3) >> 8; x = d * (trit - 1)
//   TQ2_0 (66): u8 qs[64] | f16 d. Element 128g + 32k + m is bits 2k.. of qs[32g + m]; x = d * (q - 1)
constexpr int64_t kTQ1Bytes = 54;
constexpr int64_t kTQ2Bytes = 66;

int Trit(uint8_t byte, int k) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto shifted = static_cast<uint8_t>(byte * kPow3[k]);  // mod 256, as the format defines it
  return (shifted * 3) >> 8;
}

void DequantizeTQ1_0(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kTQ1Bytes, dst += kQK) {
    const uint8_t *qs = b;
    const uint8_t *qh = b + 48;
    const float d = HalfToFloat(LoadU16(b + 52));
    for (int k = 0; k < 5; ++k) {
      for (int m = 0; m < 32; ++m) dst[32 * k + m] = d * static_cast<float>(Trit(qs[m], k) - 1);
      for (int m = 0; m < 16; ++m) dst[160 + 16 * k + m] = d * static_cast<float>(Trit(qs[32 + m], k) - 1);
    }
    for (int k = 0; k < 4; ++k) {
      for (int m = 0; m < 4; ++m) dst[240 + 4 * k + m] = d * static_cast<float>(Trit(qh[m], k) - 1);
    }
  }
}

void DequantizeTQ2_0(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kTQ2Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b + 64));
    for (int e = 0; e < kQK; ++e) {
      const int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      dst[e] = d * static_cast<float>(q - 1);
    }
  }
}

// ggml: d = max |x| over the block; each trit is lround(x / d) + 1 computed as x * (1 / d).
struct TernaryScale {
  float d, id;
};
TernaryScale ScaleOf(const float *x) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQK; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  return {amax, amax != 0.0f ? 1.0f / amax : 0.0f};
}

// The trit of v under id; a non-finite v (whose rounding is unspecified) counts as 0.
int TritOf(float v, float id) {
  const float r = std::round(v * id);
  return r >= 1.0f ? 2 : (r <= -1.0f ? 0 : 1);
}

// Packs the trits of count elements x[stride * k] (k < count), most significant first, into the
// top places of one byte: ceil(t * 3^(5 - count) * 256 / 243).
uint8_t PackTrits(const float *x, int stride, int count, float id) {
  int t = 0;
  for (int k = 0; k < count; ++k) t = 3 * t + TritOf(x[stride * k], id);
  for (int k = count; k < 5; ++k) t *= 3;
  return static_cast<uint8_t>((t * 256 + 242) / 243);
}

void QuantizeTQ1_0(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kTQ1Bytes, src += kQK) {
    const TernaryScale s = ScaleOf(src);
    StoreU16(b + 52, FloatToHalf(s.d));
    for (int m = 0; m < 32; ++m) b[m] = PackTrits(src + m, 32, 5, s.id);
    for (int m = 0; m < 16; ++m) b[32 + m] = PackTrits(src + 160 + m, 16, 5, s.id);
    for (int m = 0; m < 4; ++m) b[48 + m] = PackTrits(src + 240 + m, 4, 4, s.id);
  }
}

void QuantizeTQ2_0(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kTQ2Bytes, src += kQK) {
    const TernaryScale s = ScaleOf(src);
    StoreU16(b + 64, FloatToHalf(s.d));
    for (int g = 0; g < 2; ++g) {
      for (int m = 0; m < 32; ++m) {
        int q = 0;
        for (int k = 0; k < 4; ++k) q |= TritOf(src[128 * g + 32 * k + m], s.id) << (2 * k);
        b[32 * g + m] = static_cast<uint8_t>(q);
      }
    }
  }
}

float DotTQ1_0(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeTQ1_0, kQK, kTQ1Bytes, row, x, n);
}
float DotTQ2_0(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeTQ2_0, kQK, kTQ2Bytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecTQ1_0 = {TypeId::kTQ1_0, "TQ1_0", kQK, kTQ1Bytes, &DequantizeTQ1_0, &QuantizeTQ1_0, &DotTQ1_0,
                           nullptr};  // ggml ignores importance weights for TQ1_0
const Codec kCodecTQ2_0 = {TypeId::kTQ2_0, "TQ2_0", kQK, kTQ2Bytes, &DequantizeTQ2_0, &QuantizeTQ2_0, &DotTQ2_0,
                           nullptr};  // ggml ignores importance weights for TQ2_0
}  // namespace internal

}  // namespace strata::quant
