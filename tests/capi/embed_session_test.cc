// Sessions for a host's own save system and dialogue trees (issue 47): snapshots in memory
// (moe_session_save_buffer / load_buffer: the file format and its checks), forks that share their
// prompt's KV blocks copy-on-write (moe_session_fork) and rewinding (moe_session_rewind). Every
// continuation is checked bit for bit against a session run the plain way, with fresh random tokens.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
const std::string kOtherModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-f16.gguf";
constexpr int kBlock = 128;  // KV positions per block (moe_cache_plan.kv_block_tokens)

moe_ctx *Open(const std::string &path = kModel, uint32_t max_sessions = 8) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = path.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_ctx = 1024;
  p.max_sessions = max_sessions;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

moe_session *NewSession(moe_ctx *ctx, float temperature = 0.f, uint64_t seed = 7) {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = temperature;
  sp.top_k = 20;
  sp.seed = seed;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  return s;
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

// The logits after each chunk, fed and stepped one chunk at a time on a fresh session.
std::vector<std::vector<float>> Reference(moe_ctx *ctx, const std::vector<std::vector<int32_t>> &chunks) {
  moe_session *s = NewSession(ctx);
  std::vector<std::vector<float>> out;
  for (const auto &c : chunks) {
    Feed(s, c);
    StepAll(ctx);
    out.push_back(LogitsOf(s));
  }
  moe_session_close(s);
  return out;
}

uint64_t KvUsed(moe_ctx *ctx) {
  uint64_t used = 0;
  REQUIRE(moe_ctx_kv_usage(ctx, &used, nullptr) == MOE_OK);
  return used;
}

std::vector<uint8_t> SaveBuffer(moe_session *s) {
  size_t need = 0;
  REQUIRE(moe_session_save_buffer(s, nullptr, 0, &need) == MOE_ERR_LIMIT);
  std::vector<uint8_t> buf(need);
  size_t n = 0;
  REQUIRE(moe_session_save_buffer(s, buf.data(), buf.size(), &n) == MOE_OK);
  REQUIRE(n == need);
  return buf;
}

std::string TempPath(const char *tag) {
  return "/tmp/strata-" + std::string(tag) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::random_device{}());
}

std::vector<uint8_t> ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

// ---- snapshots in memory ---------------------------------------------------------------------

TEST_CASE("save_buffer: the bytes of moe_session_save, a size query, a short buffer left untouched",
          "[capi][snapshot_buffer]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_session *s = NewSession(ctx, 0.8f, rng());
  Feed(s, Tokens(rng, 1 + rng() % 200));
  StepAll(ctx);
  Feed(s, Tokens(rng, 3));  // queued input is part of a snapshot too
  const std::string path = TempPath("snap");
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  const std::vector<uint8_t> file = ReadFile(path);
  unlink(path.c_str());
  REQUIRE(file.size() > 112);
  size_t need = 0;
  CHECK(moe_session_save_buffer(s, nullptr, 0, &need) == MOE_ERR_LIMIT);
  CHECK(need == file.size());
  CHECK(std::string(moe_last_error()).find(std::to_string(file.size())) != std::string::npos);
  // Too small by one: nothing written.
  std::vector<uint8_t> buf(need + 16, 0xA5);
  size_t n = 0;
  CHECK(moe_session_save_buffer(s, buf.data(), need - 1, &n) == MOE_ERR_LIMIT);
  CHECK(n == need);
  for (uint8_t b : buf) REQUIRE(b == 0xA5);
  // Large enough (larger than needed): exactly the file's bytes, nothing past them.
  n = 0;
  REQUIRE(moe_session_save_buffer(s, buf.data(), buf.size(), &n) == MOE_OK);
  REQUIRE(n == need);
  CHECK(std::vector<uint8_t>(buf.begin(), buf.begin() + n) == file);
  for (size_t i = n; i < buf.size(); ++i) REQUIRE(buf[i] == 0xA5);
  // Misuse.
  CHECK(moe_session_save_buffer(nullptr, buf.data(), buf.size(), &n) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_save_buffer(s, buf.data(), buf.size(), nullptr) == MOE_ERR_INVALID_ARGUMENT);
  moe_ctx_close(ctx);
}

