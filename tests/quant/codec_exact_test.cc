// Bit-identity of the CPU codecs with the gguf Python package: every fixture written by
// scripts/quant/make_codec_fixtures.py must be present and must reproduce exactly (float bits for
// dequantize, bytes for quantize). Outputs are poisoned first and guarded past the end.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "lib/quant/codec.h"

namespace strata::quant {
namespace {

constexpr uint32_t kKindDequant = 0;
constexpr uint32_t kKindQuant = 1;
constexpr uint32_t kPoisonBits = 0x7fc0dead;  // a quiet NaN no fixture contains
constexpr size_t kGuard = 64;                  // elements / bytes past the end that must stay put

struct Fixture {
  uint32_t type_id = 0, kind = 0, n_blocks = 0, block_elems = 0, block_bytes = 0;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

// Reads tests/quant/fixtures/<prefix>_<name>.bin; fails the test if it is missing or malformed.
Fixture LoadFixture(const std::string &prefix, std::string_view name) {
  const std::string path =
      std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/" + prefix + "_" + std::string(name) + ".bin";
  INFO("fixture " << path << " (regenerate with scripts/quant/make_codec_fixtures.py)");
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(data.size() >= 28);
  REQUIRE(std::memcmp(data.data(), "SQFX", 4) == 0);
  uint32_t h[6];
  std::memcpy(h, data.data() + 4, sizeof h);
  REQUIRE(h[0] == 1);  // version
  Fixture f;
  f.type_id = h[1];
  f.kind = h[2];
  f.n_blocks = h[3];
  f.block_elems = h[4];
  f.block_bytes = h[5];
  const size_t nb = size_t{f.n_blocks} * f.block_bytes;
  const size_t nv = size_t{f.n_blocks} * f.block_elems;
  REQUIRE(data.size() == 28 + nb + nv * sizeof(float));
  f.blocks.assign(data.begin() + 28, data.begin() + 28 + static_cast<std::ptrdiff_t>(nb));
  f.values.resize(nv);
  std::memcpy(f.values.data(), data.data() + 28 + nb, nv * sizeof(float));
  REQUIRE(f.n_blocks > 0);
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float Poison() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}

void CheckDequantFixture(TypeId id) {
  const Codec *c = FindCodec(id);
  REQUIRE(c != nullptr);
  INFO("codec " << c->name);
  const Fixture f = LoadFixture("dequant", c->name);
  REQUIRE(f.kind == kKindDequant);
  REQUIRE(f.type_id == static_cast<uint32_t>(id));
  REQUIRE(f.block_elems == c->block_elems);
  REQUIRE(f.block_bytes == c->block_bytes);
  const int64_t n = static_cast<int64_t>(f.values.size());
  std::vector<float> out(f.values.size() + kGuard, Poison());
  c->dequantize(f.blocks.data(), out.data(), n);
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (Bits(out[i]) != Bits(f.values[i])) {
      if (first < 0) first = i;
      ++mismatches;
    }
  }
  if (first >= 0) {
    INFO("first mismatch at element " << first << " (block " << first / c->block_elems << "): got 0x"
                                      << std::hex << Bits(out[first]) << " want 0x"
                                      << Bits(f.values[first]));
    CHECK(mismatches == 0);
  }
  for (size_t i = f.values.size(); i < out.size(); ++i) REQUIRE(Bits(out[i]) == kPoisonBits);
}

void CheckQuantFixture(TypeId id) {
  const Codec *c = FindCodec(id);
  REQUIRE(c != nullptr);
  REQUIRE(c->quantize != nullptr);
  INFO("codec " << c->name);
  const Fixture f = LoadFixture("quant", c->name);
  REQUIRE(f.kind == kKindQuant);
  REQUIRE(f.type_id == static_cast<uint32_t>(id));
  REQUIRE(f.block_bytes == c->block_bytes);
  std::vector<uint8_t> out(f.blocks.size() + kGuard, 0xA5);
  c->quantize(f.values.data(), out.data(), static_cast<int64_t>(f.values.size()));
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < f.blocks.size(); ++i) {
    if (out[i] != f.blocks[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatches;
    }
  }
  if (first >= 0) {
    INFO("first mismatch at byte " << first << " (block " << first / c->block_bytes << "): got "
                                   << int{out[first]} << " want " << int{f.blocks[first]});
    CHECK(mismatches == 0);
  }
  for (size_t i = f.blocks.size(); i < out.size(); ++i) REQUIRE(out[i] == 0xA5);
}

}  // namespace

TEST_CASE("dequantize is bit-identical to gguf.quants.dequantize", "[quant]") {
  for (TypeId id : {TypeId::kF32, TypeId::kF16, TypeId::kBF16, TypeId::kQ4_0, TypeId::kQ4_1,
                    TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ8_0, TypeId::kQ2_K, TypeId::kQ3_K,
                    TypeId::kQ4_K, TypeId::kQ5_K, TypeId::kQ6_K, TypeId::kIQ4_NL, TypeId::kIQ4_XS,
                    TypeId::kMXFP4, TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS,
                    TypeId::kIQ3_S, TypeId::kIQ1_S, TypeId::kIQ1_M, TypeId::kTQ1_0, TypeId::kTQ2_0}) {
    DYNAMIC_SECTION("type " << TypeName(static_cast<uint32_t>(id))) { CheckDequantFixture(id); }
  }
}

TEST_CASE("quantize is bit-identical to gguf.quants.quantize", "[quant]") {
  for (TypeId id : {TypeId::kF16, TypeId::kBF16, TypeId::kQ4_0, TypeId::kQ4_1, TypeId::kQ5_0,
                    TypeId::kQ5_1, TypeId::kQ8_0}) {
    DYNAMIC_SECTION("type " << TypeName(static_cast<uint32_t>(id))) { CheckQuantFixture(id); }
  }
}

}  // namespace strata::quant
