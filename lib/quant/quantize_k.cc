// Quantizers of the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, byte-identical to ggml's: without
// weights its reference quantizers, with importance weights its weighted ones (a different search,
// not the same one reweighted). Both levels follow ggml: sub-block scales (and mins) are fitted
// first, then quantized against an f16 super-block scale, and every code is recomputed against the
// scale actually stored. Layouts are in codecs_k.cc; the searches in fit.h.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fit.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant::internal {
namespace {

constexpr int kQK = 256;
constexpr int64_t kQ2Bytes = 84, kQ3Bytes = 110, kQ4Bytes = 144, kQ5Bytes = 176, kQ6Bytes = 210;

int Clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Stores v as the f16 field at p and returns the value stored.
float StoreHalf(uint8_t *p, float v) {
  const uint16_t h = FloatToHalf(v);
  StoreU16(p, h);
  return HalfToFloat(h);
}

// Sum of x^2 over one super-block, in index order.
float SumSquares(const float *x, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

// The importance of each element under an imatrix column weight: qw * sqrt(sigma2 + x^2).
void ImportanceWeights(const float *qw, const float *x, int n, float sigma2, float *w) {
  for (int i = 0; i < n; ++i) w[i] = qw[i] * std::sqrt(sigma2 + x[i] * x[i]);
}

float Sum(const float *w, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += w[i];
  return s;
}

// Q2_K / Q3_K low two bits: element 128h + 32k + l is bits 2k.. of qs[32h + l].
void Pack2Bit(const uint8_t *codes, uint8_t *qs) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t *c = codes + 128 * h;
    for (int l = 0; l < 32; ++l) {
      qs[32 * h + l] = static_cast<uint8_t>(c[l] | (c[l + 32] << 2) | (c[l + 64] << 4) | (c[l + 96] << 6));
    }
  }
}

// ---- Q2_K: f16 d, dmin; 16 sub-blocks with 4-bit scale and min; codes 0..3 ----

// Recomputes the codes of every sub-block whose stored scale is non-zero (the others keep the
// codes of their fit), then packs them.
void FinishQ2_K(const float *x, float d, float dmin, uint8_t *b, uint8_t *codes) {
  const uint8_t *scales = b;
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(scales[j] & 0x0f);
    if (dl == 0.0f) continue;
    const float ml = dmin * static_cast<float>(scales[j] >> 4);
    for (int i = 0; i < 16; ++i) {
      codes[16 * j + i] = static_cast<uint8_t>(Clamp(NearestInt((x[16 * j + i] + ml) / dl), 0, 3));
    }
  }
  Pack2Bit(codes, b + 16);
}

void QuantizeBlockQ2_K(const float *x, uint8_t *b) {
  uint8_t codes[kQK], scratch[16];
  float w[16], scale[16], neg_min[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 16; ++j) {
    for (int i = 0; i < 16; ++i) w[i] = std::fabs(x[16 * j + i]);
    scale[j] = FitAffine(16, 3, x + 16 * j, w, codes + 16 * j, &neg_min[j], scratch, {-0.5f, 0.1f, 15, true});
    if (scale[j] > max_scale) max_scale = scale[j];
    if (neg_min[j] > max_min) max_min = neg_min[j];
  }
  uint8_t *scales = b;
  float d = 0.0f, dmin = 0.0f;
  if (max_scale > 0.0f) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) scales[j] = static_cast<uint8_t>(NearestInt(iscale * scale[j]));
    d = StoreHalf(b + 80, max_scale / 15.0f);
  } else {
    std::memset(scales, 0, 16);
    d = StoreHalf(b + 80, 0.0f);
  }
  if (max_min > 0.0f) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < 16; ++j) scales[j] = static_cast<uint8_t>(scales[j] | (NearestInt(iscale * neg_min[j]) << 4));
    dmin = StoreHalf(b + 82, max_min / 15.0f);
  } else {
    dmin = StoreHalf(b + 82, 0.0f);
  }
  FinishQ2_K(x, d, dmin, b, codes);
}

