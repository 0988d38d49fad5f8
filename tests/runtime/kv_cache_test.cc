// The block-wise KV cache through the C ABI: blocks allocated as a session grows, the context's KV
// budget (MOE_ERR_LIMIT_KV leaves every session as it was), eviction of idle sessions to disk and
// their bit-identical return, and the per-session attention masks (sliding window, blocked tokens)
// against references that do not use the mask code.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/runtime/spill_dir_util.h"

namespace {

using strata::testing::CountEntries;
using strata::testing::MakeTempDir;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
constexpr int kVocab = 256;

struct Ctx {
  moe_ctx *c = nullptr;
  explicit Ctx(uint64_t kv_budget = 0, const char *spill_dir = nullptr, uint32_t max_sessions = 1) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = kModel.c_str();
    p.n_threads = 2;
    p.kv_budget_bytes = kv_budget;
    p.kv_spill_dir = spill_dir;
    p.max_sessions = max_sessions;
    REQUIRE(moe_ctx_open(&p, &c) == MOE_OK);
  }
  ~Ctx() { moe_ctx_close(c); }
  uint64_t block_bytes() const {
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(c, &plan) == MOE_OK);
    return plan.kv_bytes_per_token * plan.kv_block_tokens;
  }
  uint64_t used() const {
    uint64_t u = 0;
    REQUIRE(moe_ctx_kv_usage(c, &u, nullptr) == MOE_OK);
    return u;
  }
};

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = static_cast<int32_t>((seed >> 8) % 240);  // ids 240..255 stay free for blocking
  }
  return t;
}

