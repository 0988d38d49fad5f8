// A fixed pool of worker threads for data-parallel loops. ParallelFor splits [0, n) into contiguous
// chunks, runs them on the workers and the caller, and returns when all are done. Chunk boundaries
// depend only on n and the pool size, so results that are computed per index are reproducible.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: one per hardware thread
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end, thread_index) over [0, n) in at most size() chunks of at least min_chunk.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t, int)> &fn);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t, int)> *job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  int job_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::mutex call_mu_;  // one ParallelFor at a time
};

}  // namespace strata
