// The embedding calls that control the library from a host (issue 47): the log callback (nothing on
// stderr once it is set), a load the host cancels (MOE_ERR_CANCELLED, nothing left allocated) and a
// step aborted from another thread (MOE_ERR_ABORTED, every session as if the step never ran).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "include/strata/moe.h"
#include "lib/model/forward.h"
#include "lib/runtime/context.h"
#include "lib/util/log.h"
#include "tests/util/alloc_hook.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";
const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";

// Captures what the process writes to stderr (fd 2) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    char path[] = "/tmp/strata-stderr-XXXXXX";
    fd_ = mkstemp(path);
    REQUIRE(fd_ >= 0);
    unlink(path);
    saved_ = dup(2);
    REQUIRE(saved_ >= 0);
    REQUIRE(dup2(fd_, 2) == 2);
  }
  ~StderrCapture() { Restore(); }
  // Stops capturing and returns what was written.
  std::string Take() {
    Restore();
    std::string out;
    char buf[4096];
    ssize_t n;
    off_t at = 0;
    while ((n = pread(fd_, buf, sizeof buf, at)) > 0) {
      out.append(buf, static_cast<size_t>(n));
      at += n;
    }
    return out;
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  int fd_ = -1, saved_ = -1;
};

struct Heard {
  std::vector<std::pair<int32_t, std::string>> lines;
};
void Hear(int32_t level, const char *msg, void *user) { static_cast<Heard *>(user)->lines.emplace_back(level, msg); }

std::string RandomWord(std::mt19937_64 &rng) {
  std::string w;
  for (int i = 0; i < 12; ++i) w += static_cast<char>('a' + rng() % 26);
  return w;
}

}  // namespace

TEST_CASE("log: once a callback is set nothing reaches stderr; NULL restores stderr", "[capi][log]") {
  std::mt19937_64 rng(std::random_device{}());
  const std::string a = RandomWord(rng), b = RandomWord(rng), c = RandomWord(rng);
  Heard heard;
  StderrCapture cap;
  moe_log_set(Hear, &heard);
  strata::LogLine(strata::LogLevel::kWarn, "strata: " + a + "\n");
  strata::LogPrintf(strata::LogLevel::kDebug, "trace %s %d", b.c_str(), 42);
  // A line longer than LogPrintf's stack buffer arrives whole.
  const std::string longer(3000, 'x');
  strata::LogPrintf(strata::LogLevel::kInfo, "%s%s", longer.c_str(), c.c_str());
  moe_log_set(nullptr, nullptr);
  strata::LogLine(strata::LogLevel::kError, "after " + c);
  const std::string err = cap.Take();
  REQUIRE(heard.lines.size() == 3);
  CHECK(heard.lines[0] == std::make_pair(int32_t{MOE_LOG_WARN}, "strata: " + a));  // no trailing newline
  CHECK(heard.lines[1] == std::make_pair(int32_t{MOE_LOG_DEBUG}, "trace " + b + " 42"));
  CHECK(heard.lines[2] == std::make_pair(int32_t{MOE_LOG_INFO}, longer + c));
  CHECK(err == "after " + c + "\n");  // only the line logged after NULL
  CHECK(MOE_LOG_ERROR == 0);
  CHECK(MOE_LOG_DEBUG == 3);
}

TEST_CASE("log: a context opened, stepped and closed with a callback set writes nothing to stderr", "[capi][log]") {
  Heard heard;
  StderrCapture cap;
  moe_log_set(Hear, &heard);
  moe_params p;
  moe_params_init(&p);
  p.model_path = kDemo.c_str();
  p.ram_budget_bytes = 1;  // the expert cache and its I/O threads too
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const int32_t t[3] = {5, 6, 7};
  REQUIRE(moe_session_feed(s, t, 3) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  moe_ctx_close(ctx);
  moe_log_set(nullptr, nullptr);
  CHECK(cap.Take().empty());
}

TEST_CASE("log: lines from many threads arrive whole, one call at a time", "[capi][log]") {
  struct Count {
    std::atomic<int> in{0}, calls{0}, overlapped{0}, bad{0};
  } count;
  moe_log_set(
      [](int32_t level, const char *msg, void *user) {
        auto *c = static_cast<Count *>(user);
        if (c->in.fetch_add(1) != 0) c->overlapped.fetch_add(1);
        if (level != MOE_LOG_INFO || std::strncmp(msg, "line ", 5) != 0) c->bad.fetch_add(1);
        c->calls.fetch_add(1);
        c->in.fetch_sub(1);
      },
      &count);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) strata::LogPrintf(strata::LogLevel::kInfo, "line %d.%d", t, i);
    });
  }
  for (auto &th : threads) th.join();
  moe_log_set(nullptr, nullptr);
  CHECK(count.calls.load() == 800);
  CHECK(count.overlapped.load() == 0);
  CHECK(count.bad.load() == 0);
}

