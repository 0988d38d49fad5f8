// Context shift (moe_session_params.ctx_shift / n_keep, moe_session_shift): a session run far past
// n_ctx holds the positions and tokens llama.cpp's rule gives, whatever the feeding; its logits after
// a shift equal those of a fresh session fed only the kept tokens, in every golden family and KV
// type (the dropped tokens are blocked tokens, so the kept ones never saw them: the comparison is
// exact up to rounding); manual and automatic shifts agree bit for bit; snapshots, forks and
// eviction keep a shifted session whole; shift off still refuses, and bad arguments are named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/runtime/context.h"
#include "lib/util/crc32c.h"
#include "tests/model/golden_util.h"
#include "tests/runtime/ctx_shift_util.h"
#include "tests/runtime/spill_dir_util.h"

namespace {

using namespace strata::testing;
using namespace strata::testing::ctx_shift;

// llama.cpp's rule, token by token: a full context drops (n_ctx - n_keep) / 2 tokens after n_keep.
std::vector<int32_t> Expected(const std::vector<int32_t> &stream, int n_ctx, int n_keep) {
  std::vector<int32_t> h;
  for (int32_t t : stream) {
    if (static_cast<int>(h.size()) == n_ctx) {
      const int d = std::max(1, (n_ctx - n_keep) / 2);
      h.erase(h.begin() + n_keep, h.begin() + n_keep + d);
    }
    h.push_back(t);
  }
  return h;
}

}  // namespace

TEST_CASE("ctx shift: a session past n_ctx holds the tokens llama.cpp's rule keeps, however it is fed",
          "[ctx_shift]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::string model = kGolden + "qwen3moe_f32/model-f32.gguf";
  strata::runtime::ContextOptions o;
  o.model_path = model;
  o.n_threads = 2;
  o.max_sessions = 3;
  auto ctx = strata::runtime::Context::Open(o);
  REQUIRE(ctx.ok());
  const int n_ctx = 150 + static_cast<int>(rng() % 100), keep = static_cast<int>(rng() % 30);
  INFO("n_ctx " << n_ctx << " keep " << keep);
  const std::vector<int32_t> stream = RandomTokens(rng, 4 * n_ctx + static_cast<int>(rng() % 100), 0, 255);
  strata::runtime::SessionOptions so;
  so.n_ctx = n_ctx;
  so.ctx_shift = true;
  so.n_keep = keep;
  // Three ways in: all at once, token by token, random chunks (one step each).
  std::vector<std::vector<float>> last;
  for (int way = 0; way < 3; ++way) {
    INFO("way " << way);
    auto s = (*ctx)->OpenSession(so);
    REQUIRE(s.ok());
    size_t done = 0;
    while (done < stream.size()) {
      const size_t n = way == 0 ? stream.size() : way == 1 ? 1 : std::min<size_t>(stream.size() - done, 1 + rng() % 300);
      REQUIRE((*s)->Feed(stream.data() + done, n).ok());
      uint32_t pending = 1;
      while (pending > 0) REQUIRE((*ctx)->Step(&pending).ok());
      done += n;
      const std::vector<int32_t> want = Expected({stream.begin(), stream.begin() + done}, n_ctx, keep);
      REQUIRE((*s)->n_past() == static_cast<int>(want.size()));
      REQUIRE((*s)->history() == want);
    }
    auto l = (*s)->Logits();
    REQUIRE(l.ok());
    last.emplace_back(*l, *l + 256);
    (*ctx)->CloseSession(*s);
  }
  CHECK(last[0] == last[1]);
  CHECK(last[0] == last[2]);
}

TEST_CASE("ctx shift: logits after a shift equal a fresh session fed the kept tokens, every family",
          "[ctx_shift][golden]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char *family : kFamilies) {
    INFO(family);
    double one_off = 0;
    const std::vector<double> rows = ShiftedVersusFresh(kGolden + family + "/model-f32.gguf", MOE_KV_F32, rng, &one_off);
    const double err = *std::max_element(rows.begin(), rows.end());
    // The sessions differ only by where rounding falls: the kept tokens' keys rotated back (a few
    // float roundings of angles under 512 rad) and every hidden state of the tail computed at
    // positions d further on (RoPE's angles rounded there instead). The golden fixtures hold a
    // float32 engine to 1e-4 of the largest logit; the same bound holds here, while keys one
    // position off are far outside it.
    INFO("shifted vs fresh " << err << ", one position off vs fresh " << one_off);
    CHECK(err < 1e-4);
    CHECK(one_off > 1e-2);
  }
}

