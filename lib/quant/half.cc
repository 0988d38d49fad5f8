// IEEE binary16 and bfloat16 <-> binary32 conversions, done on bit patterns so they are exact and
// independent of the host's FPU modes (no FTZ/DAZ, no F16C). Narrowing rounds to nearest even;
// NaNs keep their sign and as much payload as fits and never turn into infinities (numpy's rules).
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"

namespace strata::quant {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {
    // Inf or NaN: the payload moves up unchanged (a signalling NaN stays signalling, as in numpy).
    return BitsFloat(sign | 0x7f800000u | (mant << 13));
  }
  if (exp != 0) return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsFloat(sign);
  // Subnormal half: mant * 2^-24 is a normal float; shift the leading one into the implicit bit.
  int e = -14;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  mant &= 0x3ffu;
  return BitsFloat(sign | (static_cast<uint32_t>(e + 127) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: keep the top 10 payload bits; if they are all zero, set one so it stays a NaN.
    uint16_t r = static_cast<uint16_t>(0x7c00u + ((a & 0x7fffffu) >> 13));
    if (r == 0x7c00u) ++r;
    return sign | r;
  }
  // 65520 is halfway between 65504 (max half, odd mantissa) and 65536: ties-to-even gives inf.
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Below 2^-14: the result is a subnormal half, round(|f| / 2^-24). 2^-25 itself ties to 0.
    if (a <= 0x33000000u) return sign;
    const uint32_t e = a >> 23;                      // 102..112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // |f| = m * 2^(e-150)
    const uint32_t shift = 126u - e;                 // |f| / 2^-24 = m >> shift, 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: fine
    return sign | static_cast<uint16_t>(r);
  }
  // Normal half: rebias the exponent, drop 13 mantissa bits with ties-to-even. A carry out of the
  // mantissa correctly bumps the exponent (never to inf: that range was handled above).
  uint32_t r = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  uint32_t x = FloatBits(f);
  // NaN: quieten it (as ggml and gguf do) so truncation cannot turn it into an infinity.
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  // Ties to even; in 64 bits so the largest finite values round up to inf without wrapping.
  const uint64_t r = (static_cast<uint64_t>(x) + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(r);
}

}  // namespace strata::quant
