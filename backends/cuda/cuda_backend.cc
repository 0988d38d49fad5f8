// CudaBackend: weight adoption (one copy of the host arena, float32 copies of matrices without a
// device kernel, one packed buffer of vectors), pointer resolution from host weight addresses to
// device ones, and each Backend operation as kernel-layer launches on one stream.
#include "backends/cuda/cuda_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "lib/model/placement.h"
#include "lib/quant/codec.h"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

// Device memory handed to the forward pass (activations, KV caches), zero-filled.
class VramBuffer final : public model::Buffer {
 public:
  explicit VramBuffer(DeviceBuffer b) : b_(std::move(b)) {
    data_ = b_.data();
    bytes_ = b_.size();
  }

 private:
  DeviceBuffer b_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::ModelWeights &w, const uint8_t *arena,
                                                                 size_t arena_bytes, uint64_t expert_vram_bytes,
                                                                 int n_min_slots, const CpuExpertOptions &cpu,
                                                                 bool q8_activations,
                                                                 const std::vector<model::HotExpert> &hot,
                                                                 size_t hot_max, const BackendChoices &choices) {
  if (DeviceCount() <= 0) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "no CUDA device");
  auto be = std::unique_ptr<CudaBackend>(new CudaBackend());
  const tunables::Values &knobs = tunables::Get();
  be->profile_ = knobs.cuda_profile;
  if (knobs.cuda_stamps) {
    STRATA_ASSIGN_OR_RETURN(be->stamps_, DeviceBuffer::Allocate(kMaxStamps * sizeof(unsigned long long)));
  }
  be->use_graphs_ = choices.graphs.value_or(knobs.cuda_graphs);
  be->cold_copies_choice_ = choices.cold_copies;
  be->host_trace_ = knobs.cuda_host_trace;
  be->graph_trace_ = knobs.cuda_graph_trace;
  be->paths_alternate_ = std::max<int64_t>(0, knobs.cuda_paths_alternate);
  be->profiler_step_ = knobs.cuda_profiler_step;
  be->q8_ = q8_activations;
  be->promotion_margin_ = knobs.cuda_promotion_margin != 0;
  if (knobs.cuda_promotion_margin > 0) be->decode_margin_z_ = knobs.cuda_promotion_margin;
  be->prompt_promote_ = knobs.cuda_prompt_promote;
  be->batch_copies_ = knobs.cold_copies_batch;
  STRATA_ASSIGN_OR_RETURN(be->stream_, Stream::Create());
  STRATA_ASSIGN_OR_RETURN(be->copy_stream_, Stream::Create());
  STRATA_ASSIGN_OR_RETURN(be->up_done_, Event::Create());
  STRATA_ASSIGN_OR_RETURN(be->blas_, Blas::Create(Blas::Compute::kF32));
  STRATA_ASSIGN_OR_RETURN(be->ring_, PinnedBuffer::Allocate(kRingSegment * kRingSegments));
  for (Event &e : be->ring_done_) {
    STRATA_ASSIGN_OR_RETURN(e, Event::Create());
  }
  STRATA_RETURN_IF_ERROR(be->Adopt(w, arena, arena_bytes, expert_vram_bytes, n_min_slots));
  STRATA_RETURN_IF_ERROR(be->BuildTables(w));
  STRATA_RETURN_IF_ERROR(be->WarmUpBlas());
  const bool any_table =
      std::any_of(be->tables_.begin(), be->tables_.end(), [](const LayerTable &t) { return t.ok; });
  if (cpu.mode != CpuExpertMode::kOff && !be->slots_.empty() && be->arena_dev_ != nullptr && any_table) {
    int n_expert_max = 0;
    for (const LayerTable &t : be->tables_) n_expert_max = std::max(n_expert_max, t.ge.n_expert);
    absl::Status st = be->StartCpuExperts(w, cpu, n_expert_max);
    // The path is an optimisation under auto: without it the GPU runs every miss, as with off.
    if (!st.ok() && cpu.mode == CpuExpertMode::kAlways) return Annotate(st, "setting up CPU experts");
    if (!st.ok()) {
      std::fprintf(stderr, "strata: CPU experts off: %s\n", std::string(st.message()).c_str());
      be->cpu_experts_.reset();
    }
    // With the copy engines on offer as well, auto times the two ways (model::RegimeProbe).
    // STRATA_CUDA_REGIME_PROBE=0: the per-layer cost model alone, as without the copier (a
    // measuring knob).
    if (be->cpu_experts_ != nullptr && be->copier_ != nullptr && cpu.mode == CpuExpertMode::kAuto &&
        knobs.cuda_regime_probe) {
      be->regime_ = std::make_unique<model::RegimeProbe>();
    }
  }
  // After the link's measurements, which copy into the slots.
  STRATA_RETURN_IF_ERROR(be->FillAtOpen(hot, hot_max));
  return be;
}

absl::Status CudaBackend::WarmUpBlas() {
  // cuBLASLt sets itself up at its first product (tens of milliseconds), which would otherwise land in
  // the first prompt's first layer (its float32 router): one small product here, at open.
  constexpr int64_t kRows = 64, kCols = 64, kTok = 32;
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer w, DeviceBuffer::Allocate((kRows + kTok) * kCols * sizeof(float) +
                                                                 kRows * kTok * sizeof(float)));
  float *wf = w.as<float>(), *x = wf + kRows * kCols, *y = x + kTok * kCols;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(wf, 0, (kRows + kTok) * kCols * sizeof(float), stream_.get()));
  STRATA_ASSIGN_OR_RETURN(void *ws, Grow(mm_ws_, Blas::kLtWorkspaceBytes));
  STRATA_RETURN_IF_ERROR(blas_.Sgemm(wf, kRows, kCols, x, kTok, y, Workspace{ws, mm_ws_.size()}, stream_.get()));
  return stream_.Synchronize();
}

