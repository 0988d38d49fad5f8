// Unquantized codecs: F32 (copy), F16 and BF16 (widening is exact; narrowing rounds to nearest
// even, NaNs stay NaN). Blocks are single elements; n may be any non-negative count.
#include <cstring>

#include "lib/quant/codec.h"
#include "lib/quant/codec_impl.h"
#include "lib/quant/fp_contract_off.h"

namespace strata::quant {
namespace {

void DequantizeF32(const void *src, float *dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void QuantizeF32(const float *src, void *dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

float DotF32(const void *row, const float *x, int64_t n) {
  const auto *p = static_cast<const uint8_t *>(row);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, p + i * 4, sizeof v);  // rows inside a mapped file need not be 4-aligned
    acc += static_cast<double>(v) * x[i];
  }
  return static_cast<float>(acc);
}

void DequantizeF16(const void *src, float *dst, int64_t n) {
  const auto *p = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(internal::LoadU16(p + 2 * i));
}

void QuantizeF16(const float *src, void *dst, int64_t n) {
  auto *p = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; ++i) internal::StoreU16(p + 2 * i, FloatToHalf(src[i]));
}

float DotF16(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeF16, 1, 2, row, x, n);
}

void DequantizeBF16(const void *src, float *dst, int64_t n) {
  const auto *p = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(internal::LoadU16(p + 2 * i));
}

void QuantizeBF16(const float *src, void *dst, int64_t n) {
  auto *p = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n; ++i) internal::StoreU16(p + 2 * i, FloatToBf16(src[i]));
}

float DotBF16(const void *row, const float *x, int64_t n) {
  return internal::DotViaDequantize(&DequantizeBF16, 1, 2, row, x, n);
}

}  // namespace

namespace internal {
const Codec kCodecF32 = {TypeId::kF32, "F32", 1, 4, &DequantizeF32, &QuantizeF32, &DotF32,
                         nullptr};
const Codec kCodecF16 = {TypeId::kF16, "F16", 1, 2, &DequantizeF16, &QuantizeF16, &DotF16,
                         nullptr};
const Codec kCodecBF16 = {TypeId::kBF16, "BF16", 1, 2, &DequantizeBF16, &QuantizeBF16, &DotBF16,
                         nullptr};
}  // namespace internal

}  // namespace strata::quant
