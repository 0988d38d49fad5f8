// moe_ctx_abort (issue 47): a step stopped at a layer boundary, through a test hook in the forward
// pass at every boundary of batched and token-by-token steps, and from another thread, returns
// MOE_ERR_ABORTED and leaves every session as if the step had never run: continued, each gives the
// logits of a run never aborted, bit for bit. Also in the ThreadSanitizer executable.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "include/strata/moe.h"
#include "lib/model/forward.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";

}  // namespace

// ---- moe_ctx_abort ----------------------------------------------------------------------------

namespace {

moe_ctx *OpenGolden(uint32_t prefill_token_max = 0) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_ctx = 512;
  p.max_sessions = 8;
  p.prefill_token_max = prefill_token_max;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

std::vector<float> LogitsOf(const moe_session *s) {
  const float *l = nullptr;
  int32_t n = 0;
  REQUIRE(moe_session_logits(s, &l, &n) == MOE_OK);
  return std::vector<float>(l, l + n);
}

std::vector<int32_t> RandomTokens(std::mt19937_64 &rng, size_t n, int32_t vocab) {
  std::vector<int32_t> t(n);
  for (auto &x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// A script of several sessions: a first input each (stepped without abort), then a second input
// each, all run in one batched step; the logits after each.
struct Script {
  std::vector<std::vector<int32_t>> first, second;
};

Script MakeScript(std::mt19937_64 &rng, int32_t vocab, size_t n_sessions) {
  Script sc;
  for (size_t i = 0; i < n_sessions; ++i) {
    sc.first.push_back(RandomTokens(rng, 1 + rng() % 40, vocab));
    sc.second.push_back(RandomTokens(rng, 1 + rng() % 20, vocab));
  }
  return sc;
}

struct Run {
  moe_ctx *ctx = nullptr;
  std::vector<moe_session *> s;
};

Run StartRun(const Script &sc, uint32_t prefill_token_max) {
  Run r;
  r.ctx = OpenGolden(prefill_token_max);
  for (size_t i = 0; i < sc.first.size(); ++i) {
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(r.ctx, nullptr, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, sc.first[i].data(), sc.first[i].size()) == MOE_OK);
    r.s.push_back(s);
  }
  uint32_t pending = 1;
  while (pending > 0) REQUIRE(moe_ctx_step(r.ctx, &pending) == MOE_OK);
  for (size_t i = 0; i < sc.second.size(); ++i) {
    REQUIRE(moe_session_feed(r.s[i], sc.second[i].data(), sc.second[i].size()) == MOE_OK);
  }
  return r;
}

// Steps until no input is left, stepping again after an abort; the logits of every session.
std::vector<std::vector<float>> Finish(Run &r) {
  uint32_t pending = 1;
  while (pending > 0) {
    const moe_status st = moe_ctx_step(r.ctx, &pending);
    if (st == MOE_ERR_ABORTED) {
      pending = 1;
      continue;
    }
    REQUIRE(st == MOE_OK);
  }
  std::vector<std::vector<float>> out;
  for (moe_session *s : r.s) out.push_back(LogitsOf(s));
  return out;
}

// Calls moe_ctx_abort at the chosen layer boundary (counted over all passes) of the steps that run
// while it is installed.
struct AbortAt {
  moe_ctx *ctx;
  int at;  // 1 = the first boundary
  int seen = 0;
};
void AbortHook(int layer, void *user) {
  auto *a = static_cast<AbortAt *>(user);
  if (++a->seen == a->at) moe_ctx_abort(a->ctx);
}
struct ScopedLayerHook {
  ScopedLayerHook(void (*fn)(int, void *), void *user) { strata::model::SetLayerHookForTesting(fn, user); }
  ~ScopedLayerHook() { strata::model::SetLayerHookForTesting(nullptr, nullptr); }
};

}  // namespace

TEST_CASE("abort: NULL is refused, an abort before a step stops that step and is then spent", "[capi][abort]") {
  CHECK(moe_ctx_abort(nullptr) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("NULL") != std::string::npos);
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = OpenGolden();
  const int32_t vocab = moe_ctx_vocab_size(ctx);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const std::vector<int32_t> t = RandomTokens(rng, 9, vocab);
  REQUIRE(moe_session_feed(s, t.data(), t.size()) == MOE_OK);
  REQUIRE(moe_ctx_abort(ctx) == MOE_OK);
  REQUIRE(moe_ctx_abort(ctx) == MOE_OK);  // two requests before a step: one stop
  uint32_t pending = 99;
  CHECK(moe_ctx_step(ctx, &pending) == MOE_ERR_ABORTED);
  CHECK(std::string(moe_last_error()).find("abort") != std::string::npos);
  CHECK(pending == 1);
  CHECK(moe_session_n_pending(s) == 9);
  CHECK(moe_session_n_past(s) == 0);
  const float *l = nullptr;
  int32_t n = 0;
  CHECK(moe_session_logits(s, &l, &n) == MOE_ERR_STATE);
  // The request is spent: the next step runs.
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(pending == 0);
  CHECK(moe_session_n_past(s) == 9);
  // moe_ctx_step_for too, with nothing done.
  REQUIRE(moe_session_feed(s, t.data(), 3) == MOE_OK);
  REQUIRE(moe_ctx_abort(ctx) == MOE_OK);
  uint32_t steps = 99;
  CHECK(moe_ctx_step_for(ctx, 1000000, &pending, &steps) == MOE_ERR_ABORTED);
  CHECK(steps == 0);
  CHECK(moe_session_n_past(s) == 9);
  REQUIRE(moe_ctx_step_for(ctx, 1000000, &pending, &steps) == MOE_OK);
  CHECK(moe_session_n_past(s) == 12);
  moe_ctx_close(ctx);
}

TEST_CASE("abort: a batched step stopped at any layer boundary leaves every session as if it never ran",
          "[capi][abort]") {
  std::mt19937_64 rng(std::random_device{}());
  // prefill_token_max 0: one pass a step; 6: short inputs token by token (several passes, the abort
  // may land in a later one after earlier passes wrote KV rows).
  for (uint32_t ptm : {0u, 6u}) {
    const Script sc = MakeScript(rng, 256, 4);
    // The reference: never aborted.
    Run ref = StartRun(sc, ptm);
    std::vector<std::vector<float>> before;
    for (moe_session *s : ref.s) before.push_back(LogitsOf(s));
    const std::vector<std::vector<float>> want = Finish(ref);
    moe_ctx_close(ref.ctx);
    // Count the boundaries the step crosses, then abort at a random one of them.
    int boundaries = 0;
    {
      Run probe = StartRun(sc, ptm);
      AbortAt count{probe.ctx, -1};
      {
        ScopedLayerHook hook(AbortHook, &count);
        uint32_t pending = 0;
        REQUIRE(moe_ctx_step(probe.ctx, &pending) == MOE_OK);
      }
      boundaries = count.seen;
      moe_ctx_close(probe.ctx);
    }
    REQUIRE(boundaries >= 3);  // at least one pass over three layers
    for (int at : {1 + static_cast<int>(rng() % boundaries), boundaries}) {
      INFO("prefill_token_max " << ptm << ", abort at boundary " << at << " of " << boundaries);
      Run r = StartRun(sc, ptm);
      uint64_t kv_before = 0, kv_after = 0;
      REQUIRE(moe_ctx_kv_usage(r.ctx, &kv_before, nullptr) == MOE_OK);
      std::vector<int32_t> past_before;
      for (moe_session *s : r.s) past_before.push_back(moe_session_n_past(s));
      AbortAt abort{r.ctx, at};
      moe_status st;
      {
        ScopedLayerHook hook(AbortHook, &abort);
        st = moe_ctx_step(r.ctx, nullptr);
      }
      REQUIRE(st == MOE_ERR_ABORTED);
      REQUIRE(moe_ctx_kv_usage(r.ctx, &kv_after, nullptr) == MOE_OK);
      CHECK(kv_after == kv_before);
      for (size_t i = 0; i < r.s.size(); ++i) {
        CHECK(moe_session_n_past(r.s[i]) == past_before[i]);
        CHECK(moe_session_n_pending(r.s[i]) == static_cast<int32_t>(sc.second[i].size()));
        CHECK(LogitsOf(r.s[i]) == before[i]);  // the logits of the last completed step
      }
      const std::vector<std::vector<float>> got = Finish(r);
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
      moe_ctx_close(r.ctx);
    }
  }
}

TEST_CASE("abort: from another thread while steps run, every session ends as without abort",
          "[capi][abort][threads]") {
  std::mt19937_64 rng(std::random_device{}());
  const Script sc = MakeScript(rng, 256, 3);
  Run ref = StartRun(sc, 0);
  const std::vector<std::vector<float>> want = Finish(ref);
  moe_ctx_close(ref.ctx);
  int aborted = 0;
  for (int round = 0; round < 8; ++round) {
    Run r = StartRun(sc, 0);
    const int delay_us = static_cast<int>(rng() % 400);
    // Catch's assertions are not thread-safe: the aborter keeps its status for the main thread.
    moe_status abort_st = MOE_ERR_INTERNAL;
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      abort_st = moe_ctx_abort(r.ctx);
    });
    uint32_t pending = 1;
    while (pending > 0) {
      const moe_status st = moe_ctx_step(r.ctx, &pending);
      if (st == MOE_ERR_ABORTED) {
        ++aborted;
        pending = 1;
        continue;
      }
      REQUIRE(st == MOE_OK);
    }
    aborter.join();
    REQUIRE(abort_st == MOE_OK);
    // An abort that came after the last step is kept for the next one: Finish steps past it.
    const std::vector<std::vector<float>> got = Finish(r);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
    moe_ctx_close(r.ctx);
  }
  INFO("steps aborted: " << aborted);
  SUCCEED();
}