absl::Status CudaBackend::StartCpuExperts(const model::ModelWeights &w, const CpuExpertOptions &cpu,
                                          int n_expert_max) {
  STRATA_ASSIGN_OR_RETURN(double link, MeasureLink());
  STRATA_ASSIGN_OR_RETURN(double copy_s, MeasureCopyLatency(link));
  STRATA_ASSIGN_OR_RETURN(skip_dev_, DeviceBuffer::Allocate(n_expert_max));
  STRATA_ASSIGN_OR_RETURN(cpu_experts_, CpuExperts::Create(w, cpu, kDeviceRouteMaxRows, n_expert_max, host_arena_,
                                                           arena_dev_, arena_bytes_, link, copy_s, stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::MeasureLink() {
  const size_t bytes = std::min<size_t>({slot_buf_.size(), arena_bytes_, size_t{256} << 20});
  if (bytes == 0 || !arena_registered_) return 0.0;
  STRATA_ASSIGN_OR_RETURN(Event a, Event::Create(/*timing=*/true));
  STRATA_ASSIGN_OR_RETURN(Event b, Event::Create(/*timing=*/true));
  float best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    STRATA_RETURN_IF_ERROR(a.Record(stream_.get()));
    STRATA_RETURN_IF_ERROR(CopyAsync(slot_buf_.data(), host_arena_, bytes, stream_.get()));
    STRATA_RETURN_IF_ERROR(b.Record(stream_.get()));
    STRATA_RETURN_IF_ERROR(b.Synchronize());
    STRATA_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(a, b));
    if (ms > 0 && (best == 0 || ms < best)) best = ms;
  }
  return best > 0 ? static_cast<double>(bytes) / (best * 1e-3) : 0.0;
}

absl::StatusOr<double> CudaBackend::MeasureCopyLatency(double link_bytes_s) {
  // One slot's copy from the arena, timed by the host from the call to its end, less its bytes at
  // the link's rate: the best of five.
  const size_t bytes = std::min<size_t>({slot_buf_.size(), arena_bytes_, slot_bytes_});
  if (bytes == 0 || !arena_registered_ || link_bytes_s <= 0) return 0.0;
  double best = 1.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(CopyAsync(slot_buf_.data(), host_arena_, bytes, stream_.get()));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return std::max(0.0, best - static_cast<double>(bytes) / link_bytes_s);
}

void CudaBackend::UpdatePaths(int64_t n_tok) {
  // The paths wanted first, then whether to take them.
  std::vector<char> hybrid_on(tables_.size(), 0), copies_on(tables_.size(), 0);
  for (size_t l = 0; l < tables_.size(); ++l) {
    hybrid_on[l] = tables_[l].hybrid ? 1 : 0;
    copies_on[l] = tables_[l].copies ? 1 : 0;
  }
  bool forced = false;  // a change of regime
  bool entering = false;  // into the CPU's share, the cost model choosing the layers
  double gain = 0;      // seconds a step the layers' own changes are expected to save
  if (cpu_experts_ != nullptr) {
    const double rt = cpu_experts_->round_trip_s();
    // Under the probe's link regime no layer takes the CPU's share (the copier serves them all).
    bool allow = !cpu_experts_->failed();  // after a wait for the CPU gave up, the device computes all
    if (allow && regime_ != nullptr) {
      const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      allow = regime_->Step(n_tok, now) == model::RegimeProbe::Regime::kHybrid;
    }
    forced = allow != allowed_;
    entering = allow && !allowed_ && cpu_experts_->mode() != CpuExpertMode::kAlways && paths_alternate_ == 0;
    allowed_ = allow;
    for (size_t l = 0; l < tables_.size(); ++l) {
      const LayerTable &t = tables_[l];
      if (!t.ok) continue;
      bool on = allow;
      if (allow && cpu_experts_->mode() != CpuExpertMode::kAlways) {
        on = t.cpu_saving > (t.hybrid ? 0.5 : 1.0) * rt;  // hysteresis: a layer does not flip back and forth
        if (on != t.hybrid) gain += std::abs(t.cpu_saving - rt);
      }
      if (paths_alternate_ > 0) on = allow && (steps_ / paths_alternate_) % 2 == 1;
      hybrid_on[l] = on ? 1 : 0;
    }
  }
  if (copier_ != nullptr) {
    // The copy engines pay where a layer has a cold expert a call or more: its prediction and the
    // wait cost a few microseconds, where a layer with hardly any cold expert reads them in place
    // as fast (copying every layer was slower with concentrated routing; bench/README.md).
    // Beside the CPU's share as well: the copier takes the cold experts the CPU leaves, slightly
    // faster than in-place reads there at every budget and batch measured.
    // STRATA_CUDA_COPIES_BESIDE_CPU=0 reads them in place while any layer is on the hybrid path.
    const bool beside = tunables::Get().cuda_copies_beside_cpu;
    bool hybrid = false, was_hybrid = false;
    for (size_t l = 0; l < tables_.size(); ++l) {
      hybrid = hybrid || (!beside && tables_[l].ok && hybrid_on[l]);
      was_hybrid = was_hybrid || (!beside && tables_[l].ok && tables_[l].hybrid);
    }
    forced = forced || hybrid != was_hybrid;
    // STRATA_CUDA_COPIES_MIN_COLD=X: the cold experts a call from which a layer takes the copy
    // engines (default 1; it keeps them down to half of that). A measuring knob.
    const double min_cold = std::max(0.0, tunables::Get().cuda_copies_min_cold);
    for (size_t l = 0; l < tables_.size(); ++l) {
      const LayerTable &t = tables_[l];
      if (!t.ok || !t.stage) continue;
      bool on = !hybrid && t.cold_avg >= (t.copies ? 0.5 : 1.0) * min_cold;
      if (paths_alternate_ > 0) on = (steps_ / paths_alternate_) % 2 == 0;
      if (on != t.copies && hybrid == was_hybrid) gain += kCopiesFlipGainS;
      copies_on[l] = on ? 1 : 0;
    }
    forced = forced || paths_alternate_ > 0;
  }
  const bool tracing = cpu_experts_ != nullptr && cpu_experts_->tracing();
  const std::string want_set = PathString(hybrid_on, copies_on);
  const auto found = std::find(path_sets_.begin(), path_sets_.end(), want_set);
  const bool known = found != path_sets_.end();
  const bool recorded = known && Recorded(n_tok, static_cast<uint32_t>(found - path_sets_.begin()));  // no recording
  // Until a recording's cost is measured, it is taken as two replayed steps (about what one costs).
  // Without that, the layers' first changes in the CPU-share probe went through at every step: each
  // ran watched and eager.
  const double record_cost = record_s_ > 0 ? record_s_ : 2 * replay_s_;
  // Entering the CPU's share (the probe's turn, or its verdict) is held by the same rule: where the
  // cost model gives the CPU a few experts a step, the watched step and the recording cost more than
  // the share can save: with skewed routing, where the CPU takes a few experts a step, entering at
  // once decoded slower than the link alone, the probe's way in costing more than it saved. Held,
  // the share comes in a few steps later there (once the fitted saving pays for the recording), and
  // at once with spread routing; against entering at once, within the noise (bench/README.md).
  // STRATA_CUDA_SHARE_HELD=0: entered at once, as before (a measuring knob).
  const bool share_held = tunables::Get().cuda_share_held;
  const bool hold_entry = share_held && entering;
  if ((!forced || hold_entry) && !recorded && record_cost > 0 && gain * kPathHorizon <= record_cost) {
    if (hold_entry) {
      allowed_ = false;  // asked again at the next step
      // A probe's step of the share that ran on the link is no sample of the share.
      if (regime_ != nullptr) regime_->Declined();
    }
    if ((tracing || graph_trace_) && gain > 0) {
      std::fprintf(stderr, "cuda paths: step %lld: %s held (%.1f us a step against %.2f ms to record again)\n",
                   static_cast<long long>(steps_ - 1), hold_entry ? "CPU's share" : "changes", gain * 1e6,
                   record_cost * 1e3);
    }
    return;
  }
  for (size_t l = 0; l < tables_.size(); ++l) {
    tables_[l].hybrid = hybrid_on[l] != 0;
    tables_[l].copies = copies_on[l] != 0;
  }
  const uint32_t want = known ? static_cast<uint32_t>(found - path_sets_.begin()) : AddPathSet(want_set);
  const bool changed = want != paths_;
  paths_ = want;
  if (changed && (tracing || graph_trace_)) {
    int n_hybrid = 0, n_copies = 0;
    for (const LayerTable &t : tables_) {
      n_hybrid += t.ok && t.hybrid ? 1 : 0;
      n_copies += t.ok && t.stage && t.copies ? 1 : 0;
    }
    std::fprintf(stderr, "cuda paths: step %lld: %d layers with the CPU's share, %d with the copy engines (set %u%s)\n",
                 static_cast<long long>(steps_ - 1), n_hybrid, n_copies, want, recorded ? ", recorded" : "");
  }
  // Paths without a graph record again: this step and the next are no sample of either regime.
  if (changed && !recorded && regime_ != nullptr) regime_->Disturbed();
}

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

CudaBackend::~CudaBackend() {
  if (regime_ != nullptr && cpu_experts_ != nullptr && cpu_experts_->tracing()) {
    std::fprintf(stderr,
                 "cpu experts regime: %d probes, holding %s; last timed: link %.2f ms, hybrid %.2f ms a step; "
                 "%lld path changes inside probes (their steps untimed), %lld probe steps of the share held on the "
                 "link\n",
                 regime_->probes(), regime_->held() == model::RegimeProbe::Regime::kLink ? "link" : "hybrid",
                 regime_->link_s() * 1e3, regime_->hybrid_s() * 1e3, static_cast<long long>(regime_->resettles()),
                 static_cast<long long>(regime_->declines()));
  }
  if (host_trace_ && host_n_ > 0) {
    const double n = static_cast<double>(host_n_);
    std::fprintf(stderr,
                 "cuda host: %llu replayed steps; a step: %.1f us from the last download to BeginStep, %.1f us in "
                 "it before the launch (%.1f the layers' tier, %.1f their paths), %.1f us launching, %.1f us "
                 "waiting for the download\n",
                 static_cast<unsigned long long>(host_n_), 1e6 * host_s_[0] / n, 1e6 * host_s_[1] / n,
                 1e6 * host_s_[4] / n, 1e6 * host_s_[5] / n, 1e6 * host_s_[2] / n, 1e6 * host_s_[3] / n);
  }
  ReadStamps();
  if (!stamp_table_.empty()) {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(stamp_table_.begin(), stamp_table_.end());
    std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.first > b.second.first; });
    std::fprintf(stderr, "cuda stamps over %llu recorded steps: up to mark, marks, ms a step, us a mark\n",
                 static_cast<unsigned long long>(stamped_steps_));
    for (auto &[name, r] : rows) {
      std::fprintf(stderr, "  %-20s %8llu %8.3f %8.2f\n", name.c_str(), static_cast<unsigned long long>(r.second),
                   1e3 * r.first / std::max<uint64_t>(stamped_steps_, 1), 1e6 * r.first / std::max<uint64_t>(r.second, 1));
    }
  }
  if (profile_ && !profile_table_.empty()) {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(profile_table_.begin(), profile_table_.end());
    std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.first > b.second.first; });
    std::fprintf(stderr, "cuda profile: operation, calls, total s, us per call\n");
    for (auto &[op, r] : rows) {
      std::fprintf(stderr, "  %-16s %10llu %10.4f %10.2f\n", op.c_str(), static_cast<unsigned long long>(r.second),
                   r.first, 1e6 * r.first / std::max<uint64_t>(r.second, 1));
    }
  }
  // Work still queued may use the buffers about to be freed. The compute stream first: its layers
  // may still post requests to the copier, whose thread serves them until it is stopped; then no
  // copy may read the arena once it is unregistered.
  if (stream_.get() != nullptr) (void)stream_.Synchronize();
  copier_.reset();
  if (cold_copies_) g_copier_claimed.store(false);
  if (copy_stream_.get() != nullptr) (void)copy_stream_.Synchronize();
  if (arena_registered_) (void)cudaHostUnregister(const_cast<uint8_t *>(host_arena_));
  for (const uint8_t *p : mapped_) (void)cudaHostUnregister(const_cast<uint8_t *>(p));
}

absl::StatusOr<void *> CudaBackend::Grow(DeviceBuffer &b, size_t bytes) {
  if (bracket_ == Bracket::kCapture) graph_bufs_.insert(&b);
  if (b.size() < bytes) {
    STRATA_RETURN_IF_ERROR(HostRoundTrip("a scratch buffer growing", /*growth=*/true));
    // Recorded steps use the old address: they go, where one reads this buffer. Buffers no
    // recording took (a prompt's own) grow without dropping the decode graphs.
    if (graph_bufs_.count(&b) != 0) {
      if (graph_trace_) {
        std::fprintf(stderr, "cuda graphs: a recorded scratch buffer grew (%zu to %zu bytes): %zu graphs dropped\n",
                     b.size(), bytes, graphs_.size());
      }
      ReadStamps();
      graphs_.clear();
      clean_.clear();
      graph_bufs_.clear();
    }
    STRATA_RETURN_IF_ERROR(stream_.Synchronize());  // queued work may still read the old buffer
    b.Reset();
    STRATA_ASSIGN_OR_RETURN(b, DeviceBuffer::Allocate(Align(bytes)));
  }
  return b.data();
}

absl::StatusOr<void *> CudaBackend::GrowPinned(PinnedBuffer &b, size_t bytes) {
  if (b.size() < bytes) {
    STRATA_RETURN_IF_ERROR(HostRoundTrip("a pinned buffer growing", /*growth=*/true));
    STRATA_RETURN_IF_ERROR(stream_.Synchronize());  // a queued copy may still read the old buffer
    b.Reset();
    STRATA_ASSIGN_OR_RETURN(b, PinnedBuffer::Allocate(Align(bytes)));
  }
  return b.data();
}

// ---- memory ----

