// Quantizers of IQ1_S and IQ1_M, byte-identical to ggml's ggml_quantize_chunk with importance
// weights (IQ1_S needs them; IQ1_M also runs without, weighting by x^2). Each element is one of
// three levels -1, 0, 1 moved by a shift of +-1/8, under a sub-block scale: the best split of a
// sub-block's values into the three levels is found exactly (values sorted, prefix sums, every
// pair of boundaries tried for each shift), then each group of 8 levels is snapped to the grid or
// its nearest grid neighbours (iq_lattice.h). Float operations run in ggml's order, one rounding
// each, with its tie-breaking; equal values keep their index order in the sort, as glibc's
// (stable, merging) qsort leaves them. Layouts are in codecs_iq.cc.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fit.h"
#include "lib/quant/iq_lattice.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant::internal {
namespace {

constexpr int kQK = 256;
constexpr float kDelta = 0.125f;
constexpr float kFltMax = 3.402823466e38f;
const float kPlus[3] = {-1.0f + kDelta, kDelta, 1.0f + kDelta};
const float kMinus[3] = {-1.0f - kDelta, -kDelta, 1.0f - kDelta};

// The grid entry for levels L (8 of them, 0..2) that are off the grid: the neighbour minimizing
// sum w (scale v[l] - x)^2 over the shifted levels v, the first on ties; rewrites L from it.
int BestNeighbour(const Lattice &lat, int key, const float *x, const float *w, float scale, const float *v,
                  int8_t *L) {
  const uint16_t *list = lat.NeighboursOf(key);
  float best = kFltMax;
  int best_g = -1;
  auto score = [&](int g) {
    const int8_t *p = lat.pos.data() + static_cast<size_t>(g) * 8;
    float d2 = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const float q = v[(p[i] - 1) / 2];
      const float diff = scale * q - x[i];
      d2 += w[i] * diff * diff;
    }
    if (d2 < best) {
      best = d2;
      best_g = g;
    }
  };
  for (int j = 1; j <= list[0]; ++j) score(list[j]);
  // Only non-finite scores leave no pick; then the whole grid is searched, as ggml does.
  for (int g = 0; best_g < 0 && g < lat.grid_size; ++g) score(g);
  if (best_g < 0) best_g = list[1];
  const int8_t *p = lat.pos.data() + static_cast<size_t>(best_g) * 8;
  for (int i = 0; i < 8; ++i) L[i] = static_cast<int8_t>((p[i] - 1) / 2);
  return best_g;
}

// Element indices of xb (n of them) in ascending order of value, equal values by index: the order
// glibc's stable qsort gives ggml. (An insertion sort: n is 16 or 32.)
void SortedOrder(const float *xb, int n, int *idx) {
  for (int j = 0; j < n; ++j) {
    int k = j;
    while (k > 0 && xb[idx[k - 1]] > xb[j]) {
      idx[k] = idx[k - 1];
      --k;
    }
    idx[k] = j;
  }
}

// Levels from the best split: the first i1 sorted elements take level 0, up to i2 level 1, the
// rest level 2.
void SplitLevels(const int *idx, int n, int i1, int i2, int8_t *L) {
  for (int j = 0; j < n; ++j) L[idx[j]] = static_cast<int8_t>(j < i1 ? 0 : (j < i2 ? 1 : 2));
}

float SumSquares(const float *x) {
  float s = 0.0f;
  for (int i = 0; i < kQK; ++i) s += x[i] * x[i];
  return s;
}

int Clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// IQ1_S (50 bytes): f16 d | u8 qs[32] (low 8 bits of the grid indices) | u16 qh[8]: per 32
// elements, 3 high index bits per group of 8, a 3-bit scale at bit 12 and the shift sign at bit 15.
void BlockIQ1S(const float *xbl, uint8_t *b, const float *qwl) {
  const Lattice &lat = LatticeIQ1S();
  constexpr int kSub = 32;
  std::memset(b, 0, 50);
  uint16_t qh[8] = {};
  float scales[8];
  int shifts[8];
  float max_scale = 0.0f;
  const float sigma2 = 2.0f * SumSquares(xbl) / kQK;
  for (int ib = 0; ib < kQK / kSub; ++ib) {
    const float *xb = xbl + kSub * ib;
    const float *qw = qwl + kSub * ib;
    float weight[kSub];
    for (int i = 0; i < kSub; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
    float max = std::fabs(xb[0]);
    for (int i = 1; i < kSub; ++i) max = max > std::fabs(xb[i]) ? max : std::fabs(xb[i]);
    scales[ib] = 0.0f;
    shifts[ib] = 1;
    if (max < 1e-12f) continue;
    int idx[kSub];
    SortedOrder(xb, kSub, idx);
    float sumx[kSub + 1], sumw[kSub + 1];
    sumx[0] = sumw[0] = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      sumx[j + 1] = sumx[j] + weight[idx[j]] * xb[idx[j]];
      sumw[j + 1] = sumw[j] + weight[idx[j]];
    }
    float best_score = -kFltMax, scale = max;
    int besti1 = -1, besti2 = -1, best_shift = 0;
    for (int i1 = 0; i1 <= kSub; ++i1) {
      for (int i2 = i1; i2 <= kSub; ++i2) {
        for (int sh = 1; sh >= -1; sh -= 2) {
          const float *v = sh == 1 ? kPlus : kMinus;
          const float sumqx =
              (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[kSub] - sumx[i2]) * v[2];
          const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                              (sumw[kSub] - sumw[i2]) * v[2] * v[2];
          if (sumq2 > 0.0f && sumqx * sumqx > best_score * sumq2) {
            scale = sumqx / sumq2;
            best_score = scale * sumqx;
            besti1 = i1;
            besti2 = i2;
            best_shift = sh;
          }
        }
      }
    }
    if (besti1 < 0 || besti2 < 0 || best_shift == 0) continue;
    int8_t L[kSub];
    SplitLevels(idx, kSub, besti1, besti2, L);
    if (scale < 0.0f) {
      for (int j = 0; j < kSub; ++j) L[j] = static_cast<int8_t>(2 - L[j]);
      scale = -scale;
      best_shift = -best_shift;
    }
    const float *v = best_shift == 1 ? kPlus : kMinus;
    int index[4];
    bool all_on_grid = true;
    for (int k = 0; k < 4; ++k) {
      const int key = lat.Key(L + 8 * k);
      index[k] = lat.slot[key];
      if (index[k] < 0) {
        all_on_grid = false;
        index[k] = BestNeighbour(lat, key, xb + 8 * k, weight + 8 * k, scale, v, L + 8 * k);
      }
    }
    if (!all_on_grid) {
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (int k = 0; k < 4; ++k) {
        const int8_t *p = lat.pos.data() + static_cast<size_t>(index[k]) * 8;
        for (int j = 0; j < 8; ++j) {
          const float w = weight[8 * k + j];
          const float q = v[(p[j] - 1) / 2];
          sumqx += w * q * xb[8 * k + j];
          sumq2 += w * q * q;
        }
      }
      if (sumqx > 0.0f && sumq2 > 0.0f) scale = sumqx / sumq2;
    }
    uint16_t h = 0;
    for (int k = 0; k < 4; ++k) {
      b[2 + 4 * ib + k] = static_cast<uint8_t>(index[k] & 255);
      h = static_cast<uint16_t>(h | ((index[k] >> 8) << (3 * k)));
    }
    qh[ib] = h;
    scales[ib] = scale;
    shifts[ib] = best_shift;
    max_scale = max_scale > scale ? max_scale : scale;
  }
  if (max_scale != 0.0f) {
    const float d = max_scale / 15.0f;
    StoreU16(b, FloatToHalf(d * 1.125f));
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ++ib) {
      int l = Clamp(NearestInt(0.5f * (id * scales[ib] - 1.0f)), 0, 7);
      if (shifts[ib] == -1) l |= 8;
      qh[ib] = static_cast<uint16_t>(qh[ib] | (l << 12));
    }
  }
  for (int ib = 0; ib < 8; ++ib) StoreU16(b + 34 + 2 * ib, qh[ib]);
}

