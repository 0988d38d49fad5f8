// The 256-element "k-quant" GGUF codecs Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Dequantization follows the
// gguf Python package operation by operation in float32 (sub-block scale d * sc first, then times
// the code, then minus dmin * m), so it is bit-identical to it. The Q4_K/Q5_K/Q6_K quantizers are
// Strata's own (gguf has none): least-squares fits per sub-block; bounds are in codec_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

using internal::LoadU16;
using internal::StoreU16;

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

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes. For j < 4 they are the low
// six bits of bytes j and j + 4; for j >= 4 the low nibble comes from byte j + 4 (scale: low half,
// min: high half) and the top two bits from the spare top bits of bytes j - 4 and j.
void KScaleMin(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 0x3f;
    *m = s[j + 4] & 0x3f;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

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
      KScaleMin(scales, j, &sc, &m);
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
      KScaleMin(scales, j, &sc, &m);
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

// ---- Quantizers (Q4_K, Q5_K, Q6_K) ----
//
// Two levels, as the formats dictate: first each sub-block gets the real-valued scale (and min)
// that minimizes its squared error, searched over a few candidate grids and refined by least
// squares with the codes held fixed; then those scales are themselves quantized (6 or 8 bits
// against an f16 super-block scale) and every code is recomputed against the scale actually
// stored, so what dequantize reproduces is exactly what was fitted last. Non-finite inputs give
// unspecified codes but never undefined behaviour.

constexpr float kMaxHalf = 65504.0f;

// round(v) clamped to [lo, hi]; NaN gives lo.
int ClampRound(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// A scale that fits in f16 (stored fields saturate rather than becoming inf) and its stored value.
float StoreScale(float v, uint8_t *field) {
  const uint16_t h = FloatToHalf(std::min(v, kMaxHalf));
  StoreU16(field, h);
  return HalfToFloat(h);
}

// Symmetric fit: the scale s minimizing sum (x - s*q)^2 with q = clamp(round(x/s), lo, hi).
// Candidates map the signed extreme onto codes near lo or near hi; each is refined once by least
// squares (s = sum xq / sum qq) with its codes fixed.
float FitSymmetric(const float *x, int n, int lo, int hi) {
  float amax = 0.0f, ext = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      ext = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  auto sse = [&](float s) {
    double e = 0.0;
    for (int i = 0; i < n; ++i) {
      const double r = x[i] - static_cast<double>(s) * ClampRound(x[i] / s, lo, hi);
      e += r * r;
    }
    return e;
  };
  float best = ext / static_cast<float>(lo);
  double best_err = sse(best);
  for (int t = 0; t <= 16; ++t) {
    for (float target : {static_cast<float>(lo) + 0.25f * t, static_cast<float>(hi) - 0.25f * t}) {
      float s = ext / target;
      double sxq = 0.0, sqq = 0.0;
      for (int i = 0; i < n; ++i) {
        const int q = ClampRound(x[i] / s, lo, hi);
        sxq += static_cast<double>(x[i]) * q;
        sqq += static_cast<double>(q) * q;
      }
      for (float cand : {s, sqq > 0 ? static_cast<float>(sxq / sqq) : s}) {
        if (!(cand != 0.0f) || !std::isfinite(cand)) continue;
        const double e = sse(cand);
        if (e < best_err) {
          best_err = e;
          best = cand;
        }
      }
    }
  }
  return best;
}

// Affine fit for x ~ a*q - b with q in [0, qmax], a >= 0, b >= 0 (the formats store the offset as
// a subtracted non-negative min, so a block above zero is fitted with b = 0).
void FitAffine(const float *x, int n, int qmax, float *a_out, float *b_out) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  mn = std::min(mn, 0.0f);
  if (!(mx > mn)) {  // constant non-positive block (or NaN): all codes 0
    *a_out = 0.0f;
    *b_out = -mn;
    return;
  }
  auto sse = [&](float a, float b) {
    double e = 0.0;
    for (int i = 0; i < n; ++i) {
      const double r = x[i] - (static_cast<double>(a) * ClampRound((x[i] + b) / a, 0, qmax) - b);
      e += r * r;
    }
    return e;
  };
  float best_a = (mx - mn) / static_cast<float>(qmax), best_b = -mn;
  double best_err = sse(best_a, best_b);
  for (int t = -4; t <= 8; ++t) {
    const float a0 = (mx - mn) / (static_cast<float>(qmax) + 0.125f * t);
    const float b0 = -mn;
    // Least squares for (a, b) with the codes of (a0, b0) fixed: minimize sum (a q - b - x)^2.
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      const int q = ClampRound((x[i] + b0) / a0, 0, qmax);
      sq += q;
      sqq += static_cast<double>(q) * q;
      sx += x[i];
      sxq += static_cast<double>(x[i]) * q;
    }
    const double det = n * sqq - sq * sq;
    float a1 = a0, b1 = b0;
    if (det > 0) {
      a1 = static_cast<float>((n * sxq - sq * sx) / det);
      b1 = static_cast<float>(-(sqq * sx - sq * sxq) / det);
      if (b1 < 0.0f) {  // a positive offset is not representable: refit the scale alone
        b1 = 0.0f;
        a1 = sqq > 0 ? static_cast<float>(sxq / sqq) : a0;
      }
    }
    for (auto [a, b] : {std::pair<float, float>{a0, b0}, std::pair<float, float>{a1, b1}}) {
      if (!(a > 0.0f) || !std::isfinite(a) || !std::isfinite(b)) continue;
      const double e = sse(a, b);
      if (e < best_err) {
        best_err = e;
        best_a = a;
        best_b = b;
      }
    }
  }
  *a_out = best_a;
  *b_out = best_b;
}