absl::StatusOr<std::unique_ptr<model::Buffer>> CudaBackend::Allocate(size_t bytes) {
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(std::max<size_t>(bytes, 1)));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.data(), 0, b.size(), stream_.get()));
  STRATA_RETURN_IF_ERROR(stream_.Synchronize());
  return std::unique_ptr<model::Buffer>(new VramBuffer(std::move(b)));
}

// Through pinned memory: the caller may free `src` at once, and the copy is a true asynchronous
// DMA. Small uploads (inputs, block tables, table entries) go through the ring: a segment is
// rewritten only after the copies of its previous lap are done, so the host rarely waits. Larger
// ones use a bounce buffer rewritten after the previous upload has left it.
void CudaBackend::Upload(void *dst, const void *src, size_t bytes) {
  Profile prof(this, "Upload");
  if (!err_.ok() || bytes == 0) return;
  if (!Note(HostRoundTrip("an upload"))) return;
  if (bytes <= kRingSegment) {
    size_t off = (ring_off_ + 15) & ~size_t{15};
    if (off + bytes > (ring_seg_ + 1) * kRingSegment) {  // on to the next segment
      if (!Note(ring_done_[ring_seg_].Record(stream_.get()))) return;
      ring_seg_ = (ring_seg_ + 1) % kRingSegments;
      if (!Note(ring_done_[ring_seg_].Synchronize())) return;
      off = ring_seg_ * kRingSegment;
    }
    uint8_t *p = ring_.as<uint8_t>() + off;
    std::memcpy(p, src, bytes);
    ring_off_ = off + bytes;
    Note(CopyAsync(dst, p, bytes, stream_.get()));
    return;
  }
  if (!Note(up_done_.Synchronize())) return;
  auto io = GrowPinned(up_io_, bytes);
  if (!Note(io.status())) return;
  std::memcpy(*io, src, bytes);
  if (Note(CopyAsync(dst, *io, bytes, stream_.get()))) Note(up_done_.Record(stream_.get()));
}

void CudaBackend::Download(void *dst, const void *src, size_t bytes) {
  const DownloadPart part{dst, bytes};
  DownloadParts(src, &part, 1);
}

void CudaBackend::DownloadParts(const void *src, const DownloadPart *parts, size_t n) {
  Profile prof(this, "Download");
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes += parts[i].bytes;
  if (!err_.ok() || bytes == 0) return;
  if (!Note(HostRoundTrip("a download"))) return;
  // One transfer into the pinned buffer, then each part copied once to its place.
  auto io = GrowPinned(down_io_, bytes);
  const auto t0 = host_trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (!Note(io.status()) || !Note(CopyAsync(*io, src, bytes, stream_.get())) || !Note(stream_.Synchronize())) return;
  if (host_trace_) {
    down_end_ = std::chrono::steady_clock::now();
    if (std::exchange(host_step_, false)) host_s_[3] += std::chrono::duration<double>(down_end_ - t0).count();
  }
  // A layer that gave up waiting for its experts' copies read stale slots: the step fails.
  if (copier_ != nullptr && !Note(copier_->status())) return;
  if (cpu_experts_ != nullptr && !Note(cpu_experts_->TakeStatus())) return;
  const auto *p = static_cast<const uint8_t *>(*io);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(parts[i].dst, p, parts[i].bytes);
    p += parts[i].bytes;
  }
}

absl::Status CudaBackend::TakeError() {
  absl::Status s = std::move(err_);
  err_ = absl::OkStatus();
  return s;
}

// ---- element-wise ----

void CudaBackend::CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int64_t width) {
  Profile prof(this, "CopyRows");
  if (!err_.ok() || rows <= 0 || width <= 0) return;
  const cudaError_t e =
      cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float), width * sizeof(float), rows,
                        cudaMemcpyDeviceToDevice, stream_.get());
  Note(CudaStatus(e, "cudaMemcpy2DAsync", __FILE__, __LINE__));
}

void CudaBackend::Add(float *x, const float *y, int64_t n) {
  Profile prof(this, "Add");
  if (err_.ok()) Note(cuda::Add(x, y, n, stream_.get()));
}

void CudaBackend::AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) {
  Profile prof(this, "AddBias");
  if (!err_.ok()) return;
  auto b = Resolve(bias);
  if (Note(b.status())) Note(cuda::AddBias(x, n_rows, n, *b, stream_.get()));
}

void CudaBackend::SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) {
  if (err_.ok()) Note(cuda::SigmoidScaleRows(x, g, n_rows, n, stream_.get()));
}

void CudaBackend::GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) {
  Profile prof(this, "GatherRows");
  if (err_.ok()) Note(cuda::GatherRows(src, width, idx, n, dst, stream_.get()));
}

void CudaBackend::WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                                 int64_t width, float *out) {
  Profile prof(this, "WeightedRowSum");
  host_batch_rows_ = 0;  // the layer's experts are done
  if (err_.ok()) Note(cuda::WeightedRowSum(rows, idx, wts, n_tok, k, width, out, stream_.get()));
}

absl::StatusOr<RouteArgs> CudaBackend::ToRouteArgs(const model::RouteParams &p) const {
  RouteArgs a;
  a.gating = p.gating == model::Gating::kSoftmax ? 0 : p.gating == model::Gating::kSoftmaxSelected ? 1 : 2;
  a.n_expert = p.n_expert;
  a.k = p.k;
  a.n_group = std::max(p.n_group, 1);
  a.topk_group = p.n_group > 1 ? p.topk_group : 1;
  a.norm_topk_prob = p.norm_topk_prob;
  a.routed_scale = p.routed_scale;
  STRATA_ASSIGN_OR_RETURN(a.select_bias, Resolve(p.select_bias));
  return a;
}

void CudaBackend::Route(const model::RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host,
                        float *wts) {
  Profile prof(this, "Route");
  if (!err_.ok() || n_tok <= 0) return;
  auto ra = ToRouteArgs(p);
  if (!Note(ra.status())) return;
  const RouteArgs &a = *ra;
  const size_t bytes = static_cast<size_t>(n_tok) * p.k * sizeof(int32_t);
  auto sel = Grow(sel_dev_, bytes);
  if (!Note(sel.status())) return;
  if (!Note(cuda::Route(a, logits, n_tok, static_cast<int32_t *>(*sel), wts, stream_.get()))) return;
  // The host needs the selections now (grouping, the expert source): one small copy per layer.
  Download(sel_host, *sel, bytes);
}

// ---- compute ----

absl::StatusOr<bool> CudaBackend::MatMulQ8(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y) {
  const Q8Act f = Q8ActFor(w.type);
  if (!q8_ || f == Q8Act::kNone || !Q8RowsAligned(w)) return false;
  // Past the GEMV path's batch (a prompt) on the tensor cores in one launch (PromptGemvQ8), where the
  // GEMVs would read the weights every 16 tokens and cuBLASLt would take a dequantized copy.
  STRATA_ASSIGN_OR_RETURN(void *xq, Grow(q8_x_, static_cast<size_t>(n_tok * Q8ActRowBytes(f, w.cols))));
  STRATA_RETURN_IF_ERROR(QuantizeActivationsQ8(f, x, n_tok, w.cols, xq, stream_.get()));
  if (Blas::Choose(n_tok, Blas::Path::kAuto) == Blas::Path::kGemv) {
    STRATA_RETURN_IF_ERROR(GemvQ8(w, xq, n_tok, y, stream_.get()));
  } else {
    STRATA_RETURN_IF_ERROR(PromptGemvQ8(w, xq, n_tok, y, stream_.get()));
  }
  return true;
}

int CudaBackend::Q8Grid(quant::TypeId type) const {
  const quant::Codec *c = q8_ ? quant::FindCodec(type) : nullptr;
  switch (c != nullptr ? cpu::kernels::ActFormatOf(*c) : cpu::kernels::ActFormat::kNone) {
    case cpu::kernels::ActFormat::kQ8Block32: return 32;
    case cpu::kernels::ActFormat::kQ8Block256: return 256;
    default: return 0;
  }
}

absl::StatusOr<const float *> CudaBackend::GridInput(quant::TypeId type, const float *x, int64_t n_tok,
                                                      int64_t cols) {
  const int block = Q8Grid(type);
  if (block == 0) return x;
  STRATA_ASSIGN_OR_RETURN(void *r, Grow(q8_r_, static_cast<size_t>(n_tok * cols) * sizeof(float)));
  STRATA_RETURN_IF_ERROR(RoundActivationsQ8(block, x, n_tok, cols, static_cast<float *>(r), stream_.get()));
  return static_cast<const float *>(r);
}

absl::Status CudaBackend::MatMulDevice(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y,
                                       quant::TypeId host_type) {
  const bool direct = CheckMatrix(w).ok();
  if (direct) {
    STRATA_ASSIGN_OR_RETURN(bool done, MatMulQ8(w, x, n_tok, y));
    if (done) return absl::OkStatus();
  }
  // Converted matrices (float32 on the device) keep their file codec's grid.
  STRATA_ASSIGN_OR_RETURN(x, GridInput(host_type, x, n_tok, w.cols));
  if (direct) {
    const size_t bytes = Blas::MatMulWorkspaceBytes(w, n_tok);
    STRATA_ASSIGN_OR_RETURN(void *ws, Grow(mm_ws_, bytes));
    return blas_.MatMul(w, x, n_tok, y, Workspace{ws, mm_ws_.size()}, stream_.get());
  }
  if (w.type == quant::TypeId::kF32 && w.row_bytes == static_cast<uint64_t>(w.cols) * 4) {
    // A float32 shape the GEMV kernels reject (cols not a multiple of 32): cuBLASLt takes any.
    STRATA_ASSIGN_OR_RETURN(void *ws, Grow(mm_ws_, Blas::kLtWorkspaceBytes));
    return blas_.Sgemm(static_cast<const float *>(w.data), w.rows, w.cols, x, n_tok, y,
                       Workspace{ws, mm_ws_.size()}, stream_.get());
  }
  return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no device product for a (%d, %d) matrix of type %d", w.rows, w.cols,
                static_cast<int>(w.type));
}

