// `strata pack IN OUT Q4_K_M`: llama-quantize's file types. Each tensor of a float32 `strata synth
// --shape tiny` model is given the type llama-quantize gives it (tests/quant/fixtures/recipes.json,
// scripts/quant/make_recipe_fixture.sh): attn_v and ffn_down of the layers that get more bits, the
// output, the fallbacks of rows that are not whole blocks; the lattice i-quant types with an
// importance matrix, as llama-quantize makes them. The packed file then runs.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/model/imatrix.h"
#include "lib/model/pack.h"
#include "lib/model/recipe.h"
#include "lib/model/synth.h"
#include "lib/util/status.h"
#include "nlohmann/json.hpp"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

// An importance matrix for every matrix of the blk.* tensors of the model at src, every column
// weighted 1 + its index mod 7 (as scripts/quant/make_recipe_fixture.sh makes its own).
void WriteImatrixFor(const std::string &src, const std::string &path) {
  strata::model::Imatrix im;
  auto file = strata::format::File::Open(src);
  REQUIRE(file.ok());
  auto g = strata::format::ParseGguf(**file);
  REQUIRE(g.ok());
  for (const auto &t : g->tensors) {
    if (t.name.rfind("blk.", 0) != 0 || t.n_dims < 2 || t.name.find("_norm") != std::string::npos ||
        t.name.find("ffn_gate_inp") != std::string::npos) {
      continue;
    }
    strata::model::ImatrixEntry e;
    e.n_cols = t.ne[0];
    const int64_t n_mat = t.n_dims >= 3 ? t.ne[2] : 1;
    e.counts.assign(static_cast<size_t>(n_mat), 1);
    for (int64_t m = 0; m < n_mat; ++m) {
      for (int64_t j = 0; j < e.n_cols; ++j) e.sums.push_back(1.0 + static_cast<double>(j % 7));
    }
    im.entries[t.name] = std::move(e);
  }
  im.datasets = {"synthetic"};
  im.chunk_count = 1;
  im.chunk_size = 512;
  REQUIRE(strata::model::WriteImatrix(im, path).ok());
}

// The lattice i-quant file types, which the fixture made with an importance matrix.
bool LatticeRecipe(const std::string &name) { return name.rfind("IQ", 0) == 0 && name.rfind("IQ4", 0) != 0; }

}  // namespace

TEST_CASE("pack with a llama-quantize file type gives each tensor llama.cpp's type", "[quant][recipe]") {
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/recipes.json");
  REQUIRE(f.good());
  const auto want = nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(f)), {}));
  strata::format::testing::TempDir tmp;
  strata::model::SynthOptions so;
  so.shape = "tiny";
  so.experts = "f32";
  so.attention = "f32";
  const std::string src = tmp.File("f32.gguf");
  REQUIRE(strata::model::Synthesize(so, src).ok());
  REQUIRE(want.size() >= 25);
  const std::string imatrix = tmp.File("imatrix.gguf");
  WriteImatrixFor(src, imatrix);
  for (const auto &[recipe, types] : want.items()) {
    INFO(recipe);
    auto r = strata::model::ParseRecipe(recipe);
    REQUIRE(r.ok());
    strata::model::PackOptions o;
    o.recipe = *r;
    o.verbose = false;
    if (LatticeRecipe(recipe)) o.imatrix_path = imatrix;
    const std::string out = tmp.File(recipe + ".gguf");
    auto packed = strata::model::Pack(src, out, o);
    INFO(packed.status().message());
    REQUIRE(packed.ok());
    auto file = strata::format::File::Open(out);
    REQUIRE(file.ok());
    auto g = strata::format::ParseGguf(**file);
    REQUIRE(g.ok());
    CHECK(g->GetUint("general.file_type").value() == strata::model::RecipeFileType(*r));
    size_t seen = 0;
    for (const auto &t : g->tensors) {
      if (!types.contains(t.name)) continue;  // Strata's own extras
      ++seen;
      INFO(t.name);
      CHECK(std::string(strata::quant::TypeName(t.type)) == types[t.name].get<std::string>());
    }
    CHECK(seen == types.size());
    // It runs: a few tokens through the C ABI, finite logits.
    const auto logits = strata::testing::TeacherForced(out, {1, 2, 3, 4}, 2);
    REQUIRE(!logits.empty());
    for (float v : logits) REQUIRE(std::isfinite(v));
  }
  // Names people use, in either case; an unknown one is named back with the known ones.
  CHECK(strata::model::ParseRecipe("q4_k_m").ok());
  CHECK(strata::model::ParseRecipe("iq2_xxs").ok());
  auto bad = strata::model::ParseRecipe("IQ2_XXXS");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("IQ2_XXXS") != std::string::npos);
  CHECK(std::string(bad.status().message()).find("IQ1_M") != std::string::npos);
}

// Without an importance matrix, a file type that stores a tensor (but the token embeddings and the
// output) in IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_M or IQ1_S, or Q2_K in a Q2_K_S file, is refused,
// naming the first such tensor and its type, as llama-quantize refuses it (llama-quant.cpp's
// tensor_requires_imatrix); the others pack (llama.cpp's no-imatrix rules) and run.
TEST_CASE("pack with a very low-bit file type needs an imatrix where llama-quantize does", "[quant][recipe]") {
  strata::format::testing::TempDir tmp;
  strata::model::SynthOptions so;
  so.shape = "tiny";
  so.experts = "f32";
  so.attention = "f32";
  const std::string src = tmp.File("f32.gguf");
  REQUIRE(strata::model::Synthesize(so, src).ok());
  struct Want {
    const char *recipe;
    const char *refused_type;  // the type named, or null when it packs
  };
  const Want wants[] = {{"IQ2_XXS", "IQ2_XXS"}, {"IQ2_XS", "IQ2_XS"}, {"IQ2_S", "IQ2_XS"},    {"IQ2_M", "IQ2_S"},
                        {"IQ3_XXS", "IQ2_S"},   {"IQ3_XS", "IQ3_XXS"}, {"IQ3_S", nullptr},     {"IQ3_M", nullptr},
                        {"IQ1_S", "IQ1_S"},     {"IQ1_M", "IQ1_M"},    {"Q2_K_S", "Q2_K"},     {"Q2_K", nullptr}};
  for (const Want &w : wants) {
    INFO(w.recipe);
    auto r = strata::model::ParseRecipe(w.recipe);
    REQUIRE(r.ok());
    strata::model::PackOptions o;
    o.recipe = *r;
    o.verbose = false;
    const std::string out = tmp.File(std::string(w.recipe) + ".gguf");
    auto packed = strata::model::Pack(src, out, o);
    const std::string msg(packed.status().message());
    INFO(msg);
    if (w.refused_type != nullptr) {
      REQUIRE(!packed.ok());
      CHECK(strata::StatusToMoe(packed.status()) == MOE_ERR_INVALID_ARGUMENT);
      CHECK(msg.find(std::string(" ") + w.refused_type + ",") != std::string::npos);
      CHECK(msg.find("importance matrix") != std::string::npos);
      CHECK(msg.find("--imatrix") != std::string::npos);
      continue;
    }
    REQUIRE(packed.ok());
    const auto logits = strata::testing::TeacherForced(out, {1, 2, 3, 4}, 2);
    REQUIRE(!logits.empty());
    for (float v : logits) REQUIRE(std::isfinite(v));
  }
}
