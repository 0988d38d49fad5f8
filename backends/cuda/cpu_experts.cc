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

namespace strata::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void CUDART_CB NoOp(void *) {}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuExperts>> CpuExperts::Create(const model::ModelWeights &w, const CpuExpertOptions &o,
                                                               int64_t max_rows, int n_expert_max,
                                                               const uint8_t *arena, const uint8_t *arena_dev,
                                                               size_t arena_bytes, double link_bytes_s,
                                                               cudaStream_t stream) {
  if (max_rows <= 0 || n_expert_max <= 0 || arena == nullptr || arena_dev == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "CPU experts need selections, experts and a mapped host arena");
  }
  auto ce = std::unique_ptr<CpuExperts>(new CpuExperts());
  ce->w_ = &w;
  ce->mode_ = o.mode;
  ce->arena_dev_ = arena_dev;
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
  STRATA_ASSIGN_OR_RETURN(ce->sel_, PinnedBuffer::Allocate(max_rows * sizeof(int32_t)));
  STRATA_ASSIGN_OR_RETURN(ce->h_, PinnedBuffer::Allocate(rows_bytes));
  STRATA_ASSIGN_OR_RETURN(ce->tab_, PinnedBuffer::Allocate(n_expert_max * sizeof(void *)));
  STRATA_ASSIGN_OR_RETURN(ce->skip_, PinnedBuffer::Allocate(n_expert_max));
  STRATA_ASSIGN_OR_RETURN(ce->y_, PinnedBuffer::Allocate(rows_bytes, cudaHostAllocMapped));
  void *y_dev = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&y_dev, ce->y_.data(), 0));
  ce->y_dev_ = static_cast<float *>(y_dev);
  ce->xg_.assign(static_cast<size_t>(max_rows) * ce->n_embd_, 0.f);
  // Jobs come once a layer (a few hundred microseconds apart in decode): the pool's threads spin
  // through the gaps (~1 ms) rather than sleep and be woken for every job.
  ce->cpu_ = std::make_unique<cpu::CpuBackend>(
      o.n_threads, o.q8_activations ? cpu::MatMulMode::kQ8Activations : cpu::MatMulMode::kExact,
      cpu::kernels::BestIsa(), 10 * ThreadPool::kSpinIterations);
  STRATA_RETURN_IF_ERROR(ce->Calibrate(stream));
  const char *trace = std::getenv("STRATA_CPU_EXPERTS_TRACE");
  ce->trace_ = trace != nullptr && trace[0] == '1';
  if (const char *ms = std::getenv("STRATA_CPU_EXPERTS_WAIT_MS"); ms != nullptr && std::atoll(ms) > 0) {
    ce->wait_limit_ = std::chrono::milliseconds(std::atoll(ms));
  }
  ce->worker_ = std::thread([p = ce.get()] { p->WorkerLoop(); });
  return ce;
}

CpuExperts::~CpuExperts() {
  if (trace_ && tr_.calls > 0) {
    const double c = static_cast<double>(tr_.calls), us = 1e6;
    std::fprintf(stderr,
                 "cpu experts: %llu calls, %llu jobs; us per call: decide %.1f, device %.1f, wait %.1f, "
                 "between %.1f; us per job %.1f; rates: link %.1f GB/s, CPU %.1f GB/s + %.1f us a job (token "
                 "share %.2f), round trip %.1f us\n",
                 static_cast<unsigned long long>(tr_.calls), static_cast<unsigned long long>(tr_.jobs),
                 us * tr_.decide_s / c, us * tr_.device_s / c, us * tr_.wait_s / c, us * tr_.between_s / c,
                 us * job_s_.load() / std::max<double>(1, static_cast<double>(tr_.jobs)), link_bytes_s_ / 1e9,
                 cpu_bytes_s_.load() / 1e9, us * cpu_fixed_s_.load(), token_share_, us * round_trip_s_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// The CPU's cost on the model's own experts: jobs of 1 to 4 experts of one token, spread over the
// layers (each read once where the model has enough, so from memory as in decode), fit a fixed
// cost and a rate; jobs of eight tokens give the per-token share. Then the host round trip, as
// the layer's copies and host functions queue it.
absl::Status CpuExperts::Calibrate(cudaStream_t stream) {
  std::vector<const model::ExpertWeights *> pick;
  for (size_t l = 0; l < w_->layers.size(); ++l) {
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
        }
      }
    }
    fit_.HoldFixed();
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
  // The round trip: three copies back, a host function, a copy out, a host function.
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(4096));
  double best = 1.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    for (int c = 0; c < 3; ++c) STRATA_RETURN_IF_ERROR(CopyAsync(sel_.data(), dev.data(), sizeof(int32_t), stream));
    STRATA_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, NoOp, nullptr));
    STRATA_RETURN_IF_ERROR(CopyAsync(dev.data(), skip_.data(), 1, stream));
    STRATA_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, NoOp, nullptr));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  round_trip_s_ = best;
  return absl::OkStatus();
}

