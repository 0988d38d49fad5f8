// A model whose routed experts are in the lattice i-quants (IQ2_XXS .. IQ1_M) loads, binds and runs
// through the CPU backend as the same model with those experts dequantized to F32 (the decoders
// are bit-identical to gguf.quants: tests/quant/codec_exact_test.cc).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/format/gguf_writer.h"
#include "lib/quant/codec.h"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::quant::TypeId;
using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

// Random blocks of codec c: random codes, the f16 d a small random scale (the weights then have
// the magnitude of a trained model's), where IQ1_M keeps it in the top nibbles of its scales.
std::vector<uint8_t> RandomBlocks(const strata::quant::Codec &c, int64_t n, std::mt19937 &rng) {
  std::uniform_real_distribution<float> scale(1e-4f, 3e-4f);
  std::vector<uint8_t> b(static_cast<size_t>(n / c.block_elems * c.block_bytes));
  for (auto &x : b) x = static_cast<uint8_t>(rng());
  for (size_t at = 0; at < b.size(); at += static_cast<size_t>(c.block_bytes)) {
    const uint16_t h = strata::quant::FloatToHalf((rng() & 1 ? 1.f : -1.f) * scale(rng));
    if (c.id == TypeId::kIQ1_M) {
      strata::quant::SetIQ1_MScaleBits(&b[at], h);
    } else {
      std::memcpy(&b[at], &h, 2);
    }
  }
  return b;
}

// Writes `quant` (the golden with each layer's gate, up and down experts in types[3 l .. 3 l + 2],
// random blocks) and `f32` (the same with those experts dequantized to F32).
void WritePair(const std::string &golden, const std::vector<TypeId> &types, const std::string &quant,
               const std::string &f32, std::mt19937 &rng) {
  auto file = strata::format::File::Open(golden);
  REQUIRE(file.ok());
  auto g = strata::format::ParseGguf(**file);
  REQUIRE(g.ok());
  strata::format::GgufWriter wq(quant, static_cast<uint32_t>(g->alignment));
  strata::format::GgufWriter wf(f32, static_cast<uint32_t>(g->alignment));
  for (const auto &[k, v] : g->kv) {
    if (k == "general.alignment") continue;
    wq.SetValue(k, v);
    wf.SetValue(k, v);
  }
  // Which tensors change: layer l's gate, up and down experts take types[3 l], [3 l + 1], [3 l + 2].
  const char *const kParts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
  std::vector<int> which(g->tensors.size(), -1);
  for (size_t i = 0; i < g->tensors.size(); ++i) {
    for (int k = 0; k < static_cast<int>(types.size()); ++k) {
      if (g->tensors[i].name == "blk." + std::to_string(k / 3) + "." + kParts[k % 3] + ".weight") which[i] = k;
    }
  }
  for (size_t i = 0; i < g->tensors.size(); ++i) {
    const auto &t = g->tensors[i];
    const uint32_t qt = which[i] >= 0 ? static_cast<uint32_t>(types[which[i]]) : t.type;
    const uint32_t ft = which[i] >= 0 ? static_cast<uint32_t>(TypeId::kF32) : t.type;
    REQUIRE(wq.AddTensor(t.name, qt, t.n_dims, t.ne).ok());
    REQUIRE(wf.AddTensor(t.name, ft, t.n_dims, t.ne).ok());
  }
  REQUIRE(wq.Begin().ok());
  REQUIRE(wf.Begin().ok());
  int changed = 0;
  for (size_t i = 0; i < g->tensors.size(); ++i) {
    const auto &t = g->tensors[i];
    if (which[i] < 0) {
      std::vector<char> bytes(t.nbytes);
      REQUIRE((*file)->ReadAt(t.offset, bytes.data(), bytes.size()).ok());
      REQUIRE(wq.Write(bytes.data(), bytes.size()).ok());
      REQUIRE(wf.Write(bytes.data(), bytes.size()).ok());
      continue;
    }
    const strata::quant::Codec *c = strata::quant::FindCodec(types[which[i]]);
    REQUIRE(c != nullptr);
    const int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    REQUIRE(n % c->block_elems == 0);
    const std::vector<uint8_t> blocks = RandomBlocks(*c, n, rng);
    std::vector<float> values(static_cast<size_t>(n));
    c->dequantize(blocks.data(), values.data(), n);
    REQUIRE(wq.Write(blocks.data(), blocks.size()).ok());
    REQUIRE(wf.Write(values.data(), values.size() * sizeof(float)).ok());
    ++changed;
  }
  REQUIRE(changed == static_cast<int>(types.size()));
  REQUIRE(wq.Finish().ok());
  REQUIRE(wf.Finish().ok());
}

}  // namespace

TEST_CASE("a model with lattice i-quant experts runs as its F32 dequantization", "[model][quant]") {
  const std::string dir = kGolden + "qwen3moe_mixed/";  // 2 layers of 8 experts, 256 x 256
  const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  strata::format::testing::TempDir tmp;
  // Two files: every lattice i-quant in some expert matrix.
  const std::vector<std::vector<TypeId>> assignments = {
      {TypeId::kIQ2_XXS, TypeId::kIQ3_S, TypeId::kIQ1_M, TypeId::kIQ2_S, TypeId::kIQ2_XS, TypeId::kIQ3_XXS},
      {TypeId::kIQ1_S, TypeId::kIQ2_XXS, TypeId::kIQ3_S, TypeId::kIQ3_XXS, TypeId::kIQ1_M, TypeId::kIQ2_S}};
  for (size_t a = 0; a < assignments.size(); ++a) {
    INFO("assignment " << a);
    const std::string quant = tmp.File("q" + std::to_string(a) + ".gguf");
    const std::string f32 = tmp.File("f" + std::to_string(a) + ".gguf");
    WritePair(dir + "model-mixed.gguf", assignments[a], quant, f32, rng);
    for (size_t prefill : {tokens.size(), size_t{1}}) {
      const auto got = TeacherForced(quant, tokens, prefill);
      const auto want = TeacherForced(f32, tokens, prefill);
      const double err = NormalizedMaxError(got, want);
      INFO("prefill " << prefill << ": normalized max error " << err);
      CHECK(err < 1e-5);  // measured 0: the kernels decode a row, then take the float dot
      CHECK(got != TeacherForced(dir + "model-mixed.gguf", tokens, prefill));  // the experts did change
    }
  }
}
