// A fixed pool of worker threads for data-parallel loops. ParallelFor splits [0, n) into contiguous
// chunks (a few per thread), which the caller and the workers take one at a time until none is
// left, and returns when all are done. Chunk boundaries depend only on n and the pool size, so
// results that are computed per index are reproducible; which thread runs a chunk does not matter.
// A thread that is late to a call (asleep, or off its core because the host has more runnable
// threads than cores) takes no chunk and delays nobody.
//
// A decode step makes hundreds of short ParallelFor calls, so waking sleeping threads through the
// kernel each time would cost as much as the work: workers and the caller first spin on atomics
// for a bounded time (kSpinIterations pauses, ~0.1 ms) and only then sleep on a condition variable.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace strata {

// One wait of a spin loop: the CPU's pause hint (a yield where there is none).
inline void CpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// The wait of a thread serving work that comes in bursts (requests every layer or every few layers
// of a decode step, none while the application waits for its user): a look that finds no work spins
// while work came within `busy` (longer than a step, so a step with a single request waits for no
// nap); after that it naps, `nap` at first and twice as long each time up to `max_nap`: a long
// pause costs about 1,000 wakeups a second, not a core. Idle() after each look that found nothing,
// Worked() after serving.
class BurstWait {
 public:
  explicit BurstWait(std::chrono::microseconds nap = std::chrono::microseconds(50),
                     std::chrono::milliseconds busy = std::chrono::milliseconds(50),
                     std::chrono::microseconds max_nap = std::chrono::microseconds(1000))
      : first_nap_(nap), nap_(nap), max_nap_(std::max(nap, max_nap)), busy_(busy),
        last_(std::chrono::steady_clock::now()) {}
  void Idle() {
    if (spins_ < kSpins) {
      ++spins_;
      CpuPause();
    } else if (std::chrono::steady_clock::now() - last_ < busy_) {
      spins_ = 0;  // the clock is read once every kSpins looks
    } else {
      std::this_thread::sleep_for(nap_);  // and every look naps until work comes
      nap_ = std::min(2 * nap_, max_nap_);
      ++naps_;
    }
  }
  void Worked() {
    spins_ = 0;
    nap_ = first_nap_;
    last_ = std::chrono::steady_clock::now();
  }
  uint64_t naps() const { return naps_; }                // naps taken
  std::chrono::microseconds next_nap() const { return nap_; }  // the next nap's length

 private:
  static constexpr int kSpins = 1024;
  std::chrono::microseconds first_nap_, nap_, max_nap_;
  std::chrono::milliseconds busy_;
  std::chrono::steady_clock::time_point last_;
  int spins_ = 0;
  uint64_t naps_ = 0;
};

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread. spin: pauses a waiting thread spins before it sleeps
  // (longer for pools fed at a steady pace, whose workers should not sleep between calls).
  // Throws nothing when the host refuses a thread: the workers already started are stopped and
  // joined, status() says why (MOE_ERR_NO_MEMORY), and the pool runs every call on the caller.
  explicit ThreadPool(int n_threads, int spin = kSpinIterations);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return n_threads_; }
  // OK, or why the threads asked for could not all be started (the pool then has size() 1).
  const absl::Status &status() const { return status_; }
  // fn(begin, end, thread_index) over [0, n) in at most kChunksPerThread * size() chunks of at least
  // min_chunk (STRATA_POOL_CHUNKS=N sets N chunks a thread instead: a measuring knob); thread_index
  // (in [0, size())) is the thread running that chunk.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t, int)> &fn);
  // Times a worker took the pool's mutex to go to sleep (its spin ran out with no call): a worker
  // that sees a call while spinning goes straight to the chunks.
  uint64_t sleep_checks() const { return sleep_checks_.load(std::memory_order_relaxed); }

  // Pauses a waiting thread spins before it sleeps.
  static constexpr int kSpinIterations = 2000;
  static constexpr int kChunksPerThread = 4;
  static constexpr int kMaxThreads = 4096;  // chunk numbers fit 16 bits

 private:
  struct Job {
    const std::function<void(int64_t, int64_t, int)> *fn;
    int64_t n, chunk;
    int chunks;
  };
  void WorkerLoop(int index);
  // Wakes the workers to return and joins them.
  void StopWorkers();
  // Claims and runs chunks of call `gen` until none is left (or a later call has begun).
  void RunChunks(uint32_t gen, int index);

  int n_threads_;
  absl::Status status_;
  int spin_;
  int chunks_per_thread_;  // kChunksPerThread, or STRATA_POOL_CHUNKS (1-64; a measuring knob)
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  // The call: its job (on the caller's stack), the claim word (generation, chunks, next chunk) and
  // the chunks done. job_ and done_ are set before the claim word is published (release); a thread
  // reads the job only after claiming a chunk, which keeps the call from returning.
  std::atomic<const Job *> job_{nullptr};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_{0};
  std::atomic<uint64_t> generation_{0};
  int sleepers_ = 0;  // workers waiting on cv_work_ (under mu_)
  std::atomic<bool> stop_{false};  // set under mu_, before the generation that wakes the workers
  std::atomic<uint64_t> sleep_checks_{0};
  std::mutex call_mu_;  // one ParallelFor at a time
};

}  // namespace strata