absl::Status CpuExperts::TakeStatus() {
  // Asked at every download: the lock only once a wait has given up (it sets both under mu_).
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = std::move(err_);
  err_ = absl::OkStatus();
  return s;
}

model::PlacementRates CpuExperts::rates() const {
  model::PlacementRates r;
  r.link_bytes_s = link_bytes_s_;
  r.cpu_bytes_s = cpu_bytes_s_.load(std::memory_order_relaxed);
  r.cpu_token_share = token_share_;
  r.cpu_fixed_s = cpu_fixed_s_.load(std::memory_order_relaxed);
  return r;
}

absl::Status CpuExperts::Start(int l, int64_t n_tok, int k, int n_expert, const int32_t *sel, const float *h,
                               const void *const *gate_tab, uint8_t *skip_dev, cudaStream_t stream) {
  if (l < 0 || l >= static_cast<int>(w_->layers.size()) || n_tok <= 0 || k <= 0 || n_tok * k > max_rows_ ||
      n_expert <= 0 || n_expert > n_expert_max_ || n_expert != static_cast<int>(w_->layers[l].experts.size())) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "CPU experts: layer %d, %lld tokens of %d selections over %d experts", l,
                  static_cast<long long>(n_tok), k, n_expert);
  }
  std::unique_ptr<Call> &c = calls_[{l, n_tok, k}];
  if (c == nullptr) {
    c = std::make_unique<Call>();
    *c = Call{this, l, k, n_expert, n_tok};
  }
  STRATA_RETURN_IF_ERROR(CopyAsync(sel_.data(), sel, n_tok * k * sizeof(int32_t), stream));
  STRATA_RETURN_IF_ERROR(CopyAsync(h_.data(), h, n_tok * n_embd_ * sizeof(float), stream));
  STRATA_RETURN_IF_ERROR(CopyAsync(tab_.data(), gate_tab, n_expert * sizeof(void *), stream));
  STRATA_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, DecideFn, c.get()));
  return CopyAsync(skip_dev, skip_.data(), n_expert, stream);
}

absl::Status CpuExperts::Finish(const int32_t *plan, int n_max, const uint8_t *skip_dev, float *yg,
                                cudaStream_t stream) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, WaitFn, this));
  return CopySkippedGroups(plan, n_max, skip_dev, y_dev_, yg, n_embd_, stream);
}

void CUDART_CB CpuExperts::DecideFn(void *call) {
  const Call *c = static_cast<const Call *>(call);
  c->self->Decide(*c);
}

void CUDART_CB CpuExperts::WaitFn(void *self) {
  auto *ce = static_cast<CpuExperts *>(self);
  if (ce->failed_.load(std::memory_order_relaxed)) return;  // no job was posted (see DecideImpl)
  const Clock::time_point t0 = Clock::now();
  const uint64_t posted = ce->posted_.load(std::memory_order_relaxed);
  if (!SpinUntil([&] { return ce->done_.load(std::memory_order_acquire) >= posted; }, t0 + ce->wait_limit_)) {
    // The device goes on without the CPU's rows: the step fails at its download (TakeStatus), and
    // from now on no job is posted, so the device computes every expert itself.
    std::lock_guard<std::mutex> lock(ce->mu_);
    ce->failed_.store(true, std::memory_order_release);
    ce->err_ = Errorf(MOE_ERR_INTERNAL,
                      "CPU experts: layer %d waited more than %.1f s for the CPU's job (%llu posted, %llu done, "
                      "the worker %s); the CPU's share is off from now on",
                      ce->job_layer_, std::chrono::duration<double>(ce->wait_limit_).count(),
                      static_cast<unsigned long long>(posted),
                      static_cast<unsigned long long>(ce->done_.load(std::memory_order_relaxed)),
                      ce->working_.load(std::memory_order_relaxed) ? "inside the job" : "not running it");
  }
  if (ce->trace_) {
    Trace &t = ce->tr_;
    t.waited = Clock::now();
    t.device_s += Seconds(t.decided, t0);
    t.wait_s += Seconds(t0, t.waited);
  }
}

