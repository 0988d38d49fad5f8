// Scale searches shared by the quantizers that reproduce ggml's bytes (the k-quants, the weighted
// legacy types and IQ4). Each takes the values of one (sub-)block and optional per-element weights,
// picks a scale (and for the affine fits an offset) by ggml's rules, and writes the integer codes it
// chose. Bit-identity with ggml rests on doing every float operation in ggml's order, one rounding
// each (fit.cc includes fp_contract_off.h). Not installed; only lib/quant includes it.
#pragma once

#include <cstdint>

namespace strata::quant::internal {

// Below this magnitude a group counts as all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: v + 1.5 * 2^23 puts the integer in the low
// mantissa bits. This is ggml's nearest_int, and its result outside that range is what ggml gets too.
int NearestInt(float v);

// Symmetric fit x ~ s * l, l in [-nmax, nmax - 1], minimizing sum w (x - s l)^2 with w = weights
// or x^2 when weights is null. Tries 19 grids (nmax + 0.1 k over the signed extreme, k = -9..9),
// keeping the best least-squares scale. codes[i] = l + nmax. Returns s (0 for an all-zero group).
float FitSigned(int n, int nmax, const float *x, const float *weights, int8_t *codes);

// The Q3_K reference variant: one grid (nmax over the signed extreme), then up to five passes that
// move single codes when that raises (sum w x l)^2 / sum w l^2, with w = x^2. codes[i] = l + nmax.
float FitSignedByPasses(int n, int nmax, const float *x, int8_t *codes);

// Affine fit x ~ s * l - m, l in [0, nmax], m >= 0 stored as *neg_min (so x ~ s l + min with
// min = -*neg_min <= 0). w = weights, or x^2 when weights is null. The start grid spans [min, max];
// then nstep + 1 grids with nmax + rmin + rdelta k steps are refitted by weighted least squares and
// kept when their error (squared, or absolute with use_mad) is lower. scratch holds n codes.
struct AffineSearch {
  float rmin;
  float rdelta;
  int nstep;
  bool use_mad;
};
float FitAffine(int n, int nmax, const float *x, const float *weights, uint8_t *codes, float *neg_min,
                uint8_t *scratch, const AffineSearch &search);

// Fit of non-negative values (sub-block scales or mins) to codes in [0, nmax] under one scale,
// weighted by weights (never null): 9 grids around nmax / max, then up to five passes moving single
// codes. Codes are stored in bytes as ggml stores them (a negative input wraps).
float FitUnsigned(int n, int nmax, const float *x, uint8_t *codes, const float *weights);

// Index of the level of val[0..n) (ascending) nearest to x; ties go to the upper level.
int NearestLevel(int n, const int8_t *val, float x);

}  // namespace strata::quant::internal
