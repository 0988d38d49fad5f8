// Quantizers of the lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S, byte-identical to
// ggml's ggml_quantize_chunk with and without importance weights (IQ1_S and IQ1_M live in
// quantize_iq1.cc). Per 256-element block:
//   - per sub-block (16 or 32 elements) the magnitudes are fitted, signs kept apart (for the types
//     that store 7 sign bits per 8 elements, an odd count of negatives flips the least important
//     element, so the stored signs have even parity);
//   - a range of trial scales rounds the magnitudes onto levels 2l + 1, snaps each group of 8 (or 4)
//     levels onto the grid (or its nearest grid neighbours, iq_lattice.h) and keeps the scale with
//     the best weighted least-squares fit; the codes are then re-picked under the kept scale;
//   - the sub-block scales are stored as 4-bit multiples of one f16 scale.
// Float operations run in ggml's order, one rounding each (fp_contract_off.h), with ggml's
// tie-breaking (first best wins), so the chosen codes equal ggml's bit for bit. Layouts are in
// codecs_iq.cc.
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

// When the codes are re-picked under the kept scale: always (IQ2_XXS); for the groups the kept
// trial moved off the grid (IQ2_XS, IQ2_S, IQ3_XXS); for every group unless the kept trial had all
// groups on the grid, counting no kept trial as off grid (IQ3_S).
enum class Repick { kAlways, kOffGridGroups, kAllIfAnyOff };

struct Spec {
  const Lattice &(*lattice)();
  int sub;             // elements under one scale
  int kmax;            // levels 0..kmax-1
  int is_lo, is_hi;    // trial steps
  float is_step;       // scale step per trial
  bool qp_start;       // start from a fitted scale (IQ2_XXS) rather than from the maximum
  bool parity_signs;   // 7 stored sign bits per 8 elements
  float eps;           // below this maximum magnitude a sub-block is all zero (0: exactly zero)
  Repick repick;
};

// Picks the grid entry for one group whose levels `l` (dims of them) are off the grid: the
// neighbour minimizing sum w (scale (2l + 1) - x)^2, the first on ties; rewrites l from it.
int BestNeighbour(const Lattice &lat, int key, const float *x, const float *w, float scale, int8_t *l) {
  const uint16_t *list = lat.NeighboursOf(key);
  float best = 3.402823466e38f;
  int best_g = list[1];
  for (int j = 1; j <= list[0]; ++j) {
    const int8_t *p = lat.pos.data() + static_cast<size_t>(list[j]) * lat.dims;
    float d2 = 0.0f;
    for (int i = 0; i < lat.dims; ++i) {
      const float diff = scale * static_cast<float>(p[i]) - x[i];
      d2 += w[i] * diff * diff;
    }
    if (d2 < best) {
      best = d2;
      best_g = list[j];
    }
  }
  const int8_t *p = lat.pos.data() + static_cast<size_t>(best_g) * lat.dims;
  for (int i = 0; i < lat.dims; ++i) l[i] = static_cast<int8_t>((p[i] - 1) / 2);
  return best_g;
}

// Rounds the group's magnitudes under inverse scale id onto levels 0..kmax-1, snaps them to the
// grid under scale, and returns whether the rounded point was on the grid.
bool SnapGroup(const Lattice &lat, int kmax, float id, float scale, const float *x, const float *w, int8_t *l) {
  for (int i = 0; i < lat.dims; ++i) {
    const int v = NearestInt(0.5f * (id * x[i] - 1.0f));
    l[i] = static_cast<int8_t>(v < 0 ? 0 : (v > kmax - 1 ? kmax - 1 : v));
  }
  const int key = lat.Key(l);
  if (lat.slot[key] >= 0) return true;
  BestNeighbour(lat, key, x, w, scale, l);
  return false;
}

void Sums(int n, const float *w, const float *x, const int8_t *l, float *sumqx, float *sumq2) {
  float a = 0.0f, b = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float q = static_cast<float>(2 * l[i] + 1);
    a += w[i] * x[i] * q;
    b += w[i] * q * q;
  }
  *sumqx = a;
  *sumq2 = b;
}

