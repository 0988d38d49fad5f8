// CudaBackend's decode steps: the bracket (BeginStep, EndStep), graphs recorded and replayed per
// step key and path set, the host round trips that keep a step from being recorded, and the step's
// diagnostics (profile, stamps). A key is recorded only after a watched step of it stayed clean.
#include "backends/cuda/cuda_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "lib/util/log.h"

namespace strata::cuda {

std::string CudaBackend::PathString(const std::vector<char> &hybrid_on, const std::vector<char> &copies_on) {
  std::string set(hybrid_on.size(), '\0');
  for (size_t l = 0; l < set.size(); ++l) set[l] = static_cast<char>((hybrid_on[l] ? 1 : 0) | (copies_on[l] ? 2 : 0));
  return set;
}

uint32_t CudaBackend::AddPathSet(const std::string &set) {
  if (path_sets_.size() >= kMaxPathSets) {  // paths that keep moving: the old sets' graphs go
    ReadStamps();  // before its graph goes
    graphs_.clear();
    clean_.clear();
    refused_.clear();
    path_sets_.clear();
    paths_ = UINT32_MAX;  // none of the new sets: the caller's set is a change
  }
  path_sets_.push_back(set);
  return static_cast<uint32_t>(path_sets_.size() - 1);
}

bool CudaBackend::Recorded(int64_t n_tok, uint32_t paths) const {
  for (const auto &[k, g] : graphs_) {
    if (k.step.n_tok == n_tok && k.paths == paths) return true;
  }
  return false;
}

CudaBackend::Profile::Profile(CudaBackend *be, const char *op)
    : be_(be->profile_ ? be : nullptr), stamp_(be->stamps_.data() != nullptr ? be : nullptr), op_(op) {
  if (be_ != nullptr && be_->profile_depth_++ == 0) t0_ = std::chrono::steady_clock::now();
  if (stamp_ != nullptr) ++stamp_->stamp_depth_;
}

CudaBackend::Profile::~Profile() {
  if (stamp_ != nullptr && --stamp_->stamp_depth_ == 0) stamp_->Stamp(op_);
  if (be_ == nullptr || --be_->profile_depth_ > 0) return;  // only the outermost operation is timed
  (void)be_->stream_.Synchronize();
  auto &row = be_->profile_table_[op_];
  row.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  ++row.second;
}

void CudaBackend::FinishHist(const std::vector<std::pair<int, int64_t>> &hist) {
  if (hist.empty() || !Note(step_hist_done_.Record(stream_.get()))) return;
  step_hist_landed_ = false;
  for (const auto &[l, rows] : hist) {
    tables_[l].hist_rows = rows;
    tables_[l].hist_step = true;
  }
}

absl::StatusOr<bool> CudaBackend::HistLanded(LayerTable &t) {
  if (!t.hist_step) return t.hist_done.Done();
  if (!step_hist_landed_) {
    STRATA_ASSIGN_OR_RETURN(step_hist_landed_, step_hist_done_.Done());
  }
  return step_hist_landed_;
}

absl::Status CudaBackend::HostRoundTrip(const char *what, bool growth) {
  if (bracket_ == Bracket::kWatch && step_clean_ && graph_trace_) {
    LogDebug("cuda graphs: step %lld %s: %s\n", static_cast<long long>(steps_ - 1),
             growth ? "grew" : "not clean", what);
  }
  if (bracket_ == Bracket::kWatch && !growth) step_clean_ = false;
  if (bracket_ == Bracket::kCapture) return Errorf(MOE_ERR_INTERNAL, "%s inside a recorded decode step", what);
  return absl::OkStatus();
}

void CudaBackend::Stamp(const char *name) {
  if (stamps_.data() == nullptr || bracket_ != Bracket::kCapture || stamp_names_.size() >= kMaxStamps) return;
  if (Note(cuda::Stamp(stamps_.as<unsigned long long>() + stamp_names_.size(), stream_.get()))) {
    stamp_names_.push_back(name);
  }
}

void CudaBackend::ReadStamps() {
  const std::vector<const char *> *names = std::exchange(stamped_, nullptr);
  if (names == nullptr || names->size() < 2 || !stream_.Synchronize().ok()) return;
  std::vector<unsigned long long> t(names->size());
  if (cudaMemcpy(t.data(), stamps_.data(), t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost) != cudaSuccess) return;
  for (size_t i = 1; i < t.size(); ++i) {
    auto &row = stamp_table_[(*names)[i]];
    row.first += 1e-9 * static_cast<double>(t[i] - t[i - 1]);
    ++row.second;
  }
  ++stamped_steps_;
}

void CudaBackend::TimeStep(const model::StepKey &key) {
  const auto now = std::chrono::steady_clock::now();
  if (last_n_tok_ == key.n_tok && !host_batch_since_) {
    const double dt = std::chrono::duration<double>(now - last_begin_).count();
    if (last_mode_ == StepMode::kReplay) {
      replay_s_ = replay_s_ > 0 ? 0.875 * replay_s_ + 0.125 * dt : dt;
    } else if (last_mode_ == StepMode::kEager) {
      eager_s_ = dt;
    } else if (last_mode_ == StepMode::kCapture && replay_s_ > 0 && eager_s_ > 0) {
      const double cost = std::max(0.0, eager_s_ + dt - 2 * replay_s_);
      record_s_ = record_s_ > 0 ? 0.5 * record_s_ + 0.5 * cost : cost;
    }
  }
  last_begin_ = now;
  last_n_tok_ = key.n_tok;
  host_batch_since_ = false;
}

model::Backend::StepMode CudaBackend::BeginStep(const model::StepKey &key) {
  const auto t0 = std::chrono::steady_clock::now();
  TimeStep(key);
  if (tables_dirty_ && bracket_ == Bracket::kNone) FlushTables();  // a tier's moves since the last step
  last_mode_ = BeginStepImpl(key);
  const auto t1 = std::chrono::steady_clock::now();
  if (host_trace_ && last_mode_ == StepMode::kReplay && down_end_ != std::chrono::steady_clock::time_point{}) {
    host_s_[0] += std::chrono::duration<double>(t0 - down_end_).count();
    host_s_[1] += std::chrono::duration<double>(launch_t0_ - t0).count();
    host_s_[2] += std::chrono::duration<double>(t1 - launch_t0_).count();
    host_s_[4] += host_part_s_[0];
    host_s_[5] += host_part_s_[1];
    ++host_n_;
    host_step_ = true;
  }
  return last_mode_;
}

model::Backend::StepMode CudaBackend::BeginStepImpl(const model::StepKey &key) {
  // A replayed step queues its graph here and has no EndStep: the bracket closes at the next step.
  if (profiler_step_ >= 0 && steps_ == profiler_step_ + 1) (void)cudaProfilerStop();
  if (steps_++ == profiler_step_) {
    (void)cudaProfilerStart();
    LogDebug("strata: profiler on for step %lld\n", static_cast<long long>(profiler_step_));
  }
  pf_layer_ = -1;  // a prediction is for the step that made it
  if (stamped_ != nullptr) ReadStamps();
  if (copier_ != nullptr && err_.ok()) Note(copier_->status());
  if (!err_.ok() || !use_graphs_ || profile_ || bracket_ != Bracket::kNone) return StepMode::kEager;
  if (external_tables_ && hist_dev_ != nullptr) {
    // The tiers' tables with the CPU's share: the last step's counts, then the step's paths.
    const auto t0 = host_trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    for (size_t l = 0; l < tables_.size(); ++l) {
      if (tables_[l].ok && !Note(UpdateTierLayer(static_cast<int>(l)))) return StepMode::kEager;
    }
    const auto t1 = host_trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    UpdatePaths(key.n_tok);
    if (host_trace_) {
      host_part_s_[0] = std::chrono::duration<double>(t1 - t0).count();
      host_part_s_[1] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
  }
  step_key_ = GraphKey{key, paths_};
  step_hist_.clear();
  if (auto g = graphs_.find(step_key_); g != graphs_.end()) {
    if (host_trace_) launch_t0_ = std::chrono::steady_clock::now();
    if (Note(g->second.exec.Launch(stream_.get()))) {
      if (stamps_.data() != nullptr) stamped_ = &g->second.stamps;
      ++graph_replays_;
      g->second.used = steps_;
      FinishHist(g->second.hist);
    }
    return StepMode::kReplay;
  }
  if (clean_.count(step_key_) != 0 && refused_.count(step_key_) == 0 && Graph::BeginCapture(stream_.get()).ok()) {
    if (graph_trace_) LogDebug("cuda graphs: step %lld recorded (paths %u)\n", static_cast<long long>(steps_ - 1), paths_);
    capture_t0_ = std::chrono::steady_clock::now();
    bracket_ = Bracket::kCapture;
    stamp_names_.clear();
    Stamp("step start");
    return StepMode::kCapture;
  }
  (void)cudaGetLastError();
  if (graph_trace_) LogDebug("cuda graphs: step %lld watched (paths %u)\n", static_cast<long long>(steps_ - 1), paths_);
  bracket_ = Bracket::kWatch;
  step_clean_ = true;
  return StepMode::kEager;
}

absl::Status CudaBackend::EndStep() {
  if (steps_ - 1 == profiler_step_) (void)cudaProfilerStop();
  const Bracket b = bracket_;
  if (b == Bracket::kCapture) Stamp("step end");
  bracket_ = Bracket::kNone;
  if (b == Bracket::kWatch) {
    if (step_clean_ && err_.ok()) clean_.insert(step_key_);
    FinishHist(step_hist_);
    return absl::OkStatus();
  }
  if (b != Bracket::kCapture) return absl::OkStatus();
  const auto t_end = std::chrono::steady_clock::now();
  size_t nodes = 0;
  absl::StatusOr<Graph> g = Graph::EndCapture(stream_.get(), graph_trace_ ? &nodes : nullptr);
  if (graph_trace_) {
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    LogDebug("cuda graphs: step %lld: %zu nodes, %.2f ms recording, %.2f ms instantiating\n",
             static_cast<long long>(steps_ - 1), nodes, ms(capture_t0_, t_end),
             ms(t_end, std::chrono::steady_clock::now()));
  }
  if (!g.ok() || !err_.ok()) {
    // Nothing ran: the caller runs the step again outside a bracket. This key is not recorded again.
    absl::Status why = !err_.ok() ? err_ : g.status();
    if (graph_trace_) {
      LogDebug("cuda graphs: step %lld not recorded: %s\n", static_cast<long long>(steps_ - 1),
               std::string(why.message()).c_str());
    }
    err_ = absl::OkStatus();
    refused_.insert(step_key_);
    step_hist_.clear();
    return Annotate(why, "recording a decode step");
  }
  if (absl::Status launched = g->Launch(stream_.get()); !launched.ok()) {
    refused_.insert(step_key_);  // as above: the caller runs the step outside a bracket
    step_hist_.clear();
    return Annotate(launched, "launching a recorded decode step");
  }
  if (graphs_.size() >= kMaxGraphs) {
    graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(),
                                   [](const auto &a, const auto &b) { return a.second.used < b.second.used; }));
  }
  StepGraph &sg = graphs_[step_key_];
  sg.used = steps_;
  sg.exec = std::move(*g);
  sg.hist = step_hist_;
  sg.stamps = stamp_names_;
  if (stamps_.data() != nullptr) stamped_ = &sg.stamps;
  ++graph_captures_;
  FinishHist(step_hist_);
  return absl::OkStatus();
}

}  // namespace strata::cuda
