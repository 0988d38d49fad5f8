// MXFP4 (OCP microscaling FP4, as stored by GGUF): 32 E2M1 values sharing one E8M0 exponent byte.
// Levels are stored doubled (so they are integers) and the scale halved to compensate, exactly as
// gguf and ggml do; the product d * level is then bit-identical to gguf.quants.dequantize. The
// quantizer is byte-identical to ggml's (which has no weighted search: it ignores importance weights).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

// Byte layout (17): u8 e | u8 qs[16]; element j < 16 = low nibble of qs[j], j + 16 = high nibble;
// x = 2^(e - 128) * level[q], level = twice the E2M1 value.
constexpr int64_t kElems = 32;
constexpr int64_t kBytes = 17;
constexpr int8_t kLevels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as a float: subnormal for e < 2 (2^-128 and 2^-127), normal up to 2^127 at e = 255.
float HalfScale(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e) - 1u) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void DequantizeMXFP4(const void *src, float *dst, int64_t n) {
  const auto *b = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; i += kElems, b += kBytes, dst += kElems) {
    const float d = HalfScale(b[0]);
    const uint8_t *qs = b + 1;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(kLevels[qs[j] & 0x0f]);
      dst[j + 16] = d * static_cast<float>(kLevels[qs[j] >> 4]);
    }
  }
}

// The level nearest v under scale d: the first of equally near ones (so +0 before -0).
uint8_t NearestLevel(float v, float d) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kLevels[0]) * d - v);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kLevels[i]) * d - v);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

// ggml: the shared exponent puts the block's largest magnitude in the top binade of the levels,
// e = floor(log2(amax)) - 2 + 127 (0 for an all-zero block); each element takes its nearest level.
void QuantizeMXFP4(const float *src, void *dst, int64_t n) {
  auto *b = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; i += kElems, b += kBytes, src += kElems) {
    float amax = 0.0f;
    for (int j = 0; j < kElems; ++j) {
      if (amax < std::fabs(src[j])) amax = std::fabs(src[j]);
    }
    // ggml casts the float exponent straight to a byte; its x86 build goes through a 32-bit int
    // (an out-of-range value, from an infinite amax, becomes INT_MIN), which this spells out
    // without undefined behaviour.
    const float ef = amax > 0.0f ? std::floor(std::log2(amax)) - 2.0f + 127.0f : 0.0f;
    const int32_t ei = ef > -2147483648.0f && ef < 2147483648.0f ? static_cast<int32_t>(ef) : INT32_MIN;
    const auto e = static_cast<uint8_t>(ei);
    const float d = HalfScale(e);
    b[0] = e;
    for (int j = 0; j < 16; ++j) {
      b[1 + j] = static_cast<uint8_t>(NearestLevel(src[j], d) | (NearestLevel(src[j + 16], d) << 4));
    }
  }
}

float DotMXFP4(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeMXFP4, kElems, kBytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecMXFP4 = {TypeId::kMXFP4, "MXFP4", kElems, kBytes, &DequantizeMXFP4, &QuantizeMXFP4,
                           &DotMXFP4, nullptr};  // ggml ignores importance weights for MXFP4
}  // namespace internal

}  // namespace strata::quant
