// MXFP4 (OCP microscaling FP4, as stored by GGUF): 32 E2M1 values sharing one E8M0 exponent byte.
// Levels are stored doubled (so they are integers) and the scale halved to compensate, exactly as
// gguf and ggml do; the product d * level is then bit-identical to gguf.quants.dequantize.
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

float DotMXFP4(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeMXFP4, kElems, kBytes, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecMXFP4 = {TypeId::kMXFP4, "MXFP4", kElems, kBytes, &DequantizeMXFP4, nullptr,
                           &DotMXFP4, nullptr};
}  // namespace internal

}  // namespace strata::quant
