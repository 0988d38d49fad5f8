// Streaming experts: budget invariance (logits at the minimum RAM budget bit-identical to an
// all-resident run, for every golden and every policy and prefetch distance), under injected short
// reads and EINTR, a failing read that fails the step with the tensor named and leaves the context
// usable, eviction with pins, stats, and the expert table through the C ABI.
#include <catch2/catch.hpp>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/model/pack.h"
#include "lib/runtime/context.h"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::kGolden;
using strata::testing::ReadBinary;

struct RunResult {
  std::vector<float> logits;  // every position
  moe_stats stats;
  moe_status status = MOE_OK;
  std::string error;
};

moe_ctx *Open(const std::string &model, uint64_t ram_budget, int policy = MOE_CACHE_HOTNESS, int prefetch = 1,
              int io_threads = 2) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = ram_budget;
  p.cache_policy = policy;
  p.prefetch_distance = prefetch;
  p.n_io_threads = io_threads;
  p.n_threads = 2;
  moe_ctx *ctx = nullptr;
  INFO(model << ": " << moe_last_error());
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  return ctx;
}

// Prefill `prefill` tokens, then one token per step; logits of every position.
RunResult Run(moe_ctx *ctx, const std::vector<int32_t> &tokens, size_t prefill) {
  RunResult r;
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.logits_all = 1;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  const int32_t nv = moe_ctx_vocab_size(ctx);
  r.logits.assign(tokens.size() * nv, std::nanf(""));
  size_t done = 0;
  while (done < tokens.size()) {
    const size_t n = done == 0 ? prefill : 1;
    REQUIRE(moe_session_feed(s, tokens.data() + done, n) == MOE_OK);
    r.status = moe_ctx_step(ctx, nullptr);
    if (r.status != MOE_OK) {
      r.error = moe_last_error();
      break;
    }
    const float *rows;
    int32_t nt, v;
    REQUIRE(moe_session_logits_all(s, &rows, &nt, &v) == MOE_OK);
    std::copy(rows, rows + n * nv, r.logits.begin() + done * nv);
    done += n;
  }
  moe_session_close(s);
  // Prefetches still reading when the last step returned are counted as issued but not yet as
  // reads: the counters are read once every load has landed.
  REQUIRE(moe_ctx_wait_loads(ctx) == MOE_OK);
  moe_stats_init(&r.stats);
  REQUIRE(moe_ctx_stats(ctx, &r.stats) == MOE_OK);
  return r;
}

