// Byte-identity of Strata's quantizers with ggml's, with and without importance weights: every
// case of tests/quant/fixtures/ggml_*.bin (written by scripts/quant/make_ggml_fixtures.py from
// ggml_quantize_chunk) must reproduce exactly. Output buffers are poisoned first and guarded past
// the end; the weighted path runs one row at a time, as Codec::quantize_weighted is specified.
// The types ggml refuses to quantize without weights (IQ2_XXS, IQ2_XS, IQ1_S) have no unweighted
// bytes in their fixture and no unweighted quantizer in Strata.
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

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kGuard = 64;

std::vector<uint8_t> ReadFile(const std::string &name) {
  const std::string path = std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/" + name;
  INFO("fixture " << path << " (regenerate with scripts/quant/make_ggml_fixtures.py)");
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A little-endian reader that fails the test on a short file.
struct Reader {
  const std::vector<uint8_t> &data;
  size_t at = 0;
  const uint8_t *Take(size_t n) {
    REQUIRE(at + n <= data.size());
    const uint8_t *p = data.data() + at;
    at += n;
    return p;
  }
  uint32_t U32() {
    uint32_t v;
    std::memcpy(&v, Take(4), 4);
    return v;
  }
  std::vector<float> Floats(size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), Take(n * 4), n * 4);
    return v;
  }
};

struct Case {
  std::string name;
  uint32_t rows = 0, cols = 0;
  std::vector<float> x, weights;
};

std::vector<Case> LoadInputs() {
  static const std::vector<uint8_t> data = ReadFile("ggml_inputs.bin");
  Reader r{data};
  REQUIRE(std::memcmp(r.Take(4), "SQGI", 4) == 0);
  REQUIRE(r.U32() == 1);
  const uint32_t n = r.U32();
  REQUIRE(n > 0);
  std::vector<Case> cases(n);
  for (Case &c : cases) {
    const uint8_t *name = r.Take(24);
    c.name.assign(reinterpret_cast<const char *>(name), strnlen(reinterpret_cast<const char *>(name), 24));
    c.rows = r.U32();
    c.cols = r.U32();
    c.x = r.Floats(size_t{c.rows} * c.cols);
    c.weights = r.Floats(c.cols);
  }
  REQUIRE(r.at == data.size());
  return cases;
}

// Index of the first differing byte, or -1.
int64_t FirstMismatch(const uint8_t *got, const uint8_t *want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

void CheckType(TypeId id, bool weighted) {
  const Codec *c = FindCodec(id);
  REQUIRE(c != nullptr);
  REQUIRE(CanQuantize(*c));
  // ggml ignores importance weights for Q8_0, MXFP4, TQ1_0 and TQ2_0; the others have a weighted search.
  const bool ignores_weights = id == TypeId::kQ8_0 || id == TypeId::kMXFP4 || id == TypeId::kTQ1_0 ||
                               id == TypeId::kTQ2_0;
  if (weighted) REQUIRE((c->quantize_weighted == nullptr) == ignores_weights);
  const bool needs_weights = id == TypeId::kIQ2_XXS || id == TypeId::kIQ2_XS || id == TypeId::kIQ1_S;
  REQUIRE(RequiresImportance(*c) == needs_weights);
  if (!weighted && needs_weights) return;
  const std::vector<Case> cases = LoadInputs();
  const std::vector<uint8_t> data = ReadFile("ggml_" + std::string(c->name) + ".bin");
  Reader r{data};
  REQUIRE(std::memcmp(r.Take(4), "SQGQ", 4) == 0);
  REQUIRE(r.U32() == 1);
  REQUIRE(r.U32() == static_cast<uint32_t>(id));
  REQUIRE(r.U32() == cases.size());
  REQUIRE(r.U32() == c->block_elems);
  REQUIRE(r.U32() == c->block_bytes);
  for (const Case &k : cases) {
    INFO(c->name << (weighted ? " with weights" : " without weights") << ", case " << k.name << " ("
                 << k.rows << " x " << k.cols << ")");
    REQUIRE(r.U32() == k.rows);
    REQUIRE(r.U32() == k.cols);
    const size_t row_bytes = static_cast<size_t>(k.cols / c->block_elems * c->block_bytes);
    const size_t bytes = row_bytes * k.rows;
    const uint8_t *plain = needs_weights ? nullptr : r.Take(bytes);
    const uint8_t *with_w = r.Take(bytes);
    std::vector<uint8_t> out(bytes + kGuard, kPoison);
    if (weighted) {
      for (uint32_t row = 0; row < k.rows; ++row) {
        QuantizeRow(*c, k.x.data() + size_t{row} * k.cols, out.data() + row * row_bytes, k.cols, k.weights.data());
      }
    } else {
      c->quantize(k.x.data(), out.data(), static_cast<int64_t>(k.x.size()));
    }
    const uint8_t *want = weighted ? with_w : plain;
    const int64_t first = FirstMismatch(out.data(), want, bytes);
    if (first >= 0) {
      INFO("first mismatch at byte " << first << " (row " << first / static_cast<int64_t>(row_bytes) << ", block "
                                     << (first % static_cast<int64_t>(row_bytes)) / c->block_bytes << ", offset "
                                     << first % c->block_bytes << "): got " << int{out[first]} << " want "
                                     << int{want[first]});
      CHECK(first < 0);
    }
    for (size_t i = bytes; i < out.size(); ++i) REQUIRE(out[i] == kPoison);
  }
  REQUIRE(r.at == data.size());
}

constexpr TypeId kGgmlTypes[] = {TypeId::kQ4_0,   TypeId::kQ4_1,   TypeId::kQ5_0,   TypeId::kQ5_1,
                                 TypeId::kQ8_0,   TypeId::kQ2_K,   TypeId::kQ3_K,   TypeId::kQ4_K,
                                 TypeId::kQ5_K,   TypeId::kQ6_K,   TypeId::kIQ4_NL, TypeId::kIQ4_XS,
                                 TypeId::kMXFP4,  TypeId::kTQ1_0,  TypeId::kTQ2_0,  TypeId::kIQ2_XXS,
                                 TypeId::kIQ2_XS, TypeId::kIQ2_S,  TypeId::kIQ3_XXS, TypeId::kIQ3_S,
                                 TypeId::kIQ1_S,  TypeId::kIQ1_M};

}  // namespace

TEST_CASE("quantize is byte-identical to ggml without importance weights", "[quant]") {
  for (TypeId id : kGgmlTypes) {
    DYNAMIC_SECTION("type " << TypeName(static_cast<uint32_t>(id))) { CheckType(id, false); }
  }
}

TEST_CASE("quantize is byte-identical to ggml with importance weights", "[quant]") {
  for (TypeId id : kGgmlTypes) {
    DYNAMIC_SECTION("type " << TypeName(static_cast<uint32_t>(id))) { CheckType(id, true); }
  }
}

}  // namespace strata::quant
