// Helpers for the GPU tests: skip without a device, random codec-encoded matrices, device copies,
// NaN-poisoned outputs and the relative L2 error every test states its tolerance in.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "lib/quant/codec.h"

namespace strata::cuda::test {

// True when a GPU is present; otherwise records a warning so CI (no GPU) passes with the skip visible.
inline bool HaveGpu() {
  if (DeviceCount() > 0) return true;
  WARN("no CUDA device: GPU test skipped");
  return false;
}

// A fresh seed per run (reported, so a failure can be replayed by hand).
inline std::mt19937 Rng() {
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  return std::mt19937(seed);
}

inline std::vector<float> RandomFloats(std::mt19937 &rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

inline void PutHalf(uint8_t *p, float f) {
  const uint16_t h = quant::FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

// The codecs whose blocks RandomMatrix draws as random bytes although Strata quantizes them: every
// code, grid entry, sign, sub-block scale and high bit takes all its values (a quantizer's output need
// not), with RandomBlockScales setting the scale fields.
inline bool RandomBytesCodec(quant::TypeId type) {
  using quant::TypeId;
  for (TypeId t : {TypeId::kQ4_0, TypeId::kQ4_1, TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ2_K, TypeId::kQ3_K,
                   TypeId::kQ5_K, TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS,
                   TypeId::kIQ3_S, TypeId::kIQ1_S, TypeId::kIQ1_M}) {
    if (t == type) return true;
  }
  return false;
}

// Finite random scale fields in a block of random bytes of any block codec (not F32, F16, BF16): the
// f16 d, |d| in [0.001, 0.05) and of either sign (IQ1_M keeps it in its scales' top nibbles), the
// offset where the codec has one, MXFP4's exponent in 2^-10 .. 2^5.
inline void RandomBlockScales(std::mt19937 &rng, quant::TypeId type, uint8_t *b) {
  using quant::TypeId;
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::bernoulli_distribution neg(0.5);
  auto any_sign = [&] { return neg(rng) ? -scale(rng) : scale(rng); };
  switch (type) {
    case TypeId::kQ4_0:
    case TypeId::kQ5_0:
    case TypeId::kQ8_0:
    case TypeId::kIQ4_NL:
    case TypeId::kIQ4_XS:
    case TypeId::kIQ2_XXS:
    case TypeId::kIQ2_XS:
    case TypeId::kIQ2_S:
    case TypeId::kIQ3_XXS:
    case TypeId::kIQ3_S:
    case TypeId::kIQ1_S: PutHalf(b, any_sign()); break;
    case TypeId::kIQ1_M: quant::SetIQ1_MScaleBits(b, quant::FloatToHalf(any_sign())); break;
    case TypeId::kQ4_1:
    case TypeId::kQ5_1: PutHalf(b, scale(rng)); PutHalf(b + 2, 8.0f * any_sign()); break;
    case TypeId::kQ2_K: PutHalf(b + 80, scale(rng)); PutHalf(b + 82, any_sign()); break;
    case TypeId::kQ3_K: PutHalf(b + 108, any_sign()); break;
    case TypeId::kQ4_K:
    case TypeId::kQ5_K: PutHalf(b, 0.1f * scale(rng)); PutHalf(b + 2, 0.1f * any_sign()); break;
    case TypeId::kQ6_K: PutHalf(b + 208, any_sign()); break;
    case TypeId::kTQ1_0: PutHalf(b + 52, any_sign()); break;
    case TypeId::kTQ2_0: PutHalf(b + 64, any_sign()); break;
    case TypeId::kMXFP4: b[0] = static_cast<uint8_t>(118 + std::uniform_int_distribution<int>(0, 15)(rng)); break;
    default: FAIL("no scale fields known for " << quant::TypeName(static_cast<uint32_t>(type)));
  }
}

// Random block bytes of a block codec, its scale fields set by RandomBlockScales.
inline std::vector<uint8_t> RandomBlocks(std::mt19937 &rng, quant::TypeId type, int64_t rows, int64_t cols,
                                         uint64_t *row_bytes) {
  const quant::Codec *c = quant::FindCodec(type);
  REQUIRE(c != nullptr);
  *row_bytes = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
  std::vector<uint8_t> out(*row_bytes * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto &b : out) b = static_cast<uint8_t>(byte(rng));
  for (size_t i = 0; i < out.size(); i += static_cast<size_t>(c->block_bytes)) RandomBlockScales(rng, type, out.data() + i);
  return out;
}

// Rows of a codec quantized by lib/quant from random floats in [-1, 1): under random importance
// weights (one per column, in [0.1, 10)) when `weighted` or when the codec needs them (IQ2_XXS,
// IQ2_XS, IQ1_S), as ggml would quantize them; otherwise without.
inline std::vector<uint8_t> QuantizedMatrix(std::mt19937 &rng, quant::TypeId type, int64_t rows, int64_t cols,
                                            uint64_t *row_bytes, bool weighted = false) {
  const quant::Codec *c = quant::FindCodec(type);
  REQUIRE(c != nullptr);
  REQUIRE(quant::CanQuantize(*c));
  *row_bytes = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
  std::vector<uint8_t> out(*row_bytes * rows);
  const bool weights = weighted || c->quantize == nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> x = RandomFloats(rng, cols);
    const std::vector<float> imp = weights ? RandomFloats(rng, cols, 0.1f, 10.f) : std::vector<float>();
    quant::QuantizeRow(*c, x.data(), out.data() + r * *row_bytes, cols, weights ? imp.data() : nullptr);
  }
  return out;
}

// Random rows of a codec: RandomBlocks for a RandomBytesCodec codec, else QuantizedMatrix.
inline std::vector<uint8_t> RandomMatrix(std::mt19937 &rng, quant::TypeId type, int64_t rows, int64_t cols,
                                         uint64_t *row_bytes) {
  if (RandomBytesCodec(type)) return RandomBlocks(rng, type, rows, cols, row_bytes);
  return QuantizedMatrix(rng, type, rows, cols, row_bytes);
}

template <typename T>
DeviceBuffer Upload(const std::vector<T> &v) {
  auto b = DeviceBuffer::Allocate(v.size() * sizeof(T));
  REQUIRE(b.ok());
  REQUIRE(cudaMemcpy(b->data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return std::move(b).value();
}

// n floats of device memory filled with NaN (all-ones bits), so a value the kernel did not write
// shows up as NaN and fails the comparison.
inline DeviceBuffer Poisoned(size_t n) {
  auto b = DeviceBuffer::Allocate(n * sizeof(float));
  REQUIRE(b.ok());
  REQUIRE(cudaMemset(b->data(), 0xff, n * sizeof(float)) == cudaSuccess);
  return std::move(b).value();
}

template <typename T>
std::vector<T> Download(const DeviceBuffer &b, size_t n) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

// ‖out − ref‖₂ / ‖ref‖₂ in double; infinity if out holds a NaN.
inline double RelL2(const std::vector<float> &out, const std::vector<float> &ref) {
  REQUIRE(out.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

inline DeviceMatrix View(quant::TypeId type, const DeviceBuffer &b, int64_t rows, int64_t cols, uint64_t row_bytes) {
  return DeviceMatrix{type, b.data(), rows, cols, row_bytes};
}

}  // namespace strata::cuda::test