void QuantizeBlockQ2_KWeighted(const float *x, uint8_t *b, const float *qw) {
  uint8_t codes[kQK], scratch[16], ls[16], lm[16];
  float w[16], scale[16], neg_min[16], sw[16];
  const float sigma2 = SumSquares(x, kQK) / static_cast<float>(kQK);
  for (int j = 0; j < 16; ++j) {
    ImportanceWeights(qw + 16 * j, x + 16 * j, 16, sigma2, w);
    sw[j] = Sum(w, 16);
    scale[j] = FitAffine(16, 3, x + 16 * j, w, codes + 16 * j, &neg_min[j], scratch, {-0.9f, 0.05f, 36, false});
  }
  const float dm = FitUnsigned(16, 15, scale, ls, sw);
  const float mm = FitUnsigned(16, 15, neg_min, lm, sw);
  const float d = StoreHalf(b + 80, dm);
  const float dmin = StoreHalf(b + 82, mm);
  for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>(ls[j] | (lm[j] << 4));
  FinishQ2_K(x, d, dmin, b, codes);
}

// ---- Q3_K: f16 d; 16 sub-blocks with signed 6-bit scales; codes -4..3 ----

// Packs sixteen biased 6-bit scales (see Q3Scale in codecs_k.cc).
void PackQ3Scales(const int *biased, uint8_t *s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 16; ++j) {
    const int l = biased[j];
    if (j < 8) {
      s[j] = static_cast<uint8_t>(l & 0x0f);
    } else {
      s[j - 8] = static_cast<uint8_t>(s[j - 8] | ((l & 0x0f) << 4));
    }
    s[8 + j % 4] = static_cast<uint8_t>(s[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
  }
}

// Recomputes the codes against the stored scales (sub-blocks whose scale is zero keep their fit's
// codes), then writes hmask (the third bit) and the low two bits.
void FinishQ3_K(const float *x, uint8_t *b, int8_t *codes) {
  const uint8_t *s = b + 96;
  const float d = HalfToFloat(LoadU16(b + 108));
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int sc = (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    const float dl = d * static_cast<float>(static_cast<int8_t>(sc));
    if (dl == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      codes[16 * j + i] = static_cast<int8_t>(Clamp(NearestInt(x[16 * j + i] / dl), -4, 3) + 4);
    }
  }
  uint8_t *hmask = b;
  std::memset(hmask, 0, 32);
  uint8_t low[kQK];
  for (int e = 0; e < kQK; ++e) {
    int c = codes[e];
    if (c > 3) {
      hmask[e % 32] = static_cast<uint8_t>(hmask[e % 32] | (1 << (e / 32)));
      c -= 4;
    }
    low[e] = static_cast<uint8_t>(c);
  }
  Pack2Bit(low, b + 32);
}

void QuantizeBlockQ3_K(const float *x, uint8_t *b) {
  int8_t codes[kQK];
  float scale[16];
  float max_scale = 0.0f, amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scale[j] = FitSignedByPasses(16, 4, x + 16 * j, codes + 16 * j);
    if (std::fabs(scale[j]) > amax) {
      amax = std::fabs(scale[j]);
      max_scale = scale[j];
    }
  }
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    int biased[16];
    for (int j = 0; j < 16; ++j) {
      const int l = static_cast<int8_t>(NearestInt(iscale * scale[j]));  // ggml keeps it in an int8
      biased[j] = Clamp(l, -32, 31) + 32;
    }
    PackQ3Scales(biased, b + 96);
    StoreHalf(b + 108, 1.0f / iscale);
  } else {
    std::memset(b + 96, 0, 12);
    StoreHalf(b + 108, 0.0f);
  }
  FinishQ3_K(x, b, codes);
}

void QuantizeBlockQ3_KWeighted(const float *x, uint8_t *b, const float *qw) {
  int8_t codes[kQK], ls[16];
  float w[16], scale[16], sw[16];
  const float sigma2 = 2.0f * SumSquares(x, kQK) / static_cast<float>(kQK);
  for (int j = 0; j < 16; ++j) {
    ImportanceWeights(qw + 16 * j, x + 16 * j, 16, sigma2, w);
    sw[j] = Sum(w, 16);
    scale[j] = FitSigned(16, 4, x + 16 * j, w, codes + 16 * j);
  }
  const float d_block = FitSigned(16, 32, scale, sw, ls);
  int biased[16];
  for (int j = 0; j < 16; ++j) biased[j] = ls[j];
  PackQ3Scales(biased, b + 96);
  StoreHalf(b + 108, d_block);
  FinishQ3_K(x, b, codes);
}

