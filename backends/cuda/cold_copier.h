// The host half of moving cold experts by the copy engines (kernels.h, PlanColdCopies): a thread
// that serves the device's requests in order. For request n it queues, on the given stream, the
// copies of each expert's matrices (from the page-locked host arena into the request's VRAM slots;
// one cudaMemcpyBatchAsync where the driver takes it), then n into the device's `done` counter,
// which WaitColdCopies polls: written by the stream itself (StreamWriteValue32), or by a 4-byte
// copy where the driver refuses that. The copy engines then move the bytes while the compute stream
// runs the layer before.
//
// The stream must never wait on the device for work queued after a WaitColdCopies (the wait would
// then wait for itself). It should be created next to the compute stream: the driver spreads
// streams over a few hardware queues in the order they are created, and a stream sharing the
// compute stream's queue would see its copies queued behind the compute stream's wait (measured:
// copies never landed). Two contexts' streams can pair that way too (more streams than the
// driver's queues, CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), so the CUDA backend gives a copier
// to one context of the process at a time; the others read their cold experts in place.
//
// The thread spins while requests come (a decode layer posts two every ~0.3 ms) and sleeps in
// naps (50 us, doubling up to 1 ms: BurstWait) after 50 ms without one, so an idle context costs
// no core.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"

namespace strata::cuda {

// Joins copies i and i + 1 of the n (dst, src, size) where both ends meet (dst[i] + size[i] ==
// dst[i + 1] and the same for src), in place, in order; returns how many are left. A packed GGUF
// (`strata pack`) keeps an expert's gate|up|down adjacent, as a VRAM slot does: one copy an expert
// then, and one for experts adjacent in both.
size_t CoalesceCopies(void **dst, const void **src, size_t *size, size_t n);

class ColdCopier {
 public:
  // arena (host) / arena_dev (its device mapping): the page-locked host memory every requested
  // expert lies in, arena_bytes long. MOE_ERR_OUT_OF_MEMORY where the mailbox cannot be allocated.
  static absl::StatusOr<std::unique_ptr<ColdCopier>> Create(const uint8_t *arena, const uint8_t *arena_dev,
                                                            size_t arena_bytes, cudaStream_t stream);
  ~ColdCopier();
  ColdCopier(const ColdCopier &) = delete;
  ColdCopier &operator=(const ColdCopier &) = delete;

  const ColdMailbox &mailbox() const { return mb_; }
  // OK, or the first failure: a copy the runtime refused, a request naming memory outside the
  // arena (nothing is copied for it), or a device wait that gave up. Results of the steps since
  // are not to be trusted.
  absl::Status status() const;
  uint64_t experts_copied() const { return copied_.load(std::memory_order_relaxed); }
  uint32_t served() const { return served_.load(std::memory_order_acquire); }  // the last request served

 private:
  ColdCopier() = default;
  void Loop();
  void Retire(uint32_t seq);  // STRATA_COLD_COPIES_TRACE=1: adds request seq's timing events to the sums
  absl::Status Serve(const ColdRequest &r, uint32_t seq);

  const uint8_t *arena_ = nullptr, *arena_dev_ = nullptr;
  size_t arena_bytes_ = 0;
  PinnedBuffer ring_;     // kColdRing requests, mapped: written by the device
  PinnedBuffer flags_;    // the timed-out flag and what the wait saw, mapped
  PinnedBuffer numbers_;  // kColdRing request numbers, the sources of copies into `done` (see write_value_)
  DeviceBuffer counters_;  // next, done, want; the waits' summed nanoseconds (traced)
  cudaStream_t stream_ = nullptr;
  ColdMailbox mb_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> copied_{0};
  std::atomic<uint32_t> served_{0};  // the last request served
  bool trace_ = false;
  // A request's copies in one cudaMemcpyBatchAsync (faster than one cudaMemcpyAsync a matrix:
  // bench/link_overlap_bench); STRATA_COLD_COPIES_BATCH=0 copies one by
  // one, as does a driver that refuses the batch. The copier's thread alone reads it after Create.
  bool batch_ = true;
  // A request's adjacent copies joined (CoalesceCopies); STRATA_COLD_COPIES_COALESCE=0 issues them
  // one a matrix (a measuring knob).
  bool coalesce_ = true;
  // The number into `done` by the stream's write (StreamWriteValue32) while it holds, else by a
  // copy; STRATA_COLD_COPIES_NUMBER=copy always copies (a measuring knob). The thread alone reads it.
  bool write_value_ = true;
  // STRATA_COLD_COPIES_TRACE=1: timing events around each request's copies on the stream, read a
  // ring later (a request's start is when the stream reached it: the end of the one before, or
  // later when the copier issued it later), and the device's summed waits, printed at the end.
  // Also: the host's time to issue a request, and each request's copies (start to mid) fitted as a
  // fixed time plus bytes over a rate.
  Event base_, start_[kColdRing], mid_[kColdRing], end_[kColdRing];
  uint64_t bytes_[kColdRing] = {};
  int32_t layer_[kColdRing] = {}, urgent_[kColdRing] = {};  // each request's, kept for Retire
  // Idle time before requests, by kind (a prediction's, a layer's own) and by layer (kIdleLayers
  // at most): where in a step the link waits for work.
  static constexpr int kIdleLayers = 256;
  double idle_kind_ms_[2] = {}, idle_layer_ms_[kIdleLayers] = {};
  uint64_t idle_kind_n_[2] = {}, idle_start_n_ = 0;
  double idle_start_ms_ = 0;  // before a step's first request (one for a layer below the last's)
  int32_t last_layer_ = 0;
  uint32_t retired_ = 0;
  double busy_ms_ = 0, idle_ms_ = 0, last_end_ms_ = 0, issue_us_ = 0, serve_us_ = 0, number_ms_ = 0;
  double fit_[5] = {};  // n, sum x, sum y, sum xx, sum xy (x: MB, y: ms)
  uint64_t traced_copies_ = 0, traced_matrices_ = 0;  // the copies issued, and the matrices they moved
  uint64_t traced_bytes_ = 0;
  mutable std::mutex mu_;
  absl::Status err_;
};

}  // namespace strata::cuda