// Fits one sub-block: xval (magnitudes, sign-corrected), weight and waux = sqrt(weight). Writes the
// levels to L and returns the scale; *zero is set when the sub-block counts as all zero.
float FitSub(const Spec &s, const Lattice &lat, const float *xval, const float *weight, const float *waux,
             int8_t *L, bool *zero) {
  const int n = s.sub, groups = s.sub / lat.dims;
  float max = xval[0];
  for (int i = 1; i < n; ++i) max = max > xval[i] ? max : xval[i];
  std::memset(L, 0, n);
  *zero = true;
  if (s.eps > 0.0f ? max < s.eps : max == 0.0f) return 0.0f;
  float scale;
  float base;  // the value the trial steps divide
  if (s.qp_start) {
    uint8_t codes[32];
    scale = FitUnsigned(n, s.kmax + 1, xval, codes, weight);
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(codes[i]);
    base = scale * static_cast<float>(s.kmax);
    if (base <= 0.0f) return 0.0f;
  } else {
    scale = max / static_cast<float>(2 * s.kmax - 1);
    base = max;
  }
  *zero = false;
  bool on_grid[8], on_grid_aux[8];
  for (int k = 0; k < groups; ++k) on_grid[k] = s.repick != Repick::kAllIfAnyOff;
  int8_t Laux[32];
  float best = 0.0f;
  for (int is = s.is_lo; is <= s.is_hi; ++is) {
    const float id = (static_cast<float>(2 * s.kmax - 1) + static_cast<float>(is) * s.is_step) / base;
    const float this_scale = 1.0f / id;
    for (int k = 0; k < groups; ++k) {
      const int o = k * lat.dims;
      on_grid_aux[k] = SnapGroup(lat, s.kmax, id, this_scale, xval + o, waux + o, Laux + o);
    }
    float sumqx, sumq2;
    Sums(n, weight, xval, Laux, &sumqx, &sumq2);
    if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
      scale = sumqx / sumq2;
      best = scale * sumqx;
      std::memcpy(L, Laux, n);
      for (int k = 0; k < groups; ++k) on_grid[k] = on_grid_aux[k];
    }
  }
  bool repick = scale > 0.0f;
  if (s.repick != Repick::kAlways) {
    int off = 0;
    for (int k = 0; k < groups; ++k) off += on_grid[k] ? 0 : 1;
    repick = repick && off > 0;
  }
  if (repick) {
    const float id = 1.0f / scale;
    for (int k = 0; k < groups; ++k) {
      if (s.repick == Repick::kOffGridGroups && on_grid[k]) continue;
      const int o = k * lat.dims;
      SnapGroup(lat, s.kmax, id, scale, xval + o, waux + o, L + o);
    }
    float sumqx, sumq2;
    Sums(n, weight, xval, L, &sumqx, &sumq2);
    if (sumq2 > 0.0f) scale = sumqx / sumq2;
  }
  return scale;
}

// One 256-element block's sub-blocks: scales[ib] (0 for an all-zero sub-block, skip[ib] set),
// grid[ib * groups + k] and signs[ib * sub / 8 + k] per sub-block.
struct BlockFit {
  float scales[16];
  bool skip[16];
  uint16_t grid[64];
  uint8_t signs[32];
  float max_scale;
};

void FitBlock(const Spec &s, const float *x, const float *qw, float sigma2, bool sigma_weights, BlockFit *f) {
  const Lattice &lat = s.lattice();
  const int n = s.sub, groups = s.sub / lat.dims;
  float weight[32], waux[32], xval[32];
  int8_t L[32];
  f->max_scale = 0.0f;
  std::memset(f->grid, 0, sizeof f->grid);
  std::memset(f->signs, 0, sizeof f->signs);
  for (int ib = 0; ib < kQK / n; ++ib) {
    const float *xb = x + n * ib;
    for (int i = 0; i < n; ++i) {
      if (qw != nullptr) {
        weight[i] = qw[n * ib + i] * std::sqrt(sigma2 + xb[i] * xb[i]);
      } else {
        weight[i] = sigma_weights ? 0.25f * sigma2 + xb[i] * xb[i] : xb[i] * xb[i];
      }
    }
    for (int i = 0; i < n; ++i) waux[i] = std::sqrt(weight[i]);
    uint8_t *signs = f->signs + ib * (n / 8);
    for (int k = 0; k < n / 8; ++k) {
      int nflip = 0;
      uint8_t sg = 0;
      for (int i = 0; i < 8; ++i) {
        const float v = xb[8 * k + i];
        if (v >= 0.0f) {
          xval[8 * k + i] = v;
        } else {
          xval[8 * k + i] = -v;
          ++nflip;
          sg = static_cast<uint8_t>(sg | (1 << i));
        }
      }
      if (s.parity_signs && nflip % 2 != 0) {
        int imin = 0;
        float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
        for (int i = 1; i < 8; ++i) {
          const float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
          if (ax < min) {
            min = ax;
            imin = i;
          }
        }
        xval[8 * k + imin] = -xval[8 * k + imin];
        sg = static_cast<uint8_t>(sg ^ (1 << imin));
      }
      signs[k] = s.parity_signs ? static_cast<uint8_t>(sg & 127) : sg;
    }
    float scale = FitSub(s, lat, xval, weight, waux, L, &f->skip[ib]);
    if (f->skip[ib]) {
      f->scales[ib] = 0.0f;
      for (int k = 0; k < n / 8; ++k) signs[k] = 0;
      continue;
    }
    if (scale < 0.0f) {  // as ggml: a negative fit is stored positive with every sign flipped
      scale = -scale;
      for (int k = 0; k < n / 8; ++k) signs[k] = static_cast<uint8_t>(s.parity_signs ? ~signs[k] & 127 : ~signs[k]);
    }
    for (int k = 0; k < groups; ++k) {
      // Every path above leaves the levels on the grid; levels off it (a scale overflowed by
      // extreme input) take entry 0 rather than index outside the tables.
      const int8_t *lv = L + k * lat.dims;
      bool in_range = true;
      for (int i = 0; i < lat.dims; ++i) in_range = in_range && lv[i] >= 0 && lv[i] < (1 << lat.bits);
      const int g = in_range ? lat.slot[lat.Key(lv)] : 0;
      f->grid[ib * groups + k] = static_cast<uint16_t>(g >= 0 ? g : 0);
    }
    f->scales[ib] = scale;
    f->max_scale = f->max_scale > scale ? f->max_scale : scale;
  }
}