// ---- Q4_K / Q5_K: f16 d, dmin; 8 sub-blocks of 32 with 6-bit scale and min ----

// Inverse of KScaleMin (codec_impl.h): for j < 4 the low six bits of bytes j (scale) and j + 4
// (min); for j >= 4 the low nibbles in byte j + 4 and the top two bits in the spare top bits of
// bytes j - 4 (scale) and j (min).
void PackKScaleMin(const uint8_t *ls, const uint8_t *lm, uint8_t *s) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
      s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((ls[j] >> 4) << 6));
      s[j] = static_cast<uint8_t>(s[j] | ((lm[j] >> 4) << 6));
    }
  }
}

// Recomputes the codes (0..qmax) against the stored d, dmin and 6-bit scales and mins; sub-blocks
// whose scale is zero keep their fit's codes.
void RequantizeK(const float *x, const uint8_t *b, int qmax, uint8_t *codes) {
  const float d = HalfToFloat(LoadU16(b));
  const float dmin = HalfToFloat(LoadU16(b + 2));
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    KScaleMin(b + 4, j, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    if (dl == 0.0f) continue;
    const float ml = dmin * static_cast<float>(m);
    for (int i = 0; i < 32; ++i) {
      codes[32 * j + i] = static_cast<uint8_t>(Clamp(NearestInt((x[32 * j + i] + ml) / dl), 0, qmax));
    }
  }
}

// The reference (unweighted) scale fit of Q4_K and Q5_K.
void FitKAffine(const float *x, uint8_t *b, int qmax, const AffineSearch &search, uint8_t *codes) {
  uint8_t scratch[32];
  float w[32], scale[8], neg_min[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float *xs = x + 32 * j;
    const float av_x = std::sqrt(SumSquares(xs, 32) / 32.0f);
    for (int i = 0; i < 32; ++i) w[i] = av_x + std::fabs(xs[i]);
    scale[j] = FitAffine(32, qmax, xs, w, codes + 32 * j, &neg_min[j], scratch, search);
    if (scale[j] > max_scale) max_scale = scale[j];
    if (neg_min[j] > max_min) max_min = neg_min[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // ggml stores the rounded value in a byte before clamping it to 63.
    const auto s = static_cast<uint8_t>(NearestInt(inv_scale * scale[j]));
    const auto m = static_cast<uint8_t>(NearestInt(inv_min * neg_min[j]));
    ls[j] = s < 63 ? s : 63;
    lm[j] = m < 63 ? m : 63;
  }
  PackKScaleMin(ls, lm, b + 4);
  StoreHalf(b, max_scale / 63.0f);
  StoreHalf(b + 2, max_min / 63.0f);
  RequantizeK(x, b, qmax, codes);
}

// The weighted scale fit of Q4_K and Q5_K. Q5_K clamps the 6-bit codes to 63, Q4_K stores them as
// they come (they only exceed 63 for a negative sub-block scale).
void FitKAffineWeighted(const float *x, uint8_t *b, int qmax, const float *qw, bool clamp, uint8_t *codes) {
  uint8_t scratch[32], ls[8], lm[8];
  float w[32], scale[8], neg_min[8], sw[8];
  const float sigma2 = 2.0f * SumSquares(x, kQK) / static_cast<float>(kQK);
  for (int j = 0; j < 8; ++j) {
    ImportanceWeights(qw + 32 * j, x + 32 * j, 32, sigma2, w);
    sw[j] = Sum(w, 32);
    scale[j] = FitAffine(32, qmax, x + 32 * j, w, codes + 32 * j, &neg_min[j], scratch, {-0.9f, 0.05f, 36, false});
  }
  const float d_block = FitUnsigned(8, 63, scale, ls, sw);
  const float m_block = FitUnsigned(8, 63, neg_min, lm, sw);
  if (clamp) {
    for (int j = 0; j < 8; ++j) {
      ls[j] = ls[j] < 63 ? ls[j] : 63;
      lm[j] = lm[j] < 63 ? lm[j] : 63;
    }
  }
  PackKScaleMin(ls, lm, b + 4);
  StoreHalf(b, d_block);
  StoreHalf(b + 2, m_block);
  RequantizeK(x, b, qmax, codes);
}

// Q4_K codes: element 64c + 32k + l is nibble k of qs[32c + l].
void PackQ4_K(const uint8_t *codes, uint8_t *qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] = static_cast<uint8_t>(codes[64 * c + l] | (codes[64 * c + 32 + l] << 4));
    }
  }
}

