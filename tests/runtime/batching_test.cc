// Continuous batching through the C ABI: sessions arriving at random times with random inputs give
// every token and logit bit-identical to running alone (resident and at the minimum streamed
// budget, any token cap); prefill modes agree bit for bit; the cap is shared fairly; a failed batch
// leaves every session as it was; the time-budgeted step progresses; host threads feeding their own
// sessions while another thread steps get the numbers of a serial run (run under TSan too).
#include <catch2/catch.hpp>

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/model/forward.h"
#include "lib/runtime/context.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::kGolden;

struct CtxOptions {
  uint64_t ram_budget = 0;  // 1: clamped to the minimum (one layer's experts)
  uint32_t max_batch_tokens = 0;
  uint32_t prefill_token_max = 0;
  uint32_t prefill_layer_min = 0;
};

moe_ctx *Open(const std::string &model, const CtxOptions &o) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_threads = 2;
  p.n_ctx = 256;
  p.max_sessions = 16;
  p.ram_budget_bytes = o.ram_budget;
  p.max_batch_tokens = o.max_batch_tokens;
  p.prefill_token_max = o.prefill_token_max;
  p.prefill_layer_min = o.prefill_layer_min;
  moe_ctx *ctx = nullptr;
  INFO(model << ": " << moe_last_error());
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

moe_session *OpenSession(moe_ctx *ctx) {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.logits_all = 1;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  return s;
}

// A session's script: turns of fed tokens; an empty turn means "feed the greedy next token".
struct Script {
  std::vector<std::vector<int32_t>> turns;
};

// What a session produced: the logits rows of every turn, and the tokens it generated.
struct Trace {
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> generated;
};

int32_t Greedy(moe_session *s) {
  const float *l;
  int32_t nv;
  REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
  int32_t best = 0;
  for (int32_t i = 1; i < nv; ++i) best = l[i] > l[best] ? i : best;
  return best;
}

// The input of a session's next turn.
std::vector<int32_t> TurnInput(const Script &sc, size_t turn, moe_session *s, Trace *tr) {
  if (!sc.turns[turn].empty()) return sc.turns[turn];
  const int32_t t = Greedy(s);
  tr->generated.push_back(t);
  return {t};
}

void Record(moe_session *s, size_t n, Trace *tr) {
  const float *rows;
  int32_t nt, nv;
  REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
  REQUIRE(static_cast<size_t>(nt) == n);
  tr->rows.emplace_back(rows, rows + static_cast<size_t>(nt) * nv);
}

std::vector<Script> RandomScripts(std::mt19937_64 &rng, size_t n_sessions, int32_t n_vocab) {
  std::vector<Script> out(n_sessions);
  for (auto &sc : out) {
    const int n_turns = 1 + static_cast<int>(rng() % 6);
    for (int t = 0; t < n_turns; ++t) {
      const bool gen = t > 0 && rng() % 2 == 0;
      const size_t len = gen ? 0 : 1 + rng() % (rng() % 4 == 0 ? 40 : 6);
      std::vector<int32_t> toks(len);
      for (auto &x : toks) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab));
      sc.turns.push_back(std::move(toks));
    }
  }
  return out;
}

// Each script alone in a fresh session (the context's defaults: one pass per turn).
std::vector<Trace> RunAlone(const std::string &model, const std::vector<Script> &scripts) {
  moe_ctx *ctx = Open(model, CtxOptions{});
  std::vector<Trace> out(scripts.size());
  for (size_t i = 0; i < scripts.size(); ++i) {
    moe_session *s = OpenSession(ctx);
    for (size_t t = 0; t < scripts[i].turns.size(); ++t) {
      const auto in = TurnInput(scripts[i], t, s, &out[i]);
      REQUIRE(moe_session_feed(s, in.data(), in.size()) == MOE_OK);
      uint32_t pending = 9;
      REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
      REQUIRE(pending == 0);
      Record(s, in.size(), &out[i]);
    }
    moe_session_close(s);
  }
  moe_ctx_close(ctx);
  return out;
}