TEST_CASE("ctx shift: f16 and q8_0 KV shift within the types' own rounding", "[ctx_shift][kv][types]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int32_t type : {MOE_KV_F16, MOE_KV_Q8_0}) {
    INFO("type " << type);
    // A shifted key is rounded to the type once more after its rotation: it differs from the fresh
    // key by about one rounding of the type (tests/model/kv_shift_test.cc bounds it), which moves a
    // token's logits by about what storing the keys in the type does at all. Routing is not
    // continuous: where a token's best experts nearly tie, that much can flip a choice and move
    // its logits (and a little those after it) by far more. So the bound is held by the typical
    // token, the median over every family, and by 9 in 10 of them: 5e-3 of the largest logit for
    // f16, whose rounding is 2^-11, and 2e-2 for q8_0, whose steps are up to 1/127 of a block's
    // largest value (f32 keys one position off miss by 2e-2 to 1 in the test above).
    const double tol = type == MOE_KV_F16 ? 5e-3 : 2e-2;
    std::vector<double> all;
    for (const char *family : kFamilies) {
      double one_off = 0;
      const std::vector<double> rows = ShiftedVersusFresh(kGolden + family + "/model-f32.gguf", type, rng, &one_off);
      all.insert(all.end(), rows.begin(), rows.end());
    }
    std::sort(all.begin(), all.end());
    const double median = all[all.size() / 2];
    const size_t over = static_cast<size_t>(all.end() - std::upper_bound(all.begin(), all.end(), tol));
    INFO("median " << median << ", worst " << all.back() << ", " << over << " of " << all.size() << " tokens over " << tol);
    CHECK(median < tol);
    CHECK(over * 10 <= all.size());
  }
}

TEST_CASE("ctx shift: a manual moe_session_shift equals the automatic one, bit for bit", "[ctx_shift]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char *family : {"qwen3moe_f32", "deepseek3_f32"}) {
    INFO(family);
    Ctx ctx(kGolden + family + "/model-f32.gguf");
    const int n_ctx = 200, keep = static_cast<int>(rng() % 50);
    const std::vector<int32_t> stream = RandomTokens(rng, 3 * n_ctx, 0, 255);
    Sess autos(ctx.c, n_ctx, true, keep), manual(ctx.c, n_ctx, false, 0);
    for (size_t i = 0; i < stream.size(); ++i) {
      if (moe_session_n_past(manual.s) == n_ctx) {
        REQUIRE(moe_session_shift(manual.s, keep, (n_ctx - keep) / 2) == MOE_OK);
      }
      REQUIRE(moe_session_feed(autos.s, &stream[i], 1) == MOE_OK);
      REQUIRE(moe_session_feed(manual.s, &stream[i], 1) == MOE_OK);
      StepAll(ctx.c);
      REQUIRE(moe_session_n_past(autos.s) == moe_session_n_past(manual.s));
      REQUIRE(Last(autos.s) == Last(manual.s));
    }
  }
}

