// moe_ctx_open where the host refuses threads (RLIMIT_NPROC in a forked child): the compute pool's
// and the expert cache's threads that did start are stopped and joined, the open fails with
// MOE_ERR_NO_MEMORY and a message, and the next open, once threads are there again, succeeds. A
// hang is caught by an alarm in the child. Also: n_threads beyond the bound is refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "include/strata/moe.h"
#include "tests/util/thread_limit_util.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";

// Child exit codes.
constexpr int kOk = 0, kNoLimit = 10, kSetupFailed = 11, kOpenedUnderLimit = 12, kWrongStatus = 13,
              kNoMessage = 14, kReopenFailed = 15;

moe_status Open(int n_threads, int n_io_threads, bool streaming) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_threads = n_threads;
  p.n_io_threads = n_io_threads;
  if (streaming) p.ram_budget_bytes = 1;  // clamped to the minimum: experts stream through the cache
  moe_ctx *c = nullptr;
  const moe_status st = moe_ctx_open(&p, &c);
  moe_ctx_close(c);
  return st;
}

// In the child: opens that need more threads than the limit allows fail cleanly, then succeed.
int OpensUnderLimit(int n_threads, int n_io_threads, bool streaming, int extra) {
  if (!strata::testing::LimitThreads(1000)) return kNoLimit;
  if (Open(n_threads, n_io_threads, streaming) != MOE_OK) return kSetupFailed;  // e.g. the model unreadable
  if (!strata::testing::LimitThreads(extra)) return kNoLimit;
  for (int round = 0; round < 3; ++round) {
    const moe_status st = Open(n_threads, n_io_threads, streaming);
    if (st == MOE_OK) return kOpenedUnderLimit;
    if (st != MOE_ERR_NO_MEMORY) {
      std::fprintf(stderr, "status %d: %s\n", st, moe_last_error());
      return kWrongStatus;
    }
    if (std::strstr(moe_last_error(), "thread") == nullptr) {
      std::fprintf(stderr, "message: %s\n", moe_last_error());
      return kNoMessage;
    }
  }
  strata::testing::UnlimitThreads();
  return Open(n_threads, n_io_threads, streaming) == MOE_OK ? kOk : kReopenFailed;
}

}  // namespace

TEST_CASE("moe_ctx_open fails cleanly when the host refuses threads", "[capi][threads]") {
  // The compute pool (8 threads: 7 workers besides the caller), with 0..5 threads to be had.
  for (int extra : {0, 2, 5}) {
    INFO("compute pool, " << extra << " threads to be had");
    const int rc = strata::testing::RunInChild(30, [&] { return OpensUnderLimit(8, 1, false, extra); });
    if (rc == kNoLimit) {
      WARN("RLIMIT_NPROC cannot be set here: not tested");
      return;
    }
    CHECK(rc == kOk);
  }
  // The expert cache's I/O threads (4), with experts streaming and a single compute thread.
  for (int extra : {0, 2}) {
    INFO("expert I/O threads, " << extra << " threads to be had");
    const int rc = strata::testing::RunInChild(30, [&] { return OpensUnderLimit(1, 4, true, extra); });
    if (rc == kNoLimit) {
      WARN("RLIMIT_NPROC cannot be set here: not tested");
      return;
    }
    CHECK(rc == kOk);
  }
}

TEST_CASE("moe_params.n_threads and n_io_threads are bounded", "[capi][threads]") {
  CHECK(Open(1025, 1, false) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("1024") != std::string::npos);
  CHECK(Open(1, 1025, false) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(Open(2, 1024, false) == MOE_OK);  // the bound itself is allowed (I/O threads unused: nothing streams)
}
