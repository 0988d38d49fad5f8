#include "backends/cuda/cold_copier.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "lib/util/thread_pool.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

namespace strata::cuda {

namespace {
// The device counters: next, done and want (uint32), then the waits' summed nanoseconds (uint64).
constexpr size_t kWaitedAt = 16, kCounterBytes = 24;
}  // namespace

size_t CoalesceCopies(void **dst, const void **src, size_t *size, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (k > 0 && static_cast<uint8_t *>(dst[k - 1]) + size[k - 1] == dst[i] &&
        static_cast<const uint8_t *>(src[k - 1]) + size[k - 1] == src[i]) {
      size[k - 1] += size[i];
      continue;
    }
    dst[k] = dst[i];
    src[k] = src[i];
    size[k] = size[i];
    ++k;
  }
  return k;
}

absl::StatusOr<std::unique_ptr<ColdCopier>> ColdCopier::Create(const uint8_t *arena, const uint8_t *arena_dev,
                                                                 size_t arena_bytes, cudaStream_t stream) {
  if (arena == nullptr || arena_dev == nullptr || arena_bytes == 0 || stream == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert copier: no mapped host arena or no stream");
  }
  std::unique_ptr<ColdCopier> c(new ColdCopier());
  c->arena_ = arena;
  c->arena_dev_ = arena_dev;
  c->arena_bytes_ = arena_bytes;
  STRATA_ASSIGN_OR_RETURN(c->ring_, PinnedBuffer::Allocate(kColdRing * sizeof(ColdRequest), cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(c->flags_, PinnedBuffer::Allocate(3 * sizeof(uint32_t), cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(c->numbers_, PinnedBuffer::Allocate(kColdRing * sizeof(uint32_t)));
  STRATA_ASSIGN_OR_RETURN(c->counters_, DeviceBuffer::Allocate(kCounterBytes));
  c->stream_ = stream;
  std::memset(c->ring_.data(), 0, kColdRing * sizeof(ColdRequest));
  std::memset(c->flags_.data(), 0, 3 * sizeof(uint32_t));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(c->counters_.data(), 0, kCounterBytes));
  uint32_t *ctr = c->counters_.as<uint32_t>();
  STRATA_ASSIGN_OR_RETURN(c->mb_.ring, c->ring_.device<ColdRequest>());
  c->mb_.next = ctr;
  c->mb_.done = ctr + 1;
  c->mb_.want = ctr + 2;
  STRATA_ASSIGN_OR_RETURN(c->mb_.timed_out, c->flags_.device<uint32_t>());
  const tunables::Values &knobs = tunables::Get();
  if (knobs.cuda_cold_wait_ms > 0) c->mb_.timeout_ns = static_cast<uint64_t>(knobs.cuda_cold_wait_ms) * 1000000;
  c->write_value_ = knobs.cold_copies_number != "copy";
  c->batch_ = knobs.cold_copies_batch;
  c->coalesce_ = knobs.cold_copies_coalesce;
  c->trace_ = knobs.cold_copies_trace;
  if (c->trace_) {
    c->mb_.waited_ns = reinterpret_cast<unsigned long long *>(c->counters_.as<uint8_t>() + kWaitedAt);
    STRATA_ASSIGN_OR_RETURN(c->base_, Event::Create(true));
    for (int i = 0; i < kColdRing; ++i) {
      STRATA_ASSIGN_OR_RETURN(c->start_[i], Event::Create(true));
      STRATA_ASSIGN_OR_RETURN(c->mid_[i], Event::Create(true));
      STRATA_ASSIGN_OR_RETURN(c->end_[i], Event::Create(true));
    }
  }
  c->thread_ = std::thread([p = c.get()] { p->Loop(); });
  return c;
}

ColdCopier::~ColdCopier() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
  (void)cudaStreamSynchronize(stream_);
  (void)cudaGetLastError();
  if (trace_) {
    const uint32_t served = served_.load();
    for (uint32_t q = retired_ + 1; q <= served; ++q) Retire(q);
    unsigned long long waited = 0;
    (void)cudaMemcpy(&waited, mb_.waited_ns, sizeof(waited), cudaMemcpyDeviceToHost);
    (void)cudaGetLastError();
    LogDebug("expert copies: %u requests, %llu experts, %.1f MiB; copy stream busy %.1f ms (%.1f GB/s), idle "
             "between requests %.1f ms; the compute stream waited %.1f ms\n",
             served, static_cast<unsigned long long>(copied_.load()), traced_bytes_ / 1048576.0, busy_ms_,
             busy_ms_ > 0 ? traced_bytes_ / (busy_ms_ * 1e6) : 0.0, idle_ms_, waited * 1e-6);
    const double n = fit_[0], d = n * fit_[3] - fit_[1] * fit_[1];
    if (served > 0 && n > 1 && d > 0) {
      const double slope = (n * fit_[4] - fit_[1] * fit_[2]) / d, at0 = (fit_[2] - slope * fit_[1]) / n;
      LogDebug("expert copies: issuing %.1f us a request on the host (its copies %.1f); a request's copies %.1f "
               "us + bytes at %.1f GB/s, its number %.1f us (%s)\n",
               issue_us_ / served, serve_us_ / served, at0 * 1e3, slope > 0 ? 1.0 / slope : 0.0, number_ms_ * 1e3 / served,
               write_value_ ? "written by the stream" : "copied");
    }
    if (idle_ms_ > 0) {
      // The layers the link waited longest before, in order of that wait.
      std::vector<int> order;
      for (int l = 0; l < kIdleLayers; ++l) {
        if (idle_layer_ms_[l] > 0) order.push_back(l);
      }
      std::sort(order.begin(), order.end(), [&](int a, int b) { return idle_layer_ms_[a] > idle_layer_ms_[b]; });
      std::string top;
      for (size_t j = 0; j < order.size() && j < 6; ++j) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%s%d %.1f", j > 0 ? ", " : "", order[j], idle_layer_ms_[order[j]]);
        top += buf;
      }
      LogDebug("expert copies: idle before a layer's own requests %.1f ms (%llu), before predictions %.1f ms "
               "(%llu), before a step's first request %.1f ms (%llu); by layer (ms): %s\n",
               idle_kind_ms_[1], static_cast<unsigned long long>(idle_kind_n_[1]), idle_kind_ms_[0],
               static_cast<unsigned long long>(idle_kind_n_[0]), idle_start_ms_,
               static_cast<unsigned long long>(idle_start_n_), top.c_str());
    }
    if (traced_copies_ > 0) {
      LogDebug("expert copies: %llu copies for %llu matrices (%s)\n",
               static_cast<unsigned long long>(traced_copies_), static_cast<unsigned long long>(traced_matrices_),
               coalesce_ ? "adjacent ones joined" : "one a matrix");
    }
  }
}

void ColdCopier::Retire(uint32_t seq) {
  const int i = seq % kColdRing;
  if (!end_[i].Synchronize().ok()) return;
  absl::StatusOr<float> t0 = Event::ElapsedMs(base_, start_[i]), t1 = Event::ElapsedMs(base_, end_[i]);
  absl::StatusOr<float> tm = Event::ElapsedMs(base_, mid_[i]);
  if (t0.ok() && t1.ok()) {
    busy_ms_ += *t1 - *t0;
    if (seq > 1) {
      const double idle = *t0 - last_end_ms_;
      idle_ms_ += idle;
      idle_kind_ms_[urgent_[i] != 0] += idle;
      ++idle_kind_n_[urgent_[i] != 0];
      if (layer_[i] >= 0 && layer_[i] < kIdleLayers) idle_layer_ms_[layer_[i]] += idle;
      if (layer_[i] < last_layer_) {  // a step's first request
        idle_start_ms_ += idle;
        ++idle_start_n_;
      }
    }
    last_layer_ = layer_[i];
    last_end_ms_ = *t1;
  }
  if (t0.ok() && tm.ok() && t1.ok() && bytes_[i] > 0) {
    const double x = bytes_[i] * 1e-6, y = *tm - *t0;
    fit_[0] += 1;
    fit_[1] += x;
    fit_[2] += y;
    fit_[3] += x * x;
    fit_[4] += x * y;
    number_ms_ += *t1 - *tm;
  }
  traced_bytes_ += bytes_[i];
  retired_ = seq;
}

absl::Status ColdCopier::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t *f = flags_.as<uint32_t>();
  if (err_.ok() && __atomic_load_n(f, __ATOMIC_ACQUIRE) != 0) {
    return Errorf(MOE_ERR_INTERNAL,
                  "expert copies: a layer waited more than %.1f s for its experts (request %u; %u had landed, %u "
                  "served)",
                  mb_.timeout_ns * 1e-9, f[1], f[2], served_.load(std::memory_order_relaxed));
  }
  return err_;
}

