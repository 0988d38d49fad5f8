// The embedding calls on the CUDA backend, where KV blocks live in device memory, decode steps read
// them through device block tables and replay recorded graphs: a fork shares and copies device
// blocks, a rewind lets them go, an abort stops eager and recorded steps alike, snapshots in memory
// round-trip; every continuation against a session run the plain way on the same context (within
// 1e-5 normalized: the GPU's sums may differ with the batch a token runs in). Skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/model/forward.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
constexpr double kTolerance = 1e-5;

bool HaveCuda() {
  if (moe_backend_available(MOE_BACKEND_CUDA) == 1) return true;
  WARN("no CUDA backend: " << moe_last_error() << "; GPU test skipped");
  return false;
}

moe_ctx *OpenCuda() {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CUDA;
  p.n_ctx = 1024;
  p.max_sessions = 8;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

std::vector<int32_t> Tokens(std::mt19937_64 &rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto &x : t) x = static_cast<int32_t>(rng() % 256);
  return t;
}

void Feed(moe_session *s, const std::vector<int32_t> &t) { REQUIRE(moe_session_feed(s, t.data(), t.size()) == MOE_OK); }

void StepAll(moe_ctx *ctx) {
  uint32_t pending = 1;
  while (pending > 0) REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
}

std::vector<float> LogitsOf(const moe_session *s) {
  const float *l = nullptr;
  int32_t n = 0;
  REQUIRE(moe_session_logits(s, &l, &n) == MOE_OK);
  return std::vector<float>(l, l + n);
}

double Error(const std::vector<float> &got, const std::vector<float> &want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The logits after each chunk, run alone: one chunk a step, then single-token decode steps.
std::vector<std::vector<float>> Reference(moe_ctx *ctx, const std::vector<std::vector<int32_t>> &chunks) {
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  std::vector<std::vector<float>> out;
  for (const auto &c : chunks) {
    Feed(s, c);
    StepAll(ctx);
    out.push_back(LogitsOf(s));
  }
  moe_session_close(s);
  return out;
}

struct AbortAt {
  moe_ctx *ctx;
  int at;
  int seen = 0;
};
void AbortHook(int, void *user) {
  auto *a = static_cast<AbortAt *>(user);
  if (++a->seen == a->at) moe_ctx_abort(a->ctx);
}

}  // namespace

TEST_CASE("embedding on CUDA: forks share device blocks and diverge, rewinds, buffers", "[gpu][capi][fork]") {
  if (!HaveCuda()) return;
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = OpenCuda();
  const std::vector<int32_t> prompt = Tokens(rng, 130 + rng() % 100);
  std::vector<std::vector<int32_t>> a_chunks = {prompt}, b_chunks = {prompt};
  for (int i = 0; i < 12; ++i) {  // decode steps: device tables, recorded graphs
    a_chunks.push_back(Tokens(rng, 1));
    b_chunks.push_back(Tokens(rng, 1));
  }
  const auto want_a = Reference(ctx, a_chunks), want_b = Reference(ctx, b_chunks);
  moe_session *a = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &a) == MOE_OK);
  Feed(a, prompt);
  StepAll(ctx);
  uint64_t used = 0;
  REQUIRE(moe_ctx_kv_usage(ctx, &used, nullptr) == MOE_OK);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  uint64_t after_fork = 0;
  REQUIRE(moe_ctx_kv_usage(ctx, &after_fork, nullptr) == MOE_OK);
  CHECK(after_fork == used);
  for (size_t i = 1; i < a_chunks.size(); ++i) {
    Feed(a, a_chunks[i]);
    Feed(b, b_chunks[i]);
    StepAll(ctx);  // both in one decode batch
    INFO("step " << i);
    CHECK(Error(LogitsOf(a), want_a[i]) <= kTolerance);
    CHECK(Error(LogitsOf(b), want_b[i]) <= kTolerance);
  }
  // Rewind the decode tokens and take them again.
  REQUIRE(moe_session_rewind(a, 12) == MOE_OK);
  for (size_t i = 1; i < a_chunks.size(); ++i) {
    Feed(a, a_chunks[i]);
    StepAll(ctx);
  }
  CHECK(Error(LogitsOf(a), want_a.back()) <= kTolerance);
  // A snapshot in memory from device blocks, loaded and continued.
  size_t need = 0;
  REQUIRE(moe_session_save_buffer(b, nullptr, 0, &need) == MOE_ERR_LIMIT);
  std::vector<uint8_t> buf(need);
  REQUIRE(moe_session_save_buffer(b, buf.data(), buf.size(), &need) == MOE_OK);
  moe_session *c = nullptr;
  REQUIRE(moe_session_load_buffer(ctx, buf.data(), buf.size(), nullptr, &c) == MOE_OK);
  const std::vector<int32_t> more = Tokens(rng, 1);
  Feed(b, more);
  Feed(c, more);
  StepAll(ctx);
  CHECK(Error(LogitsOf(c), LogitsOf(b)) <= kTolerance);
  moe_ctx_close(ctx);
}

TEST_CASE("embedding on CUDA: an abort at any boundary of prefill or decode leaves the sessions intact",
          "[gpu][capi][abort]") {
  if (!HaveCuda()) return;
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = OpenCuda();
  const std::vector<int32_t> p1 = Tokens(rng, 1 + rng() % 60), p2 = Tokens(rng, 1 + rng() % 60);
  std::vector<std::vector<int32_t>> c1 = {p1}, c2 = {p2};
  for (int i = 0; i < 8; ++i) {
    c1.push_back(Tokens(rng, 1));
    c2.push_back(Tokens(rng, 1));
  }
  const auto want1 = Reference(ctx, c1), want2 = Reference(ctx, c2);
  moe_session *s1 = nullptr, *s2 = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s1) == MOE_OK);
  REQUIRE(moe_session_open(ctx, nullptr, &s2) == MOE_OK);
  for (size_t i = 0; i < c1.size(); ++i) {
    Feed(s1, c1[i]);
    Feed(s2, c2[i]);
    // Abort once at a random boundary of this step (the count of boundaries a step crosses is at
    // most one a layer; a replayed graph has one, before it).
    AbortAt abort{ctx, 1 + static_cast<int>(rng() % 3)};
    strata::model::SetLayerHookForTesting(AbortHook, &abort);
    const moe_status st = moe_ctx_step(ctx, nullptr);
    strata::model::SetLayerHookForTesting(nullptr, nullptr);
    INFO("step " << i << ": " << moe_status_string(st) << " after " << abort.seen << " boundaries");
    if (st == MOE_ERR_ABORTED) {
      CHECK(moe_session_n_pending(s1) == static_cast<int32_t>(c1[i].size()));
    } else {
      REQUIRE(st == MOE_OK);
      // The abort came after the step's last boundary: it stops the next step, before anything.
      REQUIRE(moe_ctx_step(ctx, nullptr) == (abort.seen >= abort.at ? MOE_ERR_ABORTED : MOE_OK));
    }
    StepAll(ctx);
    CHECK(Error(LogitsOf(s1), want1[i]) <= kTolerance);
    CHECK(Error(LogitsOf(s2), want2[i]) <= kTolerance);
  }
  moe_ctx_close(ctx);
}