TEST_CASE("ctx shift: snapshots, forks and eviction keep a shifted session whole", "[ctx_shift][snapshot]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::string dir = strata::testing::MakeTempDir();
  Ctx ctx(kGolden + "gptoss_f32/model-f32.gguf", MOE_KV_Q8_0, dir.c_str());
  const int n_ctx = 180, keep = 12;
  const std::vector<int32_t> first = RandomTokens(rng, 2 * n_ctx + 7, 0, 255), then = RandomTokens(rng, 300, 0, 255);
  Sess ref(ctx.c, n_ctx, true, keep);
  FeedStep(ctx.c, ref.s, first.data(), first.size());
  REQUIRE(moe_session_n_past(ref.s) < n_ctx);  // shifted, mid-way

  // Saved and loaded (the saved params: the shift stays on), forked, evicted: each continues past
  // n_ctx again, shifting, with the reference's logits bit for bit.
  size_t need = 0;
  REQUIRE(moe_session_save_buffer(ref.s, nullptr, 0, &need) == MOE_ERR_LIMIT);
  std::vector<uint8_t> snap(need);
  REQUIRE(moe_session_save_buffer(ref.s, snap.data(), snap.size(), &need) == MOE_OK);
  moe_session *raw = nullptr;
  REQUIRE(moe_session_load_buffer(ctx.c, snap.data(), snap.size(), nullptr, &raw) == MOE_OK);
  Sess loaded(raw);
  REQUIRE(moe_session_fork(ref.s, &raw) == MOE_OK);
  Sess fork(raw);
  Sess evicted(ctx.c, n_ctx, true, keep);
  FeedStep(ctx.c, evicted.s, first.data(), first.size());
  REQUIRE(moe_session_evict(evicted.s) == MOE_OK);
  CHECK(moe_session_kv_bytes(evicted.s) == 0);
  int full_evicted = 0;
  for (int32_t t : then) {
    if (moe_session_n_past(evicted.s) == n_ctx) {  // the step brings it back, then shifts it
      REQUIRE(moe_session_evict(evicted.s) == MOE_OK);
      ++full_evicted;
    }
    for (moe_session *s : {ref.s, loaded.s, fork.s, evicted.s}) REQUIRE(moe_session_feed(s, &t, 1) == MOE_OK);
    StepAll(ctx.c);
    const std::vector<float> want = Last(ref.s);
    for (moe_session *s : {loaded.s, fork.s, evicted.s}) {
      REQUIRE(moe_session_n_past(s) == moe_session_n_past(ref.s));
      REQUIRE(Last(s) == want);
    }
  }
  CHECK(full_evicted >= 2);
  // A manual shift of an evicted session reads it back first.
  REQUIRE(moe_session_evict(evicted.s) == MOE_OK);
  const int32_t past = moe_session_n_past(evicted.s);
  REQUIRE(moe_session_shift(evicted.s, keep, 30) == MOE_OK);
  CHECK(moe_session_n_past(evicted.s) == past - 30);
  CHECK(moe_session_kv_bytes(evicted.s) > 0);
}

TEST_CASE("ctx shift: off, a full context still refuses input", "[ctx_shift]") {
  Ctx ctx(kGolden + "qwen3moe_f32/model-f32.gguf");
  std::mt19937 rng(std::random_device{}());
  const std::vector<int32_t> t = RandomTokens(rng, 130, 0, 255);
  Sess off(ctx.c, 128, false, 0), on(ctx.c, 128, true, 0);
  CHECK(moe_session_feed(off.s, t.data(), t.size()) == MOE_ERR_LIMIT_CONTEXT);
  CHECK(std::string(moe_last_error()).find("do not fit") != std::string::npos);
  FeedStep(ctx.c, off.s, t.data(), 128);
  CHECK(moe_session_feed(off.s, t.data(), 1) == MOE_ERR_LIMIT_CONTEXT);
  CHECK(moe_session_n_past(off.s) == 128);
  FeedStep(ctx.c, on.s, t.data(), t.size());
  CHECK(moe_session_n_past(on.s) == 128 - 64 + 2);
}

