// The scale searches of fit.h. Every sum runs in index order in float, and every product keeps
// ggml's association (w * x * l is (w * x) * l), so the chosen codes and scales equal ggml's bit for
// bit; contraction into fused multiply-adds is off for the same reason.
#include "lib/quant/fit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/quant/fp_contract_off.h"

namespace strata::quant::internal {
namespace {

int Clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The signed extreme of x (first on ties) and its magnitude.
void SignedMax(int n, const float *x, float *max, float *amax) {
  float m = 0.0f, a = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > a) {
      a = ax;
      m = x[i];
    }
  }
  *max = m;
  *amax = a;
}

}  // namespace

int NearestInt(float v) {
  const float shifted = v + 12582912.0f;  // 1.5 * 2^23
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

float FitSigned(int n, int nmax, const float *x, const float *weights, int8_t *codes) {
  float max, amax;
  SignedMax(n, x, &max, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.0f;
  }
  auto weight = [&](int i) { return weights != nullptr ? weights[i] : x[i] * x[i]; };
  // Sums of w x l and w l^2 for the grid iscale, optionally writing the codes.
  auto sums = [&](float iscale, bool write, float *sumlx, float *suml2) {
    float slx = 0.0f, sl2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = Clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      if (write) codes[i] = static_cast<int8_t>(l + nmax);
      const float w = weight(i);
      slx += w * x[i] * static_cast<float>(l);
      sl2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    *sumlx = slx;
    *suml2 = sl2;
  };
  float sumlx, suml2;
  sums(static_cast<float>(-nmax) / max, true, &sumlx, &suml2);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
    sums(iscale, false, &sumlx, &suml2);
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      sums(iscale, true, &sumlx, &suml2);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float FitSignedByPasses(int n, int nmax, const float *x, int8_t *codes) {
  float max, amax;
  SignedMax(n, x, &max, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = Clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
    codes[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(codes[i]);
      float slx = sumlx - w * x[i] * li;
      if (!(slx > 0.0f)) continue;
      float sl2 = suml2 - w * li * li;
      const int l = Clamp(NearestInt(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (l == codes[i]) continue;
      slx += w * x[i] * static_cast<float>(l);
      sl2 += w * static_cast<float>(l) * static_cast<float>(l);
      if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
        codes[i] = static_cast<int8_t>(l);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) codes[i] = static_cast<int8_t>(codes[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float FitAffine(int n, int nmax, const float *x, const float *weights, uint8_t *codes, float *neg_min,
                uint8_t *scratch, const AffineSearch &search) {
  auto weight = [&](int i) { return weights != nullptr ? weights[i] : x[i] * x[i]; };
  float min = x[0], max = x[0];
  float sum_w = weight(0);
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weight(i);
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max <= min) {  // also false for NaN: ggml's two variants differ only there
    for (int i = 0; i < n; ++i) codes[i] = 0;
    *neg_min = -min;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  // Error of codes l under (s, m): sum w d, d = (s l + m - x)^2 or |s l + m - x|.
  auto error = [&](const uint8_t *l, float s, float m) {
    float e = 0.0f;
    for (int i = 0; i < n; ++i) {
      float diff = s * static_cast<float>(l[i]) + m - x[i];
      diff = search.use_mad ? std::fabs(diff) : diff * diff;
      e += weight(i) * diff;
    }
    return e;
  };
  float iscale = fmax / (max - min);
  float scale = 1.0f / iscale;
  for (int i = 0; i < n; ++i) {
    codes[i] = static_cast<uint8_t>(Clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
  }
  float best_error = error(codes, scale, min);
  if (search.nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int k = 0; k <= search.nstep; ++k) {
    iscale = (search.rmin + search.rdelta * static_cast<float>(k) + fmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = Clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      scratch[i] = static_cast<uint8_t>(l);
      const float w = weight(i);
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.0f)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0.0f) {  // the formats subtract a non-negative min: refit the scale alone
      this_min = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    const float e = error(scratch, this_scale, this_min);
    if (e < best_error) {
      std::memcpy(codes, scratch, static_cast<size_t>(n));
      best_error = e;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

float FitUnsigned(int n, int nmax, const float *x, uint8_t *codes, const float *weights) {
  float max = 0.0f;
  for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
  if (max < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = fmax / max;
  for (int i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(NearestInt(iscale * x[i]));
  float best_mse = 0.0f;
  {
    const float scale = 1.0f / iscale;
    for (int i = 0; i < n; ++i) {
      const float diff = x[i] - scale * static_cast<float>(codes[i]);
      best_mse += weights[i] * diff * diff;
    }
  }
  for (int k = -4; k <= 4; ++k) {
    if (k == 0) continue;
    const float iscale_k = (0.1f * static_cast<float>(k) + fmax) / max;
    const float scale_k = 1.0f / iscale_k;
    float mse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, NearestInt(iscale_k * x[i]));
      const float diff = x[i] - scale_k * static_cast<float>(l);
      mse += weights[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_k;
    }
  }
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, NearestInt(iscale * x[i]));
    codes[i] = static_cast<uint8_t>(l);
    const float w = weights[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = weights[i];
      const float li = static_cast<float>(codes[i]);
      float slx = sumlx - w * x[i] * li;
      float sl2 = suml2 - w * li * li;
      if (!(slx > 0.0f && sl2 > 0.0f)) continue;
      const int l = std::min(nmax, NearestInt(x[i] * sl2 / slx));
      if (l == codes[i]) continue;
      slx += w * x[i] * static_cast<float>(l);
      sl2 += w * static_cast<float>(l) * static_cast<float>(l);
      if (slx * slx * suml2 > sumlx * sumlx * sl2) {
        codes[i] = static_cast<uint8_t>(l);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

int NearestLevel(int n, const int8_t *val, float x) {
  if (x <= static_cast<float>(val[0])) return 0;
  if (x >= static_cast<float>(val[n - 1])) return n - 1;
  int lo = 0, hi = n - 1;  // val[lo] <= x < val[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < static_cast<float>(val[mid])) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return x - static_cast<float>(val[hi - 1]) < static_cast<float>(val[hi]) - x ? hi - 1 : hi;
}

}  // namespace strata::quant::internal