// IQ1_M (56 bytes): u8 qs[32] | u8 qh[16] | u16 scales[4]. Per 16 elements: two grid indices (low
// 8 bits in qs, 3 high bits in each nibble of qh, bit 3 of the nibble the group's shift sign) and a
// 3-bit scale; the f16 block scale sits in the top nibbles of the four u16 scales.
void BlockIQ1M(const float *xbl, uint8_t *b, const float *qwl) {
  const Lattice &lat = LatticeIQ1S();
  constexpr int kSub = 16;
  constexpr uint8_t kMasks[4] = {0x00, 0x80, 0x08, 0x88};
  std::memset(b, 0, 56);
  uint8_t *qs = b, *qh = b + 32;
  uint16_t sc[4] = {};
  float scales[16];
  int shifts[16];
  float max_scale = 0.0f;
  const float sigma2 = 2.0f * SumSquares(xbl) / kQK;
  auto weights_of = [&](int ib, float *weight) {
    const float *xb = xbl + kSub * ib;
    for (int i = 0; i < kSub; ++i) {
      weight[i] = qwl != nullptr ? qwl[kSub * ib + i] * std::sqrt(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    }
  };
  // The shifted levels of group k (0 or 1) of a sub-block under shift choice s: bit 1 of s picks
  // the first group's sign, bit 0 the second's (0: +, 1: -).
  auto levels = [](int s, int k) { return (k == 0 ? s < 2 : s % 2 == 0) ? kPlus : kMinus; };
  for (int ib = 0; ib < kQK / kSub; ++ib) {
    const float *xb = xbl + kSub * ib;
    float weight[kSub];
    weights_of(ib, weight);
    float max = std::fabs(xb[0]);
    for (int i = 1; i < kSub; ++i) max = max > std::fabs(xb[i]) ? max : std::fabs(xb[i]);
    scales[ib] = 0.0f;
    shifts[ib] = 0;
    if (max < 1e-7f) continue;
    int idx[kSub];
    SortedOrder(xb, kSub, idx);
    // Prefix sums per half (each half may take its own shift).
    float px[2][kSub + 1], pw[2][kSub + 1];
    px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      const int i = idx[j];
      const int h = i < kSub / 2 ? 0 : 1;
      px[h][j + 1] = px[h][j] + weight[i] * xb[i];
      px[1 - h][j + 1] = px[1 - h][j];
      pw[h][j + 1] = pw[h][j] + weight[i];
      pw[1 - h][j + 1] = pw[1 - h][j];
    }
    const float txs[2] = {px[0][kSub], px[1][kSub]};
    const float tws[2] = {pw[0][kSub], pw[1][kSub]};
    const float p2 = kPlus[2], m2 = kMinus[2];
    const float cp1 = kPlus[0] * kPlus[0] - kPlus[1] * kPlus[1];
    const float cp2 = kPlus[1] * kPlus[1] - kPlus[2] * kPlus[2];
    const float cm1 = kMinus[0] * kMinus[0] - kMinus[1] * kMinus[1];
    const float cm2 = kMinus[1] * kMinus[1] - kMinus[2] * kMinus[2];
    float best_score = -kFltMax, scale = max;
    int besti1 = -1, besti2 = -1, best_k = -1;
    for (int i1 = 0; i1 <= kSub; ++i1) {
      for (int i2 = i1; i2 <= kSub; ++i2) {
        float qx_p[2], qx_m[2], q2_p[2], q2_m[2];
        for (int h = 0; h < 2; ++h) {
          const float sx = px[h][i1] + px[h][i2];
          qx_p[h] = txs[h] * p2 - sx;
          qx_m[h] = txs[h] * m2 - sx;
          q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
          q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
        }
        const float sumqx[4] = {qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]};
        const float sumq2[4] = {q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]};
        for (int k = 0; k < 4; ++k) {
          if (sumq2[k] > 0.0f && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
            scale = sumqx[k] / sumq2[k];
            best_score = scale * sumqx[k];
            besti1 = i1;
            besti2 = i2;
            best_k = k;
          }
        }
      }
    }
    if (besti1 < 0 || besti2 < 0 || best_k < 0) continue;
    int8_t L[kSub];
    SplitLevels(idx, kSub, besti1, besti2, L);
    if (scale < 0.0f) {
      for (int j = 0; j < kSub; ++j) L[j] = static_cast<int8_t>(2 - L[j]);
      scale = -scale;
      best_k = 3 - best_k;
    }
    int index[2];
    bool all_on_grid = true;
    for (int k = 0; k < 2; ++k) {
      const int key = lat.Key(L + 8 * k);
      index[k] = lat.slot[key];
      if (index[k] < 0) {
        all_on_grid = false;
        index[k] = BestNeighbour(lat, key, xb + 8 * k, weight + 8 * k, scale, levels(best_k, k), L + 8 * k);
      }
    }
    if (!all_on_grid) {
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (int k = 0; k < 2; ++k) {
        const float *v = levels(best_k, k);
        const int8_t *p = lat.pos.data() + static_cast<size_t>(index[k]) * 8;
        for (int j = 0; j < 8; ++j) {
          const float w = weight[8 * k + j];
          const float q = v[(p[j] - 1) / 2];
          sumqx += w * q * xb[8 * k + j];
          sumq2 += w * q * q;
        }
      }
      if (sumqx > 0.0f && sumq2 > 0.0f) scale = sumqx / sumq2;
    }
    qs[2 * ib] = static_cast<uint8_t>(index[0] & 255);
    qs[2 * ib + 1] = static_cast<uint8_t>(index[1] & 255);
    qh[ib] = static_cast<uint8_t>((index[0] >> 8) | ((index[1] >> 8) << 4));
    scales[ib] = scale;
    shifts[ib] = best_k;
    max_scale = max_scale > scale ? max_scale : scale;
  }
  if (max_scale == 0.0f) return;
  float d = max_scale / 15.0f;
  const float id = 1.0f / d;
  // The block scale is refitted over every element under the chosen codes and sub-block scales.
  float sumqx = 0.0f, sumq2 = 0.0f;
  for (int ib = 0; ib < kQK / kSub; ++ib) {
    const int l = Clamp(NearestInt(0.5f * (id * scales[ib] - 1.0f)), 0, 7);
    sc[ib / 4] = static_cast<uint16_t>(sc[ib / 4] | (l << (3 * (ib % 4))));
    qh[ib] = static_cast<uint8_t>(qh[ib] | kMasks[shifts[ib]]);
    const float *xb = xbl + kSub * ib;
    float weight[kSub];
    weights_of(ib, weight);
    for (int k = 0; k < 2; ++k) {
      const float *v = levels(shifts[ib], k);
      const int g = qs[2 * ib + k] | (((qh[ib] >> (4 * k)) & 7) << 8);
      const int8_t *p = lat.pos.data() + static_cast<size_t>(g) * 8;
      for (int j = 0; j < 8; ++j) {
        const float w = weight[8 * k + j];
        const float q = v[(p[j] - 1) / 2] * static_cast<float>(2 * l + 1);
        sumqx += w * q * xb[8 * k + j];
        sumq2 += w * q * q;
      }
    }
  }
  if (sumq2 > 0.0f) d = sumqx / sumq2;
  const uint16_t h = FloatToHalf(d * 1.1125f);
  sc[0] = static_cast<uint16_t>(sc[0] | ((h & 0x000f) << 12));
  sc[1] = static_cast<uint16_t>(sc[1] | ((h & 0x00f0) << 8));
  sc[2] = static_cast<uint16_t>(sc[2] | ((h & 0x0f00) << 4));
  sc[3] = static_cast<uint16_t>(sc[3] | (h & 0xf000));
  for (int k = 0; k < 4; ++k) StoreU16(b + 48 + 2 * k, sc[k]);
}

}  // namespace

void QuantizeIQ1_SWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ1S, 50>(src, dst, n, weights);
}
void QuantizeIQ1_M(const float *src, void *dst, int64_t n) { LatticeRows<&BlockIQ1M, 56>(src, dst, n, nullptr); }
void QuantizeIQ1_MWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ1M, 56>(src, dst, n, weights);
}

}  // namespace strata::quant::internal
