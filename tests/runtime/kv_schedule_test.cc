// The step's scheduling under a KV budget smaller than its sessions need together: the batch
// shrinks to the sessions that fit (round-robin, so each advances), idle sessions go to the spill
// directory to make room and come back when their turn comes, every session's tokens and logits
// equal its run alone, and only a session that cannot fit the budget by itself fails the step
// (MOE_ERR_LIMIT_KV, with numbers that agree with moe_ctx_kv_usage).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/runtime/spill_dir_util.h"

namespace {

using strata::testing::CountEntries;
using strata::testing::MakeTempDir;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
constexpr int kVocab = 256;
constexpr uint64_t kBlockTokens = 128;

moe_ctx *OpenCtx(uint64_t kv_budget, const char *spill_dir, uint32_t max_sessions) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.n_threads = 2;
  p.kv_budget_bytes = kv_budget;
  p.kv_spill_dir = spill_dir;
  p.max_sessions = max_sessions;
  moe_ctx *c = nullptr;
  REQUIRE(moe_ctx_open(&p, &c) == MOE_OK);
  return c;
}

uint64_t BlockBytes(moe_ctx *c) {
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(c, &plan) == MOE_OK);
  REQUIRE(plan.kv_block_tokens == kBlockTokens);
  return plan.kv_bytes_per_token * plan.kv_block_tokens;
}

uint64_t Used(moe_ctx *c) {
  uint64_t u = 0;
  REQUIRE(moe_ctx_kv_usage(c, &u, nullptr) == MOE_OK);
  return u;
}

std::vector<int32_t> RandomTokens(std::mt19937 &rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, kVocab - 1);
  std::vector<int32_t> t(n);
  for (auto &x : t) x = d(rng);
  return t;
}

moe_session_params Sampling(uint64_t seed) {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.repeat_penalty = 1.2f;
  sp.stop_at_eos = 0;
  sp.seed = seed;
  return sp;
}

// What a session produced: the sampled tokens and the logits each was sampled from.
struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

struct Script {
  std::vector<int32_t> prompt;
  int n_gen = 0;
  uint64_t seed = 0;
};

// A session that has its logits: records them, samples, and feeds the token back until n_gen.
// Returns true when the script is done.
bool Advance(moe_session *s, const Script &sc, Run *r) {
  const float *l = nullptr;
  REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
  r->logits.emplace_back(l, l + kVocab);
  int32_t tok = 0;
  REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
  r->tokens.push_back(tok);
  if (static_cast<int>(r->tokens.size()) == sc.n_gen) return true;
  REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
  return false;
}

// The script alone on a context of its own with the default budget.
Run Solo(const Script &sc) {
  moe_ctx *c = OpenCtx(0, nullptr, 1);
  const moe_session_params sp = Sampling(sc.seed);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(c, &sp, &s) == MOE_OK);
  REQUIRE(moe_session_feed(s, sc.prompt.data(), sc.prompt.size()) == MOE_OK);
  Run r;
  for (bool done = false; !done;) {
    REQUIRE(moe_ctx_step(c, nullptr) == MOE_OK);
    if (moe_session_ready(s)) done = Advance(s, sc, &r);
  }
  moe_session_close(s);
  moe_ctx_close(c);
  return r;
}

// Every script on one context at once, all fed before the first step; a session whose script is
// done is closed when close_done, else it stays open (idle, holding its KV). Every step must
// succeed; the steps are bounded so that a scheduler that stops making progress fails.
// *evictions (nullable): times a session with processed positions was seen holding no KV in RAM.
std::vector<Run> Together(moe_ctx *c, const std::vector<Script> &scripts, bool close_done, uint64_t budget,
                          int *evictions = nullptr) {
  const size_t n = scripts.size();
  std::vector<moe_session *> s(n, nullptr);
  std::vector<Run> runs(n);
  std::vector<bool> done(n, false);
  for (size_t i = 0; i < n; ++i) {
    const moe_session_params sp = Sampling(scripts[i].seed);
    REQUIRE(moe_session_open(c, &sp, &s[i]) == MOE_OK);
    REQUIRE(moe_session_feed(s[i], scripts[i].prompt.data(), scripts[i].prompt.size()) == MOE_OK);
  }
  int total = 0;
  for (const Script &sc : scripts) total += sc.n_gen + 2;
  size_t n_done = 0;
  for (int step = 0; n_done < n && step < 4 * total; ++step) {
    const moe_status st = moe_ctx_step(c, nullptr);
    INFO("step " << step << ": " << moe_last_error());
    REQUIRE(st == MOE_OK);
    CHECK(Used(c) <= budget);
    for (size_t i = 0; i < n; ++i) {
      if (evictions != nullptr && s[i] != nullptr && moe_session_n_past(s[i]) > 0 && moe_session_kv_bytes(s[i]) == 0) {
        ++*evictions;
      }
      if (done[i] || !moe_session_ready(s[i])) continue;
      if (Advance(s[i], scripts[i], &runs[i])) {
        done[i] = true;
        ++n_done;
        if (close_done) {
          moe_session_close(s[i]);
          s[i] = nullptr;
        }
      }
    }
  }
  CHECK(n_done == n);
  for (moe_session *x : s) moe_session_close(x);
  return runs;
}


// n scripts, each needing two blocks (a prompt and its generation stay within 256 positions).
std::vector<Script> HalfBudgetScripts(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Script> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int prompt = std::uniform_int_distribution<int>(130, 200)(rng);
    out[i].prompt = RandomTokens(rng, prompt);
    out[i].n_gen = std::uniform_int_distribution<int>(8, 20)(rng);
    out[i].seed = rng();
  }
  return out;
}

}  // namespace

