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
extern const Codec kCodecTQ1_0;
extern const Codec kCodecTQ2_0;

// The IQ4 levels, fixed by the format (ggml's kvalues_iq4nl).
inline constexpr int8_t kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// Quantizers that live apart from their codec's layout file (quantize_k.cc, quantize_iq4.cc): the
// unweighted entry and the weighted one (see Codec::quantize_weighted) of each type.
void QuantizeQ2_K(const float *src, void *dst, int64_t n);
void QuantizeQ2_KWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeQ3_K(const float *src, void *dst, int64_t n);
void QuantizeQ3_KWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeQ4_K(const float *src, void *dst, int64_t n);
void QuantizeQ4_KWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeQ5_K(const float *src, void *dst, int64_t n);
void QuantizeQ5_KWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeQ6_K(const float *src, void *dst, int64_t n);
void QuantizeQ6_KWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ4_NL(const float *src, void *dst, int64_t n);
void QuantizeIQ4_NLWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ4_XS(const float *src, void *dst, int64_t n);
void QuantizeIQ4_XSWeighted(const float *src, void *dst, int64_t n, const float *weights);
// The lattice i-quants (quantize_iq.cc, quantize_iq1.cc). IQ2_XXS, IQ2_XS and IQ1_S have no
// unweighted entry: ggml refuses to make them without importance weights.
void QuantizeIQ2_XXSWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ2_XSWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ2_S(const float *src, void *dst, int64_t n);
void QuantizeIQ2_SWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ3_XXS(const float *src, void *dst, int64_t n);
void QuantizeIQ3_XXSWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ3_S(const float *src, void *dst, int64_t n);
void QuantizeIQ3_SWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ1_SWeighted(const float *src, void *dst, int64_t n, const float *weights);
void QuantizeIQ1_M(const float *src, void *dst, int64_t n);
void QuantizeIQ1_MWeighted(const float *src, void *dst, int64_t n, const float *weights);

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

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes. For j < 4 they are the low
// six bits of bytes j and j + 4; for j >= 4 the low nibble comes from byte j + 4 (scale: low half,
// min: high half) and the top two bits from the spare top bits of bytes j - 4 and j.
inline void KScaleMin(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 0x3f;
    *m = s[j + 4] & 0x3f;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}


// The reference dot of every codec: dequantize 256 elements at a time (a multiple of every block
// size) and accumulate dequantized * x in double, rounding to float once at the end. Each product
// of two floats is exact in double, so the result is within about one float ulp of the exact dot of
// the dequantized row with x, independent of summation order; SIMD kernels are checked against it.
using DequantizeFn = void (*)(const void *src, float *dst, int64_t n);
float DotViaDequantize(DequantizeFn dequantize, int64_t block_elems, int64_t block_bytes,
                       const void *row, const float *x, int64_t n);

}  // namespace strata::quant::internal
