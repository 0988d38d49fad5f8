// The 32-element "legacy" GGUF codecs Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. Dequantization and quantization
// follow the gguf Python package (gguf.quants) operation by operation, in float32 with each multiply
// and add rounded separately, so both directions are bit-identical to it (tests/quant fixtures).
#include <cmath>
#include <cstdint>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fit.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

using internal::LoadU16;
using internal::LoadU32;
using internal::StoreU16;

constexpr int64_t kQK = 32;  // elements per block

// Byte layouts (little-endian, no padding):
//   Q4_0 (18): f16 d | u8 qs[16]           x = d * (q - 8)
//   Q4_1 (20): f16 d | f16 m | u8 qs[16]   x = d * q + m
//   Q5_0 (22): f16 d | u32 qh | u8 qs[16]  x = d * (q - 16)
//   Q5_1 (24): f16 d | f16 m | u32 qh | u8 qs[16]  x = d * q + m
//   Q8_0 (34): f16 d | i8 qs[32]           x = q * d
// Nibbles: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble. Q5 adds the
// fifth bit of element i as bit i of qh.
constexpr int64_t kQ4_0Bytes = 18;
constexpr int64_t kQ4_1Bytes = 20;
constexpr int64_t kQ5_0Bytes = 22;
constexpr int64_t kQ5_1Bytes = 24;
constexpr int64_t kQ8_0Bytes = 34;

// float -> integer code for a quantizer: the truncated value clamped to [lo, hi]. Finite inputs
// only ever need the clamp at the top (gguf clips after the cast); NaN maps to lo instead of UB.
int ClampTrunc(float t, int lo, int hi) {
  if (!(t >= static_cast<float>(lo))) return lo;
  if (t >= static_cast<float>(hi)) return hi;
  return static_cast<int>(t);
}

// The element of largest magnitude, keeping its sign; the first one on ties (numpy's argmax).
float SignedAbsMax(const float *x) {
  float amax = std::fabs(x[0]), max = x[0];  // from x[0]: an all-zero block keeps x[0]'s sign
  for (int64_t j = 1; j < kQK; ++j) {
    const float a = std::fabs(x[j]);
    if (a > amax) {
      amax = a;
      max = x[j];
    }
  }
  return max;
}