// All scripts at once: each step, sessions that are ready (or not started) start their next turn
// with some probability, so arrivals, lengths and batch compositions are random.
std::vector<Trace> RunBatched(moe_ctx *ctx, const std::vector<Script> &scripts, std::mt19937_64 &rng) {
  const size_t n = scripts.size();
  std::vector<moe_session *> ss(n);
  for (auto &s : ss) s = OpenSession(ctx);
  std::vector<Trace> out(n);
  std::vector<size_t> next(n, 0), fed(n, 0);
  std::vector<bool> busy(n, false);
  for (int guard = 0; guard < 100000; ++guard) {
    bool left = false;
    for (size_t i = 0; i < n; ++i) {
      if (busy[i] && moe_session_ready(ss[i]) == 1) {
        Record(ss[i], fed[i], &out[i]);
        busy[i] = false;
      }
      if (!busy[i] && next[i] < scripts[i].turns.size() && rng() % 3 == 0) {
        const auto in = TurnInput(scripts[i], next[i], ss[i], &out[i]);
        REQUIRE(moe_session_feed(ss[i], in.data(), in.size()) == MOE_OK);
        fed[i] = in.size();
        busy[i] = true;
        ++next[i];
      }
      left = left || busy[i] || next[i] < scripts[i].turns.size();
    }
    if (!left) break;
    uint32_t pending = 0;
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  }
  for (size_t i = 0; i < n; ++i) {
    CHECK(next[i] == scripts[i].turns.size());
    moe_session_close(ss[i]);
  }
  return out;
}

void CheckSame(const std::vector<Trace> &got, const std::vector<Trace> &ref) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("session " << i);
    CHECK(got[i].generated == ref[i].generated);
    REQUIRE(got[i].rows.size() == ref[i].rows.size());
    for (size_t t = 0; t < ref[i].rows.size(); ++t) {
      INFO("turn " << t);
      REQUIRE(got[i].rows[t].size() == ref[i].rows[t].size());
      CHECK(std::memcmp(got[i].rows[t].data(), ref[i].rows[t].data(), ref[i].rows[t].size() * sizeof(float)) == 0);
    }
  }
}

const char *kModels[] = {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-f32.gguf", "olmoe_f32/model-f32.gguf",
                         "qwen2moe_f32/model-f32.gguf"};

}  // namespace

TEST_CASE("16 sessions with random arrival match running alone, bit for bit", "[batching][golden]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const char *m : kModels) {
    const std::string model = kGolden + m;
    INFO(m);
    moe_ctx *probe = Open(model, CtxOptions{});
    const int32_t n_vocab = moe_ctx_vocab_size(probe);
    moe_ctx_close(probe);
    const auto scripts = RandomScripts(rng, 16, n_vocab);
    const auto ref = RunAlone(model, scripts);
    for (const uint64_t budget : {uint64_t{0}, uint64_t{1}}) {
      CtxOptions o;
      o.ram_budget = budget;
      o.max_batch_tokens = 1 + static_cast<uint32_t>(rng() % 48);  // often below the input: chunks
      o.prefill_token_max = 1 + static_cast<uint32_t>(rng() % 4);  // short inputs token by token
      o.prefill_layer_min = rng() % 2 ? 0 : 1 + static_cast<uint32_t>(rng() % 32);  // layer-major or not
      INFO("budget " << budget << ", max_batch_tokens " << o.max_batch_tokens << ", prefill_token_max "
                     << o.prefill_token_max << ", prefill_layer_min " << o.prefill_layer_min);
      moe_ctx *ctx = Open(model, o);
      CheckSame(RunBatched(ctx, scripts, rng), ref);
      if (budget == 1) {
        moe_stats st;
        moe_stats_init(&st);
        REQUIRE(moe_ctx_stats(ctx, &st) == MOE_OK);
        CHECK(st.streaming == 1);
        CHECK(st.expert_misses > 0);
      }
      moe_ctx_close(ctx);
    }
  }
}