TEST_CASE("load_buffer: a loaded session continues bit for bit, also from a file's bytes", "[capi][snapshot_buffer]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_session *a = NewSession(ctx, 0.9f, rng());
  Feed(a, Tokens(rng, 1 + rng() % 300));
  StepAll(ctx);
  const std::vector<uint8_t> bytes = SaveBuffer(a);
  moe_session *b = nullptr;
  REQUIRE(moe_session_load_buffer(ctx, bytes.data(), bytes.size(), nullptr, &b) == MOE_OK);
  CHECK(moe_session_n_past(b) == moe_session_n_past(a));
  CHECK(LogitsOf(b) == LogitsOf(a));
  // Both sample and go on alike (the generator state came along).
  for (int i = 0; i < 6; ++i) {
    int32_t ta = -1, tb = -2;
    REQUIRE(moe_session_sample(a, &ta) == MOE_OK);
    REQUIRE(moe_session_sample(b, &tb) == MOE_OK);
    REQUIRE(ta == tb);
    REQUIRE(moe_session_feed(a, &ta, 1) == MOE_OK);
    REQUIRE(moe_session_feed(b, &tb, 1) == MOE_OK);
    StepAll(ctx);
    REQUIRE(LogitsOf(a) == LogitsOf(b));
  }
  // Its own buffer saved again is the original's.
  CHECK(SaveBuffer(a) == SaveBuffer(b));
  // A file written by moe_session_save loads from memory as well.
  const std::string path = TempPath("snap");
  REQUIRE(moe_session_save(a, path.c_str()) == MOE_OK);
  const std::vector<uint8_t> file = ReadFile(path);
  unlink(path.c_str());
  moe_session *c = nullptr;
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = 0.f;  // the host's params instead of the saved ones
  REQUIRE(moe_session_load_buffer(ctx, file.data(), file.size(), &sp, &c) == MOE_OK);
  CHECK(LogitsOf(c) == LogitsOf(a));
  moe_ctx_close(ctx);
}