absl::Status ColdCopier::Serve(const ColdRequest &r, uint32_t seq) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(arena_dev_);
  if (r.n < 0 || r.n > kRouteMaxExperts) {
    return Errorf(MOE_ERR_INTERNAL, "expert copies: request %u names %d experts", seq, r.n);
  }
  void *dsts[3 * kRouteMaxExperts];
  const void *srcs[3 * kRouteMaxExperts];
  size_t sizes[3 * kRouteMaxExperts];
  int n = 0;
  for (int j = 0; j < r.n; ++j) {
    for (int m = 0; m < 3; ++m) {
      const uint64_t src = r.src[j][m], bytes = r.bytes[m];
      if (src < lo || bytes > arena_bytes_ || src - lo > arena_bytes_ - bytes) {
        return Errorf(MOE_ERR_INTERNAL, "expert copies: request %u (layer %d) names memory outside the arena", seq,
                      r.layer);
      }
      dsts[n] = reinterpret_cast<uint8_t *>(r.slots + static_cast<uint64_t>(j) * r.slot_bytes + r.off[m]);
      srcs[n] = arena_ + (src - lo);
      sizes[n] = bytes;
      ++n;
    }
  }
  const size_t matrices = static_cast<size_t>(n);
  const size_t copies = coalesce_ ? CoalesceCopies(dsts, srcs, sizes, matrices) : matrices;
  if (trace_) {
    traced_copies_ += copies;
    traced_matrices_ += matrices;
  }
  // One call for the request's copies (the driver may spread them over its copy engines).
  STRATA_RETURN_IF_ERROR(CopyBatchAsync(dsts, srcs, sizes, copies, stream_, &batch_));
  copied_.fetch_add(static_cast<uint64_t>(r.n), std::memory_order_relaxed);
  if (trace_) {
    bytes_[seq % kColdRing] = static_cast<uint64_t>(r.n) * (r.bytes[0] + r.bytes[1] + r.bytes[2]);
    layer_[seq % kColdRing] = r.layer;
    urgent_[seq % kColdRing] = r.urgent;
  }
  return absl::OkStatus();
}

