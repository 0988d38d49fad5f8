// The C ABI's own promises: NULL-safe close, argument checks with statuses and thread-local
// messages, params read only as far as struct_size covers, state errors, context limits, status
// names, and sessions that keep their state after a failed call.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "include/strata/moe.h"


namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";

moe_ctx *OpenCtx(uint32_t n_ctx = 0) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.n_ctx = n_ctx;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

}  // namespace

TEST_CASE("version and status names", "[capi]") {
  CHECK(moe_version_number() == MOE_VERSION_NUMBER);
  CHECK(MOE_VERSION_NUMBER == 900);
  CHECK(std::string(moe_version_string()) == "0.9.0");
  CHECK(std::string(moe_status_string(MOE_ERR_CANCELLED)) == "MOE_ERR_CANCELLED");
  CHECK(std::string(moe_status_string(MOE_ERR_ABORTED)) == "MOE_ERR_ABORTED");
  CHECK(MOE_STATUS_CATEGORY(MOE_ERR_ABORTED) == MOE_ERR_CANCELLED);
  CHECK(std::string(moe_status_string(MOE_OK)) == "MOE_OK");
  CHECK(std::string(moe_status_string(MOE_ERR_FORMAT_TENSOR)) == "MOE_ERR_FORMAT_TENSOR");
  CHECK(std::string(moe_status_string(12345)) == "MOE_ERR_UNKNOWN");
  CHECK(MOE_STATUS_CATEGORY(MOE_ERR_FORMAT_TRUNCATED) == MOE_ERR_FORMAT);
  CHECK(MOE_STATUS_CATEGORY(MOE_ERR_IO_OPEN) == MOE_ERR_IO);
}

TEST_CASE("NULL handles and arguments are refused, not crashed on", "[capi]") {
  moe_ctx_close(nullptr);
  moe_session_close(nullptr);
  CHECK(moe_ctx_vocab_size(nullptr) == -1);
  CHECK(moe_session_n_past(nullptr) == -1);
  CHECK(moe_ctx_experts(nullptr) == nullptr);
  CHECK(moe_expert_table_n_layers(nullptr) == 0);
  moe_ctx *ctx = reinterpret_cast<moe_ctx *>(0x1);
  CHECK(moe_ctx_open(nullptr, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(ctx == reinterpret_cast<moe_ctx *>(0x1));  // untouched on failure
  CHECK(std::string(moe_last_error()).find("NULL") != std::string::npos);
  moe_params p;
  moe_params_init(&p);
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);  // no model path
  CHECK(std::string(moe_last_error()).find("model_path") != std::string::npos);
  CHECK(moe_ctx_step(nullptr, nullptr) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_feed(nullptr, nullptr, 0) == MOE_ERR_INVALID_ARGUMENT);
  int32_t tok;
  CHECK(moe_session_sample(nullptr, &tok) == MOE_ERR_INVALID_ARGUMENT);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  CHECK(moe_plan(nullptr, &plan) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_ctx_plan(nullptr, &plan) == MOE_ERR_INVALID_ARGUMENT);
}

TEST_CASE("params: struct_size is honoured", "[capi]") {
  moe_params p;
  std::memset(&p, 0xAB, sizeof p);
  p.struct_size = 0;
  moe_params_fill_defaults(&p);  // size 0 covers nothing: nothing is written
  CHECK(p.struct_size == 0);
  moe_params_init(&p);
  CHECK(p.struct_size == sizeof(moe_params));
  CHECK(p.backend == MOE_BACKEND_AUTO);
  CHECK(p.max_sessions == 1);
  CHECK(p.model_path == nullptr);
  p.model_path = kModel.c_str();
  p.struct_size = 2;  // too small to hold a path
  moe_ctx *ctx = nullptr;
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("struct_size") != std::string::npos);
  // An older host, whose struct ended before the expert cache's fields
  // (its sizeof: the fields before cache_policy, padded to the struct's alignment), still opens
  // with defaults for the rest.
  p.struct_size = (offsetof(moe_params, cache_policy) + alignof(moe_params) - 1) / alignof(moe_params) *
                  alignof(moe_params);
  p.cache_policy = 77;  // beyond the size: must be ignored
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_ctx_close(ctx);
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = 77;
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  // Hybrid placement: auto by default; a value outside the enum is refused by name.
  moe_params_init(&p);
  CHECK(p.cpu_experts == MOE_CPU_EXPERTS_AUTO);
  p.model_path = kModel.c_str();
  for (int32_t bad : {-1, 3, 1 << 20}) {
    p.cpu_experts = bad;
    CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("cpu_experts") != std::string::npos);
  }
  // Without a GPU every mode runs the CPU backend.
  for (int32_t mode : {MOE_CPU_EXPERTS_OFF, MOE_CPU_EXPERTS_ALWAYS}) {
    p.cpu_experts = mode;
    p.backend = MOE_BACKEND_CPU;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_ctx_close(ctx);
  }
}