TEST_CASE("at the minimum budget one batch can need every expert of a layer", "[batching][store]") {
  // The plan's minimum is one layer's experts and only one layer is acquired at a time, so a batch
  // whose tokens route to all of a layer's experts still fits (loads in flight are waited out).
  const std::string model = kGolden + "mixtral_f32/model-f32.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> inputs(16);
  for (auto &in : inputs) {
    in.resize(4 + rng() % 12);
    for (auto &t : in) t = static_cast<int32_t>(rng() % 256);
  }
  std::vector<std::vector<float>> alone;
  moe_ctx *ref = Open(model, CtxOptions{});
  for (const auto &in : inputs) {
    moe_session *s = OpenSession(ref);
    REQUIRE(moe_session_feed(s, in.data(), in.size()) == MOE_OK);
    REQUIRE(moe_ctx_step(ref, nullptr) == MOE_OK);
    const float *rows;
    int32_t nt, nv;
    REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
    alone.emplace_back(rows, rows + static_cast<size_t>(nt) * nv);
    moe_session_close(s);
  }
  moe_ctx_close(ref);
  moe_ctx *ctx = Open(model, CtxOptions{1, 0, 0, 0});
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
  const uint32_t n_experts = moe_expert_table_n_experts(moe_ctx_experts(ctx));
  CHECK(plan.ram_expert_slots == n_experts);
  std::vector<moe_session *> ss;
  for (const auto &in : inputs) {
    ss.push_back(OpenSession(ctx));
    REQUIRE(moe_session_feed(ss.back(), in.data(), in.size()) == MOE_OK);
  }
  uint32_t pending = 9;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);  // one batch: every session's whole input
  REQUIRE(pending == 0);
  size_t n = 0;
  std::vector<uint64_t> counts(static_cast<size_t>(plan.n_layers) * n_experts);
  REQUIRE(moe_ctx_expert_counts(ctx, counts.data(), counts.size(), &n) == MOE_OK);
  bool full_layer = false;
  for (uint32_t l = 0; l < plan.n_layers; ++l) {
    bool all = true;
    for (uint32_t e = 0; e < n_experts; ++e) all = all && counts[l * n_experts + e] > 0;
    full_layer = full_layer || all;
  }
  CHECK(full_layer);  // the batch needed every slot of the cache for some layer
  for (size_t i = 0; i < ss.size(); ++i) {
    const float *rows;
    int32_t nt, nv;
    REQUIRE(moe_session_logits_all(ss[i], &rows, &nt, &nv) == MOE_OK);
    REQUIRE(static_cast<size_t>(nt) * nv == alone[i].size());
    CHECK(std::memcmp(rows, alone[i].data(), alone[i].size() * sizeof(float)) == 0);
  }
  moe_ctx_close(ctx);
}

TEST_CASE("prefill modes give bit-identical logits", "[batching]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prompt(24 + rng() % 40);
  for (auto &t : prompt) t = static_cast<int32_t>(rng() % 256);
  struct Mode {
    const char *name;
    uint32_t token_max, layer_min;
  };
  // 0, 0: the defaults, which on this model (8 experts, 2 a token) are layer-major from 16 tokens.
  const Mode modes[] = {{"token by token", 100000, 100000},
                        {"selected experts", 1, 100000},
                        {"layer-major", 1, 1},
                        {"defaults", 0, 0}};
  // The minimum budget (one layer's experts), and one layer more, where layer-major can read ahead.
  moe_ctx *probe = Open(model, CtxOptions{1, 0, 0, 0});
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(probe, &plan) == MOE_OK);
  moe_ctx_close(probe);
  const uint64_t two_layers = plan.ram_budget_bytes + plan.expert_slot_bytes * (plan.n_routed_experts / plan.n_layers);
  std::vector<float> ref;
  for (const uint64_t budget : {uint64_t{1}, two_layers}) {
    uint64_t ref_uses = 0;
    for (const Mode &md : modes) {
      INFO(md.name << ", budget " << budget);
      CtxOptions o;
      o.ram_budget = budget;
      o.prefill_token_max = md.token_max;
      o.prefill_layer_min = md.layer_min;
      moe_ctx *ctx = Open(model, o);
      moe_session *s = OpenSession(ctx);
      REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
      uint32_t pending = 9;
      REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
      REQUIRE(pending == 0);
      const float *rows;
      int32_t nt, nv;
      REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
      REQUIRE(static_cast<size_t>(nt) == prompt.size());
      std::vector<float> got(rows, rows + static_cast<size_t>(nt) * nv);
      moe_stats st;
      moe_stats_init(&st);
      REQUIRE(moe_ctx_stats(ctx, &st) == MOE_OK);
      CHECK(st.streaming == 1);
      const uint64_t uses = st.expert_hits + st.expert_misses;
      if (ref.empty()) ref = got;
      CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);
      if (ref_uses == 0) {
        ref_uses = uses;
      } else {
        // Batched passes acquire each expert once per layer, token by token once per token.
        CHECK(uses < ref_uses);
      }
      if (md.layer_min == 1 && budget != 1) CHECK(st.prefetch_issued > 0);  // whole next layers requested
      moe_ctx_close(ctx);
    }
  }
}

