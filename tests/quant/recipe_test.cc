// `strata pack IN OUT Q4_K_M`: llama-quantize's file types. Each tensor of a float32 `strata synth
// --shape tiny` model is given the type llama-quantize gives it (tests/quant/fixtures/recipes.json,
// scripts/quant/make_recipe_fixture.sh): attn_v and ffn_down of the layers that get more bits, the
// output, the fallbacks of rows that are not whole blocks. The packed file then runs.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/model/pack.h"
#include "lib/model/recipe.h"
#include "lib/model/synth.h"
#include "nlohmann/json.hpp"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

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
  REQUIRE(want.size() >= 15);
  for (const auto &[recipe, types] : want.items()) {
    INFO(recipe);
    auto r = strata::model::ParseRecipe(recipe);
    REQUIRE(r.ok());
    strata::model::PackOptions o;
    o.recipe = *r;
    o.verbose = false;
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
  // Names people use, in either case; the lattice i-quant recipes are named as not available.
  CHECK(strata::model::ParseRecipe("q4_k_m").ok());
  auto iq = strata::model::ParseRecipe("IQ2_XXS");
  REQUIRE(!iq.ok());
  CHECK(std::string(iq.status().message()).find("IQ2_XXS") != std::string::npos);
}