void MinMax(const float *x, float *mn, float *mx) {
  float lo = x[0], hi = x[0];
  for (int64_t j = 1; j < kQK; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  *mn = lo;
  *mx = hi;
}

// ---- weighted quantization, shared ----
//
// ggml's weighted legacy quantizers weigh element i of a row by qw[i] * sqrt(sigma2 + x[i]^2), with
// sigma2 the mean square of the WHOLE ROW (so the result depends on where rows end), then fit each
// block with the searches of fit.h.

float RowSigma2(const float *x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s / static_cast<float>(n);
}

void BlockWeights(const float *x, const float *qw, float sigma2, float *w) {
  for (int64_t j = 0; j < kQK; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// Symmetric types (Q4_0: nmax 8, Q5_0: nmax 16): d and codes 0..2 nmax - 1 of one block.
float FitSignedBlock(const float *x, const float *qw, float sigma2, int nmax, int *q) {
  float w[kQK];
  int8_t codes[kQK];
  BlockWeights(x, qw, sigma2, w);
  const float d = internal::FitSigned(static_cast<int>(kQK), nmax, x, w, codes);
  for (int64_t j = 0; j < kQK; ++j) q[j] = codes[j];
  return d;
}

// Affine types (Q4_1: nmax 15, Q5_1: nmax 31): d, the offset m (x ~ d q + m) and codes.
float FitAffineBlock(const float *x, const float *qw, float sigma2, int nmax, float *m, int *q) {
  float w[kQK];
  uint8_t codes[kQK], scratch[kQK];
  BlockWeights(x, qw, sigma2, w);
  float neg_min;
  const float d = internal::FitAffine(static_cast<int>(kQK), nmax, x, w, codes, &neg_min, scratch,
                                      {-0.9f, 0.05f, 36, false});
  *m = -neg_min;
  for (int64_t j = 0; j < kQK; ++j) q[j] = codes[j];
  return d;
}

void PackNibbles(const int *q, uint8_t *qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

// ---- Q4_0 ----

void DequantizeQ4_0(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_0Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

// gguf: d = max / -8 with max the signed extreme, q = min(15, trunc(x / d + 8.5)).
void QuantizeQ4_0(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_0Bytes, src += kQK) {
    const float d = SignedAbsMax(src) / -8.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    StoreU16(b, FloatToHalf(d));
    for (int j = 0; j < 16; ++j) {
      const int q0 = ClampTrunc(src[j] * id + 8.5f, 0, 15);
      const int q1 = ClampTrunc(src[j + 16] * id + 8.5f, 0, 15);
      b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeQ4_0Weighted(const float *src, void *dst, int64_t n, const float *weights) {
  const float sigma2 = RowSigma2(src, n);
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_0Bytes) {
    int q[kQK];
    StoreU16(b, FloatToHalf(FitSignedBlock(src + i, weights + i, sigma2, 8, q)));
    PackNibbles(q, b + 2);
  }
}

float DotQ4_0(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ4_0, kQK, kQ4_0Bytes, row, x, n);
}

// ---- Q4_1 ----

void DequantizeQ4_1(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_1Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const float m = HalfToFloat(LoadU16(b + 2));
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      const float p0 = d * static_cast<float>(qs[j] & 0x0f);
      const float p1 = d * static_cast<float>(qs[j] >> 4);
      dst[j] = p0 + m;
      dst[j + 16] = p1 + m;
    }
  }
}

// gguf: d = (max - min) / 15, q = min(15, trunc((x - min) / d + 0.5)), m = min.
void QuantizeQ4_1(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_1Bytes, src += kQK) {
    float mn, mx;
    MinMax(src, &mn, &mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    StoreU16(b, FloatToHalf(d));
    StoreU16(b + 2, FloatToHalf(mn));
    for (int j = 0; j < 16; ++j) {
      const int q0 = ClampTrunc((src[j] - mn) * id + 0.5f, 0, 15);
      const int q1 = ClampTrunc((src[j + 16] - mn) * id + 0.5f, 0, 15);
      b[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeQ4_1Weighted(const float *src, void *dst, int64_t n, const float *weights) {
  const float sigma2 = RowSigma2(src, n);
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4_1Bytes) {
    int q[kQK];
    float m;
    StoreU16(b, FloatToHalf(FitAffineBlock(src + i, weights + i, sigma2, 15, &m, q)));
    StoreU16(b + 2, FloatToHalf(m));
    PackNibbles(q, b + 4);
  }
}

float DotQ4_1(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ4_1, kQK, kQ4_1Bytes, row, x, n);
}

// ---- Q5_0 / Q5_1 shared packing ----

int Q5Code(const uint8_t *qs, uint32_t qh, int j) {
  const int lo = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
  return lo | static_cast<int>(((qh >> j) & 1u) << 4);
}

void PackQ5(const int *q, uint8_t *qh_out, uint8_t *qs) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
  for (int k = 0; k < 4; ++k) qh_out[k] = static_cast<uint8_t>(qh >> (8 * k));
}

// ---- Q5_0 ----

void DequantizeQ5_0(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_0Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const uint32_t qh = LoadU32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(Q5Code(qs, qh, j) - 16);
  }
}

// gguf: d = max / -16, q = min(31, trunc(x / d + 16.5)).
void QuantizeQ5_0(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_0Bytes, src += kQK) {
    const float d = SignedAbsMax(src) / -16.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    StoreU16(b, FloatToHalf(d));
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = ClampTrunc(src[j] * id + 16.5f, 0, 31);
    PackQ5(q, b + 2, b + 6);
  }
}

void QuantizeQ5_0Weighted(const float *src, void *dst, int64_t n, const float *weights) {
  const float sigma2 = RowSigma2(src, n);
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_0Bytes) {
    int q[kQK];
    StoreU16(b, FloatToHalf(FitSignedBlock(src + i, weights + i, sigma2, 16, q)));
    PackQ5(q, b + 2, b + 6);
  }
}

float DotQ5_0(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ5_0, kQK, kQ5_0Bytes, row, x, n);
}

