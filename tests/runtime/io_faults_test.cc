// Faults injected at the file layer's seams (format::Set{Pread,Write,Fsync}ForTesting), SQLite
// style: every read moe_ctx_open makes fails in turn (EIO), and each failure is MOE_ERR_IO_READ
// naming the file that read was from, after which an open succeeds; short reads and EINTR at every
// read change no number; a session save meeting ENOSPC, EIO or a failing fsync at any write is
// MOE_ERR_IO_WRITE naming the file, leaving the previous snapshot whole and no temporary file, while
// short writes and EINTR save a snapshot that continues bit for bit; the GGUF writer fails the same
// way; a snapshot that cannot be read is named; a model file rewritten in place under a running
// context is detected before a step reads it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/gguf_writer.h"
#include "tests/format/format_test_util.h"

namespace {

using strata::format::testing::TempDir;

const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";
const std::string kDemoHotlist = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe.hotlist";
const std::string kHf = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/hf";

// ---- the injector: one set of counters shared by the hooks (plain functions, so globals) ----

enum class Fault { kNone, kFailNth, kShortAndEintr };

std::atomic<Fault> g_fault{Fault::kNone};
std::atomic<int64_t> g_calls{0};
std::atomic<int64_t> g_fail_at{-1};  // the call (0-based) that fails, for kFailNth
std::atomic<int> g_errno{EIO};
std::mutex g_mu;
std::string g_failed_path;             // the file of the call that failed
std::vector<std::string> g_call_paths;  // with kNone and recording on: the file of every call
std::atomic<bool> g_record{false};

std::string PathOf(int fd) {
  char buf[4096];
  const ssize_t n = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
}

// Decides what call number `c` on `fd` does: 0 = go ahead, -1 = fail with g_errno, 1 = EINTR,
// 2 = go ahead but short.
int Decide(int fd) {
  const int64_t c = g_calls++;
  if (g_record) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_call_paths.push_back(PathOf(fd));
  }
  switch (g_fault.load()) {
    case Fault::kNone: return 0;
    case Fault::kFailNth:
      if (c == g_fail_at) {
        std::lock_guard<std::mutex> lk(g_mu);
        g_failed_path = PathOf(fd);
        return -1;
      }
      return 0;
    case Fault::kShortAndEintr: return c % 3 == 1 ? 1 : 2;
  }
  return 0;
}

ssize_t FaultyPread(int fd, void *buf, size_t n, off_t off) {
  switch (Decide(fd)) {
    case -1: errno = g_errno; return -1;
    case 1: errno = EINTR; return -1;
    case 2: {
      // Past the page cache (O_DIRECT) a read moves whole 4 KiB blocks: keep those multiples.
      const bool direct = (fcntl(fd, F_GETFL) & O_DIRECT) != 0;
      size_t want = std::max<size_t>(1, n / 2 + static_cast<size_t>(g_calls % 5));
      if (direct) want = std::max<size_t>(4096, want / 4096 * 4096);
      return ::pread(fd, buf, std::min(n, want), off);
    }
  }
  return ::pread(fd, buf, n, off);
}

ssize_t FaultyWrite(int fd, const void *buf, size_t n) {
  switch (Decide(fd)) {
    case -1: errno = g_errno; return -1;
    case 1: errno = EINTR; return -1;
    case 2: return ::write(fd, buf, std::max<size_t>(1, std::min(n, n / 3 + 1)));
  }
  return ::write(fd, buf, n);
}

int FaultyFsync(int fd) {
  switch (Decide(fd)) {
    case -1: errno = g_errno; return -1;
    case 1: errno = EINTR; return -1;
  }
  return ::fsync(fd);
}

// Installs the hooks for its lifetime, with the counters reset.
struct Injector {
  explicit Injector(Fault f, int64_t fail_at = -1, int err = EIO) {
    g_calls = 0;
    g_fail_at = fail_at;
    g_errno = err;
    g_failed_path.clear();
    g_fault = f;
    strata::format::SetPreadForTesting(FaultyPread);
    strata::format::SetWriteForTesting(FaultyWrite);
    strata::format::SetFsyncForTesting(FaultyFsync);
  }
  ~Injector() {
    strata::format::SetPreadForTesting(nullptr);
    strata::format::SetWriteForTesting(nullptr);
    strata::format::SetFsyncForTesting(nullptr);
    g_fault = Fault::kNone;
    g_record = false;
  }
  Injector(const Injector &) = delete;
  Injector &operator=(const Injector &) = delete;
};