namespace {
struct LoadCalls {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
};
void OnLoad(uint64_t done, uint64_t total, void *user) { static_cast<LoadCalls *>(user)->calls.emplace_back(done, total); }
}  // namespace

TEST_CASE("params: load_progress hears the weights' load end at its total, with the user pointer", "[capi]") {
  moe_params p;
  moe_params_init(&p);
  CHECK(p.load_progress == nullptr);
  CHECK(p.load_progress_user == nullptr);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  LoadCalls seen;
  p.load_progress = OnLoad;
  p.load_progress_user = &seen;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
  moe_ctx_close(ctx);
  // A small model loads in one go: the one call at the end, with the matrices' bytes (its experts
  // fit the default budget, so all of them; the plan's non-routed line also counts the norm
  // vectors, read apart).
  REQUIRE(!seen.calls.empty());
  CHECK(seen.calls.back().first == seen.calls.back().second);
  CHECK(seen.calls.back().second > plan.routed_expert_bytes);
  CHECK(seen.calls.back().second <= plan.non_routed_bytes + plan.routed_expert_bytes);
  // An older host's struct, ending before the callback: no call, and the open still works.
  seen.calls.clear();
  p.struct_size = offsetof(moe_params, load_progress);
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_ctx_close(ctx);
  CHECK(seen.calls.empty());
}

