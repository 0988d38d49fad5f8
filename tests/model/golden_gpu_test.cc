// GPU acceptance: for every golden model (each family and codec the goldens cover), the CUDA
// backend's teacher-forced logits at every position, as one prefill and as a prefill followed by
// one-token decode steps, match the CPU backend's within 1e-3 normalized max error
// (max |gpu - cpu| / max |cpu|). Skips without a GPU.
#include <catch2/catch.hpp>

#include <string>

#include "backends/cuda/memory.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

constexpr double kTolerance = 1e-3;

const char *const kModels[] = {
    "qwen3moe_f32/hf",           "qwen3moe_f32/model-f32.gguf",   "qwen3moe_f32/model-f16.gguf",
    "qwen3moe_f32/model-q8_0.gguf", "qwen3moe_bf16/hf",           "qwen3moe_bf16/model-bf16.gguf",
    "qwen3moe_mixed/model-mixed.gguf", "mixtral_f32/hf",          "mixtral_f32/model-f32.gguf",
    "mixtral_f32/model-q8_0.gguf", "olmoe_f32/hf",                "olmoe_f32/model-f32.gguf",
    "qwen2moe_f32/hf",           "qwen2moe_f32/model-f32.gguf",   "deepseek2_f32/hf",
    "deepseek2_f32/model-f32.gguf", "deepseek2lite_f32/hf",       "deepseek2lite_f32/model-f32.gguf",
    "deepseek3_f32/hf",          "deepseek3_f32/model-f32.gguf",  "gptoss_f32/hf",
    "gptoss_f32/model-f32.gguf", "gptoss_f32/model-mxfp4.gguf",
};

}  // namespace

TEST_CASE("CUDA backend: every golden's logits match the CPU backend", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (size_t prefill : {tokens.size(), size_t{12}, size_t{1}}) {
      const auto cpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU);
      const auto gpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA);
      const double err = NormalizedMaxError(gpu, cpu);
      INFO(rel << " prefill " << prefill << ": normalized max error " << err);
      WARN("gpu-vs-cpu " << rel << " prefill " << prefill << " err " << err);
      CHECK(err <= kTolerance);
    }
  }
}

// The VRAM expert tier: with a budget too small for the routed experts they run from the fewest
// slots (top-k), refilled from host RAM on every miss; the bytes are the same, so the logits must
// be bit-identical to the all-resident run, for every family and codec.
TEST_CASE("CUDA backend: the VRAM expert tier is bit-identical to all-resident at any budget", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (size_t prefill : {tokens.size(), size_t{1}}) {
      const auto all = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA);
      for (uint64_t budget : {uint64_t{1}, uint64_t{1} << 20}) {
        uint32_t slots = 0, n_routed = 0;
        const auto tier = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA, budget, &slots, &n_routed);
        INFO(rel << " prefill " << prefill << " VRAM budget " << budget << ": " << slots << " of " << n_routed
                 << " experts in slots");
        if (budget == 1) CHECK(slots < n_routed);
        CHECK(tier == all);
      }
    }
  }
}

// Decode batches route and group on the GPU (no host wait per layer) for every family the grouped
// kernels cover; with a VRAM budget too small for the experts, the kernels read the missing ones
// from page-locked host RAM over the link and route hotness promotes experts into slots while the
// steps run, and none of it may change a bit of the logits.
TEST_CASE("CUDA backend: GPU-side routing, zero-copy reads and promotions keep the logits bit-identical",
          "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  // GGUF files (their tensors are 32-byte aligned, as the kernels' vector loads need of host bytes
  // read in place) whose layers hold experts of one codec and kernel-ready shapes; the others (a
  // checkpoint's unaligned bytes, per-expert codecs, the tiny DeepSeek fixtures' 16-wide rows) take
  // the host path, which the test above holds bit-identical too.
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf", "olmoe_f32/model-f32.gguf",
                          "qwen2moe_f32/model-f32.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_stats all_st, tier_st;
    uint32_t slots = 0, n_routed = 0;
    const auto all = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    INFO(rel);
    CHECK(all_st.vram_device_layers > 0);
    CHECK(all_st.vram_expert_slots == 0);
    CHECK(all_st.vram_zero_copy == 0);
    const auto tier = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, &slots, &n_routed, &tier_st);
    INFO(slots << " of " << n_routed << " experts in slots; zero-copy uses " << tier_st.vram_zero_copy
                << ", promotions " << tier_st.vram_promotions << ", fills " << tier_st.vram_fills);
    CHECK(tier_st.vram_device_layers == all_st.vram_device_layers);
    REQUIRE(slots < n_routed);  // 1 MiB leaves the experts the fewest slots: the tier is exercised
    CHECK(tier_st.vram_zero_copy > 0);
    CHECK(tier_st.vram_promotions > 0);
    CHECK(tier == all);
  }
}

// Steady-state decode allocates nothing on the device or in pinned memory: the workspace, KV caches,
// scratch buffers and expert slots are sized before, and reused by every step (the property a
// CUDA Graph of the decode step will need).
TEST_CASE("CUDA backend: decode steps after warm-up make no allocation", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : {"qwen3moe_mixed/model-mixed.gguf", "deepseek3_f32/hf", "gptoss_f32/model-mxfp4.gguf"}) {
    for (uint64_t budget : {uint64_t{0}, uint64_t{1}}) {
      INFO(rel << " VRAM budget " << budget);
      const std::string model = kGolden + rel;
      const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
      const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
      moe_params p;
      moe_params_init(&p);
      p.model_path = model.c_str();
      p.backend = MOE_BACKEND_CUDA;
      p.vram_budget_bytes = budget;
      moe_ctx *ctx = nullptr;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
      moe_session_params sp;
      moe_session_params_init(&sp);
      moe_session *s = nullptr;
      REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
      auto step = [&](const int32_t *t, size_t n) {
        REQUIRE(moe_session_feed(s, t, n) == MOE_OK);
        uint32_t pending = 99;
        REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
        REQUIRE(pending == 0);
      };
      step(tokens.data(), 8);
      for (size_t i = 8; i < 11; ++i) step(tokens.data() + i, 1);  // warm-up
      const uint64_t before = strata::cuda::AllocationCount();
      for (size_t i = 11; i < tokens.size(); ++i) step(tokens.data() + i, 1);
      CHECK(strata::cuda::AllocationCount() == before);
      moe_session_close(s);
      moe_ctx_close(ctx);
    }
  }
}