std::string Base(const std::string &path) { return std::filesystem::path(path).filename().string(); }

moe_params Params(const std::string &model, const char *hotlist, uint64_t ram_budget) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.hotlist_path = hotlist;
  p.ram_budget_bytes = ram_budget;
  p.n_threads = 2;
  p.max_sessions = 2;
  return p;
}

// The calls (0-based) worth failing: the first and last call on each file, and `extra` more drawn
// at random, so every file and both ends of every phase are covered without trying all of them.
std::vector<int64_t> CallsToFail(const std::vector<std::string> &paths, int extra, std::mt19937 &rng) {
  std::set<int64_t> out;
  std::map<std::string, std::pair<int64_t, int64_t>> span;
  for (int64_t i = 0; i < static_cast<int64_t>(paths.size()); ++i) {
    auto [it, fresh] = span.emplace(paths[i], std::make_pair(i, i));
    if (!fresh) it->second.second = i;
  }
  for (const auto &[p, s] : span) {
    out.insert(s.first);
    out.insert(s.second);
  }
  for (int k = 0; k < extra && !paths.empty(); ++k) out.insert(static_cast<int64_t>(rng() % paths.size()));
  return std::vector<int64_t>(out.begin(), out.end());
}

// Every read of moe_ctx_open over `model` (and `hotlist`) failing in turn.
void FailEveryOpenRead(const std::string &model, const char *hotlist, int extra) {
  const moe_params p = Params(model, hotlist, 0);
  std::vector<std::string> paths;
  {
    Injector counting(Fault::kNone);
    g_record = true;
    g_call_paths.clear();
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    REQUIRE(moe_ctx_wait_loads(ctx) == MOE_OK);  // the hotlist's seeding reads too
    moe_ctx_close(ctx);
    paths = g_call_paths;
  }
  INFO("reads at open: " << paths.size());
  REQUIRE(paths.size() > 2);
  std::mt19937 rng(std::random_device{}());
  for (int64_t k : CallsToFail(paths, extra, rng)) {
    moe_status st;
    std::string err, failed;
    {
      Injector fail(Fault::kFailNth, k, rng() % 2 ? EIO : EBADF);
      moe_ctx *ctx = nullptr;
      st = moe_ctx_open(&p, &ctx);
      err = st == MOE_OK ? "" : moe_last_error();
      if (st == MOE_OK) {
        // A read the open hands to the background (the hotlist's seeding) fails there, not here;
        // the context stays usable and counts the failure.
        moe_ctx_wait_loads(ctx);
        moe_stats s;
        moe_stats_init(&s);
        REQUIRE(moe_ctx_stats(ctx, &s) == MOE_OK);
        CHECK((g_failed_path.empty() || s.load_errors > 0));
        moe_ctx_close(ctx);
        continue;
      }
      failed = g_failed_path;
    }
    INFO("read " << k << " of " << paths.size() << " (" << failed << "): " << err);
    CHECK(st == MOE_ERR_IO_READ);
    CHECK(!failed.empty());
    CHECK(err.find(Base(failed)) != std::string::npos);
  }
  // And with the reads working again, the open succeeds.
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_ctx_close(ctx);
}