namespace {

namespace fs = std::filesystem;

// Lines of the C++ and CUDA sources under `root` whose code (comments and string literals left
// out) writes to stderr, as "path:line"; log.cc (the sink) and pack.cc (the terminal progress bar
// of pack/synth, off while a host callback is set) are allowed to.
std::vector<std::string> StderrWriters(const fs::path &root) {
  std::vector<std::string> found;
  for (const fs::directory_entry &e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    const std::string name = e.path().filename().string();
    if (name == "log.cc" || name == "pack.cc") continue;
    std::ifstream f(e.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      std::string code;
      bool quoted = false;
      for (size_t i = 0; i < line.size(); ++i) {
        if (!quoted && line.compare(i, 2, "//") == 0) break;
        if (line[i] == '"' && (i == 0 || line[i - 1] != '\\')) quoted = !quoted;
        if (!quoted) code += line[i];
      }
      for (const char *bad : {"stderr", "std::cerr", "perror(", "STDERR_FILENO", "std::clog"}) {
        if (code.find(bad) != std::string::npos) {
          found.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n));
          break;
        }
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("log: no library source writes to stderr except through lib/util/log.cc", "[capi][log]") {
  for (const char *dir : {"lib", "backends"}) {
    const std::vector<std::string> found = StderrWriters(fs::path(STRATA_SOURCE_DIR) / dir);
    std::string list;
    for (const std::string &f : found) list += " " + f;
    INFO("writes to stderr under " << dir << "/ outside lib/util/log.cc (use strata::LogLine):" << list);
    CHECK(found.empty());
  }
  // The check sees one, and not one in a comment or a string.
  const fs::path tmp = fs::temp_directory_path() / ("strata_stderr_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ofstream(tmp / "x.cc") << "// stderr\nauto s = \"on stderr\";\n  std::fprintf(stderr, \"x\");\n";
  const std::vector<std::string> seen = StderrWriters(tmp);
  fs::remove_all(tmp);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == "x.cc:3");
}

namespace {

struct CancelAt {
  int cancel_on_call;  // 1 = the first call (done == 0)
  int calls = 0;
  uint64_t last_done = 0, last_total = 0;
};
int32_t Continue(uint64_t done, uint64_t total, void *user) {
  auto *c = static_cast<CancelAt *>(user);
  c->last_done = done;
  c->last_total = total;
  return ++c->calls == c->cancel_on_call ? 0 : 1;
}

moe_params DemoParams(uint64_t ram_budget) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kDemo.c_str();
  p.ram_budget_bytes = ram_budget;
  p.n_threads = 2;
  return p;
}

}  // namespace

TEST_CASE("cancel: load_continue returning 0 stops moe_ctx_open with MOE_ERR_CANCELLED, nothing held",
          "[capi][cancel][alloc]") {
  using strata::testing::HeapBytesInUse;
  for (uint64_t budget : {uint64_t{0}, uint64_t{1}}) {  // all resident; streaming (an expert cache)
    moe_params p = DemoParams(budget);
    CHECK(p.load_continue == nullptr);
    // How many calls a full open makes: the first (done 0) and the last (done == total) at least.
    CancelAt count{0};
    p.load_continue = Continue;
    p.load_progress_user = &count;
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_ctx_wait_loads(ctx);
    moe_ctx_close(ctx);
    REQUIRE(count.calls >= 2);
    CHECK(count.last_done == count.last_total);
    CHECK(count.last_total > 0);
    for (int k = 1; k <= count.calls; ++k) {
      INFO("budget " << budget << ", cancelled at call " << k << " of " << count.calls);
      // Once first, so this thread's error text already holds this message's length.
      CancelAt once{k};
      p.load_progress_user = &once;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_ERR_CANCELLED);
      CancelAt c{k};
      p.load_progress_user = &c;
      moe_ctx *none = reinterpret_cast<moe_ctx *>(&c);  // poisoned: must stay untouched
      const int64_t before = HeapBytesInUse();
      const moe_status st = moe_ctx_open(&p, &none);
      const int64_t after = HeapBytesInUse();
      CHECK(st == MOE_ERR_CANCELLED);
      CHECK(MOE_STATUS_CATEGORY(st) == MOE_ERR_CANCELLED);
      CHECK(none == reinterpret_cast<moe_ctx *>(&c));
      CHECK(after == before);
      CHECK(std::string(moe_last_error()).find("cancelled") != std::string::npos);
      CHECK(c.calls == k);  // never asked again after saying no
    }
    // The next open, left to run, works.
    CancelAt never{0};
    p.load_progress_user = &never;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
    const int32_t t[2] = {3, 4};
    REQUIRE(moe_session_feed(s, t, 2) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
    moe_ctx_close(ctx);
  }
}

TEST_CASE("cancel: an older host's moe_params (before load_continue) never cancels", "[capi][cancel]") {
  moe_params p = DemoParams(0);
  CancelAt c{1};
  p.load_continue = Continue;  // beyond the older struct_size: never read
  p.load_progress_user = &c;
  p.struct_size = static_cast<uint32_t>((offsetof(moe_params, load_continue) + alignof(moe_params) - 1) /
                                       alignof(moe_params) * alignof(moe_params));
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_ctx_close(ctx);
  CHECK(c.calls == 0);
}

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

TEST_CASE("abort: NULL is refused; an abort before a step stops that step and is then spent", "[capi][abort]") {
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
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      REQUIRE(moe_ctx_abort(r.ctx) == MOE_OK);
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
    // An abort that came after the last step is kept for the next one: Finish steps past it.
    const std::vector<std::vector<float>> got = Finish(r);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
    moe_ctx_close(r.ctx);
  }
  INFO("steps aborted: " << aborted);
  SUCCEED();
}