// Inverse of KScaleMin.
void PackKScaleMin(const int *sc, const int *m, uint8_t *s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 0x3f) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 0x3f) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// Shared by Q4_K (qmax 15) and Q5_K (qmax 31): fills d, dmin, the packed scales and the codes
// q[256] of one super-block.
void QuantizeKAffine(const float *x, int qmax, uint8_t *d_field, uint8_t *dmin_field,
                     uint8_t *scales, int *q) {
  float a[8], b[8];
  float amax = 0.0f, bmax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    FitAffine(x + 32 * j, 32, qmax, &a[j], &b[j]);
    amax = std::max(amax, a[j]);
    bmax = std::max(bmax, b[j]);
  }
  const float d = StoreScale(amax / 63.0f, d_field);
  const float dmin = StoreScale(bmax / 63.0f, dmin_field);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.0f ? ClampRound(a[j] / d, 0, 63) : 0;
    m[j] = dmin > 0.0f ? ClampRound(b[j] / dmin, 0, 63) : 0;
    // The codes are recomputed against the scale and min exactly as dequantize will form them.
    const float dl = d * static_cast<float>(sc[j]);
    const float ml = dmin * static_cast<float>(m[j]);
    for (int l = 0; l < 32; ++l) {
      q[32 * j + l] = dl > 0.0f ? ClampRound((x[32 * j + l] + ml) / dl, 0, qmax) : 0;
    }
  }
  PackKScaleMin(sc, m, scales);
}

void QuantizeQ4_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4Bytes, src += kQK) {
    int q[kQK];
    QuantizeKAffine(src, 15, b, b + 2, b + 4, q);
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

void QuantizeQ5_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5Bytes, src += kQK) {
    int q[kQK];
    QuantizeKAffine(src, 31, b, b + 2, b + 4, q);
    uint8_t *qh = b + 16;
    uint8_t *qs = b + 48;
    for (int l = 0; l < 32; ++l) {
      int h = 0;
      for (int j = 0; j < 8; ++j) h |= (q[32 * j + l] >> 4) << j;
      qh[l] = static_cast<uint8_t>(h);
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        qs[32 * c + l] =
            static_cast<uint8_t>((q[64 * c + l] & 0x0f) | ((q[64 * c + 32 + l] & 0x0f) << 4));
      }
    }
  }
}

void QuantizeQ6_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ6Bytes, src += kQK) {
    float s[16];
    float smax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      s[j] = FitSymmetric(src + 16 * j, 16, -32, 31);
      smax = std::max(smax, std::fabs(s[j]));
    }
    const float d = StoreScale(smax / 127.0f, b + 208);
    auto *scales = reinterpret_cast<int8_t *>(b + 192);
    int q[kQK];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0.0f ? ClampRound(s[j] / d, -127, 127) : 0;
      scales[j] = static_cast<int8_t>(sc);
      const float dl = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        q[16 * j + l] = (dl != 0.0f ? ClampRound(src[16 * j + l] / dl, -32, 31) : 0) + 32;
      }
    }
    uint8_t *ql = b;
    uint8_t *qh = b + 128;
    for (int h = 0; h < 2; ++h) {
      const int *qq = q + 128 * h;
      for (int l = 0; l < 64; ++l) {
        ql[64 * h + l] = static_cast<uint8_t>((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
      }
      for (int l = 0; l < 32; ++l) {
        qh[32 * h + l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                              ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
      }
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
const Codec kCodecQ2_K = {TypeId::kQ2_K, "Q2_K", kQK, kQ2Bytes, &DequantizeQ2_K, nullptr, &DotQ2_K};
const Codec kCodecQ3_K = {TypeId::kQ3_K, "Q3_K", kQK, kQ3Bytes, &DequantizeQ3_K, nullptr, &DotQ3_K};
const Codec kCodecQ4_K = {TypeId::kQ4_K, "Q4_K", kQK, kQ4Bytes, &DequantizeQ4_K, &QuantizeQ4_K, &DotQ4_K};
const Codec kCodecQ5_K = {TypeId::kQ5_K, "Q5_K", kQK, kQ5Bytes, &DequantizeQ5_K, &QuantizeQ5_K, &DotQ5_K};
const Codec kCodecQ6_K = {TypeId::kQ6_K, "Q6_K", kQK, kQ6Bytes, &DequantizeQ6_K, &QuantizeQ6_K, &DotQ6_K};
}  // namespace internal

}  // namespace strata::quant
