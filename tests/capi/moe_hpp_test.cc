// include/strata/moe.hpp: the RAII handles close what they own (the KV budget comes back), sessions
// keep their context alive, moves leave empty handles, failures throw strata::Error with the
// status and message of the C call, and the views and helpers give what the C ABI gives.
#include <catch2/catch.hpp>

#include <random>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "include/strata/moe.hpp"
#include "lib/util/log.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";

moe_params Params(const std::string &path) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = path.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.max_sessions = 4;
  return p;
}

std::vector<int32_t> Tokens(std::mt19937_64 &rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto &x : t) x = static_cast<int32_t>(rng() % 256);
  return t;
}

}  // namespace

TEST_CASE("moe.hpp: failures throw strata::Error with the status and the message", "[capi][hpp]") {
  const std::string missing = "/nonexistent/strata-model.gguf";
  try {
    strata::Context ctx(missing);
    FAIL("opened a missing file");
  } catch (const strata::Error &e) {
    CHECK(e.status() == MOE_ERR_IO_OPEN);
    CHECK(e.category() == MOE_ERR_IO);
    CHECK(std::string(e.status_name()) == "MOE_ERR_IO_OPEN");
    CHECK(std::string(e.what()).find(missing) != std::string::npos);
  }
  strata::Context ctx(Params(kModel));
  strata::Session s = ctx.session();
  CHECK_THROWS_AS(s.logits(), strata::Error);  // nothing processed yet
  try {
    s.feed({0, 1, 100000});
  } catch (const strata::Error &e) {
    CHECK(e.status() == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("100000") != std::string::npos);
  }
  CHECK(s.n_pending() == 0);
  try {
    s.rewind(1);
    FAIL("rewound an empty session");
  } catch (const strata::Error &e) {
    CHECK(e.status() == MOE_ERR_INVALID_ARGUMENT);
  }
  try {
    s.shift(0, 1);
    FAIL("shifted an empty session");
  } catch (const strata::Error &e) {
    CHECK(e.status() == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("processed 0") != std::string::npos);
  }
  const std::vector<uint8_t> junk = {1, 2, 3};
  CHECK_THROWS_AS(ctx.load(junk), strata::Error);
  CHECK(strata::version() == moe_version_string());
}

TEST_CASE("moe.hpp: sessions step, fork, rewind and round-trip as through the C ABI", "[capi][hpp]") {
  std::mt19937_64 rng(std::random_device{}());
  strata::Context ctx(Params(kModel));
  const std::vector<int32_t> prompt = Tokens(rng, 1 + rng() % 200), more = Tokens(rng, 1 + rng() % 20);
  // The same through the C ABI.
  std::vector<float> want;
  {
    moe_session *c = nullptr;
    REQUIRE(moe_session_open(ctx.get(), nullptr, &c) == MOE_OK);
    REQUIRE(moe_session_feed(c, prompt.data(), prompt.size()) == MOE_OK);
    uint32_t pending = 1;
    while (pending > 0) REQUIRE(moe_ctx_step(ctx.get(), &pending) == MOE_OK);
    REQUIRE(moe_session_feed(c, more.data(), more.size()) == MOE_OK);
    pending = 1;
    while (pending > 0) REQUIRE(moe_ctx_step(ctx.get(), &pending) == MOE_OK);
    const float *l = nullptr;
    int32_t n = 0;
    REQUIRE(moe_session_logits(c, &l, &n) == MOE_OK);
    want.assign(l, l + n);
    moe_session_close(c);
  }
  strata::Session s = ctx.session();
  s.feed(prompt);
  while (ctx.step() > 0) {
  }
  CHECK(s.ready());
  CHECK(s.n_past() == static_cast<int32_t>(prompt.size()));
  strata::Session f = s.fork();
  const std::vector<uint8_t> saved = s.save();
  s.feed(more);
  uint32_t n_steps = 0;
  while (ctx.step_for(std::chrono::milliseconds(50), &n_steps) > 0) {
  }
  const strata::Span<const float> l = s.logits();
  REQUIRE(l.size() == static_cast<size_t>(ctx.vocab_size()));
  CHECK(l.to_vector() == want);
  // The fork and the snapshot continue alike; a rewind and the same tokens again, too.
  strata::Session g = ctx.load(saved);
  f.feed(more);
  g.feed(more);
  while (ctx.step() > 0) {
  }
  CHECK(f.logits().to_vector() == want);
  CHECK(g.logits().to_vector() == want);
  s.rewind(static_cast<int32_t>(more.size()));
  s.feed(more);
  while (ctx.step() > 0) {
  }
  CHECK(s.logits().to_vector() == want);
  const int32_t t = s.sample();
  CHECK(t >= 0);
  CHECK(t < ctx.vocab_size());
}