// Q5_K codes: low nibbles as Q4_K, the fifth bit of element 32b + l is bit b of qh[l].
void PackQ5_K(const uint8_t *codes, uint8_t *qh, uint8_t *qs) {
  std::memset(qh, 0, 32);
  for (int e = 0; e < kQK; ++e) {
    if (codes[e] > 15) qh[e % 32] = static_cast<uint8_t>(qh[e % 32] | (1 << (e / 32)));
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] = static_cast<uint8_t>((codes[64 * c + l] & 0x0f) | ((codes[64 * c + 32 + l] & 0x0f) << 4));
    }
  }
}

// ---- Q6_K: f16 d; 16 sub-blocks with 8-bit signed scales; codes -32..31 ----

void QuantizeBlockQ6_K(const float *x, uint8_t *b, const float *qw) {
  int8_t codes[kQK];
  float scale[16];
  float max_scale = 0.0f, max_abs = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scale[j] = FitSigned(16, 32, x + 16 * j, qw != nullptr ? qw + 16 * j : nullptr, codes + 16 * j);
    if (std::fabs(scale[j]) > max_abs) {
      max_abs = std::fabs(scale[j]);
      max_scale = scale[j];
    }
  }
  if (max_abs < kGroupMaxEps) {
    std::memset(b, 0, static_cast<size_t>(kQ6Bytes));
    return;
  }
  const float iscale = -128.0f / max_scale;
  const float d = StoreHalf(b + 208, 1.0f / iscale);
  auto *scales = reinterpret_cast<int8_t *>(b + 192);
  for (int j = 0; j < 16; ++j) {
    const int s = NearestInt(iscale * scale[j]);
    scales[j] = static_cast<int8_t>(s < 127 ? s : 127);
  }
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(scales[j]);
    if (dl == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      codes[16 * j + i] = static_cast<int8_t>(Clamp(NearestInt(x[16 * j + i] / dl), -32, 31) + 32);
    }
  }
  uint8_t *ql = b;
  uint8_t *qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    const int8_t *c = codes + 128 * h;
    for (int l = 0; l < 64; ++l) ql[64 * h + l] = static_cast<uint8_t>((c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4));
    for (int l = 0; l < 32; ++l) {
      qh[32 * h + l] = static_cast<uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) |
                                            ((c[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

// ---- the codec entries: a row of n elements, n a multiple of 256 ----

void QuantizeQ2_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ2_K(src + i, b + i / kQK * kQ2Bytes);
}
void QuantizeQ2_KWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ2_KWeighted(src + i, b + i / kQK * kQ2Bytes, weights + i);
}

void QuantizeQ3_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ3_K(src + i, b + i / kQK * kQ3Bytes);
}
void QuantizeQ3_KWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ3_KWeighted(src + i, b + i / kQK * kQ3Bytes, weights + i);
}

void QuantizeQ4_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4Bytes) {
    uint8_t codes[kQK];
    FitKAffine(src + i, b, 15, {-1.0f, 0.1f, 20, false}, codes);
    PackQ4_K(codes, b + 16);
  }
}
void QuantizeQ4_KWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ4Bytes) {
    uint8_t codes[kQK];
    FitKAffineWeighted(src + i, b, 15, weights + i, false, codes);
    PackQ4_K(codes, b + 16);
  }
}

void QuantizeQ5_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5Bytes) {
    uint8_t codes[kQK];
    FitKAffine(src + i, b, 31, {-0.5f, 0.1f, 15, false}, codes);
    PackQ5_K(codes, b + 16, b + 48);
  }
}
void QuantizeQ5_KWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK, b += kQ5Bytes) {
    uint8_t codes[kQK];
    FitKAffineWeighted(src + i, b, 31, weights + i, true, codes);
    PackQ5_K(codes, b + 16, b + 48);
  }
}

void QuantizeQ6_K(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ6_K(src + i, b + i / kQK * kQ6Bytes, nullptr);
}
void QuantizeQ6_KWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kQK) QuantizeBlockQ6_K(src + i, b + i / kQK * kQ6Bytes, weights + i);
}

}  // namespace strata::quant::internal
