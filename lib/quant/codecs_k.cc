// The 256-element "k-quant" GGUF codecs Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Dequantization follows the
// gguf Python package operation by operation in float32 (sub-block scale d * sc first, then times
// the code, then minus dmin * m), so it is bit-identical to it. The Q4_K/Q5_K/Q6_K quantizers are
// Strata's own (gguf has none): least-squares fits per sub-block; bounds are in codec_test.cc.
#include <cmath>
#include <cstdint>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

using internal::LoadU16;

constexpr int64_t kQK = 256;  // elements per super-block (ggml's QK_K)

// Byte layouts (little-endian, no padding), each for one super-block of 256 elements:
//   Q2_K (84):  u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
//               16 sub-blocks of 16; scales[s] = sc (low nibble) | m (high nibble);
//               element 128h + 32k + l (h<2, k<4, l<32) = bits 2k..2k+1 of qs[32h + l];
//               x = (d * sc) * q - dmin * m
//   Q3_K (110): u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
//               16 sub-blocks of 16, 6-bit signed scales (see Q3Scales); low two bits as Q2_K;
//               element 32b + l's third bit is bit b of hmask[l], and a CLEAR bit subtracts 4;
//               x = (d * (sc - 32)) * q
//   Q4_K (144): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//               8 sub-blocks of 32 with 6-bit sc and m (see KScaleMin);
//               element 64c + 32k + l (c<4, k<2, l<32) = nibble k of qs[32c + l];
//               x = (d * sc) * q - dmin * m
//   Q5_K (176): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//               as Q4_K plus a fifth bit: element 32b + l takes bit b of qh[l]
//   Q6_K (210): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//               16 sub-blocks of 16; element 128h + 64k + l (k<2, l<64) low nibble = nibble k of
//               ql[64h + l]; element 128h + 32k + l (k<4, l<32) high two bits = bits 2k.. of
//               qh[32h + l]; x = (d * scale) * (q - 32)
constexpr int64_t kQ2Bytes = 84;
constexpr int64_t kQ3Bytes = 110;
constexpr int64_t kQ4Bytes = 144;
constexpr int64_t kQ5Bytes = 176;
constexpr int64_t kQ6Bytes = 210;

// Q3_K: sixteen 6-bit scales. Low nibble: bytes 0..7 (scale i < 8 low half of byte i, i >= 8 high
// half of byte i - 8); top two bits: bits 2(i / 4).. of byte 8 + i % 4. Stored with a +32 bias.
int Q3Scale(const uint8_t *s, int i) {
  const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---- Q2_K ----

void DequantizeQ2_K(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ2Bytes, dst += kQK) {
    const uint8_t *scales = b;
    const uint8_t *qs = b + 16;
    const float d = HalfToFloat(LoadU16(b + 80));
    const float dmin = HalfToFloat(LoadU16(b + 82));
    for (int e = 0; e < kQK; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const int q = (qs[32 * h + l] >> (2 * k)) & 3;
      const uint8_t s = scales[e / 16];
      const float dl = d * static_cast<float>(s & 0x0f);
      const float ml = dmin * static_cast<float>(s >> 4);
      const float p = dl * static_cast<float>(q);
      dst[e] = p - ml;
    }
  }
}

// ---- Q3_K ----

void DequantizeQ3_K(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ3Bytes, dst += kQK) {
    const uint8_t *hmask = b;
    const uint8_t *qs = b + 32;
    const uint8_t *scales = b + 96;
    const float d = HalfToFloat(LoadU16(b + 108));
    float dl[16];
    for (int s = 0; s < 16; ++s) dl[s] = d * static_cast<float>(Q3Scale(scales, s));
    for (int e = 0; e < kQK; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const int lo = (qs[32 * h + l] >> (2 * k)) & 3;
      const int hbit = (hmask[l] >> (e / 32)) & 1;
      const int q = lo - (hbit ? 0 : 4);
      dst[e] = dl[e / 16] * static_cast<float>(q);
    }
  }
}

// ---- Q4_K ----

void DequantizeQ4_K(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const float dmin = HalfToFloat(LoadU16(b + 2));
    const uint8_t *scales = b + 4;
    const uint8_t *qs = b + 16;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      internal::KScaleMin(scales, j, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t *q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const float p = dl * static_cast<float>((q[l] >> shift) & 0x0f);
        dst[32 * j + l] = p - ml;
      }
    }
  }
}

// ---- Q5_K ----

void DequantizeQ5_K(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const float dmin = HalfToFloat(LoadU16(b + 2));
    const uint8_t *scales = b + 4;
    const uint8_t *qh = b + 16;
    const uint8_t *qs = b + 48;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      internal::KScaleMin(scales, j, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t *q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int code = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
        const float p = dl * static_cast<float>(code);
        dst[32 * j + l] = p - ml;
      }
    }
  }
}

// ---- Q6_K ----

void DequantizeQ6_K(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ6Bytes, dst += kQK) {
    const uint8_t *ql = b;
    const uint8_t *qh = b + 128;
    const auto *scales = reinterpret_cast<const int8_t *>(b + 192);
    const float d = HalfToFloat(LoadU16(b + 208));
    for (int e = 0; e < kQK; ++e) {
      const int h = e / 128, r = e % 128;
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const float dl = d * static_cast<float>(scales[e / 16]);
      dst[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

float DotQ2_K(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ2_K, kQK, kQ2Bytes, row, x, n);
}
float DotQ3_K(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ3_K, kQK, kQ3Bytes, row, x, n);
}
float DotQ4_K(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ4_K, kQK, kQ4Bytes, row, x, n);
}
float DotQ5_K(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ5_K, kQK, kQ5Bytes, row, x, n);
}
float DotQ6_K(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ6_K, kQK, kQ6Bytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecQ2_K = {TypeId::kQ2_K, "Q2_K", kQK, kQ2Bytes, &DequantizeQ2_K, &QuantizeQ2_K, &DotQ2_K,
                          &QuantizeQ2_KWeighted};
const Codec kCodecQ3_K = {TypeId::kQ3_K, "Q3_K", kQK, kQ3Bytes, &DequantizeQ3_K, &QuantizeQ3_K, &DotQ3_K,
                          &QuantizeQ3_KWeighted};
const Codec kCodecQ4_K = {TypeId::kQ4_K, "Q4_K", kQK, kQ4Bytes, &DequantizeQ4_K, &QuantizeQ4_K, &DotQ4_K,
                          &QuantizeQ4_KWeighted};
const Codec kCodecQ5_K = {TypeId::kQ5_K, "Q5_K", kQK, kQ5Bytes, &DequantizeQ5_K, &QuantizeQ5_K, &DotQ5_K,
                          &QuantizeQ5_KWeighted};
const Codec kCodecQ6_K = {TypeId::kQ6_K, "Q6_K", kQK, kQ6Bytes, &DequantizeQ6_K, &QuantizeQ6_K, &DotQ6_K,
                          &QuantizeQ6_KWeighted};
}  // namespace internal

}  // namespace strata::quant
