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

// Random rows of a codec: quantized random floats where Strata has a quantizer; otherwise random
// block bytes with the scale fields set to finite, moderate values (every code pattern is valid).
inline std::vector<uint8_t> RandomMatrix(std::mt19937 &rng, quant::TypeId type, int64_t rows, int64_t cols,
                                         uint64_t *row_bytes) {
  const quant::Codec *c = quant::FindCodec(type);
  REQUIRE(c != nullptr);
  *row_bytes = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
  std::vector<uint8_t> out(*row_bytes * rows);
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
      const uint16_t h = quant::FloatToHalf(scale(rng));
      std::memcpy(b, &h, 2);
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