void CudaBackend::MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  Profile prof(this, "MatMul");
  if (!err_.ok() || n_tok <= 0 || w.rows <= 0) return;
  auto dm = Resolve(w);
  const bool timed = PromptTrace() && n_tok > Blas::kGemvBatchTokens;  // each product of a prompt timed
  std::chrono::steady_clock::time_point t0;
  if (timed) {
    (void)stream_.Synchronize();
    t0 = std::chrono::steady_clock::now();
  }
  if (Note(dm.status())) Note(MatMulDevice(*dm, x, n_tok, y, w.codec->id));
  if (timed) {
    (void)stream_.Synchronize();
    std::fprintf(stderr, "prompt matmul: %s (%lld x %lld, %s) x %lld tokens: %.1f us\n", w.name.c_str(),
                 static_cast<long long>(w.rows), static_cast<long long>(w.cols),
                 std::string(quant::TypeName(static_cast<uint32_t>(w.codec->id))).c_str(), static_cast<long long>(n_tok),
                 std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
}

void CudaBackend::MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  if (!err_.ok() || n_tok <= 0) return;
  auto dm = Resolve(w);
  if (!Note(dm.status())) return;
  const float *dense = static_cast<const float *>(dm->data);
  if (dm->type != quant::TypeId::kF32 || dm->row_bytes != static_cast<uint64_t>(dm->cols) * 4) {
    auto ws = Grow(deq_ws_, static_cast<size_t>(dm->rows * dm->cols) * sizeof(float));
    if (!Note(ws.status()) || !Note(Dequantize(*dm, static_cast<float *>(*ws), stream_.get()))) return;
    dense = static_cast<const float *>(*ws);
  }
  Note(MatMulInputMajorF32(dense, dm->rows, dm->cols, x, n_tok, y, stream_.get()));
}

void CudaBackend::GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) {
  Profile prof(this, "GetRows");
  if (!err_.ok() || n <= 0) return;
  auto dm = Resolve(w);
  if (!Note(dm.status())) return;
  if (dm->type == quant::TypeId::kF32 && dm->row_bytes == static_cast<uint64_t>(dm->cols) * 4) {
    Note(cuda::GatherRows(static_cast<const float *>(dm->data), dm->cols, ids, n, out, stream_.get()));
  } else {
    Note(cuda::GetRows(*dm, ids, n, out, stream_.get()));
  }
}

void CudaBackend::RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y) {
  Profile prof(this, "RmsNorm");
  if (!err_.ok()) return;
  auto wd = Resolve(weight);
  if (Note(wd.status())) Note(cuda::RmsNorm(x, *wd, n_rows, n, eps, y, stream_.get()));
}

void CudaBackend::AddRmsNorm(float *x, const float *add, const float *weight, int64_t n_rows, int64_t n, float eps,
                             float *y) {
  Profile prof(this, "AddRmsNorm");
  if (!err_.ok()) return;
  auto wd = Resolve(weight);
  if (Note(wd.status())) Note(cuda::AddRmsNorm(x, add, *wd, n_rows, n, eps, y, stream_.get()));
}

// One GEMV launch for matrices of one codec and width on the GEMV path; otherwise one MatMul each.
void CudaBackend::MatMulMany(const model::Matrix *const *ws, float *const *ys, int n, const float *x, int64_t n_tok) {
  Profile prof(this, "MatMulMany");
  if (!err_.ok()) return;
  bool one = n >= 1 && n <= kGemvManyMax && Blas::Choose(n_tok, Blas::Path::kAuto) == Blas::Path::kGemv;
  DeviceMatrix dm[kGemvManyMax];
  for (int i = 0; i < n && one; ++i) {
    auto r = Resolve(*ws[i]);
    one = r.ok() && CheckMatrix(*r).ok();
    if (!one) break;
    dm[i] = *r;
    one = dm[i].type == dm[0].type && dm[i].cols == dm[0].cols && Q8Grid(ws[i]->codec->id) == Q8Grid(ws[0]->codec->id);
  }
  if (!one) {
    model::Backend::MatMulMany(ws, ys, n, x, n_tok);
    return;
  }
  // 8-bit activations: integer dots over one quantized input, in one launch (the products of every
  // other codec take the rounded input through GemvMany).
  const Q8Act f = q8_ ? Q8ActFor(dm[0].type) : Q8Act::kNone;
  bool aligned = true;
  for (int i = 0; i < n; ++i) aligned = aligned && Q8RowsAligned(dm[i]);
  if (f != Q8Act::kNone && aligned) {
    auto xq = Grow(q8_x_, static_cast<size_t>(n_tok * Q8ActRowBytes(f, dm[0].cols)));
    if (!Note(xq.status()) || !Note(QuantizeActivationsQ8(f, x, n_tok, dm[0].cols, *xq, stream_.get()))) return;
    Note(GemvManyQ8(dm, ys, n, *xq, n_tok, stream_.get()));
    return;
  }
  auto xr = GridInput(ws[0]->codec->id, x, n_tok, dm[0].cols);
  if (Note(xr.status())) Note(GemvMany(dm, ys, n, *xr, n_tok, stream_.get()));
}

namespace {

// The inverse frequencies of a RoPE call as the CPU backend forms them (passed to kernels by value).
std::vector<float> RopeInvFreq(int head_dim, float theta, const model::RopeParams &p) {
  const int half = head_dim / 2;
  std::vector<float> inv(std::max(half, 1));
  for (int i = 0; i < half; ++i) {
    inv[i] = p.inv_freq != nullptr
                 ? p.inv_freq[i]
                 : 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  return inv;
}

}  // namespace

void CudaBackend::Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                       model::RopeStyle style, const model::RopeParams &p) {
  Profile prof(this, "Rope");
  if (!err_.ok()) return;
  const std::vector<float> inv = RopeInvFreq(head_dim, theta, p);
  Note(RopeWithTable(x, n_tok, n_heads, head_dim, pos, inv.data(), p.mscale, style, stream_.get()));
}

void CudaBackend::NormRope(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim,
                           const float *q_norm, const float *k_norm, float eps, const int32_t *pos, float theta,
                           model::RopeStyle style, const model::RopeParams &p) {
  Profile prof(this, "NormRope");
  if (!err_.ok()) return;
  auto qw = Resolve(q_norm), kw = Resolve(k_norm);
  if (!Note(qw.status()) || !Note(kw.status())) return;
  const std::vector<float> inv = RopeInvFreq(head_dim, theta, p);
  Note(cuda::NormRope(q, k, n_tok, n_head, n_head_kv, head_dim, *qw, *kw, eps, pos, inv.data(), p.mscale, style,
                      stream_.get()));
}

absl::StatusOr<AttentionExtArgs> CudaBackend::AttentionArgs(int n_head, int n_head_kv, int head_dim, int k_width,
                                                             int v_width, const model::AttentionParams &p) const {
  AttentionExtArgs a;
  a.block_tokens = model::kKvBlockTokens;
  a.k_stride = k_width;
  a.v_stride = v_width;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.v_dim = p.latent ? p.v_dim : head_dim;
  a.latent = p.latent;
  a.scale = p.scale != 0.f ? p.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  STRATA_ASSIGN_OR_RETURN(a.sinks, Resolve(p.sinks));
  return a;
}

absl::Status CudaBackend::AttentionImpl(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                                        int n_head_kv, int head_dim, int window, float *out,
                                        const model::AttentionParams &p) {
  // The cache's block tables and mask live on the host (the KvCache owns them); one upload per
  // call brings [k table | v table | mask] to the device. The block contents are device memory.
  const int n_blocks = (kv.n_ctx + model::kKvBlockTokens - 1) / model::kKvBlockTokens;
  const size_t tab = static_cast<size_t>(n_blocks) * sizeof(float *);
  const size_t mask = kv.masked != nullptr ? static_cast<size_t>(kv.n_ctx) : 0;
  std::vector<uint8_t> host(2 * tab + mask);
  std::memcpy(host.data(), kv.k_blocks, tab);
  if (kv.v_width > 0) std::memcpy(host.data() + tab, kv.v_blocks, tab);
  if (mask > 0) std::memcpy(host.data() + 2 * tab, kv.masked, mask);
  STRATA_ASSIGN_OR_RETURN(void *dev, Grow(kv_tab_, host.size()));
  Upload(dev, host.data(), host.size());
  STRATA_RETURN_IF_ERROR(TakeError());
  uint8_t *d = static_cast<uint8_t *>(dev);
  STRATA_ASSIGN_OR_RETURN(AttentionExtArgs a, AttentionArgs(n_head, n_head_kv, head_dim, kv.k_width, kv.v_width, p));
  a.k_blocks = reinterpret_cast<const float *const *>(d);
  a.v_blocks = reinterpret_cast<const float *const *>(d + tab);
  a.masked = mask > 0 ? d + 2 * tab : nullptr;
  a.pos0 = pos0;
  a.window = window;
  // Scratch for the split path, sized for the cache's last position so a growing context does not
  // reallocate it during decode.
  AttentionExtArgs longest = a;
  longest.pos0 = std::max(a.pos0, kv.n_ctx - static_cast<int>(n_tok));
  const size_t split = AttentionExtWorkspaceBytes(longest, n_tok);
  Workspace ws;
  if (split > 0) {
    STRATA_ASSIGN_OR_RETURN(void *p, Grow(attn_ws_, split));
    ws = Workspace{p, attn_ws_.size()};
  }
  return AttentionExt(q, a, n_tok, out, stream_.get(), ws);
}

void CudaBackend::Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                            int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p) {
  Profile prof(this, "Attention");
  if (err_.ok()) Note(AttentionImpl(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, p));
}