TEST_CASE("sessions: state errors, vocabulary and context limits keep the session usable", "[capi]") {
  moe_ctx *ctx = OpenCtx(16);
  CHECK(moe_ctx_vocab_size(ctx) == 256);
  const moe_expert_table *t = moe_ctx_experts(ctx);
  CHECK(moe_expert_table_n_layers(t) == 3);
  CHECK(moe_expert_table_n_experts(t) == 8);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const float *logits = nullptr;
  int32_t nv = 0;
  CHECK(moe_session_logits(s, &logits, &nv) == MOE_ERR_STATE);
  int32_t tok;
  CHECK(moe_session_sample(s, &tok) == MOE_ERR_STATE);
  CHECK(moe_session_logits_all(s, &logits, &nv, nullptr) == MOE_ERR_STATE);  // logits_all not set
  const int32_t bad[] = {1, 256};
  CHECK(moe_session_feed(s, bad, 2) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("256") != std::string::npos);
  CHECK(moe_session_feed(s, nullptr, 3) == MOE_ERR_INVALID_ARGUMENT);
  std::vector<int32_t> many(17, 5);
  CHECK(moe_session_feed(s, many.data(), many.size()) == MOE_ERR_LIMIT_CONTEXT);
  // Nothing was queued by the failed calls.
  uint32_t pending = 7;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(pending == 0);
  CHECK(moe_session_n_past(s) == 0);
  REQUIRE(moe_session_feed(s, many.data(), 16) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(moe_session_n_past(s) == 16);
  REQUIRE(moe_session_logits(s, &logits, &nv) == MOE_OK);
  CHECK(nv == 256);
  for (int i = 0; i < nv; ++i) REQUIRE(std::isfinite(logits[i]));
  CHECK(moe_session_feed(s, many.data(), 1) == MOE_ERR_LIMIT_CONTEXT);
  REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
  CHECK(tok >= 0);
  CHECK(tok < 256);
  moe_session_close(s);
  moe_ctx_close(ctx);
}

namespace {
// The logits of one random prompt on a context opened with `p` (the CPU backend).
std::vector<float> PromptLogits(const moe_params &p, const std::vector<int32_t> &prompt) {
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  const float *l = nullptr;
  int32_t nv = 0;
  REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
  std::vector<float> out(l, l + nv);
  moe_ctx_close(ctx);
  return out;
}
}  // namespace

TEST_CASE("params: the tunables' choices default to the environment, are checked, and run", "[capi]") {
  moe_params p;
  moe_params_init(&p);
  CHECK(p.cuda_graphs == MOE_SWITCH_DEFAULT);
  CHECK(p.cuda_cold_copies == 0);
  CHECK(p.huge_pages == MOE_SWITCH_DEFAULT);
  CHECK(p.cuda_streaming == MOE_SWITCH_DEFAULT);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  // Values outside moe.h's lists: refused by moe_ctx_open and moe_plan, naming the field.
  moe_ctx *ctx = nullptr;
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  for (int32_t moe_params::*field : {&moe_params::cuda_graphs, &moe_params::huge_pages, &moe_params::cuda_streaming}) {
    for (int32_t bad : {-1, 3, 1 << 20}) {
      moe_params q = p;
      q.*field = bad;
      CHECK(moe_ctx_open(&q, &ctx) == MOE_ERR_INVALID_ARGUMENT);
      CHECK(std::string(moe_last_error()).find("moe_params.") != std::string::npos);
      CHECK(moe_plan(&q, &plan) == MOE_ERR_INVALID_ARGUMENT);
    }
  }
  for (int32_t bad : {-2, 257, INT32_MIN}) {
    moe_params q = p;
    q.cuda_cold_copies = bad;
    CHECK(moe_ctx_open(&q, &ctx) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("cuda_cold_copies") != std::string::npos);
  }
  // Every valid choice opens and computes the same logits on the CPU (they change where bytes
  // live and how the GPU runs, never the numbers).
  std::mt19937 rng(std::random_device{}());
  std::vector<int32_t> prompt(1 + rng() % 6);
  for (int32_t &t : prompt) t = static_cast<int32_t>(rng() % 200);
  const std::vector<float> want = PromptLogits(p, prompt);
  for (int32_t sw : {MOE_SWITCH_ON, MOE_SWITCH_OFF}) {
    for (int32_t copies : {-1, 1 + static_cast<int32_t>(rng() % 256)}) {
      moe_params q = p;
      q.cuda_graphs = q.huge_pages = q.cuda_streaming = sw;
      q.cuda_cold_copies = copies;
      INFO("switches " << sw << ", cold copies " << copies);
      CHECK(PromptLogits(q, prompt) == want);
    }
  }
  // An older host's struct, ending before these fields: the defaults, whatever lies beyond.
  moe_params q = p;
  q.huge_pages = 77;
  q.struct_size = offsetof(moe_params, cuda_graphs);
  CHECK(PromptLogits(q, prompt) == want);
}

TEST_CASE("several sessions step together and match running alone", "[capi]") {
  moe_ctx *ctx = OpenCtx();
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {200, 100, 50, 25, 12}, {7}};
  std::vector<std::vector<float>> alone;
  for (const auto &pr : prompts) {
    moe_session *s;
    REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, pr.data(), pr.size()) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
    const float *l;
    int32_t nv;
    REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
    alone.emplace_back(l, l + nv);
    moe_session_close(s);
  }
  std::vector<moe_session *> ss(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    REQUIRE(moe_session_open(ctx, nullptr, &ss[i]) == MOE_OK);
    REQUIRE(moe_session_feed(ss[i], prompts[i].data(), prompts[i].size()) == MOE_OK);
  }
  uint32_t pending = 9;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(pending == 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const float *l;
    int32_t nv;
    REQUIRE(moe_session_logits(ss[i], &l, &nv) == MOE_OK);
    CHECK(std::memcmp(l, alone[i].data(), nv * sizeof(float)) == 0);
  }
  moe_session_close(ss[1]);
  moe_ctx_close(ctx);  // closes the other sessions too
}

TEST_CASE("sampling is deterministic per seed and differs across seeds", "[capi]") {
  moe_ctx *ctx = OpenCtx();
  auto generate = [&](uint64_t seed) {
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.temperature = 1.5f;
    sp.seed = seed;
    moe_session *s;
    REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
    std::vector<int32_t> out;
    int32_t tok = 3;
    for (int i = 0; i < 24; ++i) {
      REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
      REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
      REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
      out.push_back(tok);
    }
    moe_session_close(s);
    return out;
  };
  CHECK(generate(1) == generate(1));
  CHECK(generate(1) != generate(2));
  moe_ctx_close(ctx);
}

