// ThreadPool: every index of a ParallelFor runs exactly once, with chunks that depend only on n and
// the pool size, whether the workers are spinning or asleep when the call comes (spin 0: they
// always sleep; a long spin: they never do between close calls).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <optional>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/util/status.h"
#include "lib/util/thread_pool.h"
#include "lib/util/tunables.h"
#include "tests/util/thread_limit_util.h"

namespace {

using strata::ThreadPool;

}  // namespace

TEST_CASE("ThreadPool runs every index once, asleep or spinning", "[threads]") {
  std::mt19937 rng(std::random_device{}());
  for (int n_threads : {1, 2, 3, 5}) {
    for (int spin : {0, ThreadPool::kSpinIterations, 50 * ThreadPool::kSpinIterations}) {
      ThreadPool pool(n_threads, spin);
      REQUIRE(pool.size() == n_threads);
      for (int call = 0; call < 20; ++call) {
        const int64_t n = std::uniform_int_distribution<int64_t>(0, 5000)(rng);
        const int64_t min_chunk = std::uniform_int_distribution<int64_t>(1, 64)(rng);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        std::atomic<int> bad_index{0};  // Catch's assertions are not for worker threads
        pool.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e, int t) {
          if (t < 0 || t >= n_threads) {
            bad_index.fetch_add(1);
            return;
          }
          {
            std::lock_guard<std::mutex> lk(mu);
            chunks.push_back({b, e});
          }
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        INFO(n_threads << " threads, spin " << spin << ", n " << n << ", min chunk " << min_chunk);
        REQUIRE(bad_index.load() == 0);
        for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
        // At most kChunksPerThread chunks a thread, each at least min_chunk long but the last.
        std::sort(chunks.begin(), chunks.end());
        CHECK(chunks.size() <= static_cast<size_t>(ThreadPool::kChunksPerThread * n_threads));
        for (size_t c = 0; c + 1 < chunks.size(); ++c) CHECK(chunks[c].second - chunks[c].first >= min_chunk);
        // The same call again gives the same chunks (results computed per index are reproducible),
        // whichever thread runs each.
        std::vector<std::pair<int64_t, int64_t>> again;
        pool.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e, int) {
          std::lock_guard<std::mutex> lk(mu);
          again.push_back({b, e});
        });
        std::sort(again.begin(), again.end());
        CHECK(again == chunks);
        // Now and then let the workers fall asleep before the next call.
        if (call % 5 == 4) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
    }
  }
}