TEST_CASE("kv schedule: more sessions than the budget holds all finish, each as alone", "[kv][schedule]") {
  const std::vector<Script> scripts = HalfBudgetScripts(4, std::random_device{}());
  std::vector<Run> solo;
  for (const Script &sc : scripts) solo.push_back(Solo(sc));

  moe_ctx *probe = OpenCtx(0, nullptr, 1);
  const uint64_t block = BlockBytes(probe);
  moe_ctx_close(probe);
  const uint64_t budget = 4 * block;  // two sessions' worth

  SECTION("no spill directory: the batch shrinks to the sessions that fit; finished ones are closed") {
    moe_ctx *c = OpenCtx(budget, nullptr, 4);
    const std::vector<Run> runs = Together(c, scripts, /*close_done=*/true, budget);
    for (size_t i = 0; i < scripts.size(); ++i) {
      INFO("session " << i);
      CHECK(runs[i].tokens == solo[i].tokens);
      CHECK(runs[i].logits == solo[i].logits);
    }
    CHECK(Used(c) == 0);
    moe_ctx_close(c);
  }
  SECTION("a spill directory: sessions take turns, evicted and brought back, none closed") {
    const std::string dir = MakeTempDir("/tmp/strata-kv-sched-XXXXXX");
    moe_ctx *c = OpenCtx(budget, dir.c_str(), 4);
    int evictions = 0;
    const std::vector<Run> runs = Together(c, scripts, /*close_done=*/false, budget, &evictions);
    CHECK(evictions > 0);
    for (size_t i = 0; i < scripts.size(); ++i) {
      INFO("session " << i);
      CHECK(runs[i].tokens == solo[i].tokens);
      CHECK(runs[i].logits == solo[i].logits);
    }
    moe_ctx_close(c);
    CHECK(CountEntries(dir) == 0);
    rmdir(dir.c_str());
  }
}

TEST_CASE("kv schedule: a session alone too big for the budget fails with usage-consistent numbers",
          "[kv][schedule]") {
  moe_ctx *probe = OpenCtx(0, nullptr, 1);
  const uint64_t block = BlockBytes(probe);
  moe_ctx_close(probe);
  std::mt19937 rng(std::random_device{}());
  const uint64_t budget = 3 * block;
  const std::string dir = MakeTempDir("/tmp/strata-kv-sched-XXXXXX");
  for (const char *spill : {static_cast<const char *>(nullptr), dir.c_str()}) {
    INFO("spill dir " << (spill ? spill : "(none)"));
    moe_ctx *c = OpenCtx(budget, spill, 2);
    moe_session *a = nullptr, *b = nullptr;
    REQUIRE(moe_session_open(c, nullptr, &a) == MOE_OK);
    REQUIRE(moe_session_open(c, nullptr, &b) == MOE_OK);
    // a: one full block, then a token that needs its second block, in the same step as b's input
    // of four blocks (more than the whole budget).
    const std::vector<int32_t> ta = RandomTokens(rng, 129), tb = RandomTokens(rng, 3 * kBlockTokens + 20);
    REQUIRE(moe_session_feed(a, ta.data(), 100) == MOE_OK);
    REQUIRE(moe_ctx_step(c, nullptr) == MOE_OK);
    REQUIRE(moe_session_feed(a, ta.data() + 100, 28) == MOE_OK);
    REQUIRE(moe_ctx_step(c, nullptr) == MOE_OK);
    REQUIRE(moe_session_feed(a, ta.data() + 128, 1) == MOE_OK);
    REQUIRE(moe_session_feed(b, tb.data(), tb.size()) == MOE_OK);
    const float *l = nullptr;
    REQUIRE(moe_session_logits(a, &l, nullptr) == MOE_OK);
    const std::vector<float> a_before(l, l + kVocab);
    uint32_t pending = 0;
    REQUIRE(moe_ctx_step(c, &pending) == MOE_ERR_LIMIT_KV);
    const std::string msg = moe_last_error();
    INFO(msg);
    uint64_t used = 0, limit = 0;
    REQUIRE(moe_ctx_kv_usage(c, &used, &limit) == MOE_OK);
    CHECK(used == block);  // the failed step kept nothing
    CHECK(limit == budget);
    std::smatch m;
    REQUIRE(std::regex_search(msg, m, std::regex("KV budget of ([0-9]+) bytes")));
    CHECK(std::stoull(m[1]) == limit);
    REQUIRE(std::regex_search(msg, m, std::regex("([0-9]+) bytes in use")));
    CHECK(std::stoull(m[1]) == used);
    // Every session as before the step.
    CHECK(pending == 2);
    CHECK(moe_session_n_past(a) == 128);
    CHECK(moe_session_n_past(b) == 0);
    CHECK(moe_session_kv_bytes(b) == 0);
    REQUIRE(moe_session_logits(a, &l, nullptr) == MOE_OK);
    CHECK(std::memcmp(l, a_before.data(), kVocab * sizeof(float)) == 0);
    // Without b, a goes on.
    moe_session_close(b);
    REQUIRE(moe_ctx_step(c, &pending) == MOE_OK);
    CHECK(pending == 0);
    CHECK(moe_session_n_past(a) == 129);
    CHECK(Used(c) == 2 * block);
    moe_session_close(a);
    moe_ctx_close(c);
  }
  rmdir(dir.c_str());
}