absl::Status CudaBackend::ExpertFfnImpl(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  const bool biased = e.gate_bias.tensor != nullptr || e.up_bias.tensor != nullptr || e.down_bias.tensor != nullptr;
  // 8-bit activations go through MatMul (codes or the rounded input per product), not the fused FFN.
  const bool q8 = Q8Grid(e.gate.codec->id) != 0 || Q8Grid(e.up.codec->id) != 0 || Q8Grid(e.down.codec->id) != 0;
  if (!e.input_major && !biased && e.swiglu_limit == 0.f && !q8) {
    STRATA_ASSIGN_OR_RETURN(DeviceMatrix g, Resolve(e.gate));
    STRATA_ASSIGN_OR_RETURN(DeviceMatrix u, Resolve(e.up));
    STRATA_ASSIGN_OR_RETURN(DeviceMatrix d, Resolve(e.down));
    if (CheckMatrix(g).ok() && CheckMatrix(u).ok() && CheckMatrix(d).ok()) {
      const DeviceExpert de{g, u, d};
      STRATA_ASSIGN_OR_RETURN(void *ws, Grow(ffn_ws_, ExpertFfnWorkspaceBytes(de, n_tok)));
      return cuda::ExpertFfn(blas_, de, x, n_tok, y, Workspace{ws, ffn_ws_.size()}, stream_.get());
    }
  }
  // Composed: products, biases and the activation as separate launches (the CPU backend's steps).
  const int64_t n_ff = e.input_major ? e.down.rows : e.gate.rows;
  const int64_t act = n_tok * n_ff;
  const size_t a_floats = Align(act * sizeof(float)) / sizeof(float);
  // g (2 act: room for the interleaved gate/up of an input-major expert), u (act), h (act)
  STRATA_ASSIGN_OR_RETURN(void *ws, Grow(ffn_ws_, 4 * a_floats * sizeof(float)));
  float *g = static_cast<float *>(ws);
  float *u = g + 2 * a_floats;
  float *h = u + a_floats;
  if (e.input_major) {
    // gu (n_tok, 2 n_ff) = x · gate_up, gate and up in alternating columns; bias before the split.
    MatMulInputMajor(e.gate, x, n_tok, g);
    if (e.gate_bias.tensor != nullptr) AddBias(g, n_tok, 2 * n_ff, e.gate_bias.values.data());
    STRATA_RETURN_IF_ERROR(TakeError());
    STRATA_RETURN_IF_ERROR(GatedAct(g, g + 1, 2 * n_ff, 2, n_tok, n_ff, e.swiglu_limit, h, stream_.get()));
    MatMulInputMajor(e.down, h, n_tok, y);
  } else {
    MatMul(e.gate, x, n_tok, g);
    MatMul(e.up, x, n_tok, u);
    if (e.gate_bias.tensor != nullptr) AddBias(g, n_tok, n_ff, e.gate_bias.values.data());
    if (e.up_bias.tensor != nullptr) AddBias(u, n_tok, n_ff, e.up_bias.values.data());
    STRATA_RETURN_IF_ERROR(TakeError());
    STRATA_RETURN_IF_ERROR(GatedAct(g, u, n_ff, 1, n_tok, n_ff, e.swiglu_limit, h, stream_.get()));
    MatMul(e.down, h, n_tok, y);
  }
  const int64_t n_embd = e.input_major ? e.gate.rows : e.down.rows;
  if (e.down_bias.tensor != nullptr) AddBias(y, n_tok, n_embd, e.down_bias.values.data());
  return TakeError();
}

void CudaBackend::ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  Profile prof(this, "ExpertFfn");
  if (!err_.ok() || n_tok <= 0) return;
  if (host_batch_rows_ > kDeviceRouteMaxRows && PromptEligible(e)) {  // a late expert of a prompt's layer
    Note(PromptExperts({&e}, {0}, {n_tok}, x, y));
  } else {
    ExpertFfnOne(e, x, n_tok, y);
  }
  // A streamed expert's slot may take another expert once this returns: its reads are done first.
  if (!mapped_.empty()) Note(stream_.Synchronize());
}

void CudaBackend::ExpertsFfn(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg,
                             float *yg, int64_t width) {
  Profile prof(this, "ExpertsFfn");
  if (!err_.ok() || n <= 0) return;
  ExpertsFfnCall(ew, n, first, xg, yg, width);
  // Streamed experts' slots may take other experts once this returns: their reads are done first.
  if (!mapped_.empty()) Note(stream_.Synchronize());
}

void CudaBackend::ExpertsFfnCall(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg,
                                 float *yg, int64_t width) {
  host_batch_rows_ = first[n] - first[0];
  if (host_batch_rows_ <= kDeviceRouteMaxRows) {  // an expert at a time, as ExpertFfn takes them
    for (int u = 0; u < n; ++u) {
      if (ew[u] == nullptr || first[u + 1] <= first[u]) continue;
      ExpertFfnOne(*ew[u], xg + first[u] * width, first[u + 1] - first[u], yg + first[u] * width);
    }
    return;
  }
  host_batch_since_ = true;  // a prompt: the next step's time is not a step's (TimeStep)
  // The re-plan inside the prompt over the layer's whole call (PromptPromotions).
  std::vector<const model::ExpertWeights *> call;
  std::vector<int64_t> c0, c1;
  std::vector<char> staged(n, 0), call_staged;
  prompt_plan_.clear();
  prompt_pending_.clear();
  for (int u = 0; u < n; ++u) {
    if (ew[u] == nullptr || first[u + 1] <= first[u]) continue;
    staged[u] = PromptStages(*ew[u]) ? 1 : 0;
    call.push_back(ew[u]);
    c0.push_back(first[u]);
    c1.push_back(first[u + 1]);
    call_staged.push_back(staged[u]);
    prompt_pending_.insert(ew[u]->gate.data);
  }
  const auto to = PromptPromotions(call, c0, c1, call_staged);
  for (size_t i = 0; i < call.size(); ++i) {
    if (to[i].first >= 0) prompt_plan_[call[i]->gate.data] = to[i];
  }
  // Experts of one codec pair go together (a packed file may mix codecs within a layer); the
  // others one at a time, those in VRAM first (each writes its own rows: the order changes no bits).
  std::map<std::pair<int, int>, std::vector<int>> by_codec;
  for (int pass = 0; pass < 2; ++pass) {
    for (int u = 0; u < n; ++u) {
      if (ew[u] == nullptr || first[u + 1] <= first[u] || staged[u] != pass) continue;
      if (!PromptEligible(*ew[u])) {
        ExpertFfnOne(*ew[u], xg + first[u] * width, first[u + 1] - first[u], yg + first[u] * width);
        continue;
      }
      by_codec[{static_cast<int>(ew[u]->gate.codec->id), static_cast<int>(ew[u]->down.codec->id)}].push_back(u);
    }
  }
  absl::Status st = absl::OkStatus();
  for (const auto &[codecs, us] : by_codec) {
    std::vector<const model::ExpertWeights *> es;
    std::vector<int64_t> r0, r1;
    for (int u : us) {
      es.push_back(ew[u]);
      r0.push_back(first[u]);
      r1.push_back(first[u + 1]);
    }
    st = PromptExperts(es, r0, r1, xg, yg);
    if (!st.ok()) break;
  }
  prompt_plan_.clear();
  prompt_pending_.clear();
  Note(st);
}

bool CudaBackend::PromptEligible(const model::ExpertWeights &e) const {
  if (!q8_ || e.input_major || e.swiglu_limit != 0.f || e.gate.tensor == nullptr || e.up.tensor == nullptr ||
      e.down.tensor == nullptr) {
    return false;
  }
  if (e.gate_bias.tensor != nullptr || e.up_bias.tensor != nullptr || e.down_bias.tensor != nullptr) return false;
  const quant::TypeId g = e.gate.codec->id;
  return g == e.up.codec->id && Q8ActFor(g) != Q8Act::kNone && !NeedsConversion(e.gate) &&
         !NeedsConversion(e.up) && e.gate.rows == e.up.rows && e.gate.cols == e.up.cols &&
         e.gate.row_bytes == e.up.row_bytes && e.down.cols == e.gate.rows;
}

