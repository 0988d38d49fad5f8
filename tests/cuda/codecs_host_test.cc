// The CUDA decoders, run on the host (host_decoders.h: the device code compiled by nvcc for the host),
// bit for bit against lib/quant's dequantize (the reference, itself bit-identical to the gguf Python
// package) for every codec lib/quant decodes: rows lib/quant quantizes from fresh random floats, and
// random block bytes with finite scales, in which every code, grid entry, sign and sub-block scale
// occurs. This checks the decoders' arithmetic without a GPU (the CPU suite runs it); the GPU suite
// checks the kernels that call them. Outputs are poisoned with NaN first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/host_decoders.h"

namespace strata::cuda {
namespace {

using quant::TypeId;

// Every type id lib/quant decodes.
std::vector<TypeId> DecodedTypes() {
  std::vector<TypeId> v;
  for (uint32_t id = 0; id < 256; ++id) {
    if (quant::FindCodec(id) != nullptr) v.push_back(static_cast<TypeId>(id));
  }
  return v;
}

std::string Name(TypeId t) { return std::string(quant::TypeName(static_cast<uint32_t>(t))); }

// The device decoder's rows of w against lib/quant's, bit for bit; the first difference is reported.
void CheckDecodes(TypeId type, const std::vector<uint8_t> &w, int64_t rows, int64_t cols, uint64_t rb) {
  const quant::Codec *c = quant::FindCodec(type);
  REQUIRE(c != nullptr);
  std::vector<float> ref(static_cast<size_t>(rows * cols)), got(ref.size(), NAN);
  for (int64_t r = 0; r < rows; ++r) c->dequantize(w.data() + r * rb, ref.data() + r * cols, cols);
  REQUIRE(test::DecodeOnHost(type, w.data(), rows, cols, rb, got.data()));
  size_t i = 0;
  while (i < ref.size() && std::memcmp(&got[i], &ref[i], sizeof(float)) == 0) ++i;
  INFO("first difference at row " << i / cols << ", column " << i % cols << ": decoded "
                                  << (i < got.size() ? got[i] : 0.f) << ", lib/quant " << (i < ref.size() ? ref[i] : 0.f));
  CHECK(i == ref.size());
}

TEST_CASE("Every codec lib/quant decodes has a CUDA decoder that takes rows of any whole blocks", "[cuda_host]") {
  int decoded = 0;
  for (uint32_t id = 0; id < 256; ++id) {
    const quant::Codec *c = quant::FindCodec(id);
    const auto type = static_cast<TypeId>(id);
    INFO(quant::TypeName(id));
    if (c == nullptr) {
      CHECK_FALSE(HasDeviceCodec(type));
      CHECK(test::DecoderAlign(type) == 0);
      continue;
    }
    ++decoded;
    CHECK(HasDeviceCodec(type));
    const int align = test::DecoderAlign(type);
    REQUIRE(align > 0);
    // An odd number of 32-element items and blocks a row: each row starts only as aligned as a block's
    // size allows, which must satisfy the decoder (otherwise the backend would convert to float).
    const int64_t unit = std::max<int64_t>(32, c->block_elems);
    const int64_t cols = unit * 33;
    const uint64_t rb = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
    CHECK(rb % static_cast<uint64_t>(align) == 0);
    const DeviceMatrix m{type, reinterpret_cast<const void *>(uintptr_t{256}), 5, cols, rb};
    CHECK(CheckMatrix(m).ok());
  }
  CHECK(decoded >= 25);  // F32 .. TQ2_0 and MXFP4 (lib/quant/codec.cc's registry)
}

TEST_CASE("CUDA decoders decode lib/quant's quantized rows bit-identically", "[cuda_host]") {
  auto rng = test::Rng();
  const int64_t rows = 3, cols = 1024;  // whole blocks of every codec
  for (TypeId type : DecodedTypes()) {
    const quant::Codec *c = quant::FindCodec(type);
    for (bool weighted : {false, true}) {
      if (weighted && c->quantize_weighted == nullptr) continue;  // ggml ignores the weights
      if (!weighted && c->quantize == nullptr) continue;          // needs importance weights
      INFO(Name(type) << (weighted ? " under importance weights" : ""));
      uint64_t rb = 0;
      const std::vector<uint8_t> w = test::QuantizedMatrix(rng, type, rows, cols, &rb, weighted);
      CheckDecodes(type, w, rows, cols, rb);
    }
  }
}

TEST_CASE("CUDA decoders decode random blocks bit-identically", "[cuda_host]") {
  auto rng = test::Rng();
  // 1,024 blocks of 256 elements: IQ1_S's 2,048 grid entries are drawn 32,768 times, each one missed
  // with probability e^-16; every smaller grid, sign index and scale far more surely occurs.
  const int64_t rows = 64, cols = 4096;
  for (TypeId type : DecodedTypes()) {
    const quant::Codec *c = quant::FindCodec(type);
    INFO(Name(type));
    uint64_t rb = 0;
    std::vector<uint8_t> w;
    if (c->block_elems > 1) {
      w = test::RandomBlocks(rng, type, rows, cols, &rb);
    } else {  // F32, F16, BF16: every bit pattern but NaN (whose payload conversions need not keep)
      rb = static_cast<uint64_t>(cols * c->block_bytes);
      w.resize(rb * rows);
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto &b : w) b = static_cast<uint8_t>(byte(rng));
      std::vector<float> v(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t e = 0; e < cols; ++e) {
          uint8_t *p = w.data() + r * rb + e * c->block_bytes;
          c->dequantize(p, v.data(), 1);
          if (std::isnan(v[0])) p[c->block_bytes - 1] &= 0x80;  // keep the sign; the exponent leaves NaN
        }
      }
    }
    CheckDecodes(type, w, rows, cols, rb);
  }
}

}  // namespace
}  // namespace strata::cuda