TEST_CASE("ctx shift: bad arguments are refused with a message, changing nothing", "[ctx_shift]") {
  Ctx ctx(kGolden + "qwen3moe_f32/model-f32.gguf");
  auto refused = [&](uint32_t n_ctx, uint32_t shift, int32_t keep, const char *says) {
    INFO("n_ctx " << n_ctx << " shift " << shift << " keep " << keep);
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.n_ctx = n_ctx;
    sp.ctx_shift = shift;
    sp.n_keep = keep;
    moe_session *s = reinterpret_cast<moe_session *>(&sp);  // must stay untouched
    CHECK(moe_session_open(ctx.c, &sp, &s) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(s == reinterpret_cast<moe_session *>(&sp));
    CHECK(std::string(moe_last_error()).find(says) != std::string::npos);
  };
  refused(128, 1, 128, "n_keep 128");
  refused(128, 1, 500, "below the session's n_ctx 128");
  refused(0, 1, 512, "n_keep 512");  // the context's default n_ctx, 512
  refused(128, 1, -1, "negative n_keep -1");
  refused(128, 0, -5, "negative n_keep -5");
  refused(128, 2, 0, "ctx_shift is 2");

  Sess s(ctx.c, 128, false, 0);
  std::mt19937 rng(std::random_device{}());
  const std::vector<int32_t> t = RandomTokens(rng, 100, 0, 255);
  FeedStep(ctx.c, s.s, t.data(), t.size());
  const std::vector<float> before = Last(s.s);
  for (auto [keep, discard] : std::vector<std::pair<int32_t, int32_t>>{{-1, 10}, {10, -1}, {50, 51}, {101, 0}}) {
    INFO("keep " << keep << " discard " << discard);
    CHECK(moe_session_shift(s.s, keep, discard) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("the session has processed 100") != std::string::npos);
    CHECK(moe_session_n_past(s.s) == 100);
  }
  CHECK(moe_session_shift(nullptr, 0, 1) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_shift(s.s, 100, 0) == MOE_OK);  // nothing to drop
  CHECK(moe_session_shift(s.s, 0, 100) == MOE_OK);  // everything
  CHECK(moe_session_n_past(s.s) == 0);
  CHECK(Last(s.s) == before);  // the logits of the last step stay
}

TEST_CASE("ctx shift: a snapshot keeps the shift and input queued past n_ctx; version 3 loads it off",
          "[ctx_shift][snapshot]") {
  std::mt19937 rng(std::random_device{}());
  Ctx ctx(kGolden + "mixtral_f32/model-f32.gguf");
  const int n_ctx = 130, keep = 9;
  Sess s(ctx.c, n_ctx, true, keep);
  const std::vector<int32_t> first = RandomTokens(rng, 200, 0, 255), queued = RandomTokens(rng, 2 * n_ctx, 0, 255);
  FeedStep(ctx.c, s.s, first.data(), first.size());
  REQUIRE(moe_session_feed(s.s, queued.data(), queued.size()) == MOE_OK);  // not stepped yet
  auto save = [&](moe_session *from) {
    size_t need = 0;
    REQUIRE(moe_session_save_buffer(from, nullptr, 0, &need) == MOE_ERR_LIMIT);
    std::vector<uint8_t> b(need);
    REQUIRE(moe_session_save_buffer(from, b.data(), b.size(), &need) == MOE_OK);
    return b;
  };
  const std::vector<uint8_t> snap = save(s.s);
  moe_session *raw = nullptr;
  REQUIRE(moe_session_load_buffer(ctx.c, snap.data(), snap.size(), nullptr, &raw) == MOE_OK);
  Sess loaded(raw);
  StepAll(ctx.c);
  CHECK(moe_session_n_past(loaded.s) == moe_session_n_past(s.s));
  CHECK(Last(loaded.s) == Last(s.s));

  // As version 3 wrote it (options end at frequency_penalty: the shift's 5 bytes cut; see
  // tests/runtime/snapshot_test.cc for the layout), the session loads with the shift off.
  auto as_v3 = [](std::vector<uint8_t> b) {
    uint64_t opts_len = 0, total = 0;
    std::memcpy(&opts_len, b.data() + 120, 8);
    std::memcpy(&total, b.data() + 16, 8);
    uint8_t shift = 0;
    std::memcpy(&shift, b.data() + 128 + opts_len - 5, 1);
    REQUIRE(shift == 1);
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(128 + opts_len - 5), b.begin() + static_cast<std::ptrdiff_t>(128 + opts_len));
    const uint32_t v3 = 3;
    opts_len -= 5;
    total -= 5;
    std::memcpy(b.data() + 8, &v3, 4);
    std::memcpy(b.data() + 16, &total, 8);
    std::memcpy(b.data() + 120, &opts_len, 8);
    const uint32_t crc = strata::Crc32c(0, b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  const std::vector<uint8_t> v3_queued = as_v3(snap);
  raw = reinterpret_cast<moe_session *>(0x1);
  CHECK(moe_session_load_buffer(ctx.c, v3_queued.data(), v3_queued.size(), nullptr, &raw) == MOE_ERR_LIMIT_CONTEXT);
  CHECK(raw == reinterpret_cast<moe_session *>(0x1));
  const std::vector<uint8_t> v3_idle = as_v3(save(s.s));  // stepped: nothing queued
  REQUIRE(moe_session_load_buffer(ctx.c, v3_idle.data(), v3_idle.size(), nullptr, &raw) == MOE_OK);
  Sess off(raw);
  CHECK(moe_session_feed(off.s, queued.data(), n_ctx) == MOE_ERR_LIMIT_CONTEXT);
}