// A prompt whose every position's logits are asked, longer than the rows the workspace holds
// (model::kLogitsChunkRows), runs its output head chunk by chunk: the logits are those of the same
// prompt fed in pieces that each fit, bit for bit, with two sessions in the batch (their rows
// interleave across chunk edges), and the plan no longer sets aside a logits row per batch token.
TEST_CASE("all-logits prompts past the workspace's rows: chunked output head, same bits", "[batching]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const size_t n0 = 2 * strata::model::kLogitsChunkRows + 1 + rng() % 60, n1 = 20 + rng() % 90;
  std::vector<std::vector<int32_t>> prompts{std::vector<int32_t>(n0), std::vector<int32_t>(n1)};
  for (auto &p : prompts) {
    for (auto &t : p) t = static_cast<int32_t>(rng() % 256);
  }
  // In one step each (both sessions in one batch of up to 512 tokens).
  CtxOptions o;
  o.max_batch_tokens = 512;
  // The plan's workspace grows by a logits row per batch token only up to kLogitsChunkRows tokens.
  auto workspace = [&](uint32_t tokens) {
    CtxOptions w;
    w.max_batch_tokens = tokens;
    moe_ctx *c = Open(model, w);
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(c, &plan) == MOE_OK);
    moe_ctx_close(c);
    return static_cast<int64_t>(plan.workspace_bytes);
  };
  const int64_t rows = strata::model::kLogitsChunkRows;
  const int64_t below = (workspace(rows) - workspace(rows / 2)) / (rows / 2);
  const int64_t above = (workspace(8 * rows) - workspace(4 * rows)) / (4 * rows);
  moe_ctx *ctx = Open(model, o);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx);
  INFO("workspace bytes a batch token: " << below << " up to " << rows << " tokens, " << above << " beyond");
  CHECK(below - above == int64_t{n_vocab} * static_cast<int64_t>(sizeof(float)));
  std::vector<std::vector<float>> whole(2);
  {
    moe_session *s[2] = {OpenSession(ctx), OpenSession(ctx)};
    for (int i = 0; i < 2; ++i) REQUIRE(moe_session_feed(s[i], prompts[i].data(), prompts[i].size()) == MOE_OK);
    uint32_t pending = 9;
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    REQUIRE(pending == 0);
    for (int i = 0; i < 2; ++i) {
      const float *rows;
      int32_t nt, nv;
      REQUIRE(moe_session_logits_all(s[i], &rows, &nt, &nv) == MOE_OK);
      REQUIRE(static_cast<size_t>(nt) == prompts[i].size());
      whole[i].assign(rows, rows + static_cast<size_t>(nt) * nv);
      CHECK(std::none_of(whole[i].begin(), whole[i].end(), [](float v) { return std::isnan(v); }));
      moe_session_close(s[i]);
    }
  }
  moe_ctx_close(ctx);
  // Each prompt alone, fed in pieces of at most 40 tokens (each step's rows fit the workspace).
  for (int i = 0; i < 2; ++i) {
    INFO("session " << i << " of " << prompts[i].size() << " tokens");
    moe_ctx *c = Open(model, o);
    moe_session *s = OpenSession(c);
    std::vector<float> pieces;
    for (size_t at = 0; at < prompts[i].size(); at += 40) {
      const size_t n = std::min<size_t>(40, prompts[i].size() - at);
      REQUIRE(moe_session_feed(s, prompts[i].data() + at, n) == MOE_OK);
      uint32_t pending = 9;
      REQUIRE(moe_ctx_step(c, &pending) == MOE_OK);
      const float *rows;
      int32_t nt, nv;
      REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
      REQUIRE(static_cast<size_t>(nt) == n);
      pieces.insert(pieces.end(), rows, rows + static_cast<size_t>(nt) * nv);
    }
    REQUIRE(pieces.size() == whole[i].size());
    CHECK(std::memcmp(pieces.data(), whole[i].data(), pieces.size() * sizeof(float)) == 0);
    moe_session_close(s);
    moe_ctx_close(c);
  }
}