absl::Status CudaBackend::PromptExperts(const std::vector<const model::ExpertWeights *> &ew_in,
                                        const std::vector<int64_t> &row0_in, const std::vector<int64_t> &row1_in,
                                        const float *xg, float *yg) {
  if (ew_in.empty()) return absl::OkStatus();
  // The experts in VRAM first, then those to stage: the first launches need no copy, and the
  // copies of the staged ones stream while they run.
  std::vector<size_t> order(ew_in.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::vector<char> is_staged(ew_in.size());
  for (size_t u = 0; u < ew_in.size(); ++u) is_staged[u] = PromptStages(*ew_in[u]) ? 1 : 0;
  std::stable_partition(order.begin(), order.end(), [&](size_t u) { return is_staged[u] == 0; });
  std::vector<const model::ExpertWeights *> ew;
  std::vector<int64_t> row0, row1;
  std::vector<char> stages;
  for (size_t u : order) {
    ew.push_back(ew_in[u]);
    row0.push_back(row0_in[u]);
    row1.push_back(row1_in[u]);
    stages.push_back(is_staged[u]);
  }
  const model::ExpertWeights &e0 = *ew[0];
  const int64_t d = e0.gate.cols, n_ff = e0.gate.rows;
  const quant::TypeId tg = e0.gate.codec->id, td = e0.down.codec->id;
  const Q8Act fg = Q8ActFor(tg), fd = NeedsConversion(e0.down) ? Q8Act::kNone : Q8ActFor(td);
  // Rows [lo, hi) of xg and yg hold every group.
  const int64_t lo = *std::min_element(row0.begin(), row0.end()), hi = *std::max_element(row1.begin(), row1.end());
  const int64_t rows = hi - lo;
  const int64_t xb = Q8ActRowBytes(fg, d), hb = fd != Q8Act::kNone ? Q8ActRowBytes(fd, n_ff) : 0;
  cudaStream_t s = stream_.get();
  STRATA_ASSIGN_OR_RETURN(void *xq, Grow(prompt_xq_, static_cast<size_t>(rows * xb)));
  STRATA_ASSIGN_OR_RETURN(void *hv, Grow(prompt_h_, static_cast<size_t>(rows * n_ff) * sizeof(float)));
  void *hq = nullptr;
  if (hb > 0) {
    STRATA_ASSIGN_OR_RETURN(hq, Grow(prompt_hq_, static_cast<size_t>(rows * hb)));
  }
  float *h = static_cast<float *>(hv);
  STRATA_RETURN_IF_ERROR(QuantizeActivationsQ8(fg, xg + lo * d, rows, d, xq, s));
  // In the tier a chunk holds at most as many experts as there are slots, so no expert of a chunk
  // takes the slot of another before their products ran; and at most half the staging ring staged,
  // so a chunk's copies go while the chunk before computes from the other half.
  const size_t chunk = slots_.empty() ? ew.size() : slots_.size();
  const size_t stage_chunk = std::max<size_t>(prompt_stage_.size() / 2, 1);
  const auto chunk_end = [&](size_t c0) {
    size_t c1 = c0, n_staged = 0;
    while (c1 < ew.size() && c1 - c0 < chunk && (stages[c1] == 0 || n_staged < stage_chunk)) n_staged += stages[c1++];
    return c1;
  };
  const bool trace = PromptTrace();
  using Clock = std::chrono::steady_clock;
  const auto mark = [&](Clock::time_point *t) {
    if (trace) {
      (void)stream_.Synchronize();
      (void)copy_stream_.Synchronize();
      *t = Clock::now();
    }
  };
  Clock::time_point t0, t1, t2, t3;
  mark(&t0);
  t1 = t0;
  for (size_t c0 = 0, c1 = 0; c0 < ew.size(); c0 = c1) {
    c1 = chunk_end(c0);
    const int m = static_cast<int>(c1 - c0);
    std::vector<Slot *> slot;
    if (!slots_.empty()) {
      const auto h0 = Clock::now();
      STRATA_RETURN_IF_ERROR(SlotsFor(ew, c0, c1, &slot));
      if (trace) {
        const auto h1 = Clock::now();
        mark(&t1);
        std::fprintf(stderr, "prompt experts: %zu experts, slots: host %.1f us, copies done %.1f us later\n",
                     c1 - c0, std::chrono::duration<double, std::micro>(h1 - h0).count(),
                     std::chrono::duration<double, std::micro>(t1 - h1).count());
      }
    } else {
      slot.assign(m, nullptr);
    }
    // span (2 m int64) | gate (m) | up (m) | down (m) pointers
    std::vector<uint64_t> tab(5 * static_cast<size_t>(m));
    DeviceMatrix gs{}, ds{};
    std::vector<DeviceMatrix> downs(m);
    for (int i = 0; i < m; ++i) {
      const model::ExpertWeights &e = *ew[c0 + i];
      STRATA_ASSIGN_OR_RETURN(DeviceMatrix g, Resolve(e.gate));
      STRATA_ASSIGN_OR_RETURN(DeviceMatrix u, Resolve(e.up));
      STRATA_ASSIGN_OR_RETURN(downs[i], Resolve(e.down));
      if (i == 0) {
        gs = g;
        ds = downs[0];
      }
      const DeviceMatrix &dn = downs[i];
      if (g.type != gs.type || u.type != gs.type || g.rows != gs.rows || g.cols != gs.cols ||
          g.row_bytes != gs.row_bytes || u.rows != gs.rows || u.cols != gs.cols || u.row_bytes != gs.row_bytes ||
          dn.type != ds.type || dn.rows != ds.rows || dn.cols != ds.cols || dn.row_bytes != ds.row_bytes ||
          !CheckMatrix(g).ok() || !CheckMatrix(u).ok() || !Q8RowsAligned(g) || !Q8RowsAligned(u)) {
        return Errorf(MOE_ERR_INTERNAL, "prompt experts: %s does not match the layer's first expert", e.gate.name);
      }
      tab[2 * i] = static_cast<uint64_t>(row0[c0 + i] - lo);
      tab[2 * i + 1] = static_cast<uint64_t>(row1[c0 + i] - lo);
      tab[2 * m + i] = reinterpret_cast<uintptr_t>(g.data);
      tab[3 * m + i] = reinterpret_cast<uintptr_t>(u.data);
      tab[4 * m + i] = reinterpret_cast<uintptr_t>(dn.data);
    }
    STRATA_ASSIGN_OR_RETURN(void *dt, Grow(prompt_tab_, tab.size() * sizeof(uint64_t)));
    Upload(dt, tab.data(), tab.size() * sizeof(uint64_t));
    STRATA_RETURN_IF_ERROR(TakeError());
    const auto *dtab = static_cast<const uint64_t *>(dt);
    PromptGroups pg;
    pg.span = reinterpret_cast<const int64_t *>(dtab);
    pg.w0 = reinterpret_cast<const void *const *>(dtab + 2 * m);
    pg.w1 = reinterpret_cast<const void *const *>(dtab + 3 * m);
    pg.m = m;
    STRATA_RETURN_IF_ERROR(PromptMmaQ8(pg, gs, xq, h, s));
    mark(&t2);
    const bool down_q8 = hb > 0 && CheckMatrix(ds).ok() && Q8RowsAligned(ds);
    if (down_q8) {
      // The SwiGLU rows quantized for the down products, a run of adjacent groups at a time.
      for (int i = 0; i < m;) {
        int j = i + 1;
        while (j < m && row0[c0 + j] == row1[c0 + j - 1]) ++j;
        const int64_t a = row0[c0 + i] - lo, b = row1[c0 + j - 1] - lo;
        STRATA_RETURN_IF_ERROR(QuantizeActivationsQ8(fd, h + a * n_ff, b - a, n_ff, static_cast<uint8_t *>(hq) + a * hb, s));
        i = j;
      }
      PromptGroups pd;
      pd.span = pg.span;
      pd.w0 = reinterpret_cast<const void *const *>(dtab + 4 * m);
      pd.m = m;
      STRATA_RETURN_IF_ERROR(PromptMmaQ8(pd, ds, hq, yg + lo * d, s));
    } else {
      for (int i = 0; i < m; ++i) {
        const int64_t a = row0[c0 + i], b = row1[c0 + i];
        STRATA_RETURN_IF_ERROR(MatMulDevice(downs[i], h + (a - lo) * n_ff, b - a, yg + a * d, td));
      }
    }
    mark(&t3);
    if (trace) {
      std::fprintf(stderr, "prompt experts: %d experts, %lld rows: gate/up %.1f us, down %.1f us\n", m,
                   static_cast<long long>(rows), std::chrono::duration<double, std::micro>(t2 - t1).count(),
                   std::chrono::duration<double, std::micro>(t3 - t2).count());
    }
    for (int i = 0; i < m; ++i) prompt_pending_.erase(ew[c0 + i]->gate.data);
    bool promoted = false;
    for (int i = 0; i < m; ++i) {
      if (slot[i] == nullptr) continue;
      STRATA_ASSIGN_OR_RETURN(const bool p, PromoteStaged(*slot[i]));
      promoted = promoted || p;
    }
    if (promoted) FlushTables();
    // After the promotions' copies: a staging slot is refilled only once they have read it.
    for (int i = 0; i < m; ++i) {
      if (slot[i] != nullptr) STRATA_RETURN_IF_ERROR(SlotUsed(slot[i], row1[c0 + i] - row0[c0 + i]));
    }
  }
  return absl::OkStatus();
}

void CudaBackend::ExpertFfnOne(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  // A routed expert of the VRAM tier: bring it into a slot, compute, mark the slot read.
  Slot *slot = nullptr;
  if (!slots_.empty() && e.gate.data != nullptr && regions_.count(e.gate.data) == 0) {
    auto s = SlotFor(e);
    if (!Note(s.status())) return;
    slot = *s;
  }
  Note(ExpertFfnImpl(e, x, n_tok, y));
  prompt_pending_.erase(e.gate.data);
  if (slot == nullptr) return;
  auto promoted = PromoteStaged(*slot);
  if (!Note(promoted.status())) return;
  if (*promoted) FlushTables();
  Note(SlotUsed(slot, n_tok));
}

bool CudaBackend::RoutedExperts(const model::RoutedExpertsArgs &a) {
  Profile prof(this, "RoutedExperts");
  if (!err_.ok() || a.layer < 0 || a.layer >= static_cast<int>(tables_.size())) return false;
  LayerTable &t = tables_[a.layer];
  const int k = a.route.k;
  const int64_t rows = a.n_tok * k;
  if (!t.ok || rows <= 0 || rows > kDeviceRouteMaxRows || a.route.n_expert != t.ge.n_expert) return false;
  const bool tiered = !slots_.empty();
  // Inside a step bracket the tier was updated by BeginStep, for every layer.
  if (tiered && bracket_ == Bracket::kNone) {
    if (replan_ && !Note(Replan())) return true;
    if (!Note(EnterLandedFills()) || !Note(UpdateTier(a.layer))) return true;
    if (a.layer == first_table_layer_) UpdatePaths(a.n_tok);  // once a step, before its first MoE layer
  }
  auto ra = ToRouteArgs(a.route);
  if (!Note(ra.status())) return true;
  const int n_expert = t.ge.n_expert;
  const int n_max = static_cast<int>(std::min<int64_t>(rows, n_expert));
  const int64_t n_embd = t.ge.gate_shape.cols;
  cudaStream_t s = stream_.get();
  auto plan = Grow(plan_buf_, GroupPlanInts(a.n_tok, k, n_expert) * sizeof(int32_t));
  auto hg = Grow(grouped_ws_, static_cast<size_t>(rows) * t.ge.gate_shape.rows * sizeof(float));
  if (!Note(plan.status()) || !Note(hg.status())) return true;
  int32_t *pl = static_cast<int32_t *>(*plan);
  float *h = static_cast<float *>(*hg);
  Stamp("layer to experts");
  // On the hybrid path the CPU takes some cold experts: the device skips their groups.
  const bool hybrid = tiered && t.hybrid && cpu_experts_ != nullptr;
  const uint8_t *skip = hybrid ? skip_dev_.as<uint8_t>() : nullptr;
  // 8-bit gate/up products read the tokens' quantized rows through idx: no gathered copy of them.
  const bool gate_q8 = q8_ && Q8ActFor(t.ge.gate_shape.type) != Q8Act::kNone;
  // Up to 8 tokens off the hybrid path: routing, grouping and quantizing their rows in one launch
  // (16 sessions measured no faster with it: a warp then routes two tokens in turn).
  // STRATA_CUDA_FUSED_ROUTE=N moves the cap (0: never, at most kRouteGroupMaxTokens; a measuring knob).
  const int64_t fused_max = std::clamp<int64_t>(tunables::Get().cuda_fused_route, 0, kRouteGroupMaxTokens);
  // The copy engines only in a recorded step: its kernels all ran before, in the step shape's
  // first (eager) run or at the copier's creation, so none is loaded lazily while a WaitColdCopies
  // spins (loading a kernel waits for the device's work to drain, and the copies the wait waits for
  // would wait for the drain). An eager step reads the experts in place: the same bytes, the same bits.
  const bool copies = tiered && t.stage && copier_ != nullptr && t.copies && bracket_ == Bracket::kCapture;
  // Experts a prediction copied ahead for this layer are the copier's: the CPU sees them resident.
  const bool predicted = copies && pf_layer_ == a.layer;
  const void *const *cpu_tab = predicted ? pf_stage_[pf_set_].gate : t.ge.gate;
  // By the copy engines: this layer's cold experts (less those its prediction already copied),
  // then the next layer's predicted ones, while the products wait only for the first.
  GroupedExperts from = t.ge;
  ExpertStage urgent = stage_;
  if (predicted) {
    const ExpertStage &ps = pf_stage_[pf_set_];
    from = StagedExperts(t.ge, ps);
    urgent.counts = pf_counts_.as<unsigned long long>() + 2;
    urgent.hit_lo = reinterpret_cast<uintptr_t>(ps.slots);
    urgent.hit_hi = urgent.hit_lo + static_cast<uintptr_t>(ps.n_slots) * ps.slot_bytes;
  }
  pf_layer_ = -1;
  bool planned = false;  // the copies' plan run by the routing's launch
  bool join = false;     // the next layer's prediction runs on predict_stream_, to be joined
  const void *xq = nullptr;
  if (gate_q8 && !hybrid && a.n_tok <= fused_max) {
    const Q8Act f = Q8ActFor(t.ge.gate_shape.type);
    auto buf = Grow(q8_x_, static_cast<size_t>(a.n_tok * Q8ActRowBytes(f, n_embd)));
    if (!Note(buf.status())) return true;
    ColdPlan cold;
    if (copies) {
      absl::StatusOr<ColdPlan> c = MakeColdPlan(from, urgent, nullptr, copier_->mailbox(), a.layer, true);
      if (!Note(c.status())) return true;
      cold = *c;
    }
    if (!Note(RouteGroupQuantize(*ra, a.logits, a.n_tok, a.sel, a.wts, a.idx, pl, f, a.h, n_embd, *buf, s,
                                 copies ? &cold : nullptr))) {
      return true;
    }
    planned = copies;
    xq = *buf;
  } else if (!Note(cuda::Route(*ra, a.logits, a.n_tok, a.sel, a.wts, s)) ||
             (hybrid && !Note(cpu_experts_->Start(a.layer, a.n_tok, k, n_expert, a.sel, a.h, cpu_tab,
                                                  skip_dev_.as<uint8_t>(), s))) ||
             !Note(GroupByExpert(a.sel, a.n_tok, k, n_expert, a.idx, pl, s))) {
    return true;
  }
  Stamp("route");
  // Cold experts copied into VRAM staging slots first, so the products read VRAM: by the copy
  // engines (the copier, by default) in a layer with cold experts to copy, else by a kernel
  // (STRATA_CUDA_STAGE_EXPERTS). A layer the copier leaves alone reads them in place.
  const bool stage = copies || (tiered && t.stage && copier_ == nullptr);
  if (copies) {
    if (!planned && !Note(PlanColdCopies(from, urgent, pl, n_max, skip, copier_->mailbox(), a.layer, true, s))) {
      return true;
    }
    Stamp("plan urgent");
    // The next layer with routed experts (past dense ones) is the one predicted. In a recorded
    // step the tier changed its tables before the step, so a prediction's tables stay true until
    // that layer reads them.
    int nl = a.layer + 1;
    while (nl < static_cast<int>(tables_.size()) && !tables_[nl].ok) ++nl;
    if (nl < static_cast<int>(tables_.size())) {
      const LayerTable &tn = tables_[nl];
      // A layer on the hybrid path gets at most STRATA_CUDA_PREDICT_HYBRID (default 2) predicted
      // experts copied ahead, the CPU seeing them as resident, so the link works while the layers
      // before compute and the CPU takes a share of the rest. Two measured fastest of none to five
      // (bench/README.md); with every prediction copied the CPU was left only the experts it missed
      // and the step was link-bound again.
      const int predict_hybrid =
          static_cast<int>(std::clamp<int64_t>(tunables::Get().cuda_predict_hybrid, 0, INT32_MAX));
      const int n_pred = tn.hybrid ? std::min(predict_hybrid, pf_stage_[0].n_slots) : pf_stage_[0].n_slots;
      // The prediction runs beside this layer's wait and products, on a stream of its own (the
      // request it posts follows this layer's own), joined before the layer ends: h, which it
      // reads, is written again after. STRATA_CUDA_PREDICT_BESIDE=0 runs it in line (a measuring knob).
      const bool beside = tunables::Get().cuda_predict_beside;
      if (tn.stage && tn.copies && n_pred > 0) {
        cudaStream_t ps = beside ? predict_stream_.get() : s;
        if (beside && (!Note(pf_fork_.Record(s)) || !Note(predict_stream_.Wait(pf_fork_.get())))) return true;
        if (!Note(PredictColdExperts(nl, a.h, a.n_tok, a.route, n_pred, ps))) return true;
        if (beside && !Note(pf_join_.Record(ps))) return true;
        join = beside;
      }
    }
    Stamp("predict next");
    if (!Note(WaitColdCopies(copier_->mailbox(), s))) return true;
    Stamp("wait copies");
  } else if (stage && !Note(StageColdExperts(t.ge, stage_, pl, n_max, skip, s))) {
    return true;
  }
  const GroupedExperts ge = stage ? StagedExperts(from, stage_) : t.ge;
  if ((!gate_q8 && !Note(cuda::GatherRows(a.h, n_embd, a.idx, rows, a.xg, s))) ||
      !Note(GroupedProducts(ge, pl, n_max, gate_q8 ? a.h : a.xg, gate_q8 ? a.idx : nullptr, h, a.yg, rows, a.n_tok,
                            skip, xq))) {
    return true;
  }
  Stamp("products");
  // With the tier the selections come back for its hotness, written by the sum's kernel into mapped
  // memory: a copy of them would be a copy node in a recorded step, costing each layer.
  int32_t *sel_back = tiered ? hist_dev_ + static_cast<size_t>(a.layer) * kDeviceRouteMaxRows : nullptr;
  if ((hybrid && !Note(cpu_experts_->Finish(pl, n_max, skip, a.yg, s))) ||
      !Note(cuda::WeightedRowSum(a.yg, a.idx + rows, a.wts, a.n_tok, k, n_embd, a.out, s, a.sel, sel_back)) ||
      (join && !Note(stream_.Wait(pf_join_.get())))) {
    return true;
  }
  Stamp("sum");
  if (tiered) {
    if (bracket_ != Bracket::kNone) {
      step_hist_.emplace_back(a.layer, rows);  // the tier hears of it after the step
    } else if (Note(t.hist_done.Record(s))) {
      t.hist_rows = rows;
      t.hist_step = false;
    }
  }
  return true;
}

absl::Status CudaBackend::PredictColdExperts(int nl, const float *h, int64_t n_tok, const model::RouteParams &route,
                                             int n_slots, cudaStream_t s) {
  const LayerTable &tn = tables_[nl];
  const model::LayerWeights &L = w_->layers[nl];
  const int k = route.k;
  if (n_tok <= 0 || k <= 0 || n_tok * k > kDeviceRouteMaxRows || L.router.tensor == nullptr) return absl::OkStatus();
  absl::StatusOr<DeviceMatrix> router = Resolve(L.router);
  if (!router.ok()) return absl::OkStatus();  // a router outside VRAM: no prediction
  model::RouteParams rp = route;
  rp.n_expert = tn.ge.n_expert;
  rp.select_bias = L.expert_select_bias.tensor != nullptr ? L.expert_select_bias.values.data() : nullptr;
  STRATA_ASSIGN_OR_RETURN(RouteArgs ra, ToRouteArgs(rp));
  float *logits = pf_logits_.as<float>();
  int32_t *sel = pf_sel_.as<int32_t>(), *plan = pf_plan_.as<int32_t>();
  STRATA_RETURN_IF_ERROR(cuda::Gemv(*router, h, n_tok, logits, s));
  if (L.router_bias.tensor != nullptr) {
    STRATA_ASSIGN_OR_RETURN(const float *bias, Resolve(L.router_bias.values.data()));
    STRATA_RETURN_IF_ERROR(cuda::AddBias(logits, n_tok, rp.n_expert, bias, s));
  }
  // The other set than the one the current layer reads.
  const int set = pf_set_ ^ 1;
  ExpertStage st = pf_stage_[set];
  st.n_slots = std::min(st.n_slots, n_slots);
  if (n_tok <= kRouteGroupMaxTokens) {  // routing, grouping and the copies' plan in one launch
    STRATA_ASSIGN_OR_RETURN(const ColdPlan cold, MakeColdPlan(tn.ge, st, nullptr, copier_->mailbox(), nl, false));
    STRATA_RETURN_IF_ERROR(RouteGroupQuantize(ra, logits, n_tok, sel, pf_wts_.as<float>(), pf_idx_.as<int32_t>(), plan,
                                              Q8Act::kNone, nullptr, 0, nullptr, s, &cold));
  } else {
    STRATA_RETURN_IF_ERROR(cuda::Route(ra, logits, n_tok, sel, pf_wts_.as<float>(), s));
    STRATA_RETURN_IF_ERROR(GroupByExpert(sel, n_tok, k, rp.n_expert, pf_idx_.as<int32_t>(), plan, s));
    const int n_max = static_cast<int>(GroupMaxGroups(n_tok, k, rp.n_expert));
    STRATA_RETURN_IF_ERROR(PlanColdCopies(tn.ge, st, plan, n_max, nullptr, copier_->mailbox(), nl, false, s));
  }
  pf_set_ = set;
  pf_layer_ = nl;
  return absl::OkStatus();
}

absl::Status CudaBackend::GroupedProducts(const GroupedExperts &ge, const int32_t *plan, int n_max, const float *xg,
                                          const int32_t *tok, float *h, float *yg, int64_t rows, int64_t n_tok,
                                          const uint8_t *skip, const void *xq_ready) {
  cudaStream_t s = stream_.get();
  const Q8Act fi = q8_ ? Q8ActFor(ge.gate_shape.type) : Q8Act::kNone;
  const Q8Act fd = q8_ ? Q8ActFor(ge.down_shape.type) : Q8Act::kNone;
  const int64_t n_embd = ge.gate_shape.cols, n_ff = ge.gate_shape.rows;
  const int k = n_tok > 0 ? static_cast<int>(rows / n_tok) : 0;
  const int grid = k > 0 ? std::min(n_max, GroupGridGroups(n_tok, k, ge.n_expert)) : n_max;
  // Chunks sized by the expected group (GroupChunkTokens) take a group of more tokens in several
  // passes over its weights: cheap from VRAM, not where an expert is read in place over the link,
  // so with a VRAM tier a group goes in one pass as before.
  const int64_t q8_chunk = k > 0 && slots_.empty() ? GroupChunkTokens(n_tok, k, ge.n_expert) : n_tok;
  // Each stage on its own: a Q4_K gate/up with a Q6_K down (as Q4_K_M files mix them) dots codes in
  // the first and rounds h for the second.
  if (tok != nullptr && fi == Q8Act::kNone) {
    return Errorf(MOE_ERR_INTERNAL, "grouped products: token rows given for float activations");
  }
  if (fi != Q8Act::kNone) {
    const void *xq = xq_ready;
    if (xq == nullptr) {
      const int64_t x_rows = tok != nullptr ? n_tok : rows;  // the tokens' rows, or the gathered ones
      STRATA_ASSIGN_OR_RETURN(void *buf, Grow(q8_x_, static_cast<size_t>(x_rows * Q8ActRowBytes(fi, n_embd))));
      STRATA_RETURN_IF_ERROR(QuantizeActivationsQ8(fi, xg, x_rows, n_embd, buf, s));
      xq = buf;
    }
    STRATA_RETURN_IF_ERROR(GroupedSwiGluQ8(ge, plan, n_max, xq, h, s, q8_chunk, skip, tok, grid));
  } else {
    STRATA_ASSIGN_OR_RETURN(const float *xr, GridInput(ge.gate_shape.type, xg, rows, n_embd));
    STRATA_RETURN_IF_ERROR(GroupedSwiGlu(ge, plan, n_max, xr, h, s, n_tok, skip, grid));
  }
  if (fd != Q8Act::kNone) {
    STRATA_ASSIGN_OR_RETURN(void *hq, Grow(q8_h_, static_cast<size_t>(rows * Q8ActRowBytes(fd, n_ff))));
    STRATA_RETURN_IF_ERROR(QuantizeActivationsQ8(fd, h, rows, n_ff, hq, s));
    return GroupedGemvQ8(ge.down, ge.down_shape, plan, n_max, hq, yg, s, q8_chunk, skip, grid);
  }
  if (const int block = Q8Grid(ge.down_shape.type); block != 0) {  // h is scratch: rounded in place
    STRATA_RETURN_IF_ERROR(RoundActivationsQ8(block, h, rows, n_ff, h, s));
  }
  return GroupedGemv(ge.down, ge.down_shape, plan, n_max, h, yg, s, n_tok, skip, grid);
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
    std::fprintf(stderr, "cuda graphs: step %lld %s: %s\n", static_cast<long long>(steps_ - 1),
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

absl::Status CudaBackend::IssuePassFills() {
  if (pass_slots_.empty() && pass_copies_.empty()) return absl::OkStatus();
  // The victims' last reads were queued before the step (their `used` events, recorded at Evict):
  // the wait is for the work before the step, not for it.
  absl::Status st = absl::OkStatus();
  for (int v : pass_slots_) {
    if (st.ok()) st = AfterLastUse(slots_[v]);
  }
  if (st.ok()) st = IssueCopies(pass_copies_);
  for (int v : pass_slots_) {
    if (st.ok()) st = slots_[v].fill.Record(copy_stream_.get());
  }
  if (!st.ok()) {
    // The slots hold no copy of their experts: they go empty again, out of every table.
    for (int v : pass_slots_) (void)Evict(v);
  }
  pass_slots_.clear();
  pass_copies_.clear();
  return st;
}

model::Backend::StepMode CudaBackend::BeginStep(const model::StepKey &key) {
  const auto t0 = std::chrono::steady_clock::now();
  TimeStep(key);
  last_mode_ = BeginStepImpl(key);
  const auto t1 = std::chrono::steady_clock::now();
  // After a replay's launch, or a way out of BeginStepImpl that left some (a recording has none).
  if (last_mode_ != StepMode::kCapture) Note(IssuePassFills());
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
    std::fprintf(stderr, "strata: profiler on for step %lld\n", static_cast<long long>(profiler_step_));
  }
  pf_layer_ = -1;  // a prediction is for the step that made it
  if (stamped_ != nullptr) ReadStamps();
  if (copier_ != nullptr && err_.ok()) Note(copier_->status());
  if (!err_.ok() || !use_graphs_ || profile_ || bracket_ != Bracket::kNone) return StepMode::kEager;
  // Promotions and the last step's selections reach the tables before the step, for every layer;
  // after a prompt the slots are first given to the experts it used most.
  if (!slots_.empty()) {
    if (replan_ && !Note(Replan())) return StepMode::kEager;
    // The pass's table changes reach the device in one upload a layer (a tiny upload a table entry
    // cost the stream, and the host a call, each time); its promotions' copies wait for their
    // victims' last reads and go in one batch after the step's launch (IssuePassFills), while the
    // device runs the step.
    const auto t0 = host_trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    defer_tables_ = true;
    fill_sink_ = &pass_copies_;
    pass_fills_ = &pass_slots_;
    tier_pass_ = true;
    victim_floor_ok_ = false;
    if (Note(EnterLandedFills())) {
      for (size_t l = 0; l < tables_.size(); ++l) {
        if (tables_[l].ok && !Note(UpdateTier(static_cast<int>(l)))) break;
      }
    }
    tier_pass_ = victim_floor_ok_ = false;
    fill_sink_ = nullptr;
    pass_fills_ = nullptr;
    defer_tables_ = false;
    FlushTables();
    if (!err_.ok()) return StepMode::kEager;
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
    return StepMode::kReplay;  // BeginStep issues the pass's fills, the step running
  }
  if (!Note(IssuePassFills())) return StepMode::kEager;  // not inside a recording
  if (clean_.count(step_key_) != 0 && refused_.count(step_key_) == 0 && Graph::BeginCapture(stream_.get()).ok()) {
    if (graph_trace_) std::fprintf(stderr, "cuda graphs: step %lld recorded (paths %u)\n", static_cast<long long>(steps_ - 1), paths_);
    capture_t0_ = std::chrono::steady_clock::now();
    bracket_ = Bracket::kCapture;
    stamp_names_.clear();
    Stamp("step start");
    return StepMode::kCapture;
  }
  (void)cudaGetLastError();
  if (graph_trace_) std::fprintf(stderr, "cuda graphs: step %lld watched (paths %u)\n", static_cast<long long>(steps_ - 1), paths_);
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
    std::fprintf(stderr, "cuda graphs: step %lld: %zu nodes, %.2f ms recording, %.2f ms instantiating\n",
                 static_cast<long long>(steps_ - 1), nodes, ms(capture_t0_, t_end),
                 ms(t_end, std::chrono::steady_clock::now()));
  }
  if (!g.ok() || !err_.ok()) {
    // Nothing ran: the caller runs the step again outside a bracket. This key is not recorded again.
    absl::Status why = !err_.ok() ? err_ : g.status();
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

void CudaBackend::WriteKvRows(const model::KvRowRef *rows, const model::KvRowRef *, int64_t n, const float *k,
                              const float *v, int k_width, int v_width) {
  Profile prof(this, "WriteKvRows");
  if (err_.ok()) Note(cuda::WriteKvRows(rows, n, k, v, k_width, v_width, model::kKvBlockTokens, stream_.get()));
}

void CudaBackend::AttentionRows(const float *q, const model::KvRowRef *rows, const model::KvRowRef *, int64_t n,
                                int max_keys, int n_head, int n_head_kv, int head_dim, int k_width, int v_width,
                                float *out, const model::AttentionParams &p) {
  Profile prof(this, "AttentionRows");
  if (!err_.ok() || n <= 0) return;
  auto args = AttentionArgs(n_head, n_head_kv, head_dim, k_width, v_width, p);
  if (!Note(args.status())) return;
  AttentionExtArgs a = *args;
  a.rows = rows;
  a.max_keys = max_keys;
  auto ws = Grow(attn_ws_, std::max<size_t>(AttentionExtWorkspaceBytes(a, n), 1));
  if (Note(ws.status())) Note(AttentionExt(q, a, n, out, stream_.get(), Workspace{*ws, attn_ws_.size()}));
}

}  // namespace strata::cuda
