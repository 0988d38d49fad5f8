// The embedding calls that control the library from a host (issue 47): the log callback (nothing on
// stderr once it is set) and a load the host cancels (MOE_ERR_CANCELLED, nothing left allocated).
// Aborted steps: embed_abort_test.cc.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
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
#include "lib/util/log.h"
#include "tests/util/alloc_hook.h"

namespace {

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

TEST_CASE("log: once a callback is set nothing reaches stderr, NULL restores stderr", "[capi][log]") {
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
  strata::LogDebug("debug %s\n", a.c_str());
  strata::LogWarn("warn %d", 7);
  moe_log_set(nullptr, nullptr);
  strata::LogLine(strata::LogLevel::kError, "after " + c);
  const std::string err = cap.Take();
  REQUIRE(heard.lines.size() == 5);
  CHECK(heard.lines[0] == std::make_pair(int32_t{MOE_LOG_WARN}, "strata: " + a));  // no trailing newline
  CHECK(heard.lines[1] == std::make_pair(int32_t{MOE_LOG_DEBUG}, "trace " + b + " 42"));
  CHECK(heard.lines[2] == std::make_pair(int32_t{MOE_LOG_INFO}, longer + c));
  CHECK(heard.lines[3] == std::make_pair(int32_t{MOE_LOG_DEBUG}, "debug " + a));
  CHECK(heard.lines[4] == std::make_pair(int32_t{MOE_LOG_WARN}, std::string("warn 7")));
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
// out) writes to stderr or stdout, as "path:line"; log.cc (the sink) and pack.cc (the terminal
// progress bar of pack/synth, off while a host callback is set) are allowed to.
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
      for (const char *bad : {"stderr", "std::cerr", "perror(", "STDERR_FILENO", "std::clog", "stdout", "std::cout"}) {
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

TEST_CASE("log: no library source writes to stderr (or stdout) except through lib/util/log.cc", "[capi][log]") {
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

// Where the callback says no: its first call (done == 0, before any read), a call while reading
// (0 < done < total: only when a load takes more than 0.1 s), or the last (done == total).
enum class CancelWhere { kNever, kFirst, kMiddle, kLast };
struct CancelAt {
  CancelWhere where;
  int calls = 0;
  bool said_no = false, asked_after_no = false;
  uint64_t last_done = 0, last_total = 0;
};
int32_t Continue(uint64_t done, uint64_t total, void *user) {
  auto *c = static_cast<CancelAt *>(user);
  ++c->calls;
  c->asked_after_no = c->asked_after_no || c->said_no;
  c->last_done = done;
  c->last_total = total;
  const bool no = (c->where == CancelWhere::kFirst && done == 0) ||
                  (c->where == CancelWhere::kMiddle && done > 0 && done < total) ||
                  (c->where == CancelWhere::kLast && done == total);
  c->said_no = c->said_no || no;
  return no ? 0 : 1;
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
    // A full open asks at least twice: first (done 0) and last (done == total).
    CancelAt count{CancelWhere::kNever};
    p.load_continue = Continue;
    p.load_progress_user = &count;
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_ctx_wait_loads(ctx);
    moe_ctx_close(ctx);
    REQUIRE(count.calls >= 2);
    CHECK(count.last_done == count.last_total);
    CHECK(count.last_total > 0);
    for (CancelWhere where : {CancelWhere::kFirst, CancelWhere::kMiddle, CancelWhere::kLast}) {
      INFO("budget " << budget << ", cancelled at " << static_cast<int>(where) << " (1 first, 2 reading, 3 last)");
      // Once first, so this thread's error text already holds this message's length.
      CancelAt once{where};
      p.load_progress_user = &once;
      moe_ctx *opened = nullptr;
      if (moe_ctx_open(&p, &opened) == MOE_OK) {
        // No call came while reading (a load under 0.1 s): nothing to cancel there.
        REQUIRE(where == CancelWhere::kMiddle);
        moe_ctx_close(opened);
        continue;
      }
      CancelAt c{where};
      p.load_progress_user = &c;
      moe_ctx *none = reinterpret_cast<moe_ctx *>(&c);  // poisoned: must stay untouched
      const int64_t before = HeapBytesInUse();
      const moe_status st = moe_ctx_open(&p, &none);
      const int64_t after = HeapBytesInUse();
      if (st == MOE_OK && where == CancelWhere::kMiddle) {  // this time the load was quick
        moe_ctx_close(none);
        continue;
      }
      CHECK(st == MOE_ERR_CANCELLED);
      CHECK(MOE_STATUS_CATEGORY(st) == MOE_ERR_CANCELLED);
      CHECK(none == reinterpret_cast<moe_ctx *>(&c));
      CHECK(after == before);
      CHECK(std::string(moe_last_error()).find("cancelled") != std::string::npos);
      CHECK(c.said_no);
      CHECK_FALSE(c.asked_after_no);  // never asked again after saying no
    }
    // The next open, left to run, works.
    CancelAt never{CancelWhere::kNever};
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
  CancelAt c{CancelWhere::kFirst};
  p.load_continue = Continue;  // beyond the older struct_size: never read
  p.load_progress_user = &c;
  p.struct_size = static_cast<uint32_t>((offsetof(moe_params, load_continue) + alignof(moe_params) - 1) /
                                       alignof(moe_params) * alignof(moe_params));
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_ctx_close(ctx);
  CHECK(c.calls == 0);
}
