// Context shift on the CUDA backend, whose KV blocks live in device memory: the shift runs there
// through the backend's operations (ReadKvBytes and WriteKvBytes as device copies, the RoPE kernel
// with the position offsets). A shifted session's logits equal a fresh session's fed only the kept
// tokens in every golden family (the comparison of tests/runtime/ctx_shift_test.cc); a session run
// far past n_ctx, its decode steps recorded and replayed as graphs over the moved rows, follows the
// CPU backend's within the GPU goldens' 1e-3; a manual shift follows the automatic one within the
// GPU's batch rounding (1e-5). Skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/model/golden_util.h"
#include "tests/runtime/ctx_shift_util.h"

namespace {

using namespace strata::testing;
using namespace strata::testing::ctx_shift;

bool HaveCuda() {
  if (moe_backend_available(MOE_BACKEND_CUDA) == 1) return true;
  WARN("no CUDA backend: " << moe_last_error() << "; GPU test skipped");
  return false;
}

}  // namespace

TEST_CASE("ctx shift on CUDA: logits after a shift equal a fresh session fed the kept tokens, every family",
          "[gpu][ctx_shift]") {
  if (!HaveCuda()) return;
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char *family : kFamilies) {
    INFO(family);
    double one_off = 0;
    const std::vector<double> rows =
        ShiftedVersusFresh(kGolden + family + "/model-f32.gguf", MOE_KV_F32, rng, &one_off, MOE_BACKEND_CUDA);
    const double err = *std::max_element(rows.begin(), rows.end());
    // As on the CPU (1e-4 of the largest logit, keys one position off far outside it); the GPU's
    // sums may also round differently with the batch a token runs in, well inside the bound.
    INFO("shifted vs fresh " << err << ", one position off vs fresh " << one_off);
    CHECK(err < 1e-4);
    CHECK(one_off > 1e-2);
  }
}

TEST_CASE("ctx shift on CUDA: far past n_ctx, decode steps replayed, as the CPU backend; manual as automatic",
          "[gpu][ctx_shift]") {
  if (!HaveCuda()) return;
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char *family : {"qwen3moe_f32", "gptoss_f32", "deepseek3_f32"}) {
    INFO(family);
    const std::string model = kGolden + family + "/model-f32.gguf";
    Ctx cpu(model), gpu(model, MOE_KV_F32, nullptr, 4, MOE_BACKEND_CUDA);
    const int n_ctx = 200, keep = static_cast<int>(rng() % 40);
    const std::vector<int32_t> prompt = RandomTokens(rng, 150, 0, 255), decode = RandomTokens(rng, 400, 0, 255);
    Sess c(cpu.c, n_ctx, true, keep), g(gpu.c, n_ctx, true, keep), manual(gpu.c, n_ctx, false, 0);
    FeedStep(cpu.c, c.s, prompt.data(), prompt.size());
    FeedStep(gpu.c, g.s, prompt.data(), prompt.size());
    FeedStep(gpu.c, manual.s, prompt.data(), prompt.size());
    double worst_cpu = 0, worst_manual = 0;
    for (int32_t t : decode) {  // one token a step: decode steps, recorded as graphs and replayed
      if (moe_session_n_past(manual.s) == n_ctx) {
        REQUIRE(moe_session_shift(manual.s, keep, (n_ctx - keep) / 2) == MOE_OK);
      }
      FeedStep(cpu.c, c.s, &t, 1);
      REQUIRE(moe_session_feed(g.s, &t, 1) == MOE_OK);
      REQUIRE(moe_session_feed(manual.s, &t, 1) == MOE_OK);
      StepAll(gpu.c);
      REQUIRE(moe_session_n_past(g.s) == moe_session_n_past(c.s));
      REQUIRE(moe_session_n_past(manual.s) == moe_session_n_past(c.s));
      const std::vector<float> want = Last(c.s), got = Last(g.s);
      worst_cpu = std::max(worst_cpu, NormalizedMaxError(got, want));
      worst_manual = std::max(worst_manual, NormalizedMaxError(Last(manual.s), got));
    }
    INFO("CUDA vs CPU " << worst_cpu << ", manual vs automatic " << worst_manual);
    CHECK(worst_cpu <= 1e-3);
    CHECK(worst_manual <= 1e-5);
    moe_stats st;
    moe_stats_init(&st);
    REQUIRE(moe_ctx_stats(gpu.c, &st) == MOE_OK);
    WARN(family << ": " << st.gpu_graph_replays << " decode steps replayed as graphs");
  }
}
