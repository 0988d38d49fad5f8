// Internals shared by the kernel files: the 16-lane accumulation order every exact kernel follows
// and the AVX2 table lookup. Only backends/cpu/kernels/ includes it.
#pragma once

#include "backends/cpu/kernels/kernels.h"

namespace strata::cpu::kernels::internal {

// Exact kernels accumulate element i into lane i % 16 and reduce the 16 lanes as
// lane[l] + lane[l + 8] (l < 8), then ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)): the order
// _mm256 add of the two halves, then the 128-bit halves, then movehl, then movehdup, produces.
inline float Reduce16(const float *lane) {
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = lane[l] + lane[l + 8];
  const float a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
  return (a0 + a2) + (a1 + a3);
}

// Fills *k with the AVX2 kernels for codec; false when there are none (use the generic ones).
// avx512: where an AVX-512 kernel exists, it instead (same results bit for bit). Defined in
// kernels_avx2.cc, the only file built with -mavx2 -mfma -mf16c (its AVX-512 functions carry their
// own target attribute); call it only when BestIsa() is kAvx2 (avx512 false) or kAvx512.
bool FindAvx2RowKernels(const quant::Codec &codec, bool avx512, RowKernels *k);

}  // namespace strata::cpu::kernels::internal