bool BitEqual(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const char *kModels[] = {"qwen3moe_f32/hf", "qwen3moe_f32/model-f32.gguf", "qwen3moe_f32/model-q8_0.gguf",
                         "qwen3moe_bf16/hf", "qwen3moe_bf16/model-bf16.gguf", "mixtral_f32/hf",
                         "mixtral_f32/model-f16.gguf", "mixtral_f32/model-q8_0.gguf",
                         "qwen3moe_mixed/model-mixed.gguf",
                         // DeepSeek (a leading dense layer, shared experts) and gpt-oss (input-major HF
                         // experts, MXFP4). deepseek2lite_f32 has a single MoE layer: its minimum budget
                         // already holds every expert, so it cannot stream.
                         "deepseek2_f32/hf", "deepseek2_f32/model-f32.gguf", "deepseek3_f32/hf",
                         "deepseek3_f32/model-f32.gguf", "gptoss_f32/hf", "gptoss_f32/model-f32.gguf",
                         "gptoss_f32/model-mxfp4.gguf"};

std::vector<int32_t> Tokens(const std::string &model) {
  return ReadBinary<int32_t>(kGolden + model.substr(0, model.find('/')) + "/tokens.bin");
}

// Fault injection through the file layer's pread hook.
std::atomic<int> g_calls{0};
std::atomic<int> g_fail_after{-1};  // fail every call from this one on (-1: never)
std::atomic<bool> g_fail_once{false};

// Short reads and EINTR. Past the page cache (an O_DIRECT descriptor) a read moves whole 4 KiB
// blocks: there the short reads are block multiples, or (every fifth call) a full read reported a
// little short, which the reader must finish through the page cache.
ssize_t ShortAndInterrupted(int fd, void *buf, size_t n, off_t off) {
  const int c = g_calls++;
  if (c % 3 == 1) {
    errno = EINTR;
    return -1;
  }
  const size_t want = std::max<size_t>(1, std::min<size_t>(n, (c % 7) + 1 + n / 3));
  if ((::fcntl(fd, F_GETFL) & O_DIRECT) == 0) return ::pread(fd, buf, want, off);
  if (c % 5 == 0 && n > 8192) {
    const ssize_t got = ::pread(fd, buf, n, off);
    return got > 100 ? got - 100 : got;
  }
  return ::pread(fd, buf, std::min(n, std::max<size_t>(4096, want / 4096 * 4096)), off);
}

ssize_t FailingRead(int fd, void *buf, size_t n, off_t off) {
  const int c = g_calls++;
  if (g_fail_once.exchange(false) || (g_fail_after >= 0 && c >= g_fail_after)) {
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

TEST_CASE("logits at the minimum RAM budget are bit-identical to an all-resident run", "[store][golden]") {
  for (const char *m : kModels) {
    const std::string model = kGolden + m;
    const auto tokens = Tokens(m);
    moe_ctx *full = Open(model, 0);
    RunResult ref = Run(full, tokens, 12);
    REQUIRE(ref.status == MOE_OK);
    CHECK(ref.stats.streaming == 0);
    CHECK(ref.stats.expert_misses == 0);
    CHECK(ref.stats.expert_hits > 0);
    moe_ctx_close(full);

    moe_ctx *small = Open(model, 1);  // clamped to the minimum: one layer's experts
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(small, &plan) == MOE_OK);
    CHECK(plan.clamped == 1);
    CHECK(plan.ram_expert_slots == moe_expert_table_n_experts(moe_ctx_experts(small)));
    RunResult got = Run(small, tokens, 12);
    INFO(m << ": " << got.error);
    REQUIRE(got.status == MOE_OK);
    CHECK(BitEqual(got.logits, ref.logits));
    CHECK(got.stats.streaming == 1);
    CHECK(got.stats.expert_misses > 0);
    CHECK(got.stats.evictions > 0);
    CHECK(got.stats.bytes_read >= got.stats.expert_misses * 1024);
    CHECK(got.stats.expert_hits + got.stats.expert_misses == ref.stats.expert_hits);
    moe_ctx_close(small);
  }
}

TEST_CASE("every policy and prefetch distance gives the same numbers", "[store]") {
  const std::string m = "qwen3moe_f32/model-q8_0.gguf";
  const auto tokens = Tokens(m);
  moe_ctx *full = Open(kGolden + m, 0);
  const RunResult ref = Run(full, tokens, 12);
  moe_ctx_close(full);
  for (int policy : {MOE_CACHE_LRU, MOE_CACHE_LFU, MOE_CACHE_HOTNESS}) {
    for (int prefetch : {0, 1, 2}) {
      for (uint64_t budget : {uint64_t{1}, uint64_t{0}}) {
        // Budget 0 here means "auto", which holds everything: use the minimum plus a few slots too.
        moe_ctx *ctx = Open(kGolden + m, budget, policy, prefetch, 3);
        RunResult r = Run(ctx, tokens, prefetch == 2 ? 1 : 12);
        INFO("policy " << policy << " prefetch " << prefetch << ": " << r.error);
        REQUIRE(r.status == MOE_OK);
        CHECK(BitEqual(r.logits, ref.logits));
        if (budget == 1 && prefetch == 0) CHECK(r.stats.prefetch_issued + r.stats.prefetch_skipped == 0);
        if (budget == 1 && prefetch > 0) {
          // The gate opens with a prior, so the first predictions are issued; later ones are issued
          // or skipped by the measured precision, and every one of them is counted.
          CHECK(r.stats.prefetch_issued > 0);
          CHECK(r.stats.prefetch_useful <= r.stats.prefetch_issued);
          CHECK(r.stats.prefetch_precision > 0.0);
          CHECK(r.stats.prefetch_precision <= 1.0);
        }
        moe_ctx_close(ctx);
      }
    }
  }
}

TEST_CASE("short reads and EINTR do not change the numbers", "[store][faults]") {
  const std::string m = "mixtral_f32/model-f32.gguf";
  const auto tokens = Tokens(m);
  moe_ctx *full = Open(kGolden + m, 0);
  const RunResult ref = Run(full, tokens, 12);
  moe_ctx_close(full);
  moe_ctx *ctx = Open(kGolden + m, 1);
  HookGuard hook(ShortAndInterrupted);
  g_calls = 0;
  RunResult r = Run(ctx, tokens, 12);
  REQUIRE(r.status == MOE_OK);
  CHECK(g_calls > 100);
  CHECK(BitEqual(r.logits, ref.logits));
  moe_ctx_close(ctx);
}

TEST_CASE("a failing read fails the step, names the tensor, and leaves the context usable", "[store][faults]") {
  const std::string m = "qwen3moe_f32/model-f32.gguf";
  const auto tokens = Tokens(m);
  moe_ctx *full = Open(kGolden + m, 0);
  const RunResult ref = Run(full, tokens, 12);
  moe_ctx_close(full);

  moe_ctx *ctx = Open(kGolden + m, 1, MOE_CACHE_LRU, 0, 1);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  REQUIRE(moe_session_feed(s, tokens.data(), 12) == MOE_OK);
  {
    HookGuard hook(FailingRead);
    g_calls = 0;
    g_fail_after = 0;  // persistent EIO
    CHECK(moe_ctx_step(ctx, nullptr) == MOE_ERR_IO_READ);
    const std::string err = moe_last_error();
    INFO(err);
    CHECK(err.find("ffn_") != std::string::npos);
    CHECK(err.find("model-f32.gguf") != std::string::npos);
    CHECK(moe_session_n_past(s) == 0);  // nothing consumed
    // The step returned at its first failed expert; the reads it had queued may still be running
    // (and failing). Let them finish before the fault changes, so the next failure is the next step's.
    REQUIRE(moe_ctx_wait_loads(ctx) == MOE_OK);
    // Failing once: the step fails again, then succeeds once reads work.
    g_fail_after = -1;
    g_fail_once = true;
    CHECK(moe_ctx_step(ctx, nullptr) == MOE_ERR_IO_READ);
    CHECK(moe_session_n_past(s) == 0);
  }
  uint32_t pending = 9;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  CHECK(pending == 0);
  CHECK(moe_session_n_past(s) == 12);
  const float *l;
  int32_t nv;
  REQUIRE(moe_session_logits(s, &l, &nv) == MOE_OK);
  CHECK(std::memcmp(l, ref.logits.data() + 11 * nv, nv * sizeof(float)) == 0);
  moe_stats st;
  moe_stats_init(&st);
  REQUIRE(moe_ctx_stats(ctx, &st) == MOE_OK);
  CHECK(st.load_errors >= 2);
  moe_session_close(s);
  moe_ctx_close(ctx);
}

// A copy of a golden model in a temporary directory, opened at the minimum RAM budget, with one
// session that has run a step over `first`; the tests then change the file under it.
struct RunningCopy {
  strata::format::testing::TempDir tmp;
  std::string path;
  moe_ctx *ctx = nullptr;
  moe_session *s = nullptr;
  explicit RunningCopy(const std::vector<int32_t> &first) : path(tmp.File("m.gguf")) {
    std::filesystem::copy_file(kGolden + "qwen3moe_f32/model-q8_0.gguf", path);
    ctx = Open(path, 1);
    REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, first.data(), first.size()) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  }
  ~RunningCopy() {
    moe_session_close(s);
    moe_ctx_close(ctx);
  }
};

TEST_CASE("a replaced model file is detected", "[store][faults]") {
  RunningCopy run({1, 2, 3});
  // Replace the file by rename, as a download or a re-pack would.
  std::filesystem::copy_file(kGolden + "qwen3moe_f32/model-q8_0.gguf", run.path + ".new");
  std::filesystem::rename(run.path + ".new", run.path);
  const int32_t t = 1;
  REQUIRE(moe_session_feed(run.s, &t, 1) == MOE_OK);
  CHECK(moe_ctx_step(run.ctx, nullptr) == MOE_ERR_IO_CHANGED);
  CHECK(std::string(moe_last_error()).find("m.gguf") != std::string::npos);
}

TEST_CASE("expert table through the C ABI", "[store][capi]") {
  moe_ctx *ctx = Open(kGolden + "qwen3moe_f32/model-q8_0.gguf", 0);
  const moe_expert_table *t = moe_ctx_experts(ctx);
  moe_expert_info info;
  moe_expert_info_init(&info);
  REQUIRE(moe_expert_table_get(t, 2, 7, &info) == MOE_OK);
  // Q8_0 (8): gate/up 32 rows of 64, down 64 rows of 32; 34 bytes per 32 elements.
  CHECK(info.codec[0] == 8);
  CHECK(info.rows[0] == 32);
  CHECK(info.cols[0] == 64);
  CHECK(info.rows[2] == 64);
  CHECK(info.cols[2] == 32);
  CHECK(info.bytes[0] == 32 * 2 * 34);
  CHECK(info.total_bytes == 3 * 32 * 2 * 34);
  CHECK(info.single_read == 0);  // 3-D expert tensors: three reads
  CHECK(info.file_offset[0] != info.file_offset[1]);
  CHECK(moe_expert_table_get(t, 3, 0, &info) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_expert_table_get(t, 0, 8, &info) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(moe_expert_table_get(nullptr, 0, 0, &info) == MOE_ERR_INVALID_ARGUMENT);
  moe_ctx_close(ctx);
}

TEST_CASE("prefetch racing eviction at a tiny budget, many steps", "[store][stress]") {
  const std::string m = "qwen3moe_mixed/model-mixed.gguf";
  const auto tokens = Tokens(m);
  moe_ctx *full = Open(kGolden + m, 0);
  const RunResult ref = Run(full, tokens, 1);
  moe_ctx_close(full);
  moe_ctx *ctx = Open(kGolden + m, 1, MOE_CACHE_LRU, 1, 4);
  for (int round = 0; round < 3; ++round) {
    RunResult r = Run(ctx, tokens, 1);
    REQUIRE(r.status == MOE_OK);
    CHECK(BitEqual(r.logits, ref.logits));
  }
  moe_ctx_close(ctx);
}

namespace {

// `model` at the minimum RAM budget, with and without O_DIRECT, gives the all-resident logits;
// with it every load bypasses the page cache. Expert 5 of layer 1 is read in one piece
// (single_read) from a 4 KiB-aligned offset, or part by part from unaligned slices.
void CheckStreamsPastPageCache(const std::string &model, const std::string &tokens_of, bool single_read) {
  const auto tokens = Tokens(tokens_of);
  moe_ctx *full = Open(model, 0);
  const RunResult ref = Run(full, tokens, 12);
  moe_ctx_close(full);
  for (uint32_t direct : {1u, 0u}) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.ram_budget_bytes = 1;
    p.direct_io = direct;
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_expert_info info;
    moe_expert_info_init(&info);
    REQUIRE(moe_expert_table_get(moe_ctx_experts(ctx), 1, 5, &info) == MOE_OK);
    CHECK(info.single_read == (single_read ? 1u : 0u));
    CHECK((info.file_offset[0] % 4096 == 0) == single_read);
    RunResult r = Run(ctx, tokens, 12);
    INFO("direct " << direct << ": " << r.error);
    REQUIRE(r.status == MOE_OK);
    CHECK(BitEqual(r.logits, ref.logits));
    CHECK(r.stats.expert_misses > 0);
    if (direct) CHECK(r.stats.direct_reads == r.stats.expert_misses + r.stats.prefetch_issued);
    else CHECK(r.stats.direct_reads == 0);
    moe_ctx_close(ctx);
  }
}

}  // namespace

TEST_CASE("packed files stream past the page cache with identical numbers", "[store][direct]") {
  strata::format::testing::TempDir tmp;
  const std::string packed = tmp.File("packed.gguf");
  strata::model::PackOptions o;
  o.layout = strata::model::ExpertLayout::kExpertContiguous;  // one read per expert
  o.experts = strata::quant::TypeId::kQ4_K;  // the mixed golden's rows are multiples of 256
  o.attention = strata::quant::TypeId::kQ8_0;
  REQUIRE(strata::model::Pack(kGolden + "qwen3moe_mixed/model-mixed.gguf", packed, o).ok());
  CheckStreamsPastPageCache(packed, "qwen3moe_mixed/x", true);
}

TEST_CASE("stacked expert tensors (any GGUF) stream past the page cache with identical numbers", "[store][direct]") {
  // Each expert is a slice of the stacked gate, up and down tensors, at 32-byte alignment: three
  // direct reads of the 4 KiB blocks around the slices.
  CheckStreamsPastPageCache(kGolden + "qwen3moe_f32/model-q8_0.gguf", "qwen3moe_f32/x", false);
}

TEST_CASE("a model file truncated under a running context is detected", "[store][faults]") {
  RunningCopy run({5, 6, 7});
  std::filesystem::resize_file(run.path, std::filesystem::file_size(run.path) / 2);
  const int32_t t = 5;
  REQUIRE(moe_session_feed(run.s, &t, 1) == MOE_OK);
  CHECK(moe_ctx_step(run.ctx, nullptr) == MOE_ERR_IO_CHANGED);
  CHECK(moe_session_n_past(run.s) == 3);
}