// ---- Q5_1 ----

void DequantizeQ5_1(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_1Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const float m = HalfToFloat(LoadU16(b + 2));
    const uint32_t qh = LoadU32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < kQK; ++j) {
      const float p = d * static_cast<float>(Q5Code(qs, qh, j));
      dst[j] = p + m;
    }
  }
}

// gguf: d = (max - min) / 31, q = min(31, trunc((x - min) / d + 0.5)), m = min.
void QuantizeQ5_1(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_1Bytes, src += kQK) {
    float mn, mx;
    MinMax(src, &mn, &mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    StoreU16(b, FloatToHalf(d));
    StoreU16(b + 2, FloatToHalf(mn));
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = ClampTrunc((src[j] - mn) * id + 0.5f, 0, 31);
    PackQ5(q, b + 4, b + 8);
  }
}

void QuantizeQ5_1Weighted(const float *src, void *dst, int64_t n, const float *weights) {
  const float sigma2 = RowSigma2(src, n);
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5_1Bytes) {
    int q[kQK];
    float m;
    StoreU16(b, FloatToHalf(FitAffineBlock(src + i, weights + i, sigma2, 31, &m, q)));
    StoreU16(b + 2, FloatToHalf(m));
    PackQ5(q, b + 4, b + 8);
  }
}

float DotQ5_1(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ5_1, kQK, kQ5_1Bytes, row, x, n);
}

// ---- Q8_0 ----

void DequantizeQ8_0(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kQK, b += kQ8_0Bytes, dst += kQK) {
    const float d = HalfToFloat(LoadU16(b));
    const auto *qs = reinterpret_cast<const int8_t *>(b + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

// gguf (and ggml's reference): d = amax / 127, q = round-half-away(x / d) computed as x * (1/d).
// std::round is round-half-away-from-zero, exactly gguf's np_roundf on finite floats.
void QuantizeQ8_0(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ8_0Bytes, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    StoreU16(b, FloatToHalf(d));
    for (int j = 0; j < kQK; ++j) {
      const float r = std::round(src[j] * id);
      // NaN (from a non-finite input) gives 0, as ggml's x86 build's conversion does.
      const int q = r >= 127.0f ? 127 : (r <= -127.0f ? -127 : (r == r ? static_cast<int>(r) : 0));
      b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

float DotQ8_0(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeQ8_0, kQK, kQ8_0Bytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecQ4_0 = {TypeId::kQ4_0, "Q4_0", kQK, kQ4_0Bytes,
                          &DequantizeQ4_0, &QuantizeQ4_0, &DotQ4_0, &QuantizeQ4_0Weighted};
const Codec kCodecQ4_1 = {TypeId::kQ4_1, "Q4_1", kQK, kQ4_1Bytes,
                          &DequantizeQ4_1, &QuantizeQ4_1, &DotQ4_1, &QuantizeQ4_1Weighted};
const Codec kCodecQ5_0 = {TypeId::kQ5_0, "Q5_0", kQK, kQ5_0Bytes,
                          &DequantizeQ5_0, &QuantizeQ5_0, &DotQ5_0, &QuantizeQ5_0Weighted};
const Codec kCodecQ5_1 = {TypeId::kQ5_1, "Q5_1", kQK, kQ5_1Bytes,
                          &DequantizeQ5_1, &QuantizeQ5_1, &DotQ5_1, &QuantizeQ5_1Weighted};
const Codec kCodecQ8_0 = {TypeId::kQ8_0, "Q8_0", kQK, kQ8_0Bytes,
                          &DequantizeQ8_0, &QuantizeQ8_0, &DotQ8_0,
                          nullptr};  // ggml ignores importance weights for Q8_0
}  // namespace internal

}  // namespace strata::quant
