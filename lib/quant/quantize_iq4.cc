// Quantizers of IQ4_NL (one 32-element block) and IQ4_XS (256 elements, 8 sub-blocks of 32 with
// 6-bit scales), byte-identical to ggml's ggml_quantize_chunk with and without importance weights.
// Per 32 elements: the scale mapping the signed extreme onto the lowest level, refined by weighted
// least squares over 15 grids; IQ4_XS then quantizes those scales against one f16 scale and
// re-picks every level under the scale it stores. Layouts are in codecs_iq.cc.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fit.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant::internal {
namespace {

constexpr int kSub = 32;     // elements under one fitted scale
constexpr int kGrids = 7;    // grids tried on each side of the lowest level
constexpr int64_t kNlBytes = 18;
constexpr int64_t kXsBytes = 136;

int Level(float v) { return NearestLevel(16, kIQ4Levels, v); }

// Fits the 32 values xb with weights w: writes the level indices to codes and returns the scale
// (0 for an all-zero group, whose codes are left as they were).
float FitSub(const float *xb, const float *w, uint8_t *codes) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.0f;
  const float lowest = static_cast<float>(kIQ4Levels[0]);
  auto sums = [&](float id, bool write, float *sumqx, float *sumq2) {
    float sqx = 0.0f, sq2 = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      const int l = Level(id * xb[j]);
      if (write) codes[j] = static_cast<uint8_t>(l);
      const float q = static_cast<float>(kIQ4Levels[l]);
      sqx += w[j] * q * xb[j];
      sq2 += w[j] * q * q;
    }
    *sumqx = sqx;
    *sumq2 = sq2;
  };
  float sumqx, sumq2;
  sums(1.0f / (-max / lowest), true, &sumqx, &sumq2);
  float d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
  float best = d * sumqx;
  for (int t = -kGrids; t <= kGrids; ++t) {
    sums(static_cast<float>(t + kIQ4Levels[0]) / max, false, &sumqx, &sumq2);
    if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// Weights of one group of 32: the imatrix's qw * sqrt(sigma2 + x^2), or x^2 without one.
void Weights(const float *xb, const float *qw, float sigma2, float *w) {
  for (int j = 0; j < kSub; ++j) w[j] = qw != nullptr ? qw[j] * std::sqrt(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
}

// sigma2 of a super-block of n elements: 2 / n * sum x^2.
float Sigma2(const float *x, int n) {
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s += x[j] * x[j];
  return s * (2.0f / static_cast<float>(n));
}

// Element j < 16 of a group of 32 is the low nibble of qs[j], j + 16 the high nibble.
void PackNibbles(const uint8_t *codes, uint8_t *qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
}

void QuantizeBlockNL(const float *x, uint8_t *b, const float *qw) {
  float w[kSub];
  uint8_t codes[kSub];
  Weights(x, qw, Sigma2(x, kSub), w);
  const float d = FitSub(x, w, codes);
  StoreU16(b, FloatToHalf(d));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kSub; ++j) codes[j] = static_cast<uint8_t>(Level(id * x[j]));
  PackNibbles(codes, b + 2);
}

void QuantizeBlockXS(const float *x, uint8_t *b, const float *qw) {
  const float sigma2 = Sigma2(x, 256);
  float w[kSub], scale[8];
  uint8_t codes[256];
  float max_scale = 0.0f, amax_scale = 0.0f;
  for (int s = 0; s < 8; ++s) {
    Weights(x + kSub * s, qw != nullptr ? qw + kSub * s : nullptr, sigma2, w);
    scale[s] = FitSub(x + kSub * s, w, codes + kSub * s);
    if (std::fabs(scale[s]) > amax_scale) {
      amax_scale = std::fabs(scale[s]);
      max_scale = scale[s];
    }
  }
  const float d = -max_scale / 32.0f;
  StoreU16(b, FloatToHalf(d));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t scales_h = 0;
  uint8_t *scales_l = b + 4;
  std::memset(scales_l, 0, 4);
  for (int s = 0; s < 8; ++s) {
    int l = NearestInt(id * scale[s]);
    l = l < -32 ? -32 : (l > 31 ? 31 : l);
    // The levels are re-picked under the unrounded sub-block scale d * l, as ggml does.
    const float dl = d * static_cast<float>(l);
    const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
    for (int j = 0; j < kSub; ++j) codes[kSub * s + j] = static_cast<uint8_t>(Level(idl * x[kSub * s + j]));
    l += 32;
    scales_l[s / 2] = static_cast<uint8_t>(scales_l[s / 2] | ((l & 0x0f) << (4 * (s % 2))));
    scales_h = static_cast<uint16_t>(scales_h | ((l >> 4) << (2 * s)));
  }
  StoreU16(b + 2, scales_h);
  for (int s = 0; s < 8; ++s) PackNibbles(codes + kSub * s, b + 8 + 16 * s);
}

}  // namespace

void QuantizeIQ4_NL(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kSub) QuantizeBlockNL(src + i, b + i / kSub * kNlBytes, nullptr);
}
void QuantizeIQ4_NLWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kSub) QuantizeBlockNL(src + i, b + i / kSub * kNlBytes, weights + i);
}
void QuantizeIQ4_XS(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += 256) QuantizeBlockXS(src + i, b + i / 256 * kXsBytes, nullptr);
}
void QuantizeIQ4_XSWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += 256) QuantizeBlockXS(src + i, b + i / 256 * kXsBytes, weights + i);
}

}  // namespace strata::quant::internal