// Teacher-forced logits of every position: the tokens in one batch with logits_all.
std::vector<float> AllLogits(moe_ctx *ctx, const std::vector<int32_t> &toks, const moe_session_params *base = nullptr) {
  moe_session_params sp;
  if (base) {
    sp = *base;
  } else {
    moe_session_params_init(&sp);
  }
  sp.logits_all = 1;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  REQUIRE(moe_session_feed(s, toks.data(), toks.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  const float *l = nullptr;
  int32_t n = 0, nv = 0;
  REQUIRE(moe_session_logits_all(s, &l, &n, &nv) == MOE_OK);
  REQUIRE(n == static_cast<int32_t>(toks.size()));
  std::vector<float> out(l, l + static_cast<size_t>(n) * nv);
  moe_session_close(s);
  return out;
}

bool RowEq(const std::vector<float> &a, const std::vector<float> &b, int row) {
  return std::memcmp(a.data() + static_cast<size_t>(row) * kVocab, b.data() + static_cast<size_t>(row) * kVocab,
                     kVocab * sizeof(float)) == 0;
}

// A session that is fed a prompt, then generates with temperature and penalties; returns the
// sampled tokens and the last logits of every step. `between(i)` runs before generation step i.
struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

moe_session_params SamplingParams() {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = 0.9f;
  sp.top_k = 50;
  sp.repeat_penalty = 1.3f;
  sp.presence_penalty = 0.4f;
  sp.penalty_last_n = 24;
  sp.seed = 77;
  return sp;
}


}  // namespace

TEST_CASE("kv cache: blocks of 128 tokens are allocated as a session grows", "[kv]") {
  Ctx ctx(0, nullptr, 2);
  const uint64_t block = ctx.block_bytes();
  CHECK(block == 128ull * 3 * (32 + 32) * sizeof(float));  // 3 layers, k and v rows of 2 heads x 16
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx.c, nullptr, &s) == MOE_OK);
  CHECK(moe_session_kv_bytes(s) == 0);  // nothing up front
  CHECK(ctx.used() == 0);
  const std::vector<int32_t> t = Tokens(260, 1);
  REQUIRE(moe_session_feed(s, t.data(), 1) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
  CHECK(moe_session_kv_bytes(s) == block);
  REQUIRE(moe_session_feed(s, t.data() + 1, 127) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
  CHECK(moe_session_kv_bytes(s) == block);  // 128 positions: still one block
  REQUIRE(moe_session_feed(s, t.data() + 128, 1) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
  CHECK(moe_session_kv_bytes(s) == 2 * block);
  CHECK(ctx.used() == 2 * block);
  // Logits across block boundaries equal one batch over the same tokens.
  for (int i = 129; i < 260; ++i) {
    REQUIRE(moe_session_feed(s, t.data() + i, 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
  }
  const float *l = nullptr;
  REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
  const std::vector<float> one_batch = AllLogits(ctx.c, t);
  CHECK(std::memcmp(l, one_batch.data() + 259 * kVocab, kVocab * sizeof(float)) == 0);
  CHECK(moe_session_kv_bytes(s) == 3 * block);
  moe_session_close(s);
  CHECK(ctx.used() == 0);  // closing gives the blocks back
}

TEST_CASE("kv cache: the context's budget fails the step with MOE_ERR_LIMIT_KV and keeps state", "[kv]") {
  Ctx probe;
  const uint64_t block = probe.block_bytes();
  uint64_t budget = 0;
  REQUIRE(moe_ctx_kv_usage(probe.c, nullptr, &budget) == MOE_OK);
  CHECK(budget == 4 * block);  // the plan: 1 session x 512 positions = 4 blocks
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(probe.c, &plan) == MOE_OK);
  CHECK(plan.kv_bytes == budget);
  CHECK(plan.kv_block_tokens == 128);
  CHECK(plan.kv_max_blocks == 4);

  Ctx ctx(3 * block);  // an explicit budget of three blocks
  REQUIRE(moe_ctx_kv_usage(ctx.c, nullptr, &budget) == MOE_OK);
  CHECK(budget == 3 * block);
  moe_session *a = nullptr, *b = nullptr;
  REQUIRE(moe_session_open(ctx.c, nullptr, &a) == MOE_OK);
  REQUIRE(moe_session_open(ctx.c, nullptr, &b) == MOE_OK);
  const std::vector<int32_t> ta = Tokens(200, 2), tb = Tokens(150, 3);
  REQUIRE(moe_session_feed(a, ta.data(), ta.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);  // a: 2 blocks
  const float *l = nullptr;
  REQUIRE(moe_session_logits(a, &l, nullptr) == MOE_OK);
  const std::vector<float> a_logits(l, l + kVocab);
  REQUIRE(moe_session_feed(b, tb.data(), tb.size()) == MOE_OK);
  uint32_t pending = 0;
  CHECK(moe_ctx_step(ctx.c, &pending) == MOE_ERR_LIMIT_KV);  // b needs 2 more: 4 > 3
  CHECK(std::string(moe_last_error()).find("KV budget") != std::string::npos);
  CHECK(pending == 1);  // b keeps its input
  CHECK(moe_session_n_past(b) == 0);
  CHECK(moe_session_kv_bytes(b) == 0);
  CHECK(ctx.used() == 2 * block);
  CHECK(moe_session_logits(b, &l, nullptr) == MOE_ERR_STATE);
  REQUIRE(moe_session_logits(a, &l, nullptr) == MOE_OK);
  CHECK(std::memcmp(l, a_logits.data(), kVocab * sizeof(float)) == 0);
  // Room made by closing a: b runs, with the numbers of a fresh context.
  moe_session_close(a);
  REQUIRE(moe_ctx_step(ctx.c, &pending) == MOE_OK);
  CHECK(pending == 0);
  REQUIRE(moe_session_logits(b, &l, nullptr) == MOE_OK);
  Ctx fresh;
  const std::vector<float> ref = AllLogits(fresh.c, tb);
  CHECK(std::memcmp(l, ref.data() + 149 * kVocab, kVocab * sizeof(float)) == 0);
}

TEST_CASE("kv cache: an evicted session comes back bit-identically, by hand and under pressure", "[kv]") {
  const std::string dir = MakeTempDir();
  Ctx probe;
  const uint64_t block = probe.block_bytes();
  const std::vector<int32_t> prompt = Tokens(200, 4), other = Tokens(100, 5);
  const moe_session_params sp = SamplingParams();
  // The reference: uninterrupted, in its own context.
  auto generate = [&](moe_ctx *ctx, moe_session *s, int n, const std::function<void(int)> &between) {
    Run r;
    REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
    for (int i = 0; i < n; ++i) {
      between(i);
      REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
      const float *l = nullptr;
      REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
      r.logits.emplace_back(l, l + kVocab);
      int32_t tok = 0;
      REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
      r.tokens.push_back(tok);
      REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
    }
    return r;
  };
  Run ref;
  {
    Ctx ctx;
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
    ref = generate(ctx.c, s, 12, [](int) {});
  }
  SECTION("evicted by hand between steps") {
    Ctx ctx(0, dir.c_str());
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
    const Run r = generate(ctx.c, s, 12, [&](int i) {
      if (i % 3 == 1) {
        REQUIRE(moe_session_evict(s) == MOE_OK);
        CHECK(moe_session_kv_bytes(s) == 0);
        CHECK(ctx.used() == 0);
        CHECK(CountEntries(dir) == 0);  // the spill file is unlinked: nothing is left behind
      }
    });
    CHECK(r.tokens == ref.tokens);
    CHECK(r.logits == ref.logits);
  }
  SECTION("evicted automatically when another session needs the budget") {
    Ctx ctx(2 * block, dir.c_str());
    moe_session *s = nullptr, *t = nullptr;
    REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
    REQUIRE(moe_session_open(ctx.c, nullptr, &t) == MOE_OK);
    const Run r = generate(ctx.c, s, 12, [&](int i) {
      if (i == 1 || i == 6) {
        // t's 100 tokens need a block while s (idle now) holds both: s is evicted, t runs; the
        // next step brings s back and evicts t.
        REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);  // s's pending token first
        REQUIRE(moe_session_feed(t, other.data(), i == 1 ? other.size() : 1) == MOE_OK);
        REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
        CHECK(moe_session_kv_bytes(s) == 0);
        CHECK(moe_session_kv_bytes(t) == block);
      }
    });
    // s's steps ran between t's; each evicted and brought back: the same tokens and logits.
    CHECK(r.tokens == ref.tokens);
    CHECK(r.logits == ref.logits);
    CHECK(ctx.used() <= 2 * block);
  }
  SECTION("no spill directory: eviction is refused and the session is unchanged") {
    Ctx ctx;
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
    CHECK(moe_session_evict(s) == MOE_ERR_STATE);
    CHECK(std::string(moe_last_error()).find("spill") != std::string::npos);
    CHECK(moe_session_kv_bytes(s) == 2 * block);
  }
  rmdir(dir.c_str());
}

TEST_CASE("masks: a window as long as the context equals no window, bit for bit", "[kv][mask]") {
  Ctx ctx;
  const std::vector<int32_t> t = Tokens(300, 6);
  const std::vector<float> plain = AllLogits(ctx.c, t);
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.attn_window = 512;
  CHECK(AllLogits(ctx.c, t, &sp) == plain);
  sp.attn_window = 300;  // position 299 still sees position 0
  CHECK(AllLogits(ctx.c, t, &sp) == plain);
  sp.attn_window = 299;  // now it does not: the last row changes, the rows before do not
  const std::vector<float> w299 = AllLogits(ctx.c, t, &sp);
  for (int r = 0; r < 299; ++r) REQUIRE(RowEq(w299, plain, r));
  CHECK(!RowEq(w299, plain, 299));
}

TEST_CASE("masks: a sliding window limits what a position can depend on", "[kv][mask]") {
  // With window W in each of the model's 3 layers, position p depends only on tokens at
  // p - 3 (W - 1) .. p. Changing the first tokens leaves every later row bit-identical under
  // the window, and changes them without it.
  Ctx ctx;
  constexpr int W = 4, kLayers = 3, kChanged = 5, kN = 40;
  const int first_free = kChanged - 1 + kLayers * (W - 1) + 1;  // 14
  std::vector<int32_t> a = Tokens(kN, 7), b = a;
  for (int i = 0; i < kChanged; ++i) b[i] = (a[i] + 17) % 240;
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.attn_window = W;
  const std::vector<float> la = AllLogits(ctx.c, a, &sp), lb = AllLogits(ctx.c, b, &sp);
  for (int r = first_free; r < kN; ++r) REQUIRE(RowEq(la, lb, r));
  CHECK(!RowEq(la, lb, first_free - 1));  // the last row the change can reach does change
  const std::vector<float> pa = AllLogits(ctx.c, a), pb = AllLogits(ctx.c, b);
  CHECK(!RowEq(pa, pb, kN - 1));
  // Token by token (the decode path) gives the batch's rows.
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
  for (int i = 0; i < kN; ++i) {
    REQUIRE(moe_session_feed(s, &a[i], 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
    const float *l = nullptr;
    REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
    INFO("position " << i);
    REQUIRE(std::memcmp(l, la.data() + static_cast<size_t>(i) * kVocab, kVocab * sizeof(float)) == 0);
  }
  moe_session_close(s);
}

TEST_CASE("masks: blocked tokens are invisible to every later position", "[kv][mask]") {
  // Positions 3 and 9 hold a blocked token: which blocked token it is cannot change any other
  // row. Without blocking it does; a token that is not blocked at those positions does too.
  Ctx ctx;
  constexpr int kN = 24;
  std::vector<int32_t> x = Tokens(kN, 8), y = x, z = x;
  x[3] = 250, x[9] = 251;
  y[3] = 251, y[9] = 252;
  z[3] = 17, z[9] = 18;
  const int32_t blocked[] = {252, 250, 251};
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.blocked_tokens = blocked;
  sp.n_blocked_tokens = 3;
  const std::vector<float> bx = AllLogits(ctx.c, x, &sp), by = AllLogits(ctx.c, y, &sp);
  for (int r = 0; r < kN; ++r) {
    if (r == 3 || r == 9) {
      CHECK(!RowEq(bx, by, r));  // a blocked token's own row sees itself
    } else {
      REQUIRE(RowEq(bx, by, r));
    }
  }
  const std::vector<float> px = AllLogits(ctx.c, x), py = AllLogits(ctx.c, y);
  CHECK(!RowEq(px, py, kN - 1));
  const std::vector<float> bz = AllLogits(ctx.c, z, &sp);  // 17, 18 are not blocked
  CHECK(!RowEq(bx, bz, kN - 1));
  // Rows before the first blocked position are those of an unmasked run.
  for (int r = 0; r < 3; ++r) CHECK(RowEq(bx, px, r));
  // The decode path applies the same mask.
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx.c, &sp, &s) == MOE_OK);
  for (int i = 0; i < kN; ++i) {
    REQUIRE(moe_session_feed(s, &x[i], 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx.c, nullptr) == MOE_OK);
  }
  const float *l = nullptr;
  REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
  CHECK(std::memcmp(l, bx.data() + static_cast<size_t>(kN - 1) * kVocab, kVocab * sizeof(float)) == 0);
  moe_session_close(s);
  // Bad mask params are refused.
  const int32_t bad[] = {256};
  sp.blocked_tokens = bad;
  sp.n_blocked_tokens = 1;
  CHECK(moe_session_open(ctx.c, &sp, &s) == MOE_ERR_INVALID_ARGUMENT);
  sp.blocked_tokens = nullptr;
  CHECK(moe_session_open(ctx.c, &sp, &s) == MOE_ERR_INVALID_ARGUMENT);
}
