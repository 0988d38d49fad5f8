// ThreadPool: workers wait for a generation counter to move, take their chunk, and report done.
#include "lib/util/thread_pool.h"

#include <algorithm>

namespace strata {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  cv_work_.notify_all();
  fn(0, std::min(n, chunk), 0);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)> *job;
    int64_t begin, end;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= job_chunks_) continue;
      job = job_;
      begin = job_chunk_ * index;
      end = std::min(job_n_, begin + job_chunk_);
    }
    if (begin < end) (*job)(begin, end, index);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

}  // namespace strata
