// ThreadPool: a call splits [0, n) into fixed chunks and publishes them under a generation; the
// caller and the workers claim chunks one at a time (a compare-and-swap on the generation and the
// next chunk's number) until none is left, and the caller returns when every chunk is done. A
// worker that is late (asleep, or off its core) claims nothing and holds nobody up.
#include "lib/util/str_format.h"
#include "lib/util/thread_pool.h"

#include <algorithm>

#include "lib/util/thread_start.h"
#include "lib/util/tunables.h"

namespace strata {

namespace {

// The claim word: the call's generation (32 bits), its chunk count and the next chunk (16 each).
constexpr uint64_t Claim(uint32_t gen, uint32_t chunks, uint32_t next) {
  return (uint64_t{gen} << 32) | (uint64_t{chunks} << 16) | next;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, int spin) : spin_(std::max(0, spin)), chunks_per_thread_(kChunksPerThread) {
  const int64_t chunks = tunables::Get().pool_chunks;
  if (chunks > 0) chunks_per_thread_ = static_cast<int>(std::min<int64_t>(64, chunks));
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = std::min(n_threads, kMaxThreads);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) {
    absl::StatusOr<std::thread> t =
        StartThread([this, i] { WorkerLoop(i); }, strata::StrFormat("compute thread %d of %d", i + 1, n_threads_));
    if (!t.ok()) {
      // The started workers wait for calls that will not come: stop them before anyone relies on
      // the pool, which from here on runs every call on the caller alone.
      status_ = t.status();
      StopWorkers();
      workers_.clear();
      n_threads_ = 1;
      return;
    }
    workers_.push_back(std::move(*t));
  }
}

ThreadPool::~ThreadPool() { StopWorkers(); }

void ThreadPool::StopWorkers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_work_.notify_all();
  for (auto &t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t, int)> &fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t chunks = std::min<int64_t>({int64_t{chunks_per_thread_} * n_threads_, n / min_chunk, 0xffff});
  if (n_threads_ <= 1 || chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  const int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  Job job{&fn, n, chunk, static_cast<int>(chunks)};
  uint32_t gen;
  bool wake;
  {
    // Under mu_ so a worker about to sleep either sees the new generation or is counted in sleepers_.
    std::lock_guard<std::mutex> lk(mu_);
    job_.store(&job, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    gen = static_cast<uint32_t>(generation_.load(std::memory_order_relaxed) + 1);
    claim_.store(Claim(gen, static_cast<uint32_t>(chunks), 0), std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_work_.notify_all();
  RunChunks(gen, 0);
  for (int i = 0; i < spin_ && done_.load(std::memory_order_acquire) != job.chunks; ++i) CpuPause();
  if (done_.load(std::memory_order_acquire) != job.chunks) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == job.chunks; });
  }
}

void ThreadPool::RunChunks(uint32_t gen, int index) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t chunks = static_cast<uint32_t>(c >> 16) & 0xffff, next = static_cast<uint32_t>(c) & 0xffff;
    if (static_cast<uint32_t>(c >> 32) != gen || next >= chunks) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Chunk `next` of this call is claimed and not done, so the call has not returned: its job holds.
    const Job &job = *job_.load(std::memory_order_acquire);
    const int64_t begin = job.chunk * next, end = std::min(job.n, begin + job.chunk);
    (*job.fn)(begin, end, index);
    // Nothing of the job is read past this count: the one that completes the call frees it.
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int>(chunks)) {
      std::lock_guard<std::mutex> lk(mu_);  // the caller may be about to sleep on cv_done_
      cv_done_.notify_one();
    }
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < spin_ && generation_.load(std::memory_order_acquire) == seen; ++i) {
      CpuPause();
    }
    // The mutex only to sleep: a worker that saw the call while spinning goes straight to its
    // chunks. (Taking it on every call lined the workers up behind one another: the last worker of
    // a large pool took its first chunk long after the call began.)
    if (generation_.load(std::memory_order_acquire) == seen) {
      sleep_checks_.fetch_add(1, std::memory_order_relaxed);
      std::unique_lock<std::mutex> lk(mu_);
      if (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
        ++sleepers_;
        cv_work_.wait(lk, [&] {
          return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
        });
        --sleepers_;
      }
    }
    // stop_ is set before the generation moves (release), so a worker that saw the move sees it.
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    RunChunks(static_cast<uint32_t>(seen), index);
  }
}

}  // namespace strata