// The 4-bit code of a sub-block scale under inverse super-block scale id.
int ScaleCode(float id, float scale) {
  const int l = NearestInt(0.5f * (id * scale - 1.0f));
  return l < 0 ? 0 : (l > 15 ? 15 : l);
}

float SumSquares(const float *x) {
  float s = 0.0f;
  for (int i = 0; i < kQK; ++i) s += x[i] * x[i];
  return s;
}

const Spec kIQ2XXS = {&LatticeIQ2XXS, 32, 3, -6, 6, 0.1f, true, true, kGroupMaxEps, Repick::kAlways};
const Spec kIQ2XS = {&LatticeIQ2XS, 16, 3, -9, 9, 0.1f, false, true, kGroupMaxEps, Repick::kOffGridGroups};
const Spec kIQ2S = {&LatticeIQ2S, 16, 3, -9, 9, 0.1f, false, false, 1e-8f, Repick::kOffGridGroups};
const Spec kIQ3XXS = {&LatticeIQ3XXS, 32, 8, -15, 15, 0.2f, false, true, 1e-8f, Repick::kOffGridGroups};
const Spec kIQ3S = {&LatticeIQ3S, 32, 8, -9, 9, 0.2f, false, false, 0.0f, Repick::kAllIfAnyOff};

// IQ2_XXS (66 bytes): f16 d | 8 x (u32 grid bytes, u32 signs | scale << 28).
void BlockIQ2XXS(const float *x, uint8_t *b, const float *qw) {
  BlockFit f;
  FitBlock(kIQ2XXS, x, qw, SumSquares(x) / kQK, false, &f);
  std::memset(b, 0, 66);
  if (f.max_scale == 0.0f) return;
  const float d = f.max_scale / 31.0f;
  StoreU16(b, FloatToHalf(d));
  const float id = 1.0f / d;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t a = 0, s = 0;
    for (int k = 0; k < 4; ++k) {
      a |= static_cast<uint32_t>(f.grid[ib * 4 + k]) << (8 * k);
      s |= static_cast<uint32_t>(f.signs[ib * 4 + k]) << (7 * k);
    }
    s |= static_cast<uint32_t>(ScaleCode(id, f.scales[ib])) << 28;
    std::memcpy(b + 2 + 8 * ib, &a, 4);
    std::memcpy(b + 6 + 8 * ib, &s, 4);
  }
}

// IQ2_XS (74 bytes): f16 d | u16 qs[32] (9-bit grid index | signs << 9) | u8 scales[8].
void BlockIQ2XS(const float *x, uint8_t *b, const float *qw) {
  BlockFit f;
  FitBlock(kIQ2XS, x, qw, SumSquares(x) / kQK, false, &f);
  std::memset(b, 0, 74);
  if (f.max_scale == 0.0f) return;
  const float d = f.max_scale / 31.0f;
  StoreU16(b, FloatToHalf(d));
  const float id = 1.0f / d;
  for (int i = 0; i < 32; ++i) StoreU16(b + 2 + 2 * i, static_cast<uint16_t>(f.grid[i] | (f.signs[i] << 9)));
  for (int ib = 0; ib < 16; ++ib) {
    b[66 + ib / 2] = static_cast<uint8_t>(b[66 + ib / 2] | (ScaleCode(id, f.scales[ib]) << (4 * (ib % 2))));
  }
}