void CpuExperts::Decide(const Call &c) {
  if (!trace_) return DecideImpl(c);
  const Clock::time_point t0 = Clock::now();
  if (tr_.calls > 0) tr_.between_s += Seconds(tr_.waited, t0);
  const uint64_t posted = posted_.load(std::memory_order_relaxed);
  DecideImpl(c);
  tr_.decided = Clock::now();
  tr_.decide_s += Seconds(t0, tr_.decided);
  ++tr_.calls;
  if (posted_.load(std::memory_order_relaxed) != posted) ++tr_.jobs;
}

void CpuExperts::DecideImpl(const Call &c) {
  uint8_t *skip = skip_.as<uint8_t>();
  std::memset(skip, 0, c.n_expert);
  if (failed_.load(std::memory_order_relaxed)) return;
  const int32_t *sel = sel_.as<int32_t>();
  const int64_t n = c.n_tok * c.k;
  for (int64_t i = 0; i < n; ++i) {
    if (sel[i] < 0 || sel[i] >= c.n_expert) return;  // the device's grouping leaves it out; so does the CPU
  }
  const model::ExpertGroups g = model::GroupByExpert(sel, c.n_tok, c.k, c.n_expert);
  const auto *tab = tab_.as<const uint8_t *>();
  const auto &experts = w_->layers[c.layer].experts;
  std::vector<model::ColdExpert> cold;
  for (size_t u = 0; u < g.used.size(); ++u) {
    const int x = g.used[u];
    if (tab[x] < arena_dev_ || tab[x] >= arena_dev_ + arena_bytes_) continue;  // in VRAM
    if (experts[x].input_major) continue;
    cold.push_back({x, g.first[u + 1] - g.first[u], experts[x].nbytes()});
  }
  std::vector<int> chosen;
  if (mode_ == CpuExpertMode::kAlways) {
    for (const model::ColdExpert &e : cold) chosen.push_back(e.expert);
  } else {
    chosen = model::ChooseCpuExperts(cold, rates());
  }
  if (chosen.empty()) return;
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
    job_ew_[u] = &experts[x];
    for (int64_t row = g.first[u]; row < g.first[u + 1]; ++row) {
      std::memcpy(xg_.data() + row * n_embd_, h + static_cast<int64_t>(g.idx[row]) * n_embd_, n_embd_ * sizeof(float));
    }
    const int64_t tokens = g.first[u + 1] - g.first[u];
    job_x_ += static_cast<double>(experts[x].nbytes()) *
              (1.0 + r.cpu_token_share * static_cast<double>(tokens - 1));
  }
  uses_.fetch_add(chosen.size(), std::memory_order_relaxed);
  job_layer_ = c.layer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

void CpuExperts::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    // Layers come every few hundred microseconds in decode: spin a while before sleeping.
    for (int i = 0; i < 10 * ThreadPool::kSpinIterations && posted_.load(std::memory_order_acquire) == seen; ++i) {
      CpuPause();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || posted_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
    }
    seen = posted_.load(std::memory_order_acquire);
    const auto t0 = Clock::now();
    working_.store(true, std::memory_order_relaxed);
    cpu_->ExpertsFfn(job_ew_.data(), static_cast<int>(job_ew_.size()), job_first_.data(), xg_.data(),
                     y_.as<float>(), n_embd_);
    working_.store(false, std::memory_order_relaxed);
    const double secs = Seconds(t0, Clock::now());
    job_s_.store(job_s_.load(std::memory_order_relaxed) + secs, std::memory_order_relaxed);
    fit_.Add(job_x_, secs);  // the cost model follows what the jobs take
    cpu_bytes_s_.store(fit_.rate(), std::memory_order_relaxed);
    cpu_fixed_s_.store(fit_.fixed(), std::memory_order_relaxed);
    done_.store(seen, std::memory_order_release);
  }
}

}  // namespace strata::cuda
