// Helpers of the context-shift tests (tests/runtime/ctx_shift_test.cc, ctx_shift_gpu_test.cc):
// contexts and sessions through the C ABI, and the comparison of a shifted session with a fresh one
// fed only the kept tokens.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/model/golden_util.h"

namespace strata::testing::ctx_shift {

const char *const kFamilies[] = {"qwen3moe_f32", "mixtral_f32",   "olmoe_f32",         "qwen2moe_f32",
                                 "gptoss_f32",   "deepseek2_f32", "deepseek2lite_f32", "deepseek3_f32"};

struct Ctx {
  moe_ctx *c = nullptr;
  explicit Ctx(const std::string &model, int32_t type = MOE_KV_F32, const char *spill_dir = nullptr,
               uint32_t max_sessions = 4, int32_t backend = MOE_BACKEND_CPU) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = backend;
    p.n_threads = 2;
    p.type_k = type;
    p.type_v = type;
    p.kv_spill_dir = spill_dir;
    p.max_sessions = max_sessions;
    p.n_ctx = 512;
    const moe_status st = moe_ctx_open(&p, &c);
    INFO(moe_last_error());
    REQUIRE(st == MOE_OK);
  }
  ~Ctx() { moe_ctx_close(c); }
};

struct Sess {
  moe_session *s = nullptr;
  Sess(moe_ctx *ctx, uint32_t n_ctx, bool shift, int32_t n_keep, const std::vector<int32_t> &blocked = {},
       bool logits_all = false) {
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.n_ctx = n_ctx;
    sp.ctx_shift = shift ? 1 : 0;
    sp.n_keep = n_keep;
    sp.blocked_tokens = blocked.data();
    sp.n_blocked_tokens = blocked.size();
    sp.logits_all = logits_all ? 1 : 0;
    const moe_status st = moe_session_open(ctx, &sp, &s);
    INFO(moe_last_error());
    REQUIRE(st == MOE_OK);
  }
  explicit Sess(moe_session *raw) : s(raw) {}
  ~Sess() { moe_session_close(s); }
  Sess(const Sess &) = delete;
  Sess &operator=(const Sess &) = delete;
};

inline void StepAll(moe_ctx *ctx) {
  uint32_t pending = 1;
  while (pending > 0) {
    const moe_status st = moe_ctx_step(ctx, &pending);
    INFO(moe_last_error());
    REQUIRE(st == MOE_OK);
  }
}

inline void FeedStep(moe_ctx *ctx, moe_session *s, const int32_t *t, size_t n) {
  const moe_status st = moe_session_feed(s, t, n);
  INFO(moe_last_error());
  REQUIRE(st == MOE_OK);
  StepAll(ctx);
}

inline std::vector<float> Last(moe_session *s) {
  const float *l = nullptr;
  int32_t nv = 0;
  REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
  return std::vector<float>(l, l + nv);
}

// The last n rows of the session's logits_all.
inline std::vector<float> LastRows(moe_session *s, int n) {
  const float *l = nullptr;
  int32_t rows = 0, nv = 0;
  REQUIRE(moe_session_logits_all(s, &l, &rows, &nv) == MOE_OK);
  REQUIRE(rows >= n);
  return std::vector<float>(l + static_cast<size_t>(rows - n) * nv, l + static_cast<size_t>(rows) * nv);
}

inline std::vector<int32_t> RandomTokens(std::mt19937 &rng, int n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> t(n);
  for (int32_t &x : t) x = d(rng);
  return t;
}

// The shifted-versus-fresh comparison of one family and KV type. A shift is llama.cpp's
// approximation: the kept tokens after the dropped ones keep the keys and values they computed
// while they saw the dropped ones and the prefix at their old distances. So that a fresh session can
// hold exactly those rows, nothing the kept tail computed may depend on its distance to anything
// outside it: the dropped run and the kept prefix are blocked tokens (never keys for another
// position), the tail and the tokens after the shift are not. The fresh session is fed the prefix
// and the tail, then the same tokens after them; the shifted one is fed everything and shifts once,
// before the tokens after. Their logits over those tokens differ only by where rounding falls.
// Returns that error for each token after the shift (max |a - b| over its row / max |b| over all
// rows); *one_off: the error (all rows) of a fresh session whose tokens after the tail sit one
// position further on (what a rotation one position off would give).
inline std::vector<double> ShiftedVersusFresh(const std::string &model, int32_t type, std::mt19937 &rng, double *one_off,
                                       int32_t backend = MOE_BACKEND_CPU) {
  Ctx ctx(model, type, nullptr, 4, backend);
  const int32_t vocab = moe_ctx_vocab_size(ctx.c);
  const int32_t blocked = vocab - 1;
  const int n_ctx = 140 + static_cast<int>(rng() % 121);
  const int keep = static_cast<int>(rng() % 41);
  const int discard = (n_ctx - keep) / 2;
  const int extra = 8 + static_cast<int>(rng() % 17);  // discard is at least 50
  INFO("n_ctx " << n_ctx << " keep " << keep << " discard " << discard << " extra " << extra);
  const std::vector<int32_t> prefix(keep, blocked), dropped(discard, blocked);
  const std::vector<int32_t> tail = RandomTokens(rng, n_ctx - keep - discard, 0, vocab - 2);
  const std::vector<int32_t> more = RandomTokens(rng, extra, 0, vocab - 2);
  std::vector<int32_t> all = prefix;
  for (const auto *v : {&dropped, &tail, &more}) all.insert(all.end(), v->begin(), v->end());

  Sess a(ctx.c, n_ctx, true, keep, {blocked}, true);
  FeedStep(ctx.c, a.s, all.data(), all.size());  // fills the context, shifts once, then the tokens after
  CHECK(moe_session_n_past(a.s) == n_ctx - discard + extra);

  std::vector<int32_t> kept = prefix;
  kept.insert(kept.end(), tail.begin(), tail.end());
  Sess b(ctx.c, n_ctx, false, 0, {blocked}, true);
  FeedStep(ctx.c, b.s, kept.data(), kept.size());
  FeedStep(ctx.c, b.s, more.data(), more.size());

  kept.push_back(blocked);
  Sess c(ctx.c, n_ctx, false, 0, {blocked}, true);
  FeedStep(ctx.c, c.s, kept.data(), kept.size());
  FeedStep(ctx.c, c.s, more.data(), more.size());

  const std::vector<float> fresh = LastRows(b.s, extra), shifted = LastRows(a.s, extra);
  *one_off = NormalizedMaxError(LastRows(c.s, extra), fresh);
  double den = 0;
  for (float x : fresh) den = std::max(den, std::fabs(static_cast<double>(x)));
  const size_t n_vocab = fresh.size() / extra;
  std::vector<double> rows(extra, 0.0);
  for (size_t i = 0; i < fresh.size(); ++i) {
    REQUIRE(std::isfinite(shifted[i]));
    double &r = rows[i / n_vocab];
    r = std::max(r, std::fabs(static_cast<double>(shifted[i]) - fresh[i]) / den);
  }
  return rows;
}

}  // namespace strata::testing::ctx_shift