void ColdCopier::Loop() {
  auto *ring = ring_.as<ColdRequest>();
  auto *numbers = numbers_.as<uint32_t>();
  uint32_t want = 1;
  BurstWait wait;
  while (!stop_.load(std::memory_order_relaxed)) {
    const ColdRequest &r = ring[want % kColdRing];
    if (__atomic_load_n(&r.seq, __ATOMIC_ACQUIRE) != want) {
      wait.Idle();
      continue;
    }
    if (trace_) {
      if (want > kColdRing) Retire(want - kColdRing);  // its events are about to be reused
      bytes_[want % kColdRing] = 0;
      if (want == 1) (void)base_.Record(stream_);
      (void)start_[want % kColdRing].Record(stream_);
    }
    const auto seen = trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    absl::Status st = Serve(r, want);
    if (trace_) {
      serve_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - seen).count();
      (void)mid_[want % kColdRing].Record(stream_);
    }
    // The outcome is published before the number goes out: whoever sees the number land sees it.
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (err_.ok()) err_ = st;
    }
    served_.store(want, std::memory_order_release);
    // The number goes out whatever happened, so no device wait is left hanging.
    // By the stream's own write where the driver takes it, else by a 4-byte copy.
    cudaError_t ce = cudaSuccess;
    if (!write_value_ || !StreamWriteValue32(const_cast<uint32_t *>(mb_.done), want, stream_)) {
      write_value_ = false;
      numbers[want % kColdRing] = want;
      ce = cudaMemcpyAsync(const_cast<uint32_t *>(mb_.done), numbers + want % kColdRing, sizeof(uint32_t),
                           cudaMemcpyHostToDevice, stream_);
    }
    if (ce != cudaSuccess) {
      std::lock_guard<std::mutex> lock(mu_);
      if (err_.ok()) err_ = Errorf(MOE_ERR_INTERNAL, "expert copies: %s", cudaGetErrorString(ce));
    }
    if (trace_) {
      (void)end_[want % kColdRing].Record(stream_);
      issue_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - seen).count();
    }
    ++want;
    wait.Worked();
  }
}

}  // namespace strata::cuda
