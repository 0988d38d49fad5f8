// RAII owners of CUDA resources: device buffers, pinned host buffers, streams and events. Each is
// move-only, created by a factory that returns StatusOr (never throws or aborts), and releases its
// resource in the destructor; a moved-from or default object owns nothing and destroys harmlessly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "lib/util/status.h"

namespace strata::cuda {

// cudaMalloc and cudaHostAlloc calls made through DeviceBuffer / PinnedBuffer since the process
// started (all threads): tests check that steady-state decode makes none.
uint64_t AllocationCount();

// Device memory from cudaMalloc (256-byte aligned). Contents are uninitialised.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer &&o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  // MOE_ERR_NO_MEMORY when the device cannot hold `bytes`. Zero bytes gives an empty buffer.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  void *data() const { return ptr_; }
  template <typename T>
  T *as() const { return static_cast<T *>(ptr_); }
  size_t size() const { return size_; }
  void Reset();

 private:
  void *ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory from cudaHostAlloc: the source or target of asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer &&o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer &operator=(PinnedBuffer &&o) noexcept;
  PinnedBuffer(const PinnedBuffer &) = delete;
  PinnedBuffer &operator=(const PinnedBuffer &) = delete;

  // flags: cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocWriteCombined (for buffers the
  // host only writes and the device only reads: faster host-to-device copies), cudaHostAllocMapped
  // (kernels read and write it in place at device()).
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes, unsigned flags = cudaHostAllocDefault);

  void *data() const { return ptr_; }
  template <typename T>
  T *as() const { return static_cast<T *>(ptr_); }
  size_t size() const { return size_; }
  // The device's address of a buffer allocated with cudaHostAllocMapped (kernels read and write it
  // in place); the runtime's error otherwise.
  template <typename T>
  absl::StatusOr<T *> device() const {
    STRATA_ASSIGN_OR_RETURN(void *d, DeviceAddress());
    return static_cast<T *>(d);
  }
  void Reset();

 private:
  absl::StatusOr<void *> DeviceAddress() const;
  void *ptr_ = nullptr;
  size_t size_ = 0;
};

// A CUDA stream. Non-blocking streams do not synchronise with the legacy default stream, so copy
// and compute streams overlap.
class Stream {
 public:
  Stream() = default;
  ~Stream() { Reset(); }
  Stream(Stream &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream &operator=(Stream &&o) noexcept;
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;

  static absl::StatusOr<Stream> Create(bool non_blocking = true);
  cudaStream_t get() const { return s_; }
  // Waits for all work queued so far; returns the first asynchronous error it reports.
  absl::Status Synchronize() const;
  // Makes later work on this stream wait for `event` (recorded on another stream).
  absl::Status Wait(cudaEvent_t event) const;
  void Reset();

 private:
  cudaStream_t s_ = nullptr;
};

// A CUDA event: ordering between streams and, when created with timing, elapsed times.
class Event {
 public:
  Event() = default;
  ~Event() { Reset(); }
  Event(Event &&o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event &operator=(Event &&o) noexcept;
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;

  // Without timing the event is cheaper to record and wait on (cudaEventDisableTiming).
  static absl::StatusOr<Event> Create(bool timing = false);
  cudaEvent_t get() const { return e_; }
  absl::Status Record(cudaStream_t stream) const;
  absl::Status Synchronize() const;
  // Whether the work before the event's last record has finished (true for a never-recorded event).
  absl::StatusOr<bool> Done() const;
  // Milliseconds between two completed timing events.
  static absl::StatusOr<float> ElapsedMs(const Event &start, const Event &end);
  void Reset();

 private:
  cudaEvent_t e_ = nullptr;
};

// Work recorded from a stream and instantiated (cudaGraphExec_t): replayed with one launch.
class Graph {
 public:
  Graph() = default;
  ~Graph() { Reset(); }
  Graph(Graph &&o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  Graph &operator=(Graph &&o) noexcept;
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  // Starts recording the work queued on `stream` (which then runs nothing) until EndCapture. Only
  // this thread's unsafe calls (allocations, waits) are refused meanwhile.
  static absl::Status BeginCapture(cudaStream_t stream);
  // Ends the recording begun on `stream` and instantiates it. An error when anything queued or
  // called during the recording could not be recorded; the stream records nothing afterwards.
  // `nodes` (optional): the recording's node count.
  static absl::StatusOr<Graph> EndCapture(cudaStream_t stream, size_t *nodes = nullptr);
  absl::Status Launch(cudaStream_t stream) const;
  void Reset();

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// Asynchronous copies on `stream` (cudaMemcpyDefault: the direction follows from the pointers).
absl::Status CopyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);
// n copies on `stream`, host to device: in one cudaMemcpyBatchAsync while *batch holds (the driver
// may spread them over its copy engines; copies of ~1 MiB one by one lose their per-copy overhead),
// else one by one. A driver refusing the batch clears *batch, and these and later copies go one by one.
absl::Status CopyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n,
                            cudaStream_t stream, bool *batch);

// The driver's stream write of a 32-bit value (cuStreamWriteValue32, found through the runtime's
// driver entry points): `value` lands in device memory at dst once the stream's work before it has
// finished, its writes fenced before it, without the copy engines: a 4-byte copy behind a
// request's copies took the copy stream far longer (ColdCopier's trace). False where the driver
// has no such entry point or refuses the write (nothing is queued then; the caller copies instead).
bool StreamWriteValue32(uint32_t *dst, uint32_t value, cudaStream_t stream);

}  // namespace strata::cuda
