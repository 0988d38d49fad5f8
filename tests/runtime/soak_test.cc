// A bounded soak: several host threads share one context with experts streaming through a minimal
// RAM cache and a KV budget of two sessions' worth with a spill directory. Each thread runs
// scripts (a random prompt, then sampled tokens fed back) while it saves snapshots, evicts, goes
// back to its last snapshot (close, load, rewind), abandons sessions and steps the context itself;
// every step must succeed, and each script that runs to its end must give the tokens and logits of
// the same script run alone on a context of its own. A fixed count of operations (bench/soak_bench.cc
// runs the same idea for minutes).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "include/strata/moe.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
constexpr int kVocab = 256;

struct Script {
  std::vector<int32_t> prompt;
  int n_gen = 0;
  uint64_t seed = 0;
};

struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

moe_session_params Params(uint64_t seed) {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.repeat_penalty = 1.15f;
  sp.stop_at_eos = 0;
  sp.seed = seed;
  return sp;
}

moe_ctx *Open(uint64_t ram, uint64_t kv, const char *spill) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_threads = 2;
  p.ram_budget_bytes = ram;
  p.kv_budget_bytes = kv;
  p.kv_spill_dir = spill;
  p.max_sessions = 4;
  moe_ctx *c = nullptr;
  REQUIRE(moe_ctx_open(&p, &c) == MOE_OK);
  return c;
}

// Failures seen on the workers (Catch's assertions are for the main thread).
struct Failures {
  std::mutex mu;
  std::vector<std::string> what;
  void Add(const std::string &w) {
    std::lock_guard<std::mutex> lk(mu);
    what.push_back(w);
  }
  bool Check(moe_status st, const char *op) {
    if (st == MOE_OK) return true;
    Add(std::string(op) + ": " + moe_status_string(st) + ": " + moe_last_error());
    return false;
  }
};

// Records the logits, samples, and feeds the token back unless the script is done; false on error.
bool Advance(moe_session *s, const Script &sc, Run *r, bool *done, Failures *f) {
  const float *l = nullptr;
  if (!f->Check(moe_session_logits(s, &l, nullptr), "logits")) return false;
  r->logits.emplace_back(l, l + kVocab);
  int32_t tok = 0;
  if (!f->Check(moe_session_sample(s, &tok), "sample")) return false;
  r->tokens.push_back(tok);
  *done = static_cast<int>(r->tokens.size()) == sc.n_gen;
  return *done || f->Check(moe_session_feed(s, &tok, 1), "feed");
}

Run Solo(moe_ctx *c, const Script &sc, Failures *f) {
  const moe_session_params sp = Params(sc.seed);
  moe_session *s = nullptr;
  Run r;
  if (!f->Check(moe_session_open(c, &sp, &s), "open")) return r;
  f->Check(moe_session_feed(s, sc.prompt.data(), sc.prompt.size()), "feed");
  for (bool done = false; !done;) {
    if (!f->Check(moe_ctx_step(c, nullptr), "step")) break;
    if (moe_session_ready(s) && !Advance(s, sc, &r, &done, f)) break;
  }
  moe_session_close(s);
  return r;
}

}  // namespace

