// Hybrid placement for the VRAM expert tier: routed experts the device does not hold, computed by
// the CPU from host RAM while the device computes the rest (lib/model/placement.h decides which).
//
// Per MoE layer on this path, queued on the compute stream after the routing (all of it can be
// recorded into the decode step's CUDA graph: kernels only, no host function):
//   1. a kernel writes the layer's selections, input rows and table of gate addresses to page-locked
//      host memory mapped for the device, then the call (kernels.h, PostCpuCall);
//   2. a worker thread polling for calls groups the selections as the device does, finds the cold
//      experts (table address in the mapped host arena), picks the CPU's share by the cost model,
//      writes their skip flags and answers "decided"; a kernel waiting for that answer copies the
//      flags to the device, which runs its grouped kernels (skipping those experts) while the
//      worker computes them;
//   3. after the grouped kernels a kernel waits for the worker's "done"; the CPU's rows (in mapped
//      memory) are copied into the grouped output, and the layer goes on as before.
// The CPU computes with CpuBackend::ExpertsFfn (its kernels and activation mode), so results are
// those of the CPU backend for those experts: close to the device's, not bit-identical.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "lib/model/placement.h"
#include "lib/model/weights.h"

namespace strata::cuda {

enum class CpuExpertMode {
  kOff,     // cold experts are always read over the link (bit-identical at any budget)
  kAuto,    // the cost model decides, per layer and per expert
  kAlways,  // every cold expert of every tiered layer runs on the CPU (tests, measurements)
};

struct CpuExpertOptions {
  CpuExpertMode mode = CpuExpertMode::kAuto;
  int n_threads = 0;  // CPU threads computing the experts; 0 = one per core
  bool q8_activations = false;
};

class CpuExperts {
  using Clock = std::chrono::steady_clock;

 public:
  // max_rows: the most selections (tokens x k) of one call; n_expert_max: the most experts of a
  // layer. arena / arena_dev: the host arena holding every expert and its device mapping. Measures
  // the CPU's expert rate on the model's own experts and the round trip of a call on `stream`.
  // link_bytes_s / link_copy_s: the link's copy rate, and one expert's copy time beyond its bytes
  // (the link side's latency a layer is that plus the round trip; STRATA_CPU_EXPERTS_LINK_US=N
  // sets it instead, a measuring knob).
  // `calib`: experts over the arena to calibrate on, where the model's own views hold no bytes (the
  // tiers' RAM slab: its slots' experts change as they move); empty: the model's experts.
  static absl::StatusOr<std::unique_ptr<CpuExperts>> Create(const model::ModelWeights &w, const CpuExpertOptions &o,
                                                            int64_t max_rows, int n_expert_max,
                                                            const uint8_t *arena, const uint8_t *arena_dev,
                                                            size_t arena_bytes, double link_bytes_s,
                                                            double link_copy_s, cudaStream_t stream,
                                                            std::vector<model::ExpertWeights> calib = {});
  ~CpuExperts();

  // Steps 1 and 2 above for layer l: sel (n_tok, k) and h (n_tok, n_embd) on the device, tab the
  // layer's device tables (gate, up and down addresses); skip_dev (n_expert bytes, device) receives
  // the flags. An expert whose three parts lie in the arena is cold; the CPU reads it where they lie.
  absl::Status Start(int l, int64_t n_tok, int k, int n_expert, const int32_t *sel, const float *h,
                     const GroupedExperts &tab, uint8_t *skip_dev, cudaStream_t stream);
  // Step 3: after the grouped kernels, the CPU's rows into yg (plan and n_max of GroupByExpert).
  absl::Status Finish(const int32_t *plan, int n_max, const uint8_t *skip_dev, float *yg, cudaStream_t stream);

  // A layer that waited longer than its limit for the worker (STRATA_CPU_EXPERTS_WAIT_MS, default
  // 10 s) went on without its answer: that error, once (the step fails); the CPU's share is then
  // off for good (failed()), and the worker answers any later call at once with no job.
  absl::Status TakeStatus();
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  CpuExpertMode mode() const { return mode_; }
  model::PlacementRates rates() const;
  // Seconds a layer on this path adds to the device's timeline (a call and its two answers).
  double round_trip_s() const { return round_trip_s_; }
  uint64_t uses() const { return uses_.load(std::memory_order_relaxed); }  // expert uses computed here
  bool tracing() const { return trace_; }  // STRATA_CPU_EXPERTS_TRACE=1

 private:
  CpuExperts() = default;
  // The worker's handling of call c: the skip flags written; true when a job was set up for it.
  bool Decide(const CpuCall &c);
  void WorkerLoop();
  absl::Status Calibrate();
  absl::Status MeasureRoundTrip(cudaStream_t stream);

  const model::ModelWeights *w_ = nullptr;
  CpuExpertMode mode_ = CpuExpertMode::kAuto;
  std::unique_ptr<cpu::CpuBackend> cpu_;
  const uint8_t *arena_ = nullptr, *arena_dev_ = nullptr;
  size_t arena_bytes_ = 0;
  int64_t max_rows_ = 0, n_embd_ = 0;
  int n_expert_max_ = 0;
  // Page-locked and mapped for the device: the call record, the answers and the timed-out words
  // (box_); the selections, input rows and gate addresses the device writes; the skip flags and the
  // rows the CPU computes, which it reads.
  PinnedBuffer box_, sel_, h_, tab_, skip_, y_;
  DeviceBuffer counters_;  // the calls' number, the waits' summed nanoseconds
  CpuCallBox dev_box_;     // the device's view of all of it
  const uint8_t *skip_dev_ = nullptr;  // skip_'s device address
  float *y_dev_ = nullptr;
  std::vector<float> xg_;  // the CPU's grouped input rows
  // The job the worker runs: ExpertsFfn over the groups (null: the device's).
  std::vector<const model::ExpertWeights *> job_ew_;
  std::vector<model::ExpertWeights> job_views_;  // the chosen experts' views over the arena
  std::vector<model::ExpertWeights> calib_;      // Create's `calib`
  std::vector<int64_t> job_first_;
  double job_x_ = 0;  // its one-token-equivalent bytes (CpuCostFit)
  model::CpuCostFit fit_;  // the worker's (and Calibrate's) only
  std::atomic<bool> stop_{false}, failed_{false}, working_{false};
  std::atomic<int> job_layer_{-1};  // the layer of the last call decided
  std::chrono::steady_clock::duration wait_limit_ = std::chrono::seconds(10);
  std::thread worker_;
  std::atomic<double> cpu_bytes_s_{0}, cpu_fixed_s_{0};
  double link_bytes_s_ = 0, link_fixed_s_ = 0, token_share_ = 0, round_trip_s_ = 0;
  std::atomic<uint64_t> uses_{0};
  // STRATA_CPU_EXPERTS_TRACE=1 (a diagnostic): each calibration job at open, and where a hybrid
  // layer's time goes, printed to stderr at destruction. Written by the worker, read at the end
  // (with the device's waits).
  bool trace_ = false;
  cpu::CpuBackend::ExpertsFfnTimes calib_times_, job_times_;  // calibration's jobs, decode's
  struct Trace {
    uint64_t calls = 0, jobs = 0;
    double decide_s = 0;   // deciding a call
    double job_s = 0;      // the jobs' ExpertsFfn
    double between_s = 0;  // from a call's "done" to the next call's arrival
  } tr_;
};

}  // namespace strata::cuda