TEST_CASE("moe_plan reads the header only and agrees with the opened context", "[capi]") {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.ram_budget_bytes = 1024;  // below the minimum: clamped
  moe_cache_plan a, b;
  moe_cache_plan_init(&a);
  moe_cache_plan_init(&b);
  REQUIRE(moe_plan(&p, &a) == MOE_OK);
  CHECK(a.clamped == 1);
  CHECK(a.n_routed_experts == 24);
  CHECK(a.routed_expert_bytes == 24ull * a.expert_slot_bytes);
  CHECK(a.ram_budget_bytes == a.non_routed_bytes + a.kv_bytes + a.workspace_bytes + 8ull * a.expert_slot_bytes);
  CHECK(a.ram_expert_slots == 8);
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  REQUIRE(moe_ctx_plan(ctx, &b) == MOE_OK);
  CHECK(std::memcmp(&a, &b, sizeof a) == 0);
  moe_ctx_close(ctx);
  p.model_path = "/nonexistent.gguf";
  CHECK(moe_plan(&p, &a) == MOE_ERR_IO_OPEN);
}

TEST_CASE("last error is thread-local", "[capi]") {
  moe_ctx *ctx = nullptr;
  moe_params p;
  moe_params_init(&p);
  p.model_path = "/nonexistent-main-thread.gguf";
  CHECK(moe_ctx_open(&p, &ctx) != MOE_OK);
  std::thread([] {
    moe_params q;
    moe_params_init(&q);
    q.model_path = "/nonexistent-other-thread.gguf";
    moe_ctx *c = nullptr;
    CHECK(moe_ctx_open(&q, &c) != MOE_OK);
    CHECK(std::string(moe_last_error()).find("other-thread") != std::string::npos);
  }).join();
  CHECK(std::string(moe_last_error()).find("main-thread") != std::string::npos);
}

TEST_CASE("moe_backend_available: the CPU always, CUDA only with a device, bad kinds never", "[capi]") {
  // A failing call first: an available backend leaves its message alone.
  moe_ctx *ctx = nullptr;
  CHECK(moe_ctx_open(nullptr, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  const std::string before = moe_last_error();
  REQUIRE(!before.empty());
  CHECK(moe_backend_available(MOE_BACKEND_CPU) == 1);
  CHECK(moe_backend_available(MOE_BACKEND_AUTO) == 1);
  CHECK(moe_last_error() == before);

  // Kinds that name no backend, on either side of the enum.
  std::mt19937 rng(std::random_device{}());
  const int32_t above = std::uniform_int_distribution<int32_t>(MOE_BACKEND_CUDA + 1, 1 << 30)(rng);
  const int32_t below = std::uniform_int_distribution<int32_t>(-(1 << 30), -1)(rng);
  for (int32_t kind : {above, below}) {
    CHECK(moe_backend_available(kind) == 0);
    CHECK(std::string(moe_last_error()) == "unknown backend " + std::to_string(kind));
  }

  // The CUDA backend is a plugin: this test finds the build's beside the library (its RUNPATH
  // names the lib directory), so the answer is the device's.
  const int32_t cuda = moe_backend_available(MOE_BACKEND_CUDA);
#ifndef STRATA_CUDA_PLUGIN_PATH
  CHECK(cuda == 0);
#endif
  if (cuda == 0) {
    const std::string why = moe_last_error();
    INFO(why);
#ifndef STRATA_CUDA_PLUGIN_PATH
    CHECK(why == "the CUDA backend is not available in this build");
#else
    CHECK(why.find("the CUDA backend finds no CUDA device") == 0);
#endif
    // A context asked for it fails to open before the file is read, as the answer said it would.
    moe_params p;
    moe_params_init(&p);
    p.model_path = "/nonexistent.gguf";
    p.backend = MOE_BACKEND_CUDA;
    CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_UNSUPPORTED_BACKEND);
    CHECK(std::string(moe_last_error()) == why);
    // AUTO falls back to the CPU, saying nothing.
    p.model_path = kModel.c_str();
    p.backend = MOE_BACKEND_AUTO;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_ctx_close(ctx);
    ctx = nullptr;
  }
  // The reason is the calling thread's own.
  std::thread([] {
    CHECK(moe_backend_available(-7) == 0);
    CHECK(std::string(moe_last_error()) == "unknown backend -7");
  }).join();
}

TEST_CASE("moe_ctx_open refuses a kind that names no backend before reading the file", "[capi]") {
  std::mt19937 rng(std::random_device{}());
  moe_params p;
  moe_params_init(&p);
  p.model_path = "/nonexistent.gguf";  // the backend is checked first: no I/O error
  p.backend = std::uniform_int_distribution<int32_t>(MOE_BACKEND_CUDA + 1, 1000)(rng);
  moe_ctx *ctx = nullptr;
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()) == "unknown backend " + std::to_string(p.backend));
  CHECK(ctx == nullptr);
}
