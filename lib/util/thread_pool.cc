// ThreadPool: workers wait for a generation counter to move (spinning, then sleeping), take their
// chunk, and count themselves done; the last one wakes the caller if it went to sleep.
#include "lib/util/thread_pool.h"

#include <algorithm>

namespace strata {

ThreadPool::ThreadPool(int n_threads, int spin) : spin_(std::max(0, spin)) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_work_.notify_all();
  for (auto &t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t, int)> &fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int chunks = static_cast<int>(std::min<int64_t>(n_threads_, (n + min_chunk - 1) / min_chunk));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  int64_t chunk = (n + chunks - 1) / chunks;
  bool wake;
  {
    // Under mu_ so a worker about to sleep either sees the new generation or is counted in sleepers_.
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_work_.notify_all();
  fn(0, std::min(n, chunk), 0);
  for (int i = 0; i < spin_ && pending_.load(std::memory_order_acquire) != 0; ++i) CpuPause();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < spin_ && generation_.load(std::memory_order_acquire) == seen; ++i) {
      CpuPause();
    }
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (generation_.load(std::memory_order_acquire) == seen && !stop_) {
        ++sleepers_;
        cv_work_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
        --sleepers_;
      }
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    if (index < job_chunks_) {
      const int64_t begin = job_chunk_ * index, end = std::min(job_n_, begin + job_chunk_);
      if (begin < end) (*job_)(begin, end, index);
    }
    // Every worker reports, the idle ones too: the caller waits for all before the next job.
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }
}

}  // namespace strata