TEST_CASE("ThreadPool workers that are spinning go to a call without the pool's mutex", "[threads]") {
  // Back-to-back calls well inside the spin: a worker that takes the mutex on every call (lining up
  // behind the others, ~1 us each on a 16-core host) counts one check a call. A worker kept off its
  // core past its spin may check now and then, so the bound is loose.
  constexpr int kThreads = 3, kCalls = 400;
  ThreadPool pool(kThreads, 50 * ThreadPool::kSpinIterations);
  std::vector<std::atomic<int>> hits(kThreads * 64);
  pool.ParallelFor(kThreads * 64, 1, [&](int64_t b, int64_t e, int) {  // the workers are up
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  const uint64_t before = pool.sleep_checks();
  for (int c = 0; c < kCalls; ++c) {
    pool.ParallelFor(kThreads * 64, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
  }
  for (auto &h : hits) REQUIRE(h.load() == kCalls + 1);
  CHECK(pool.sleep_checks() - before < static_cast<uint64_t>(kCalls / 4));
}

TEST_CASE("BurstWait spins while work comes and naps, longer and longer, once it has stopped", "[threads]") {
  using Clock = std::chrono::steady_clock;
  using us = std::chrono::microseconds;
  std::mt19937 rng(std::random_device{}());
  const us nap(std::uniform_int_distribution<int>(100, 300)(rng));
  const us max_nap = nap * std::uniform_int_distribution<int>(4, 6)(rng);  // reached after 3 naps
  const auto busy = std::chrono::milliseconds(std::uniform_int_distribution<int>(100, 300)(rng));
  strata::BurstWait wait(nap, busy, max_nap);
  // Right after work: looks spin.
  wait.Worked();
  const auto worked = Clock::now();
  for (int i = 0; i < 1000; ++i) wait.Idle();
  CHECK(wait.naps() == 0);
  // The first nap comes once `busy` has passed without work, and from then on every look naps,
  // each twice as long as the one before up to max_nap.
  while (wait.naps() == 0) {
    wait.Idle();
    if (Clock::now() - worked > busy + std::chrono::seconds(10)) FAIL("no nap 10 s past busy");
  }
  CHECK(Clock::now() - worked >= busy);
  CHECK(wait.next_nap() == 2 * nap);
  const auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) wait.Idle();
  CHECK(wait.naps() == 5);
  CHECK(Clock::now() - t0 >= 2 * nap + 4 * nap + max_nap + max_nap);
  CHECK(wait.next_nap() == max_nap);
  // Work again: spinning again, and the next nap is short again.
  wait.Worked();
  CHECK(wait.next_nap() == nap);
  for (int i = 0; i < 1000; ++i) wait.Idle();
  CHECK(wait.naps() == 5);
}

TEST_CASE("ThreadPool takes its chunks a thread from the STRATA_POOL_CHUNKS tunable", "[threads]") {
  for (int per : {1, 7, 64}) {
    INFO(per << " chunks a thread");
    strata::tunables::Values knobs;
    knobs.pool_chunks = per;
    std::optional<strata::tunables::ScopedValues> scoped(std::in_place, knobs);
    ThreadPool pool(4);
    scoped.reset();
    const int64_t n = 40 * per;  // ten indices a chunk
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> chunks{0};
    pool.ParallelFor(n, 1, [&](int64_t b, int64_t e, int) {
      chunks.fetch_add(1);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
    CHECK(chunks.load() == 4 * per);
  }
  // None (0), or a negative count: the default. (A value that does not parse is the table's
  // default: tests/util/tunables_test.cc.)
  for (int64_t none : {0, -5}) {
    strata::tunables::Values knobs;
    knobs.pool_chunks = none;
    std::optional<strata::tunables::ScopedValues> scoped(std::in_place, knobs);
    ThreadPool pool(3);
    scoped.reset();
    std::atomic<int> chunks{0};
    pool.ParallelFor(3000, 1, [&](int64_t, int64_t, int) { chunks.fetch_add(1); });
    CHECK(chunks.load() == 3 * ThreadPool::kChunksPerThread);
  }
}

TEST_CASE("ThreadPool: threads the host refuses stop the started ones and leave a working pool",
          "[threads]") {
  std::mt19937 rng(std::random_device{}());
  const int64_t n = std::uniform_int_distribution<int64_t>(1000, 5000)(rng);
  for (int extra : {0, 1, 3}) {
    INFO(extra << " threads to be had");
    // Child exit codes: 0 as expected; 10 no limit could be set; 1 the pool started every thread;
    // 2 a wrong status or size; 3 a ParallelFor missed an index; 4 no full pool afterwards.
    const int rc = strata::testing::RunInChild(30, [&] {
      if (!strata::testing::LimitThreads(extra)) return 10;
      {
        ThreadPool pool(16, 0);
        if (pool.status().ok()) return 1;
        if (strata::StatusToMoe(pool.status()) != MOE_ERR_NO_MEMORY || pool.size() != 1) return 2;
        std::vector<int> hits(static_cast<size_t>(n), 0);
        pool.ParallelFor(n, 1, [&](int64_t b, int64_t e, int) {
          for (int64_t i = b; i < e; ++i) ++hits[i];
        });
        if (std::count(hits.begin(), hits.end(), 1) != n) return 3;
      }  // the destructor must not wait for workers that were never started (an alarm ends a hang)
      strata::testing::UnlimitThreads();
      ThreadPool full(4, 0);
      return full.status().ok() && full.size() == 4 ? 0 : 4;
    });
    if (rc == 10) {
      WARN("RLIMIT_NPROC cannot be set here: not tested");
      return;
    }
    CHECK(rc == 0);
  }
}
