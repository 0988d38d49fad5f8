// GPU acceptance for the codecs the CUDA kernels read in place beyond the goldens' own (Q5_K, Q3_K,
// Q2_K, the 32-element legacy codecs, IQ4_NL, the lattice i-quants and the ternary codecs): a
// synthetic model with every matrix but the norms and routers in the codec runs on the GPU within the
// golden tolerance of the CPU backend, and with a RAM budget too small for its experts they stream
// and the GPU reads them where they lie (the RAM tier's page-locked slots), bit-identical to the
// all-resident run. Skips without a GPU.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "lib/model/synth.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::NormalizedMaxError;
using strata::testing::TeacherForced;

// For each codec: the tiny synthetic model in it (experts, attention, embeddings and the output head)
// on the GPU against the CPU backend, resident and streamed in place.
void CheckModelsOf(const std::vector<const char *> &codecs) {
  strata::format::testing::TempDir dir;
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 511);  // the tiny shape's vocabulary
  std::vector<int32_t> tokens(24);
  for (int32_t &t : tokens) t = id(rng);
  for (const char *codec : codecs) {
    INFO(codec);
    strata::model::SynthOptions o;
    o.shape = "tiny";
    o.experts = codec;
    o.attention = codec;  // attention, embeddings and the output head too
    o.seed = rng();
    const std::string model = dir.File(std::string("tiny-") + codec + ".gguf");
    REQUIRE(strata::model::Synthesize(o, model).ok());

    const auto cpu = TeacherForced(model, tokens, 12, MOE_BACKEND_CPU);
    moe_stats all_st;
    const auto all = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    const double err = NormalizedMaxError(all, cpu);
    INFO("normalized max error " << err);
    CHECK(err <= 1e-3);
    CHECK(all_st.vram_device_layers > 0);  // the MoE layers routed and grouped on the GPU, in the codec

    // RAM budget 1: the minimum, below the routed experts; VRAM budget 1: no VRAM tier, so every
    // expert is read from its RAM slot over the link (refused at open if the codec needed conversion).
    moe_stats st;
    const auto streamed = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, /*vram_budget=*/1, nullptr, nullptr, &st,
                                        MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, /*ram_budget=*/1);
    CHECK(st.streaming == 1);
    CHECK(st.expert_misses > 0);
    CHECK(st.vram_hits == 0);
    CHECK(streamed == all);
  }
}

TEST_CASE("CUDA backend: models of Q5_K, Q3_K, Q2_K and legacy codecs match the CPU and stream in place",
          "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  CheckModelsOf({"q5_k", "q3_k", "q2_k", "q4_0", "q4_1", "q5_0", "q5_1"});
}

// The lattice types' blocks are drawn by synth (random codes under a block scale), the others quantized.
TEST_CASE("CUDA backend: models of the i-quants and ternary codecs match the CPU and stream in place",
          "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  CheckModelsOf({"iq4_nl", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0"});
}

}  // namespace
