// Internals shared by the codec files: the codec objects the registry lists, little-endian field
// readers and the block-by-block reference dot. Not installed; only lib/quant includes it.
// Every function here works on whole blocks; callers (the registry users) guarantee n % block == 0.
#pragma once

#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"

namespace strata::quant::internal {

// One object per codec Strata can run; codec.cc indexes them by type id.
extern const Codec kCodecF32;
extern const Codec kCodecF16;
extern const Codec kCodecBF16;
extern const Codec kCodecQ4_0;
extern const Codec kCodecQ4_1;
extern const Codec kCodecQ5_0;
extern const Codec kCodecQ5_1;
extern const Codec kCodecQ8_0;
extern const Codec kCodecQ2_K;
extern const Codec kCodecQ3_K;
extern const Codec kCodecQ4_K;
extern const Codec kCodecQ5_K;
extern const Codec kCodecQ6_K;
extern const Codec kCodecIQ4_NL;
extern const Codec kCodecIQ4_XS;
extern const Codec kCodecIQ2_XXS;
extern const Codec kCodecIQ2_XS;
extern const Codec kCodecIQ2_S;
extern const Codec kCodecIQ3_XXS;
extern const Codec kCodecIQ3_S;
extern const Codec kCodecIQ1_S;
extern const Codec kCodecIQ1_M;
extern const Codec kCodecMXFP4;

// GGUF is little-endian and block fields are unaligned; memcpy keeps the reads defined behaviour.
// (Strata only builds for little-endian hosts.)
inline uint16_t LoadU16(const uint8_t *p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t LoadU32(const uint8_t *p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreU16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// The reference dot of every codec: dequantize 256 elements at a time (a multiple of every block
// size) and accumulate dequantized * x in double, rounding to float once at the end. Each product
// of two floats is exact in double, so the result is within about one float ulp of the exact dot of
// the dequantized row with x, independent of summation order; SIMD kernels are checked against it.
using DequantizeFn = void (*)(const void *src, float *dst, int64_t n);
float DotViaDequantize(DequantizeFn dequantize, int64_t block_elems, int64_t block_bytes,
                       const void *row, const float *x, int64_t n);

}  // namespace strata::quant::internal