TEST_CASE("soak: threads open, feed, save, evict, reload, abandon and close under small budgets",
          "[soak][kv][snapshot][threads]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kThreads = 4, kScriptsPerThread = 8;
  std::vector<std::vector<Script>> scripts(kThreads);
  for (auto &list : scripts) {
    for (int i = 0; i < kScriptsPerThread; ++i) {
      Script sc;
      sc.prompt.resize(std::uniform_int_distribution<int>(20, 200)(rng));
      for (auto &t : sc.prompt) t = std::uniform_int_distribution<int32_t>(0, kVocab - 1)(rng);
      sc.n_gen = std::uniform_int_distribution<int>(6, 24)(rng);
      sc.seed = rng();
      list.push_back(std::move(sc));
    }
  }
  Failures f;
  std::vector<std::vector<Run>> solo(kThreads);
  {
    moe_ctx *c = Open(0, 0, nullptr);
    for (int t = 0; t < kThreads; ++t) {
      for (const Script &sc : scripts[t]) solo[t].push_back(Solo(c, sc, &f));
    }
    moe_ctx_close(c);
  }
  REQUIRE(f.what.empty());

  char tmpl[] = "/tmp/strata-soak-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  {
    moe_ctx *probe = Open(0, 0, nullptr);
    REQUIRE(moe_ctx_plan(probe, &plan) == MOE_OK);
    moe_ctx_close(probe);
  }
  const uint64_t block = plan.kv_bytes_per_token * plan.kv_block_tokens;
  moe_ctx *ctx = Open(1, 4 * block, dir.c_str());  // RAM: the minimum; KV: two sessions of two blocks

  std::vector<std::vector<Run>> runs(kThreads, std::vector<Run>(kScriptsPerThread));
  std::vector<std::vector<char>> finished(kThreads, std::vector<char>(kScriptsPerThread, 0));
  std::vector<int> counts(5, 0);  // saves, reloads, evictions, abandoned, steps (summed under mu)
  std::mutex counts_mu;
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    const uint32_t wseed = rng();
    workers.emplace_back([&, t, wseed] {
      std::mt19937 r(wseed);
      auto dice = [&] { return std::uniform_int_distribution<int>(0, 99)(r); };
      int saves = 0, reloads = 0, evictions = 0, abandoned = 0, steps = 0;
      const std::string snap = dir + "/t" + std::to_string(t) + ".snap";
      for (int i = 0; i < kScriptsPerThread; ++i) {
        const Script &sc = scripts[t][i];
        const moe_session_params sp = Params(sc.seed);
        moe_session *s = nullptr;
        if (!f.Check(moe_session_open(ctx, &sp, &s), "open")) return;
        if (!f.Check(moe_session_feed(s, sc.prompt.data(), sc.prompt.size()), "feed")) return;
        Run &run = runs[t][i];
        size_t saved_at = 0;  // tokens of run when the snapshot was written
        bool saved = false, done = false, abandon = dice() < 10;
        for (int ops = 0; !done && ops < 50 * (sc.n_gen + 4); ++ops) {
          const int d = dice();
          if (d < 5) {
            if (!f.Check(moe_session_save(s, snap.c_str()), "save")) return;
            saved = true;
            saved_at = run.tokens.size();
            ++saves;
          } else if (d < 8 && saved) {
            // Back to the snapshot: the session is closed and loaded again, its record rewound.
            moe_session_close(s);
            s = nullptr;
            if (!f.Check(moe_session_load(ctx, snap.c_str(), nullptr, &s), "load")) return;
            run.tokens.resize(saved_at);
            run.logits.resize(saved_at);
            ++reloads;
          } else if (d < 12) {
            if (!f.Check(moe_session_evict(s), "evict")) return;
            ++evictions;
          } else if (abandon && d < 15 && !run.tokens.empty()) {
            ++abandoned;
            break;
          }
          if (moe_session_ready(s)) {
            if (!Advance(s, sc, &run, &done, &f)) return;
          } else {
            const bool timed = dice() < 30;
            const moe_status st = timed ? moe_ctx_step_for(ctx, 2000, nullptr, nullptr) : moe_ctx_step(ctx, nullptr);
            if (!f.Check(st, timed ? "step_for" : "step")) return;
            ++steps;
          }
        }
        finished[t][i] = done;
        moe_session_close(s);
      }
      std::lock_guard<std::mutex> lk(counts_mu);
      for (int k = 0; k < 5; ++k) counts[k] += std::vector<int>{saves, reloads, evictions, abandoned, steps}[k];
    });
  }
  for (auto &w : workers) w.join();
  for (const std::string &w : f.what) FAIL_CHECK(w);
  int n_finished = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kScriptsPerThread; ++i) {
      if (!finished[t][i]) continue;
      ++n_finished;
      INFO("thread " << t << " script " << i);
      CHECK(runs[t][i].tokens == solo[t][i].tokens);
      CHECK(runs[t][i].logits == solo[t][i].logits);
    }
  }
  INFO("saves " << counts[0] << ", reloads " << counts[1] << ", evictions " << counts[2] << ", abandoned "
                << counts[3] << ", steps " << counts[4]);
  CHECK(n_finished + counts[3] == kThreads * kScriptsPerThread);
  CHECK(counts[1] > 0);  // the operations happened
  CHECK(counts[2] > 0);
  uint64_t used = 1;
  REQUIRE(moe_ctx_kv_usage(ctx, &used, nullptr) == MOE_OK);
  CHECK(used == 0);  // every session closed: every block back
  moe_ctx_close(ctx);
  for (int t = 0; t < kThreads; ++t) unlink((dir + "/t" + std::to_string(t) + ".snap").c_str());
  CHECK(rmdir(dir.c_str()) == 0);  // nothing else left behind (spill files are unlinked)
}