// Logits of `n` tokens fed one step at a time.
std::vector<float> Logits(moe_ctx *ctx, const std::vector<int32_t> &tokens) {
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  std::vector<float> out;
  for (int32_t t : tokens) {
    REQUIRE(moe_session_feed(s, &t, 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
    const float *l = nullptr;
    int32_t nv = 0;
    REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
    out.insert(out.end(), l, l + nv);
  }
  moe_session_close(s);
  return out;
}

std::vector<int32_t> RandomTokens(std::mt19937 &rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto &x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> Entries(const std::string &dir) {
  std::vector<std::string> out;
  for (const auto &e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("io faults: every read of moe_ctx_open failing in turn names the file, then an open succeeds",
          "[faults][io]") {
  SECTION("the demo GGUF with its hotlist") { FailEveryOpenRead(kDemo, kDemoHotlist.c_str(), 24); }
  SECTION("an HF checkpoint (config.json, safetensors)") { FailEveryOpenRead(kHf, nullptr, 12); }
}

TEST_CASE("io faults: short reads and EINTR everywhere change no number, at open or streaming",
          "[faults][io]") {
  std::mt19937 rng(std::random_device{}());
  for (uint64_t budget : {uint64_t{0}, uint64_t{1}}) {  // all resident; the minimum (experts stream)
    INFO("ram budget " << budget);
    const moe_params p = Params(kDemo, nullptr, budget);
    moe_ctx *clean = nullptr;
    REQUIRE(moe_ctx_open(&p, &clean) == MOE_OK);
    const std::vector<int32_t> tokens = RandomTokens(rng, 6, moe_ctx_vocab_size(clean));
    const std::vector<float> want = Logits(clean, tokens);
    moe_ctx_close(clean);
    Injector faults(Fault::kShortAndEintr);
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    const std::vector<float> got = Logits(ctx, tokens);
    CHECK(g_calls > 100);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    moe_ctx_close(ctx);
  }
}

TEST_CASE("io faults: a session save failing at any write or sync keeps the old snapshot whole",
          "[faults][io]") {
  std::mt19937 rng(std::random_device{}());
  TempDir dir;
  const std::string path = dir.File("npc.session");
  const moe_params p = Params(kDemo, nullptr, 0);
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const int vocab = moe_ctx_vocab_size(ctx);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  std::vector<int32_t> tokens = RandomTokens(rng, 3, vocab);
  REQUIRE(moe_session_feed(s, tokens.data(), tokens.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  const std::string old_bytes = Slurp(path);
  // Move the session on, so a new snapshot would differ from the old one.
  tokens = RandomTokens(rng, 2, vocab);
  REQUIRE(moe_session_feed(s, tokens.data(), tokens.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);

  int64_t calls = 0;
  {
    Injector counting(Fault::kNone);
    REQUIRE(moe_session_save(s, dir.File("count.session").c_str()) == MOE_OK);
    calls = g_calls;
  }
  std::filesystem::remove(dir.File("count.session"));
  REQUIRE(calls >= 3);  // data, the file's fsync, the directory's fsync
  for (int64_t k = 0; k < calls; ++k) {
    for (int err : {ENOSPC, EIO}) {
      moe_status st;
      std::string msg;
      {
        Injector fail(Fault::kFailNth, k, err);
        st = moe_session_save(s, path.c_str());
        msg = st == MOE_OK ? "" : moe_last_error();
      }
      INFO("call " << k << " of " << calls << ", " << std::strerror(err) << ": " << msg);
      if (k == calls - 1) {
        // The directory's fsync comes after the rename: the new snapshot is in place, but its
        // durability is not known, and that is reported.
        CHECK(st == MOE_ERR_IO_WRITE);
        CHECK(msg.find(dir.path()) != std::string::npos);
        REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
        break;
      }
      CHECK(st == MOE_ERR_IO_WRITE);
      CHECK(msg.find("npc.session") != std::string::npos);
      CHECK(msg.find(std::strerror(err)) != std::string::npos);
      CHECK(Slurp(path) == old_bytes);
      CHECK(Entries(dir.path()) == std::vector<std::string>{"npc.session"});
    }
    if (k == calls - 1) break;
  }
  moe_session_close(s);
  moe_ctx_close(ctx);
}

TEST_CASE("io faults: short writes and EINTR save a snapshot that continues bit for bit", "[faults][io]") {
  std::mt19937 rng(std::random_device{}());
  TempDir dir;
  const std::string path = dir.File("npc.session");
  const moe_params p = Params(kDemo, nullptr, 0);
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const int vocab = moe_ctx_vocab_size(ctx);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const std::vector<int32_t> first = RandomTokens(rng, 4, vocab);
  REQUIRE(moe_session_feed(s, first.data(), first.size()) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  {
    Injector faults(Fault::kShortAndEintr);
    REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
    CHECK(g_calls > 3);
  }
  moe_session *loaded = nullptr;
  {
    Injector faults(Fault::kShortAndEintr);  // and read back through short reads
    REQUIRE(moe_session_load(ctx, path.c_str(), nullptr, &loaded) == MOE_OK);
  }
  const int32_t next = static_cast<int32_t>(rng() % vocab);
  for (moe_session *x : {s, loaded}) REQUIRE(moe_session_feed(x, &next, 1) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  const float *a = nullptr, *b = nullptr;
  REQUIRE(moe_session_logits(s, &a, nullptr) == MOE_OK);
  REQUIRE(moe_session_logits(loaded, &b, nullptr) == MOE_OK);
  CHECK(std::memcmp(a, b, vocab * sizeof(float)) == 0);
  moe_session_close(loaded);
  moe_session_close(s);
  moe_ctx_close(ctx);
}

TEST_CASE("io faults: a snapshot that cannot be read is named", "[faults][io]") {
  TempDir dir;
  const std::string path = dir.File("npc.session");
  const moe_params p = Params(kDemo, nullptr, 0);
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const int32_t t[2] = {5, 9};
  REQUIRE(moe_session_feed(s, t, 2) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  for (int64_t k : {0, 1}) {  // the header's read, the whole file's
    moe_status st;
    std::string msg;
    {
      Injector fail(Fault::kFailNth, k, EIO);
      moe_session *loaded = nullptr;
      st = moe_session_load(ctx, path.c_str(), nullptr, &loaded);
      msg = st == MOE_OK ? "" : moe_last_error();
      CHECK(loaded == nullptr);
    }
    INFO(msg);
    CHECK(st == MOE_ERR_IO_READ);
    CHECK(msg.find(path) != std::string::npos);
  }
  moe_session_close(s);
  moe_ctx_close(ctx);
}

TEST_CASE("io faults: the GGUF writer failing at any write or sync leaves nothing behind", "[faults][io]") {
  TempDir dir;
  const std::string path = dir.File("out.gguf");
  auto write = [&]() -> absl::Status {
    strata::format::GgufWriter w(path);
    w.SetValue("general.architecture", strata::format::GgufString("qwen3moe"));
    const int64_t ne[4] = {1024, 64, 1, 1};
    STRATA_RETURN_IF_ERROR(w.AddTensor("t", 0, 2, ne, 0).status());
    STRATA_RETURN_IF_ERROR(w.Begin());
    std::vector<float> data(1024 * 64, 0.5f);
    STRATA_RETURN_IF_ERROR(w.Write(data.data(), data.size() * sizeof(float)));
    return w.Finish();
  };
  int64_t calls = 0;
  {
    Injector counting(Fault::kNone);
    REQUIRE(write().ok());
    calls = g_calls;
  }
  std::filesystem::remove(path);
  REQUIRE(calls >= 2);
  for (int64_t k = 0; k < calls; ++k) {
    absl::Status st;
    {
      Injector fail(Fault::kFailNth, k, ENOSPC);
      st = write();
    }
    INFO("call " << k << ": " << st.ToString());
    CHECK(strata::StatusToMoe(st) == MOE_ERR_IO_WRITE);
    CHECK(std::string(st.message()).find(path) != std::string::npos);
    CHECK(Entries(dir.path()).empty());
  }
}

TEST_CASE("io faults: a model file rewritten in place under a running context is detected", "[faults][io]") {
  TempDir dir;
  const std::string path = dir.File("m.gguf");
  std::filesystem::copy_file(kDemo, path);
  const moe_params p = Params(path, nullptr, 1);  // the minimum: experts stream from the file
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const int32_t t[3] = {11, 12, 13};
  REQUIRE(moe_session_feed(s, t, 3) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  // Same inode, same size, other bytes in the middle of the file (an editor or a copy over it).
  struct stat before;
  REQUIRE(stat(path.c_str(), &before) == 0);
  {
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    std::vector<char> junk(4096, 0x5a);
    REQUIRE(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(before.st_size / 2)) ==
            static_cast<ssize_t>(junk.size()));
    // A write lands within the clock's tick now and then: make the modification time move for sure.
    const timespec times[2] = {{0, UTIME_OMIT}, {before.st_mtim.tv_sec + 1, before.st_mtim.tv_nsec}};
    REQUIRE(::futimens(fd, times) == 0);
    ::close(fd);
  }
  REQUIRE(moe_session_feed(s, t, 1) == MOE_OK);
  CHECK(moe_ctx_step(ctx, nullptr) == MOE_ERR_IO_CHANGED);
  const std::string msg = moe_last_error();
  INFO(msg);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(moe_session_n_past(s) == 3);  // nothing computed from the new bytes
  moe_session_close(s);
  moe_ctx_close(ctx);
}
