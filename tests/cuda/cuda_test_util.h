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
// code, sub-block scale and high bit takes all its values (a quantizer's output need not), with
// RandomBlockScales setting the f16 fields.
inline bool RandomBytesCodec(quant::TypeId type) {
  using quant::TypeId;
  for (TypeId t : {TypeId::kQ4_0, TypeId::kQ4_1, TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ2_K, TypeId::kQ3_K,
                   TypeId::kQ5_K}) {
    if (t == type) return true;
  }
  return false;
}

// Finite random f16 scale fields (d, and the offset where the codec has one) in a block of random
// bytes of a RandomBytesCodec codec: |d| in [0.001, 0.05), offsets of either sign.
inline void RandomBlockScales(std::mt19937 &rng, quant::TypeId type, uint8_t *b) {
  using quant::TypeId;
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::bernoulli_distribution neg(0.5);
  auto any_sign = [&] { return neg(rng) ? -scale(rng) : scale(rng); };
  switch (type) {
    case TypeId::kQ4_0:
    case TypeId::kQ5_0: PutHalf(b, any_sign()); break;
    case TypeId::kQ4_1:
    case TypeId::kQ5_1: PutHalf(b, scale(rng)); PutHalf(b + 2, 8.0f * any_sign()); break;
    case TypeId::kQ2_K: PutHalf(b + 80, scale(rng)); PutHalf(b + 82, any_sign()); break;
    case TypeId::kQ3_K: PutHalf(b + 108, any_sign()); break;
    case TypeId::kQ5_K: PutHalf(b, 0.1f * scale(rng)); PutHalf(b + 2, 0.1f * any_sign()); break;
    default: FAIL("no scale fields known for " << quant::TypeName(static_cast<uint32_t>(type)));
  }
}

// Random rows of a codec: random block bytes with finite scales for a RandomBytesCodec codec;
// quantized random floats where Strata has a quantizer; otherwise random block bytes with the scale
// fields set to finite, moderate values (every code pattern is valid).
inline std::vector<uint8_t> RandomMatrix(std::mt19937 &rng, quant::TypeId type, int64_t rows, int64_t cols,
                                         uint64_t *row_bytes) {
  const quant::Codec *c = quant::FindCodec(type);
  REQUIRE(c != nullptr);
  *row_bytes = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
  std::vector<uint8_t> out(*row_bytes * rows);
  if (RandomBytesCodec(type)) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto &b : out) b = static_cast<uint8_t>(byte(rng));
    for (size_t i = 0; i < out.size(); i += static_cast<size_t>(c->block_bytes)) RandomBlockScales(rng, type, out.data() + i);
    return out;
  }
  if (c->quantize != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> x = RandomFloats(rng, cols);
      c->quantize(x.data(), out.data() + r * *row_bytes, cols);
    }
    return out;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto &b : out) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const int64_t n_blocks = static_cast<int64_t>(out.size() / c->block_bytes);
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t *b = out.data() + i * c->block_bytes;
    if (type == quant::TypeId::kMXFP4) {
      b[0] = static_cast<uint8_t>(118 + byte(rng) % 16);  // 2^-10 .. 2^5
    } else {  // IQ4_XS: f16 d first
      PutHalf(b, scale(rng));
    }
  }
  return out;
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