// IQ2_S (82 bytes): f16 d | u8 qs[32] | u8 signs[32] | u8 qh[8] | u8 scales[8].
void BlockIQ2S(const float *x, uint8_t *b, const float *qw) {
  BlockFit f;
  FitBlock(kIQ2S, x, qw, 2.0f * SumSquares(x) / kQK, true, &f);
  std::memset(b, 0, 82);
  for (int i = 0; i < 32; ++i) {
    if (f.skip[i / 2]) continue;
    b[2 + i] = static_cast<uint8_t>(f.grid[i] & 255);
    b[66 + i / 4] = static_cast<uint8_t>(b[66 + i / 4] | ((f.grid[i] >> 8) << (2 * (i % 4))));
    b[34 + i] = f.signs[i];
  }
  if (f.max_scale == 0.0f) return;
  const float d = f.max_scale / 31.0f;
  StoreU16(b, FloatToHalf(d * 0.9875f));
  const float id = 1.0f / d;
  for (int ib = 0; ib < 16; ++ib) {
    b[74 + ib / 2] = static_cast<uint8_t>(b[74 + ib / 2] | (ScaleCode(id, f.scales[ib]) << (4 * (ib % 2))));
  }
}

// IQ3_XXS (98 bytes): f16 d | u8 qs[64] grid indices | 8 x u32 (4 x 7-bit signs | scale << 28).
void BlockIQ3XXS(const float *x, uint8_t *b, const float *qw) {
  BlockFit f;
  FitBlock(kIQ3XXS, x, qw, 2.0f * SumSquares(x) / kQK, false, &f);
  std::memset(b, 0, 98);
  if (f.max_scale == 0.0f) return;
  const float d = f.max_scale / 31.0f;
  StoreU16(b, FloatToHalf(d * 1.0125f));
  const float id = 1.0f / d;
  for (int i = 0; i < 64; ++i) b[2 + i] = static_cast<uint8_t>(f.grid[i]);
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t s = 0;
    for (int k = 0; k < 4; ++k) s |= static_cast<uint32_t>(f.signs[ib * 4 + k]) << (7 * k);
    s |= static_cast<uint32_t>(ScaleCode(id, f.scales[ib])) << 28;
    std::memcpy(b + 66 + 4 * ib, &s, 4);
  }
}

// IQ3_S (110 bytes): f16 d | u8 qs[64] | u8 qh[8] | u8 signs[32] | u8 scales[4]. ggml writes the
// grid bytes and signs of the sub-blocks it fits one after another, so an all-zero sub-block
// shifts the later ones forward (the high bits in qh stay at their sub-block's place); so does this.
void BlockIQ3S(const float *x, uint8_t *b, const float *qw) {
  BlockFit f;
  FitBlock(kIQ3S, x, qw, 2.0f * SumSquares(x) / kQK, false, &f);
  std::memset(b, 0, 110);
  uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
  for (int ib = 0; ib < 8; ++ib) {
    if (f.skip[ib]) continue;
    for (int k = 0; k < 8; ++k) {
      const uint16_t g = f.grid[ib * 8 + k];
      qs[k] = static_cast<uint8_t>(g & 255);
      qh[ib] = static_cast<uint8_t>(qh[ib] | ((g >> 8) << k));
    }
    qs += 8;
    for (int k = 0; k < 4; ++k) signs[k] = f.signs[ib * 4 + k];
    signs += 4;
  }
  if (f.max_scale == 0.0f) return;
  const float d = f.max_scale / 31.0f;
  StoreU16(b, FloatToHalf(d * 1.033f));
  const float id = 1.0f / d;
  for (int ib = 0; ib < 8; ib += 2) {
    b[106 + ib / 2] = static_cast<uint8_t>(ScaleCode(id, f.scales[ib]) | (ScaleCode(id, f.scales[ib + 1]) << 4));
  }
}

}  // namespace

void QuantizeIQ2_XXSWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ2XXS, 66>(src, dst, n, weights);
}
void QuantizeIQ2_XSWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ2XS, 74>(src, dst, n, weights);
}
void QuantizeIQ2_S(const float *src, void *dst, int64_t n) { LatticeRows<&BlockIQ2S, 82>(src, dst, n, nullptr); }
void QuantizeIQ2_SWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ2S, 82>(src, dst, n, weights);
}
void QuantizeIQ3_XXS(const float *src, void *dst, int64_t n) { LatticeRows<&BlockIQ3XXS, 98>(src, dst, n, nullptr); }
void QuantizeIQ3_XXSWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ3XXS, 98>(src, dst, n, weights);
}
void QuantizeIQ3_S(const float *src, void *dst, int64_t n) { LatticeRows<&BlockIQ3S, 110>(src, dst, n, nullptr); }
void QuantizeIQ3_SWeighted(const float *src, void *dst, int64_t n, const float *weights) {
  LatticeRows<&BlockIQ3S, 110>(src, dst, n, weights);
}

}  // namespace strata::quant::internal
