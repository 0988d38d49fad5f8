// Allocation failures at the C ABI, SQLite style: the allocations moe_ctx_open makes on the calling
// thread (through operator new, counted by tests/util/alloc_hook) are made to fail one at a time.
// Each failed open returns MOE_ERR_NO_MEMORY with a message and no context, holds no byte more than
// before it (nothing leaked: the hook's count of bytes in use, and LSan in the sanitizer build), and
// the next open succeeds. Allocations on the threads the open starts are not failed: there no caller
// could receive the error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/util/alloc_hook.h"

namespace {

using strata::testing::HeapBytesInUse;
using strata::testing::ScopedAllocationFailure;
using strata::testing::ThreadAllocations;

const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";
const std::string kDemoHotlist = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe.hotlist";

moe_params Params(const char *hotlist, uint64_t ram_budget) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kDemo.c_str();
  p.hotlist_path = hotlist;
  p.ram_budget_bytes = ram_budget;
  p.n_threads = 2;
  p.max_sessions = 2;
  return p;
}

// Allocations the calling thread makes in one successful open and close.
uint64_t CountOpenAllocations(const moe_params &p) {
  const uint64_t before = ThreadAllocations();
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const uint64_t n = ThreadAllocations() - before;
  moe_ctx_wait_loads(ctx);
  moe_ctx_close(ctx);
  return n;
}

// The allocations to fail: every one up to `all`, then a stride with a fresh random offset per run,
// so the whole range is covered over runs while one run stays short; and the last few.
std::vector<uint64_t> ToFail(uint64_t n, uint64_t all, uint64_t stride, std::mt19937_64 &rng) {
  std::vector<uint64_t> out;
  for (uint64_t k = 1; k <= std::min(n, all); ++k) out.push_back(k);
  for (uint64_t k = all + 1 + rng() % stride; k <= n; k += stride) out.push_back(k);
  for (uint64_t k = n > 3 ? n - 3 : 1; k <= n; ++k) out.push_back(k);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void FailOpenAllocations(const moe_params &p) {
  // Warm up what a process allocates once (static tables, this thread's error text at its
  // longest, the CUDA plugin opened on first use), so the bytes in use before and after each
  // failed open can be compared.
  (void)moe_backend_available(MOE_BACKEND_CUDA);
  {
    const std::string missing = "/nonexistent/" + std::string(300, 'x') + ".gguf";
    moe_params q = p;
    q.model_path = missing.c_str();
    moe_ctx *none = nullptr;
    REQUIRE(moe_ctx_open(&q, &none) == MOE_ERR_IO_OPEN);
  }
  const uint64_t n = CountOpenAllocations(p);
  CountOpenAllocations(p);
  INFO("allocations in one open: " << n);
  REQUIRE(n > 10);
  std::mt19937_64 rng(std::random_device{}());
  uint64_t failed_opens = 0;
  for (uint64_t k : ToFail(n, 400, 17, rng)) {
    const int64_t bytes_before = HeapBytesInUse();
    moe_ctx *ctx = nullptr;
    moe_status st;
    bool failed;
    {
      ScopedAllocationFailure fail(k);
      st = moe_ctx_open(&p, &ctx);
      failed = fail.failed();
    }
    const int64_t bytes_after = HeapBytesInUse();  // before this test's own messages take any
    INFO("allocation " << k << " of " << n << ": " << (st == MOE_OK ? "opened" : moe_last_error()));
    REQUIRE(failed);  // the open made at least k allocations
    if (st == MOE_OK) {
      // A failure the open may absorb (a cache it can do without) must leave a working context.
      REQUIRE(ctx != nullptr);
      CHECK(moe_ctx_vocab_size(ctx) > 0);
      moe_ctx_wait_loads(ctx);
      moe_ctx_close(ctx);
      continue;
    }
    ++failed_opens;
    CHECK(st == MOE_ERR_NO_MEMORY);
    CHECK(ctx == nullptr);
    CHECK(std::string(moe_last_error()).size() > 0);
    CHECK(bytes_after == bytes_before);
  }
  CHECK(failed_opens > 0);
  // The next open, with allocations working again, succeeds and runs.
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
  const int32_t t[2] = {3, 4};
  REQUIRE(moe_session_feed(s, t, 2) == MOE_OK);
  REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
  moe_session_close(s);
  moe_ctx_close(ctx);
}

}  // namespace

TEST_CASE("alloc failures: every allocation of moe_ctx_open failing in turn is MOE_ERR_NO_MEMORY, leak-free",
          "[capi][alloc]") {
  SECTION("all weights resident, with a hotlist") { FailOpenAllocations(Params(kDemoHotlist.c_str(), 0)); }
  SECTION("the minimum RAM budget (an expert cache, I/O threads)") { FailOpenAllocations(Params(nullptr, 1)); }
}