TEST_CASE("load_buffer: cut, corrupt, foreign or other-version bytes are refused, nothing opened",
          "[capi][snapshot_buffer]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_session *a = NewSession(ctx);
  Feed(a, Tokens(rng, 1 + rng() % 150));
  StepAll(ctx);
  const std::vector<float> logits_a = LogitsOf(a);
  const int32_t past_a = moe_session_n_past(a);
  const std::vector<uint8_t> good = SaveBuffer(a);
  const uint64_t used = KvUsed(ctx);
  moe_session *const poison = reinterpret_cast<moe_session *>(&rng);
  auto refused = [&](const std::vector<uint8_t> &bytes, moe_status category, const char *words) {
    moe_session *out = poison;
    const moe_status st = moe_session_load_buffer(ctx, bytes.data(), bytes.size(), nullptr, &out);
    INFO("status " << moe_status_string(st) << ": " << moe_last_error());
    CHECK(MOE_STATUS_CATEGORY(st) == category);
    CHECK(std::string(moe_last_error()).find(words) != std::string::npos);
    CHECK(out == poison);
    CHECK(KvUsed(ctx) == used);  // no session was opened
    return st;
  };
  SECTION("truncated anywhere") {
    for (size_t cut : {size_t{0}, size_t{7}, size_t{111}, size_t{112} + rng() % (good.size() - 112),
                       good.size() - 1}) {
      INFO("cut at " << cut << " of " << good.size());
      std::vector<uint8_t> b(good.begin(), good.begin() + cut);
      if (b.empty()) b.push_back(0);  // a buffer of one byte: too short for the header
      refused(b, MOE_ERR_FORMAT, "");
    }
  }
  SECTION("one byte changed past the header: the checksum") {
    std::vector<uint8_t> b = good;
    const size_t at = 112 + rng() % (b.size() - 112 - 4);
    b[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    CHECK(refused(b, MOE_ERR_FORMAT, "") == MOE_ERR_FORMAT_CHECKSUM);
  }
  SECTION("another format version") {
    for (uint32_t version : {1u, 5u, 0xFFFFFFFFu}) {
      std::vector<uint8_t> b = good;
      std::memcpy(b.data() + 8, &version, 4);
      CHECK(refused(b, MOE_ERR_UNSUPPORTED, "version") == MOE_ERR_UNSUPPORTED);
    }
  }
  SECTION("not a snapshot") {
    std::vector<uint8_t> b = good;
    b[0] = 'X';
    CHECK(refused(b, MOE_ERR_FORMAT, "") == MOE_ERR_FORMAT_HEADER);
  }
  SECTION("written for another model (the same shapes in f16)") {
    moe_ctx *other = Open(kOtherModel);
    moe_session *o = NewSession(other);
    Feed(o, Tokens(rng, 5));
    StepAll(other);
    const std::vector<uint8_t> foreign = SaveBuffer(o);
    moe_ctx_close(other);
    CHECK(refused(foreign, MOE_ERR_FORMAT, "") == MOE_ERR_FORMAT_FOREIGN);
  }
  SECTION("misuse") {
    moe_session *out = poison;
    CHECK(moe_session_load_buffer(nullptr, good.data(), good.size(), nullptr, &out) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(moe_session_load_buffer(ctx, nullptr, good.size(), nullptr, &out) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(moe_session_load_buffer(ctx, good.data(), good.size(), nullptr, nullptr) == MOE_ERR_INVALID_ARGUMENT);
    moe_session_params bad;
    moe_session_params_init(&bad);
    bad.struct_size = 3;
    CHECK(moe_session_load_buffer(ctx, good.data(), good.size(), &bad, &out) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(out == poison);
  }
  // The session saved is untouched by it all, and the good bytes still load.
  CHECK(moe_session_n_past(a) == past_a);
  CHECK(LogitsOf(a) == logits_a);
  moe_session *b = nullptr;
  REQUIRE(moe_session_load_buffer(ctx, good.data(), good.size(), nullptr, &b) == MOE_OK);
  CHECK(LogitsOf(b) == logits_a);
  moe_ctx_close(ctx);
}

// ---- forks -----------------------------------------------------------------------------------

TEST_CASE("fork: the copy continues exactly as the original, sampling included", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_session *a = NewSession(ctx, 0.9f, rng());
  Feed(a, Tokens(rng, 1 + rng() % 300));
  StepAll(ctx);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  REQUIRE(b != nullptr);
  CHECK(moe_session_n_past(b) == moe_session_n_past(a));
  CHECK(moe_session_ready(b) == 1);
  CHECK(LogitsOf(b) == LogitsOf(a));
  for (int i = 0; i < 8; ++i) {
    int32_t ta = -1, tb = -2;
    REQUIRE(moe_session_sample(a, &ta) == MOE_OK);
    REQUIRE(moe_session_sample(b, &tb) == MOE_OK);
    REQUIRE(ta == tb);
    REQUIRE(moe_session_feed(a, &ta, 1) == MOE_OK);
    REQUIRE(moe_session_feed(b, &tb, 1) == MOE_OK);
    StepAll(ctx);  // both in one batched step
    REQUIRE(LogitsOf(a) == LogitsOf(b));
  }
  // A fork with input queued takes it along.
  Feed(a, Tokens(rng, 1 + rng() % 40));
  moe_session *c = nullptr;
  REQUIRE(moe_session_fork(a, &c) == MOE_OK);
  CHECK(moe_session_n_pending(c) == moe_session_n_pending(a));
  StepAll(ctx);
  CHECK(LogitsOf(c) == LogitsOf(a));
  CHECK(SaveBuffer(c) == SaveBuffer(a));  // the same session, byte for byte
  moe_ctx_close(ctx);
}

TEST_CASE("fork: writes to one never change the other, each matches a session run alone", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  // A prompt ending inside a block, so both write into the block they share.
  const std::vector<int32_t> prompt = Tokens(rng, kBlock + 1 + rng() % (kBlock - 2));
  const std::vector<int32_t> x1 = Tokens(rng, 1 + rng() % 30), x2 = Tokens(rng, 1 + rng() % 30);
  const std::vector<int32_t> y1 = Tokens(rng, 1 + rng() % 30), y2 = Tokens(rng, 1 + rng() % 200);
  const auto want_a = Reference(ctx, {prompt, x1, x2});
  const auto want_b = Reference(ctx, {prompt, y1, y2});
  moe_session *a = NewSession(ctx);
  Feed(a, prompt);
  StepAll(ctx);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  // One writes first; then the other; then both in one step.
  Feed(a, x1);
  StepAll(ctx);
  CHECK(LogitsOf(a) == want_a[1]);
  CHECK(LogitsOf(b) == want_a[0]);  // the fork still holds the prompt's logits
  Feed(b, y1);
  StepAll(ctx);
  CHECK(LogitsOf(b) == want_b[1]);
  Feed(a, x2);
  Feed(b, y2);
  StepAll(ctx);
  CHECK(LogitsOf(a) == want_a[2]);
  CHECK(LogitsOf(b) == want_b[2]);
  // And as a session fed the same tokens from scratch, in one go.
  std::vector<int32_t> all_b = prompt;
  all_b.insert(all_b.end(), y1.begin(), y1.end());
  all_b.insert(all_b.end(), y2.begin(), y2.end());
  CHECK(LogitsOf(b) == Reference(ctx, {all_b})[0]);
  moe_ctx_close(ctx);
}

TEST_CASE("fork: before it diverges a fork takes no KV block, a write copies one block", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
  const uint64_t block = plan.kv_bytes_per_token * plan.kv_block_tokens;
  REQUIRE(block > 0);
  moe_session *a = NewSession(ctx);
  const int n_prompt = 3 * kBlock + 1 + static_cast<int>(rng() % (kBlock - 2));  // 4 blocks, the last partial
  Feed(a, Tokens(rng, static_cast<size_t>(n_prompt)));
  StepAll(ctx);
  const uint64_t used = KvUsed(ctx);
  CHECK(used == 4 * block);
  std::vector<moe_session *> forks;
  for (int i = 0; i < 5; ++i) {
    moe_session *f = nullptr;
    REQUIRE(moe_session_fork(a, &f) == MOE_OK);
    forks.push_back(f);
  }
  CHECK(KvUsed(ctx) == used);                            // five forks, not one byte more KV
  CHECK(moe_session_kv_bytes(forks[0]) == 4 * block);    // each still sees its blocks
  // One token into each fork: each copies the partial block it writes into, nothing else.
  for (moe_session *f : forks) {
    const int32_t t = static_cast<int32_t>(rng() % 256);
    REQUIRE(moe_session_feed(f, &t, 1) == MOE_OK);
  }
  StepAll(ctx);
  CHECK(KvUsed(ctx) == used + 5 * block);  // a full copy each would be 5 x 4 blocks
  // Closing the original keeps the blocks the forks still hold; closing them all gives every byte back.
  moe_session_close(a);
  CHECK(KvUsed(ctx) == 3 * block + 5 * block);
  for (moe_session *f : forks) moe_session_close(f);
  CHECK(KvUsed(ctx) == 0);
  moe_ctx_close(ctx);
}

TEST_CASE("fork: a step admits a fork's first write only with room for the block it copies", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<int32_t> prompt = Tokens(rng, kBlock + 1 + rng() % (kBlock - 2));  // two blocks
  const std::vector<int32_t> next = Tokens(rng, 1);
  moe_ctx *roomy = Open();
  const auto want = Reference(roomy, {prompt, next});
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(roomy, &plan) == MOE_OK);
  moe_ctx_close(roomy);
  const uint64_t block = plan.kv_bytes_per_token * plan.kv_block_tokens;
  for (bool spill : {false, true}) {
    INFO((spill ? "with a spill directory" : "without one"));
    const std::string dir = TempPath("spill");
    if (spill) REQUIRE(mkdir(dir.c_str(), 0700) == 0);
    moe_params p;
    moe_params_init(&p);
    p.model_path = kModel.c_str();
    p.backend = MOE_BACKEND_CPU;
    p.n_ctx = 1024;
    p.kv_budget_bytes = 2 * block;  // the prompt's two blocks and nothing more
    p.kv_spill_dir = spill ? dir.c_str() : nullptr;
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_session *a = NewSession(ctx);
    Feed(a, prompt);
    StepAll(ctx);
    moe_session *b = nullptr;
    REQUIRE(moe_session_fork(a, &b) == MOE_OK);
    Feed(b, next);
    if (!spill) {
      // No room for the copy of the shared last block: the step says so and changes nothing.
      CHECK(moe_ctx_step(ctx, nullptr) == MOE_ERR_LIMIT_KV);
      CHECK(std::string(moe_last_error()).find("KV budget") != std::string::npos);
      CHECK(moe_session_n_pending(b) == 1);
      CHECK(moe_session_n_past(b) == static_cast<int32_t>(prompt.size()));
      CHECK(KvUsed(ctx) == 2 * block);
      moe_session_close(a);  // the blocks are b's alone now: nothing to copy
    }
    // With a spill directory the idle original is evicted, which ends the sharing.
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
    CHECK(LogitsOf(b) == want[1]);
    CHECK(KvUsed(ctx) == 2 * block);
    moe_ctx_close(ctx);
    if (spill) rmdir(dir.c_str());
  }
}

TEST_CASE("fork: the original closed first, the fork goes on alone, misuse", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  const std::vector<int32_t> prompt = Tokens(rng, 1 + rng() % 250), more = Tokens(rng, 1 + rng() % 30);
  const auto want = Reference(ctx, {prompt, more});
  moe_session *a = NewSession(ctx);
  Feed(a, prompt);
  StepAll(ctx);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  moe_session_close(a);
  CHECK(LogitsOf(b) == want[0]);
  Feed(b, more);
  StepAll(ctx);
  CHECK(LogitsOf(b) == want[1]);
  // A fork of a fork, of a session that never ran.
  moe_session *fresh = NewSession(ctx);
  moe_session *ff = nullptr;
  REQUIRE(moe_session_fork(fresh, &ff) == MOE_OK);
  CHECK(moe_session_n_past(ff) == 0);
  const float *l = nullptr;
  int32_t n = 0;
  CHECK(moe_session_logits(ff, &l, &n) == MOE_ERR_STATE);
  moe_session *poison = reinterpret_cast<moe_session *>(&rng);
  CHECK(moe_session_fork(nullptr, &poison) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("NULL") != std::string::npos);
  CHECK(poison == reinterpret_cast<moe_session *>(&rng));
  CHECK(moe_session_fork(b, nullptr) == MOE_ERR_INVALID_ARGUMENT);
  moe_ctx_close(ctx);  // closes the forks with the rest
}

TEST_CASE("fork: an evicted session is read back and shared", "[capi][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  const std::string dir = TempPath("spill");
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_ctx = 1024;
  p.max_sessions = 4;
  p.kv_spill_dir = dir.c_str();
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const std::vector<int32_t> prompt = Tokens(rng, 1 + rng() % 300), more = Tokens(rng, 1 + rng() % 20);
  const auto want = Reference(ctx, {prompt, more});
  moe_session *a = NewSession(ctx);
  Feed(a, prompt);
  StepAll(ctx);
  REQUIRE(moe_session_evict(a) == MOE_OK);
  CHECK(moe_session_kv_bytes(a) == 0);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  CHECK(moe_session_kv_bytes(a) == moe_session_kv_bytes(b));
  Feed(a, more);
  Feed(b, more);
  StepAll(ctx);
  CHECK(LogitsOf(a) == want[1]);
  CHECK(LogitsOf(b) == want[1]);
  moe_ctx_close(ctx);
  rmdir(dir.c_str());
}

// ---- rewind ----------------------------------------------------------------------------------

TEST_CASE("rewind: re-feeding the forgotten tokens gives the same logits, other tokens a fresh run's",
          "[capi][rewind]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  const std::vector<int32_t> prompt = Tokens(rng, 1 + rng() % 300);
  const std::vector<int32_t> x = Tokens(rng, 1 + rng() % 150), y = Tokens(rng, 1 + rng() % 150);
  const auto want_y = Reference(ctx, {prompt, y});
  moe_session *s = NewSession(ctx);
  Feed(s, prompt);
  StepAll(ctx);
  const uint64_t kv_prompt = moe_session_kv_bytes(s);
  Feed(s, x);
  StepAll(ctx);
  const std::vector<float> after_x = LogitsOf(s);
  const int32_t past = moe_session_n_past(s);
  // Rewind 0: nothing changes.
  REQUIRE(moe_session_rewind(s, 0) == MOE_OK);
  CHECK(LogitsOf(s) == after_x);
  REQUIRE(moe_session_rewind(s, static_cast<int32_t>(x.size())) == MOE_OK);
  CHECK(moe_session_n_past(s) == past - static_cast<int32_t>(x.size()));
  CHECK(moe_session_kv_bytes(s) == kv_prompt);  // blocks past the prompt let go
  const float *l = nullptr;
  int32_t n = 0;
  CHECK(moe_session_logits(s, &l, &n) == MOE_ERR_STATE);
  int32_t t = 0;
  CHECK(moe_session_sample(s, &t) == MOE_ERR_STATE);
  Feed(s, x);
  StepAll(ctx);
  CHECK(LogitsOf(s) == after_x);
  // Another branch of the dialogue tree from the same point.
  REQUIRE(moe_session_rewind(s, static_cast<int32_t>(x.size())) == MOE_OK);
  Feed(s, y);
  StepAll(ctx);
  CHECK(LogitsOf(s) == want_y[1]);
  std::vector<int32_t> prompt_y = prompt;
  prompt_y.insert(prompt_y.end(), y.begin(), y.end());
  CHECK(LogitsOf(s) == Reference(ctx, {prompt_y})[0]);  // as fed from scratch in one go
  // Everything: the session is as new.
  REQUIRE(moe_session_rewind(s, moe_session_n_past(s)) == MOE_OK);
  CHECK(moe_session_n_past(s) == 0);
  CHECK(moe_session_kv_bytes(s) == 0);
  Feed(s, prompt);
  StepAll(ctx);
  CHECK(LogitsOf(s) == want_y[0]);
  moe_ctx_close(ctx);
}

TEST_CASE("rewind: inside a block shared with a fork leaves the fork alone", "[capi][rewind][fork]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  const std::vector<int32_t> prompt = Tokens(rng, 20 + rng() % 200);
  const std::vector<int32_t> more = Tokens(rng, 1 + rng() % 20);
  const size_t keep = 1 + rng() % (prompt.size() - 1);
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + keep), other = Tokens(rng, 1 + rng() % 50);
  const auto want_other = Reference(ctx, {head, other});
  moe_session *a = NewSession(ctx);
  Feed(a, head);
  StepAll(ctx);
  const std::vector<int32_t> tail(prompt.begin() + keep, prompt.end());
  Feed(a, tail);
  StepAll(ctx);
  moe_session *b = nullptr;
  REQUIRE(moe_session_fork(a, &b) == MOE_OK);
  REQUIRE(moe_session_rewind(a, static_cast<int32_t>(tail.size())) == MOE_OK);
  Feed(a, other);
  StepAll(ctx);
  CHECK(LogitsOf(a) == want_other[1]);
  Feed(b, more);
  StepAll(ctx);
  const auto want_b = Reference(ctx, {head, tail, more});
  CHECK(LogitsOf(b) == want_b[2]);
  moe_ctx_close(ctx);
}

TEST_CASE("rewind: misuse changes nothing", "[capi][rewind]") {
  std::mt19937_64 rng(std::random_device{}());
  moe_ctx *ctx = Open();
  moe_session *s = NewSession(ctx);
  Feed(s, Tokens(rng, 10));
  StepAll(ctx);
  const std::vector<float> logits = LogitsOf(s);
  CHECK(moe_session_rewind(nullptr, 1) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_rewind(s, -1) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_session_rewind(s, 11) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("10") != std::string::npos);
  Feed(s, Tokens(rng, 2));
  CHECK(moe_session_rewind(s, 1) == MOE_ERR_STATE);
  CHECK(moe_session_n_past(s) == 10);
  CHECK(moe_session_n_pending(s) == 2);
  CHECK(LogitsOf(s) == logits);
  moe_ctx_close(ctx);
}