TEST_CASE("layer-major prefill starts where an evenly routed pass touches ~98% of a layer's experts", "[batching]") {
  using strata::runtime::DefaultPrefillLayerMin;
  CHECK(DefaultPrefillLayerMin(128, 8) == 64);  // Qwen3-30B-A3B: measured between 32 and 64 tokens
  CHECK(DefaultPrefillLayerMin(64, 8) == 32);   // OLMoE-1B-7B
  CHECK(DefaultPrefillLayerMin(8, 2) == 16);    // Mixtral-8x7B
  CHECK(DefaultPrefillLayerMin(256, 8) == 128); // DeepSeek-V3
  CHECK(DefaultPrefillLayerMin(0, 0) == strata::runtime::kNoLayerMajor);
  for (const auto &[e, k] : {std::pair{128, 8}, {64, 8}, {8, 2}, {256, 8}, {32, 4}}) {
    const int t = DefaultPrefillLayerMin(e, k);
    INFO(e << " experts, " << k << " a token: " << t << " tokens");
    CHECK(1.0 - std::pow(1.0 - double(k) / e, t) >= 0.98);
    CHECK(1.0 - std::pow(1.0 - double(k) / e, t / 2) < 0.98);  // and not much later than that
  }
}

TEST_CASE("the token cap is shared round-robin: a long prefill does not starve decode", "[batching]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  CtxOptions o;
  o.max_batch_tokens = 8;
  moe_ctx *ctx = Open(model, o);
  moe_session *longp = OpenSession(ctx), *dec = OpenSession(ctx);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37) % 256);
  REQUIRE(moe_session_feed(longp, prompt.data(), prompt.size()) == MOE_OK);
  const int32_t one = 5;
  REQUIRE(moe_session_feed(dec, &one, 1) == MOE_OK);
  uint32_t pending = 0;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(pending == 1);
  CHECK(moe_session_ready(dec) == 1);
  CHECK(moe_session_ready(longp) == 0);
  CHECK(moe_session_n_past(longp) == 7);
  CHECK(moe_session_n_pending(longp) == 93);
  // The decode session keeps getting its token every step while the prefill goes on.
  for (int i = 0; i < 3; ++i) {
    const int32_t t = Greedy(dec);
    REQUIRE(moe_session_feed(dec, &t, 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    CHECK(moe_session_ready(dec) == 1);
  }
  CHECK(moe_session_n_past(longp) == 28);
  // More sessions than the cap: those left out go first next time.
  moe_session *many[12];
  for (auto &s : many) {
    s = OpenSession(ctx);
    REQUIRE(moe_session_feed(s, &one, 1) == MOE_OK);
  }
  int steps = 0;
  for (bool all = false; !all && steps < 10; ++steps) {
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    all = true;
    for (auto &s : many) all = all && moe_session_ready(s) == 1;
  }
  CHECK(steps == 2);  // 12 one-token sessions + one prefill under a cap of 8: two steps
  moe_ctx_close(ctx);
}

namespace {
std::atomic<int> g_calls{0};
std::atomic<int> g_fail_at{-1};
ssize_t FailNth(int fd, void *buf, size_t n, off_t off) {
  if (g_calls++ == g_fail_at.load()) {
    errno = EIO;
    return -1;
  }
  return ::pread(fd, buf, n, off);
}
struct HookGuard {
  explicit HookGuard(strata::format::PreadFn fn) { strata::format::SetPreadForTesting(fn); }
  ~HookGuard() { strata::format::SetPreadForTesting(nullptr); }
};
}  // namespace

TEST_CASE("a failed batch leaves every session as it was", "[batching][faults]") {
  const std::string model = kGolden + "qwen3moe_f32/model-f32.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto scripts = RandomScripts(rng, 6, 256);
  std::vector<Script> first(scripts.size());  // the first turn of each (random tokens)
  for (size_t i = 0; i < scripts.size(); ++i) first[i].turns = {scripts[i].turns[0]};
  const auto ref = RunAlone(model, first);
  CtxOptions o;
  o.ram_budget = 1;
  o.max_batch_tokens = 4 + static_cast<uint32_t>(rng() % 16);
  moe_ctx *ctx = Open(model, o);
  std::vector<moe_session *> ss;
  for (auto &sc : first) {
    ss.push_back(OpenSession(ctx));
    REQUIRE(moe_session_feed(ss.back(), sc.turns[0].data(), sc.turns[0].size()) == MOE_OK);
  }
  // Every step fails at its k-th read, for growing k, until one gets through.
  HookGuard hook(FailNth);
  std::vector<std::vector<float>> acc(ss.size());
  int failures = 0;
  for (int k = 0, guard = 0; guard < 2000; ++guard) {
    std::vector<int32_t> past, queued;
    for (auto *s : ss) past.push_back(moe_session_n_past(s)), queued.push_back(moe_session_n_pending(s));
    // The logits each session holds (none before its first step): a failed step keeps them.
    std::vector<std::vector<float>> held(ss.size());
    for (size_t i = 0; i < ss.size(); ++i) {
      const float *l = nullptr;
      int32_t nv = 0;
      if (moe_session_logits(ss[i], &l, &nv) == MOE_OK) held[i].assign(l, l + nv);
    }
    g_calls = 0;
    g_fail_at = k;
    uint32_t pending = 0;
    const moe_status st = moe_ctx_step(ctx, &pending);
    if (st != MOE_OK) {
      CHECK(st == MOE_ERR_IO_READ);
      ++failures;
      for (size_t i = 0; i < ss.size(); ++i) {
        CHECK(moe_session_n_past(ss[i]) == past[i]);
        CHECK(moe_session_n_pending(ss[i]) == queued[i]);
        const float *l = nullptr;
        int32_t nv = 0;
        if (held[i].empty()) {
          CHECK(moe_session_logits(ss[i], &l, &nv) != MOE_OK);
        } else {
          REQUIRE(moe_session_logits(ss[i], &l, &nv) == MOE_OK);
          CHECK(std::memcmp(l, held[i].data(), held[i].size() * sizeof(float)) == 0);
        }
      }
      k += 1 + static_cast<int>(rng() % 3);
      continue;
    }
    k = 0;
    if (pending == 0) break;
  }
  g_fail_at = -1;
  CHECK(failures > 0);
  std::vector<Trace> got(ss.size());
  for (size_t i = 0; i < ss.size(); ++i) {
    REQUIRE(moe_session_ready(ss[i]) == 1);
    Record(ss[i], first[i].turns[0].size(), &got[i]);
  }
  CheckSame(got, ref);
  moe_ctx_close(ctx);
}

TEST_CASE("moe_ctx_step_for progresses within its budget and checks its arguments", "[batching][capi]") {
  CHECK(moe_ctx_step_for(nullptr, 1000, nullptr, nullptr) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_ready(nullptr) == -1);
  CHECK(moe_session_n_pending(nullptr) == -1);
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  CtxOptions o;
  o.max_batch_tokens = 4;
  moe_ctx *ctx = Open(model, o);
  moe_session *s = OpenSession(ctx);
  uint32_t pending = 9, steps = 9;
  REQUIRE(moe_ctx_step_for(ctx, 0, &pending, &steps) == MOE_OK);  // nothing to do
  CHECK(pending == 0);
  CHECK(steps == 0);
  std::vector<int32_t> prompt(40, 3);
  REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
  REQUIRE(moe_ctx_step_for(ctx, 0, &pending, &steps) == MOE_OK);  // a zero budget still makes progress
  CHECK(steps == 1);
  CHECK(pending == 1);
  CHECK(moe_session_n_past(s) == 4);
  REQUIRE(moe_ctx_step_for(ctx, 60ull * 1000 * 1000, &pending, &steps) == MOE_OK);  // ample: all of it
  CHECK(pending == 0);
  CHECK(steps == 9);
  CHECK(moe_session_ready(s) == 1);
  const float *rows;
  int32_t nt, nv;
  REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
  CHECK(nt == 40);  // every chunk's rows, accumulated
  moe_ctx_close(ctx);
}

TEST_CASE("host threads feed their sessions while another thread steps", "[batching][threads]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto scripts = RandomScripts(rng, 8, 256);
  for (auto &sc : scripts) sc.turns.insert(sc.turns.end(), 3, std::vector<int32_t>{});  // and generate
  const auto ref = RunAlone(model, scripts);
  CtxOptions o;
  o.ram_budget = 1;
  o.max_batch_tokens = 1 + static_cast<uint32_t>(rng() % 24);
  moe_ctx *ctx = Open(model, o);
  std::vector<Trace> got(scripts.size());
  std::atomic<int> done{0};
  std::atomic<bool> failed{false};
  constexpr int kThreads = 4;  // two sessions per host thread
  std::vector<std::thread> hosts;
  for (int h = 0; h < kThreads; ++h) {
    hosts.emplace_back([&, h] {
      std::vector<size_t> mine = {static_cast<size_t>(2 * h), static_cast<size_t>(2 * h + 1)};
      std::vector<moe_session *> ss;
      for (size_t i : mine) {
        moe_session_params sp;
        moe_session_params_init(&sp);
        sp.logits_all = 1;
        moe_session *s = nullptr;
        if (moe_session_open(ctx, &sp, &s) != MOE_OK) failed = true;
        ss.push_back(s);
      }
      std::vector<size_t> next(mine.size(), 0), fed(mine.size(), 0);
      std::vector<bool> busy(mine.size(), false);
      for (size_t left = mine.size(); left > 0 && !failed;) {
        for (size_t j = 0; j < mine.size(); ++j) {
          const Script &sc = scripts[mine[j]];
          Trace &tr = got[mine[j]];
          if (busy[j]) {
            if (moe_session_ready(ss[j]) != 1) continue;
            const float *rows;
            int32_t nt, nv;
            if (moe_session_logits_all(ss[j], &rows, &nt, &nv) != MOE_OK || static_cast<size_t>(nt) != fed[j]) {
              failed = true;
              break;
            }
            tr.rows.emplace_back(rows, rows + static_cast<size_t>(nt) * nv);
            busy[j] = false;
            if (next[j] == sc.turns.size()) --left;
          }
          if (next[j] < sc.turns.size()) {
            std::vector<int32_t> in = sc.turns[next[j]];
            if (in.empty()) {
              int32_t t = -1;
              moe_session_params sp;  // greedy, as the reference
              (void)sp;
              const float *l;
              int32_t nv;
              if (moe_session_logits(ss[j], &l, &nv) != MOE_OK) {
                failed = true;
                break;
              }
              t = 0;
              for (int32_t i = 1; i < nv; ++i) t = l[i] > l[t] ? i : t;
              tr.generated.push_back(t);
              in = {t};
            }
            if (moe_session_feed(ss[j], in.data(), in.size()) != MOE_OK) failed = true;
            fed[j] = in.size();
            busy[j] = true;
            ++next[j];
          }
        }
        std::this_thread::yield();
      }
      for (auto *s : ss) moe_session_close(s);  // while the stepper may be stepping
      ++done;
    });
  }
  std::thread stepper([&] {
    while (done < kThreads) {
      uint32_t pending = 0;
      if (moe_ctx_step_for(ctx, 2000, &pending, nullptr) != MOE_OK) failed = true;
      if (pending == 0) std::this_thread::yield();
    }
  });
  for (auto &t : hosts) t.join();
  stepper.join();
  REQUIRE_FALSE(failed);
  CheckSame(got, ref);
  moe_ctx_close(ctx);
}

// With every expert resident the backend routes and runs a layer's experts by itself
// (Backend::RoutedExperts) and the forward pass reports the selections after the pass: per layer,
// every token's k selections are counted and each distinct expert of the step is one hit, as the
// host path counted them during the pass; and the streaming cache (which needs the selections
// during the pass) counts the same selections for the same input.
TEST_CASE("expert uses routed in the backend are reported after the pass", "[batching]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> inputs(3);
  size_t n_tok = 0;
  for (auto &in : inputs) {
    in.resize(2 + rng() % 9);
    for (auto &t : in) t = static_cast<int32_t>(rng() % 256);
    n_tok += in.size();
  }
  auto run = [&](uint64_t ram_budget, std::vector<uint64_t> *counts, std::vector<uint64_t> *hits, moe_stats *st) {
    moe_ctx *ctx = Open(model, CtxOptions{ram_budget, 0, 0, 0});
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
    const uint32_t n_experts = moe_expert_table_n_experts(moe_ctx_experts(ctx));
    std::vector<moe_session *> ss;
    for (const auto &in : inputs) {
      ss.push_back(OpenSession(ctx));
      REQUIRE(moe_session_feed(ss.back(), in.data(), in.size()) == MOE_OK);
    }
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);  // one pass over every session's input
    counts->assign(static_cast<size_t>(plan.n_layers) * n_experts, 0);
    size_t n = 0;
    REQUIRE(moe_ctx_expert_counts(ctx, counts->data(), counts->size(), &n) == MOE_OK);
    hits->assign(plan.n_layers, 0);
    for (uint32_t l = 0; l < plan.n_layers; ++l) {
      uint64_t h = 0, m = 0;
      REQUIRE(moe_ctx_layer_stats(ctx, l, &h, &m) == MOE_OK);
      (*hits)[l] = h + m;
    }
    moe_stats_init(st);
    REQUIRE(moe_ctx_stats(ctx, st) == MOE_OK);
    moe_ctx_close(ctx);
    return n_experts;
  };
  std::vector<uint64_t> counts, uses, cache_counts, cache_uses;
  moe_stats st, cache_st;
  const uint32_t n_experts = run(0, &counts, &uses, &st);
  REQUIRE(st.streaming == 0);
  uint64_t k = 0, total_uses = 0;
  for (size_t l = 0; l < uses.size(); ++l) {
    uint64_t sum = 0, distinct = 0;
    for (uint32_t e = 0; e < n_experts; ++e) {
      sum += counts[l * n_experts + e];
      distinct += counts[l * n_experts + e] > 0 ? 1 : 0;
    }
    if (sum == 0) continue;  // a dense layer
    REQUIRE(sum % n_tok == 0);
    if (k == 0) k = sum / n_tok;
    CHECK(sum == k * n_tok);   // every token's k selections
    CHECK(uses[l] == distinct);  // one use per distinct expert of the pass
    total_uses += uses[l];
  }
  CHECK(k > 0);
  CHECK(st.expert_hits == total_uses);
  run(1, &cache_counts, &cache_uses, &cache_st);  // the minimum budget: the cache routes on the host
  REQUIRE(cache_st.streaming == 1);
  CHECK(cache_counts == counts);
  CHECK(cache_uses == uses);
}