TEST_CASE("moe.hpp: handles close what they own, a session keeps its context open", "[capi][hpp]") {
  std::mt19937_64 rng(std::random_device{}());
  strata::Session survivor;
  CHECK_FALSE(survivor);
  {
    strata::Context ctx(Params(kModel));
    strata::Session a = ctx.session();
    a.feed(Tokens(rng, 130));  // two KV blocks
    while (ctx.step() > 0) {
    }
    const uint64_t used = ctx.kv_usage().first;
    CHECK(used > 0);
    {
      strata::Session b = ctx.session();
      b.feed({1, 2});
      while (ctx.step() > 0) {
      }
      CHECK(ctx.kv_usage().first > used);
    }
    CHECK(ctx.kv_usage().first == used);  // b's blocks came back
    strata::Session moved = std::move(a);
    CHECK_FALSE(a);  // NOLINT: a moved-from handle is empty
    CHECK(moved);
    CHECK(moved.n_past() == 130);
    CHECK(a.n_past() == -1);  // NOLINT: the C ABI's answer for NULL
    survivor = std::move(moved);
    strata::Context other = std::move(ctx);
    CHECK(other.vocab_size() == 256);
  }
  // The context was destroyed as an object, but stays open for its last session.
  REQUIRE(survivor);
  survivor.feed({3});
  CHECK(survivor.n_pending() == 1);
  survivor.reset();
  CHECK_FALSE(survivor);
}

TEST_CASE("moe.hpp: set_log takes a C++ callable and an empty one restores stderr", "[capi][hpp][log]") {
  std::vector<std::pair<int32_t, std::string>> lines;
  strata::set_log([&](int32_t level, std::string_view line) { lines.emplace_back(level, std::string(line)); });
  strata::LogWarn("a warning %d", 1);
  strata::set_log([](int32_t, std::string_view) { throw std::runtime_error("never crosses into the library"); });
  strata::LogWarn("swallowed");
  strata::set_log(std::function<void(int32_t, std::string_view)>());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == std::make_pair(int32_t{MOE_LOG_WARN}, std::string("a warning 1")));
}

TEST_CASE("moe.hpp: text through the model's tokenizer", "[capi][hpp]") {
  moe_params p = Params(kDemo);
  strata::Context ctx(p);
  const std::vector<int32_t> ids = ctx.tokenize("It is a truth universally acknowledged");
  REQUIRE(!ids.empty());
  CHECK(ctx.detokenize(ids) == "It is a truth universally acknowledged");
  strata::Session s = ctx.session();
  s.feed(ids);
  while (ctx.step() > 0) {
  }
  std::string text;
  for (int i = 0; i < 8; ++i) {
    const strata::TextPiece piece = s.sample_text();
    text += std::string(piece.text);
    if (piece.stop != MOE_STOP_NONE) break;
    s.feed({piece.token});
    while (ctx.step() > 0) {
    }
  }
  text += std::string(s.text_end());
  CHECK(!text.empty());
  CHECK(ctx.plan().n_layers > 0);
  CHECK(ctx.stats().struct_size == sizeof(moe_stats));
}
