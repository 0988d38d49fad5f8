#include "backends/cuda/cpu_experts.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "lib/model/routing.h"
#include "lib/util/thread_pool.h"
#include "lib/util/thread_start.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

namespace strata::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The mapped words after the call record in box_: the answers ([0] decided, [1] done), then the
// timed-out words (kernels.h, CpuCallBox).
constexpr size_t kAnswerOff = (sizeof(CpuCall) + 15) / 16 * 16, kTimedOutOff = kAnswerOff + 16, kBoxBytes = kTimedOutOff + 16;

}  // namespace

absl::StatusOr<std::unique_ptr<CpuExperts>> CpuExperts::Create(const model::ModelWeights &w, const CpuExpertOptions &o,
                                                               int64_t max_rows, int n_expert_max,
                                                               const uint8_t *arena, const uint8_t *arena_dev,
                                                               size_t arena_bytes, double link_bytes_s,
                                                               double link_copy_s, cudaStream_t stream,
                                                               std::vector<model::ExpertWeights> calib) {
  if (max_rows <= 0 || n_expert_max <= 0 || arena == nullptr || arena_dev == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "CPU experts need selections, experts and a mapped host arena");
  }
  auto ce = std::unique_ptr<CpuExperts>(new CpuExperts());
  ce->w_ = &w;
  ce->mode_ = o.mode;
  ce->arena_ = arena;
  ce->arena_dev_ = arena_dev;
  ce->calib_ = std::move(calib);
  ce->arena_bytes_ = arena_bytes;
  ce->max_rows_ = max_rows;
  ce->n_expert_max_ = n_expert_max;
  ce->link_bytes_s_ = link_bytes_s;
  for (const auto &L : w.layers) {
    if (!L.experts.empty()) {
      ce->n_embd_ = L.experts[0].gate.cols;
      break;
    }
  }
  if (ce->n_embd_ <= 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "CPU experts: the model has no routed experts");
  const size_t rows_bytes = static_cast<size_t>(max_rows) * ce->n_embd_ * sizeof(float);
  STRATA_ASSIGN_OR_RETURN(ce->box_, PinnedBuffer::Allocate(kBoxBytes, cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(ce->sel_, PinnedBuffer::Allocate(max_rows * sizeof(int32_t), cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(ce->h_, PinnedBuffer::Allocate(rows_bytes, cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(ce->tab_, PinnedBuffer::Allocate(3 * n_expert_max * sizeof(void *), cudaHostAllocMapped));
  ce->job_views_.resize(n_expert_max);
  STRATA_ASSIGN_OR_RETURN(ce->skip_, PinnedBuffer::Allocate(n_expert_max, cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(ce->y_, PinnedBuffer::Allocate(rows_bytes, cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(ce->counters_, DeviceBuffer::Allocate(32));
  std::memset(ce->box_.data(), 0, kBoxBytes);
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(ce->counters_.data(), 0, 32));
  CpuCallBox &b = ce->dev_box_;
  STRATA_ASSIGN_OR_RETURN(uint8_t *box, ce->box_.device<uint8_t>());
  b.call = reinterpret_cast<CpuCall *>(box);
  b.answer = reinterpret_cast<const uint32_t *>(box + kAnswerOff);
  b.timed_out = reinterpret_cast<uint32_t *>(box + kTimedOutOff);
  STRATA_ASSIGN_OR_RETURN(b.sel, ce->sel_.device<int32_t>());
  STRATA_ASSIGN_OR_RETURN(b.h, ce->h_.device<float>());
  STRATA_ASSIGN_OR_RETURN(b.tab, ce->tab_.device<const void *>());
  b.next = ce->counters_.as<uint32_t>();
  b.waited_ns = reinterpret_cast<unsigned long long *>(ce->counters_.as<uint8_t>() + 16);
  STRATA_ASSIGN_OR_RETURN(ce->skip_dev_, ce->skip_.device<const uint8_t>());
  STRATA_ASSIGN_OR_RETURN(ce->y_dev_, ce->y_.device<float>());
  ce->xg_.assign(static_cast<size_t>(max_rows) * ce->n_embd_, 0.f);
  const tunables::Values &knobs = tunables::Get();
  ce->trace_ = knobs.cpu_experts_trace;
  // Jobs come once a layer (a few hundred microseconds apart in decode): the pool's threads spin
  // through the gaps (~1 ms) rather than sleep and be woken for every job.
  ce->cpu_ = std::make_unique<cpu::CpuBackend>(
      o.n_threads, o.q8_activations ? cpu::MatMulMode::kQ8Activations : cpu::MatMulMode::kExact,
      cpu::kernels::BestIsa(), 10 * ThreadPool::kSpinIterations);
  // A pool whose threads the host refused runs every job on the caller: say so rather than go slow.
  STRATA_RETURN_IF_ERROR(Annotate(ce->cpu_->pool().status(), "the CPU's share of cold experts"));
  if (ce->trace_) ce->cpu_->set_experts_ffn_times(&ce->calib_times_);
  STRATA_RETURN_IF_ERROR(ce->Calibrate());
  if (ce->trace_) ce->cpu_->set_experts_ffn_times(&ce->job_times_);  // the worker's from here on
  if (knobs.cpu_experts_wait_ms > 0) ce->wait_limit_ = std::chrono::milliseconds(knobs.cpu_experts_wait_ms);
  ce->dev_box_.timeout_ns = static_cast<uint64_t>(std::chrono::nanoseconds(ce->wait_limit_).count());
  STRATA_ASSIGN_OR_RETURN(ce->worker_, StartThread([p = ce.get()] { p->WorkerLoop(); }, "the CPU experts' worker"));
  STRATA_RETURN_IF_ERROR(ce->MeasureRoundTrip(stream));
  // The link side's latency a layer beyond its bytes: the request's round trip (the device asks, the
  // host answers) and a copy's own latency. Weighed without it, the link got too large a share: the
  // device hardly waited for the CPU's job, and a fixed cost set by hand decoded faster
  // (bench/README.md). STRATA_CPU_EXPERTS_LINK_US sets it instead of the measurement.
  ce->link_fixed_s_ = ce->round_trip_s_ + std::max(0.0, link_copy_s);
  if (knobs.cpu_experts_link_us >= 0) ce->link_fixed_s_ = 1e-6 * knobs.cpu_experts_link_us;
  return ce;
}

CpuExperts::~CpuExperts() {
  stop_.store(true, std::memory_order_relaxed);
  if (worker_.joinable()) worker_.join();
  if (trace_ && tr_.calls > 0) {
    unsigned long long waited[2] = {};
    (void)cudaMemcpy(waited, dev_box_.waited_ns, sizeof(waited), cudaMemcpyDeviceToHost);
    const double c = static_cast<double>(tr_.calls), us = 1e6;
    const double jobs = std::max<double>(1, static_cast<double>(tr_.jobs));
    LogDebug("cpu experts: %llu calls, %llu jobs; us per call: decide %.1f, the device waiting for the decision "
             "%.1f, the worker idle between calls %.1f; us per job: the job %.1f, the device waiting for it "
             "%.1f; rates: link %.1f GB/s + %.1f us a layer, CPU %.1f GB/s + %.1f us a job (token share %.2f), "
             "round trip %.1f us\n",
             static_cast<unsigned long long>(tr_.calls), static_cast<unsigned long long>(tr_.jobs),
             us * tr_.decide_s / c, 1e-3 * static_cast<double>(waited[0]) / c, us * tr_.between_s / c,
             us * tr_.job_s / jobs, 1e-3 * static_cast<double>(waited[1]) / jobs, link_bytes_s_ / 1e9,
             us * link_fixed_s_, cpu_bytes_s_.load() / 1e9, us * cpu_fixed_s_.load(), token_share_,
             us * round_trip_s_);
    for (const auto *ft : {&calib_times_, &job_times_}) {
      if (ft->calls == 0) continue;
      const double n = static_cast<double>(ft->calls);
      LogDebug("cpu experts: %s, %llu jobs; us per job: setup %.1f, gate and up %.1f, SwiGLU %.1f, down %.1f\n",
               ft == &calib_times_ ? "calibration" : "decode", static_cast<unsigned long long>(ft->calls),
               us * ft->setup_s / n, us * ft->gate_up_s / n, us * ft->act_s / n, us * ft->down_s / n);
    }
  }
}

// The CPU's cost on the model's own experts: jobs of 1 to 4 experts of one token, spread over the
// layers (each read once where the model has enough, so from memory as in decode), fit a fixed
// cost and a rate; jobs of eight tokens give the per-token share.
absl::Status CpuExperts::Calibrate() {
  std::vector<const model::ExpertWeights *> pick;
  for (const model::ExpertWeights &e : calib_) pick.push_back(&e);
  for (size_t l = 0; l < w_->layers.size() && calib_.empty(); ++l) {
    const auto &ex = w_->layers[l].experts;
    for (size_t x = (l * 7) % std::max<size_t>(ex.size(), 1), n = 0; n < 3 && x < ex.size(); x += 5, ++n) {
      if (!ex[x].input_major) pick.push_back(&ex[x]);
    }
  }
  float *x = xg_.data(), *y = y_.as<float>();
  uint32_t s = 12345;
  for (int64_t i = 0; i < 8 * n_embd_; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  // A job of n experts (the next ones picked, each read once where the model has enough) of t
  // tokens each; returns (seconds, bytes).
  size_t next = 0;
  // A slice of an expert: its first `ff` hidden units (gate and up rows, down columns: down keeps
  // its row stride and reads the first blocks of each row), for jobs far smaller than an expert.
  auto slice = [](const model::ExpertWeights &e, int64_t ff) {
    model::ExpertWeights s = e;
    s.gate.rows = s.up.rows = ff;
    s.down.cols = ff;
    const uint64_t down_row = static_cast<uint64_t>(ff / s.down.codec->block_elems) * s.down.codec->block_bytes;
    return std::make_pair(s, s.gate.nbytes() + s.up.nbytes() + down_row * static_cast<uint64_t>(s.down.rows));
  };
  // Whole experts, and slices of 256 hidden units where the codecs allow: the sizes of the jobs
  // spread over two orders of magnitude, so the fit tells the fixed cost from the rate whatever the
  // expert's size (a one-expert job of Mixtral's 99 MB experts is mostly rate).
  const model::ExpertWeights *e0 = pick.empty() ? nullptr : pick[0];
  const int64_t ff = 256;
  const bool sliceable = e0 != nullptr && e0->gate.rows > ff && ff % e0->down.codec->block_elems == 0 &&
                         e0->gate_bias.tensor == nullptr && e0->up_bias.tensor == nullptr &&
                         e0->swiglu_limit == 0.f;
  auto job = [&](int n, int64_t t, bool sliced) {
    std::vector<model::ExpertWeights> parts;
    std::vector<int64_t> first = {0};
    uint64_t bytes = 0;
    parts.reserve(n);
    for (int i = 0; i < n; ++i) {
      const model::ExpertWeights &e = *pick[next++ % pick.size()];
      if (sliced) {
        auto [s, b] = slice(e, ff);
        parts.push_back(s);
        bytes += b;
      } else {
        parts.push_back(e);
        bytes += e.nbytes();
      }
      first.push_back(first.back() + t);
    }
    std::vector<const model::ExpertWeights *> ew;
    for (const auto &p : parts) ew.push_back(&p);
    const auto t0 = Clock::now();
    cpu_->ExpertsFfn(ew.data(), n, first.data(), x, y, n_embd_);
    return std::make_pair(Seconds(t0, Clock::now()), static_cast<double>(bytes));
  };
  if (!pick.empty()) {
    job(1, 1, false);  // wakes the pool
    for (int round = 0; round < 2; ++round) {
      for (int n = 1; n <= 4; ++n) {
        for (bool sliced : {false, true}) {
          if (sliced && !sliceable) continue;
          const auto [secs, bytes] = job(n, 1, sliced);
          fit_.Add(bytes, secs);
          if (trace_) {
            LogDebug("cpu experts calibration: %d %s of one token, %.2f MiB: %.1f us (%.1f GB/s)\n", n,
                     sliced ? "slices" : "experts", bytes / (1 << 20), 1e6 * secs, bytes / secs / 1e9);
          }
        }
      }
    }
    fit_.HoldFixed();
    if (trace_) {
      LogDebug("cpu experts calibration: fit %.1f GB/s + %.1f us a job\n", fit_.rate() / 1e9,
               1e6 * fit_.fixed());
    }
    double share = 0;
    if (fit_.rate() > 0) {
      for (int i = 0; i < 3; ++i) {
        const auto [secs, bytes] = job(1, 8, false);
        share += std::max(0.0, ((secs - fit_.fixed()) * fit_.rate() / bytes - 1.0) / 7.0) / 3;
      }
    }
    token_share_ = share;
    cpu_bytes_s_ = fit_.rate();
    cpu_fixed_s_ = fit_.fixed();
  }
  return absl::OkStatus();
}

// The round trip of a call the worker answers at once (layer -1: no job), as a layer queues it:
// the call with one token's data, the wait for the decision (one flag copied), the wait for "done".
absl::Status CpuExperts::MeasureRoundTrip(cudaStream_t stream) {
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(256 + n_embd_ * sizeof(float)));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(dev.data(), 0, dev.size()));
  const auto *base = dev.as<uint8_t>();
  CpuCall c;
  c.layer = -1;
  c.k = 1;
  c.n_expert = 1;
  c.n_tok = 1;
  double best = 1.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(PostCpuCall(dev_box_, c, reinterpret_cast<const int32_t *>(base),
                                       reinterpret_cast<const float *>(base + 256), n_embd_,
                                       reinterpret_cast<const void *const *>(base + 64), stream));
    STRATA_RETURN_IF_ERROR(WaitCpuCall(dev_box_, 0, skip_dev_, dev.as<uint8_t>() + 128, 1, stream));
    STRATA_RETURN_IF_ERROR(WaitCpuCall(dev_box_, 1, nullptr, nullptr, 0, stream));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  STRATA_RETURN_IF_ERROR(TakeStatus());
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(dev_box_.waited_ns, 0, 2 * sizeof(unsigned long long)));  // not the model's
  round_trip_s_ = best;
  return absl::OkStatus();
}

absl::Status CpuExperts::TakeStatus() {
  // Asked at every download, the stream idle: one read of host memory unless a wait gave up.
  volatile uint32_t *to = reinterpret_cast<volatile uint32_t *>(box_.as<uint8_t>() + kTimedOutOff);
  if (to[0] == 0) return absl::OkStatus();
  const uint32_t stage = to[1], call = to[2], seen = to[3];
  failed_.store(true, std::memory_order_relaxed);
  to[0] = 0;  // later waits wait again: the worker answers every call at once from now on
  return Errorf(MOE_ERR_INTERNAL,
                "CPU experts: the device waited more than %.1f s for the CPU to %s call %u (answered up to %u; "
                "the worker %s, last at layer %d); the CPU's share is off from now on",
                std::chrono::duration<double>(wait_limit_).count(), stage == 0 ? "decide" : "finish", call, seen,
                working_.load(std::memory_order_relaxed) ? "inside a job" : "not in a job",
                job_layer_.load(std::memory_order_relaxed));
}

model::PlacementRates CpuExperts::rates() const {
  model::PlacementRates r;
  r.link_bytes_s = link_bytes_s_;
  r.cpu_bytes_s = cpu_bytes_s_.load(std::memory_order_relaxed);
  r.cpu_token_share = token_share_;
  r.cpu_fixed_s = cpu_fixed_s_.load(std::memory_order_relaxed);
  r.link_fixed_s = link_fixed_s_;
  return r;
}

absl::Status CpuExperts::Start(int l, int64_t n_tok, int k, int n_expert, const int32_t *sel, const float *h,
                               const GroupedExperts &tab, uint8_t *skip_dev, cudaStream_t stream) {
  if (l < 0 || l >= static_cast<int>(w_->layers.size()) || n_tok <= 0 || k <= 0 || n_tok * k > max_rows_ ||
      n_expert <= 0 || n_expert > n_expert_max_ || n_expert != static_cast<int>(w_->layers[l].experts.size())) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "CPU experts: layer %d, %lld tokens of %d selections over %d experts", l,
                  static_cast<long long>(n_tok), k, n_expert);
  }
  CpuCall c;
  c.layer = l;
  c.k = k;
  c.n_expert = n_expert;
  c.n_tok = n_tok;
  STRATA_RETURN_IF_ERROR(PostCpuCall(dev_box_, c, sel, h, n_embd_, tab.gate, stream, tab.up, tab.down));
  return WaitCpuCall(dev_box_, 0, skip_dev_, skip_dev, n_expert, stream);
}

absl::Status CpuExperts::Finish(const int32_t *plan, int n_max, const uint8_t *skip_dev, float *yg,
                                cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(WaitCpuCall(dev_box_, 1, nullptr, nullptr, 0, stream));
  return CopySkippedGroups(plan, n_max, skip_dev, y_dev_, yg, n_embd_, stream);
}

bool CpuExperts::Decide(const CpuCall &c) {
  uint8_t *skip = skip_.as<uint8_t>();
  std::memset(skip, 0, static_cast<size_t>(n_expert_max_));
  job_layer_.store(c.layer, std::memory_order_relaxed);
  if (failed_.load(std::memory_order_relaxed)) return false;
  // Only what Start accepted reaches here; a call outside it (the round trip's layer -1) has no job.
  if (c.layer < 0 || c.layer >= static_cast<int>(w_->layers.size()) || c.n_tok <= 0 || c.k <= 0 ||
      c.n_tok * c.k > max_rows_ || c.n_expert <= 0 || c.n_expert > n_expert_max_ ||
      c.n_expert != static_cast<int>(w_->layers[c.layer].experts.size())) {
    return false;
  }
  const int32_t *sel = sel_.as<int32_t>();
  const int64_t n = c.n_tok * c.k;
  for (int64_t i = 0; i < n; ++i) {
    if (sel[i] < 0 || sel[i] >= c.n_expert) return false;  // the device's grouping leaves it out; so does the CPU
  }
  const model::ExpertGroups g = model::GroupByExpert(sel, c.n_tok, c.k, c.n_expert);
  const auto *tab = tab_.as<const uint8_t *>();
  const auto &experts = w_->layers[c.layer].experts;
  auto in_arena = [&](const uint8_t *p, uint64_t bytes) {
    return p >= arena_dev_ && p < arena_dev_ + arena_bytes_ && bytes <= static_cast<uint64_t>(arena_dev_ + arena_bytes_ - p);
  };
  std::vector<model::ColdExpert> cold;
  for (size_t u = 0; u < g.used.size(); ++u) {
    const int x = g.used[u];
    const model::ExpertWeights &e = experts[x];
    const uint8_t *gate = tab[x], *up = tab[c.n_expert + x], *down = tab[2 * c.n_expert + x];
    // In VRAM (or a part not where the arena's bytes are): the device's.
    if (!in_arena(gate, e.gate.nbytes()) || !in_arena(up, e.up.nbytes()) || !in_arena(down, e.down.nbytes())) continue;
    if (e.input_major) continue;
    // The expert where the device reads it: the same bytes in host memory.
    model::ExpertWeights &v = job_views_[x];
    v = e;
    v.gate.data = arena_ + (gate - arena_dev_);
    v.up.data = arena_ + (up - arena_dev_);
    v.down.data = arena_ + (down - arena_dev_);
    cold.push_back({x, g.first[u + 1] - g.first[u], e.nbytes()});
  }
  std::vector<int> chosen;
  if (mode_ == CpuExpertMode::kAlways) {
    for (const model::ColdExpert &e : cold) chosen.push_back(e.expert);
  } else {
    chosen = model::ChooseCpuExperts(cold, rates());
  }
  if (chosen.empty()) return false;
  const model::PlacementRates r = rates();
  job_ew_.assign(g.used.size(), nullptr);
  job_first_ = g.first;
  job_x_ = 0;
  const float *h = h_.as<float>();
  size_t j = 0;
  for (size_t u = 0; u < g.used.size() && j < chosen.size(); ++u) {
    const int x = g.used[u];
    if (x != chosen[j]) continue;
    ++j;
    skip[x] = 1;
    job_ew_[u] = &job_views_[x];
    for (int64_t row = g.first[u]; row < g.first[u + 1]; ++row) {
      std::memcpy(xg_.data() + row * n_embd_, h + static_cast<int64_t>(g.idx[row]) * n_embd_, n_embd_ * sizeof(float));
    }
    const int64_t tokens = g.first[u + 1] - g.first[u];
    job_x_ += static_cast<double>(experts[x].nbytes()) *
              (1.0 + r.cpu_token_share * static_cast<double>(tokens - 1));
  }
  uses_.fetch_add(chosen.size(), std::memory_order_relaxed);
  return true;
}

void CpuExperts::WorkerLoop() {
  const volatile CpuCall *call = box_.as<CpuCall>();
  uint32_t *answer = reinterpret_cast<uint32_t *>(box_.as<uint8_t>() + kAnswerOff);
  uint32_t seen = 0;
  Clock::time_point last = Clock::now();
  BurstWait wait;  // layers call every few hundred microseconds in decode, none between steps
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint32_t seq = __atomic_load_n(&const_cast<const CpuCall *>(call)->seq, __ATOMIC_ACQUIRE);
    if (seq == seen) {
      wait.Idle();
      continue;
    }
    seen = seq;
    CpuCall c;
    c.layer = call->layer;
    c.k = call->k;
    c.n_expert = call->n_expert;
    c.n_tok = call->n_tok;
    const Clock::time_point t0 = Clock::now();
    const bool traced = trace_ && c.layer >= 0;  // the round trip's calls are not the model's
    if (traced && tr_.calls > 0) tr_.between_s += Seconds(last, t0);
    const bool job = Decide(c);
    __atomic_store_n(&answer[0], seen, __ATOMIC_RELEASE);
    const Clock::time_point t1 = Clock::now();
    if (job) {
      working_.store(true, std::memory_order_relaxed);
      cpu_->ExpertsFfn(job_ew_.data(), static_cast<int>(job_ew_.size()), job_first_.data(), xg_.data(),
                       y_.as<float>(), n_embd_);
      working_.store(false, std::memory_order_relaxed);
    }
    __atomic_store_n(&answer[1], seen, __ATOMIC_RELEASE);
    wait.Worked();
    last = Clock::now();
    if (job) {
      const double secs = Seconds(t1, last);
      fit_.Add(job_x_, secs);  // the cost model follows what the jobs take
      cpu_bytes_s_.store(fit_.rate(), std::memory_order_relaxed);
      cpu_fixed_s_.store(fit_.fixed(), std::memory_order_relaxed);
    }
    if (traced) {
      ++tr_.calls;
      tr_.jobs += job ? 1 : 0;
      tr_.decide_s += Seconds(t0, t1);
      if (job) tr_.job_s += Seconds(t1, last);
    }
  }
}

}  // namespace strata::cuda
