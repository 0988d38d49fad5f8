// Golden tests: Strata's teacher-forced logits against transformers' for every committed tiny
// checkpoint (tests/golden, made by scripts/golden/make_goldens.py), through the C ABI, for every
// position, both as one prefill batch and as a prefill followed by one-token decode steps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <fstream>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

struct Case {
  const char *dir;
  const char *model;      // relative to the case dir
  const char *reference;  // logits file the engine must match within 1e-4
  double tolerance;
  double bound_vs_f32;    // against the f32 transformers logits (rounding of the stored weights)
};

// Bounds vs the float32 reference: the error the weights' rounding explains, measured by the golden
// script with transformers itself (meta.json rel_err_vs_logits_bin: f16 8.7e-4 / 6.1e-4, q8_0 2.3e-2 /
// 1.2e-2) with headroom; the sharp check is the first one, against transformers run on the
// dequantized weights.
const Case kCases[] = {
    {"qwen3moe_f32", "hf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_f32", "model-f32.gguf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_f32", "model-f16.gguf", "logits-f16.bin", 1e-4, 2e-3},
    {"qwen3moe_f32", "model-q8_0.gguf", "logits-q8_0.bin", 1e-4, 3e-2},
    {"qwen3moe_bf16", "hf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_bf16", "model-bf16.gguf", "logits-bf16.bin", 1e-4, 1e-4},
    {"mixtral_f32", "hf", "logits.bin", 1e-4, 1e-4},
    {"mixtral_f32", "model-f32.gguf", "logits.bin", 1e-4, 1e-4},
    {"mixtral_f32", "model-f16.gguf", "logits-f16.bin", 1e-4, 2e-3},
    {"mixtral_f32", "model-q8_0.gguf", "logits-q8_0.bin", 1e-4, 3e-2},
};

}  // namespace

TEST_CASE("teacher-forced logits match transformers on every golden", "[golden]") {
  for (const Case &c : kCases) {
    const std::string dir = kGolden + c.dir + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto ref = ReadBinary<float>(dir + c.reference);
    const auto ref_f32 = ReadBinary<float>(dir + "logits.bin");
    REQUIRE(tokens.size() == 20);
    for (size_t prefill : {tokens.size(), size_t{12}, size_t{1}}) {
      const auto got = TeacherForced(dir + c.model, tokens, prefill);
      const double err = NormalizedMaxError(got, ref);
      const double err_f32 = NormalizedMaxError(got, ref_f32);
      INFO(c.dir << "/" << c.model << " prefill " << prefill << ": error " << err << " vs " << c.reference << ", "
                 << err_f32 << " vs logits.bin");
      CHECK(err <= c.tolerance);
      CHECK(err_f32 <= c.bound_vs_f32);
    }
  }
}

TEST_CASE("greedy continuation reproduces transformers' tokens", "[golden]") {
  for (const char *name : {"qwen3moe_f32", "mixtral_f32"}) {
    const std::string dir = kGolden + name + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (const char *model : {"hf", "model-f32.gguf"}) {
      const std::string path = dir + model;
      moe_params p;
      moe_params_init(&p);
      p.model_path = path.c_str();
      moe_ctx *ctx = nullptr;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
      moe_session *s = nullptr;
      REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);  // defaults: greedy
      REQUIRE(moe_session_feed(s, tokens.data(), 12) == MOE_OK);
      for (size_t i = 12; i < tokens.size(); ++i) {
        REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
        int32_t tok = -1;
        REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
        INFO(path << " position " << i);
        CHECK(tok == tokens[i]);
        REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
      }
      moe_session_close(s);
      moe_ctx_close(ctx);
    }
  }
}
