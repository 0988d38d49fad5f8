// CudaBackend's routed experts: a decode layer routed, grouped and computed on the device
// (RoutedExperts, with the copy engines' prediction and the CPU's share), and a prompt's experts
// on the host path (ExpertFfn, ExpertsFfn, PromptExperts). Every path gives the same bits.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/placement.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

namespace strata::cuda {

absl::Status CudaBackend::StartCpuExperts(const model::ModelWeights &w, const CpuExpertOptions &cpu,
                                          int n_expert_max, const uint8_t *host, const uint8_t *dev, size_t bytes,
                                          std::vector<model::ExpertWeights> calib) {
  // The link is timed by copies into the copy engines' staging slots.
  uint8_t *to = stage_buf_.as<uint8_t>();
  const size_t to_bytes = stage_buf_.size();
  const size_t one = static_cast<size_t>(stage_.slot_bytes);
  STRATA_ASSIGN_OR_RETURN(double link, MeasureLink(to, host, std::min<size_t>({to_bytes, bytes, size_t{256} << 20})));
  STRATA_ASSIGN_OR_RETURN(double copy_s, MeasureCopyLatency(link, to, host, std::min<size_t>({to_bytes, bytes, one})));
  STRATA_ASSIGN_OR_RETURN(skip_dev_, DeviceBuffer::Allocate(n_expert_max));
  STRATA_ASSIGN_OR_RETURN(cpu_experts_, CpuExperts::Create(w, cpu, kDeviceRouteMaxRows, n_expert_max, host, dev, bytes,
                                                           link, copy_s, stream_.get(), std::move(calib)));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::MeasureLink(void *to, const uint8_t *from, size_t bytes) {
  if (bytes == 0 || to == nullptr || from == nullptr) return 0.0;
  STRATA_ASSIGN_OR_RETURN(Event a, Event::Create(/*timing=*/true));
  STRATA_ASSIGN_OR_RETURN(Event b, Event::Create(/*timing=*/true));
  float best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    STRATA_RETURN_IF_ERROR(a.Record(stream_.get()));
    STRATA_RETURN_IF_ERROR(CopyAsync(to, from, bytes, stream_.get()));
    STRATA_RETURN_IF_ERROR(b.Record(stream_.get()));
    STRATA_RETURN_IF_ERROR(b.Synchronize());
    STRATA_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(a, b));
    if (ms > 0 && (best == 0 || ms < best)) best = ms;
  }
  return best > 0 ? static_cast<double>(bytes) / (best * 1e-3) : 0.0;
}

absl::StatusOr<double> CudaBackend::MeasureCopyLatency(double link_bytes_s, void *to, const uint8_t *from,
                                                       size_t bytes) {
  // One expert's copy, timed by the host from the call to its end, less its bytes at the link's
  // rate: the best of five.
  if (bytes == 0 || to == nullptr || from == nullptr || link_bytes_s <= 0) return 0.0;
  double best = 1.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(CopyAsync(to, from, bytes, stream_.get()));
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
      LogDebug("cuda paths: step %lld: %s held (%.1f us a step against %.2f ms to record again)\n",
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
    LogDebug("cuda paths: step %lld: %d layers with the CPU's share, %d with the copy engines (set %u%s)\n",
             static_cast<long long>(steps_ - 1), n_hybrid, n_copies, want, recorded ? ", recorded" : "");
  }
  // Paths without a graph record again: this step and the next are no sample of either regime.
  if (changed && !recorded && regime_ != nullptr) regime_->Disturbed();
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
    if (e.gate_bias.tensor != nullptr) STRATA_RETURN_IF_ERROR(AddBiasOf(g, n_tok, 2 * n_ff, e.gate_bias));
    STRATA_RETURN_IF_ERROR(TakeError());
    STRATA_RETURN_IF_ERROR(GatedAct(g, g + 1, 2 * n_ff, 2, n_tok, n_ff, e.swiglu_limit, h, stream_.get()));
    MatMulInputMajor(e.down, h, n_tok, y);
  } else {
    MatMul(e.gate, x, n_tok, g);
    MatMul(e.up, x, n_tok, u);
    if (e.gate_bias.tensor != nullptr) STRATA_RETURN_IF_ERROR(AddBiasOf(g, n_tok, n_ff, e.gate_bias));
    if (e.up_bias.tensor != nullptr) STRATA_RETURN_IF_ERROR(AddBiasOf(u, n_tok, n_ff, e.up_bias));
    STRATA_RETURN_IF_ERROR(TakeError());
    STRATA_RETURN_IF_ERROR(GatedAct(g, u, n_ff, 1, n_tok, n_ff, e.swiglu_limit, h, stream_.get()));
    MatMul(e.down, h, n_tok, y);
  }
  const int64_t n_embd = e.input_major ? e.gate.rows : e.down.rows;
  if (e.down_bias.tensor != nullptr) STRATA_RETURN_IF_ERROR(AddBiasOf(y, n_tok, n_embd, e.down_bias));
  return TakeError();
}

absl::Status CudaBackend::AddBiasOf(float *x, int64_t n_rows, int64_t n, const model::Vec &bias) {
  STRATA_ASSIGN_OR_RETURN(const float *b, Resolve(bias));
  return cuda::AddBias(x, n_rows, n, b, stream_.get());
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
  // (A resident one, such as a shared expert, needs no wait: a recorded step holds none.)
  if (InMappedHost(e.gate.data)) Note(stream_.Synchronize());
}

bool CudaBackend::InMappedHost(const uint8_t *p) const {
  for (const uint8_t *m : mapped_) {
    if (p >= m && p < m + regions_.at(m).bytes) return true;
  }
  return false;
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
  std::vector<char> staged(n, 0);
  for (int u = 0; u < n; ++u) {
    if (ew[u] != nullptr && first[u + 1] > first[u]) staged[u] = PromptStages(*ew[u]) ? 1 : 0;
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
  // A chunk stages at most half the staging ring, so its copies go while the chunk before computes
  // from the other half.
  const size_t chunk = ew.size();
  const size_t stage_chunk = std::max<size_t>(prompt_stage_.size() / 2, 1);
  // The experts in VRAM make a chunk of their own: its products wait for no copy, and the first
  // staged chunk's copies run beside them.
  const auto chunk_end = [&](size_t c0) {
    size_t c1 = c0, n_staged = 0;
    while (c1 < ew.size() && c1 - c0 < chunk && stages[c1] == stages[c0] && (stages[c1] == 0 || n_staged < stage_chunk)) {
      n_staged += stages[c1++];
    }
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
    // The chunk's experts from RAM go to the staging ring, the products waiting for their copies.
    std::vector<Slot *> slot(m, nullptr);
    for (int i = 0; i < m; ++i) {
      if (!stages[c0 + i]) continue;
      STRATA_ASSIGN_OR_RETURN(slot[i], PromptStage(*ew[c0 + i]));
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
      LogDebug("prompt experts: %d experts, %lld rows: gate/up %.1f us, down %.1f us\n", m,
               static_cast<long long>(rows), std::chrono::duration<double, std::micro>(t2 - t1).count(),
               std::chrono::duration<double, std::micro>(t3 - t2).count());
    }
    for (int i = 0; i < m; ++i) {
      if (slot[i] != nullptr) STRATA_RETURN_IF_ERROR(SlotUsed(slot[i]));
    }
  }
  return absl::OkStatus();
}

void CudaBackend::ExpertFfnOne(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  // A prompt's expert from RAM is staged, as PromptExperts stages its chunks.
  Slot *slot = nullptr;
  if (host_batch_rows_ > kDeviceRouteMaxRows && PromptStages(e)) {
    auto s = PromptStage(e);
    if (!Note(s.status())) return;
    slot = *s;
  }
  Note(ExpertFfnImpl(e, x, n_tok, y));
  if (slot != nullptr) Note(SlotUsed(slot));
}

bool CudaBackend::RoutedExperts(const model::RoutedExpertsArgs &a) {
  Profile prof(this, "RoutedExperts");
  if (!err_.ok() || a.layer < 0 || a.layer >= static_cast<int>(tables_.size())) return false;
  LayerTable &t = tables_[a.layer];
  const int k = a.route.k;
  const int64_t rows = a.n_tok * k;
  if (!t.ok || rows <= 0 || rows > kDeviceRouteMaxRows || a.route.n_expert != t.ge.n_expert) return false;
  if (tables_dirty_ && bracket_ == Bracket::kNone) FlushTables();  // a tier's moves since the last layer
  // The tiers' tables with the CPU's share: the layer's counts, and the paths once a step.
  const bool tier_share = external_tables_ && hist_dev_ != nullptr;
  if (tier_share && bracket_ == Bracket::kNone) {
    if (!Note(UpdateTierLayer(a.layer))) return true;
    if (a.layer == first_table_layer_) UpdatePaths(a.n_tok);
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
  const bool hybrid = tier_share && t.hybrid && cpu_experts_ != nullptr;
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
  const bool copies = external_tables_ && t.stage && copier_ != nullptr && t.copies &&
                      bracket_ == Bracket::kCapture;
  // Experts a prediction copied ahead for this layer are the copier's: the CPU sees them resident.
  const bool predicted = copies && pf_layer_ == a.layer;
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
             (hybrid && !Note(cpu_experts_->Start(a.layer, a.n_tok, k, n_expert, a.sel, a.h, from,
                                                  skip_dev_.as<uint8_t>(), s))) ||
             !Note(GroupByExpert(a.sel, a.n_tok, k, n_expert, a.idx, pl, s))) {
    return true;
  }
  Stamp("route");
  // Experts from RAM copied into VRAM staging slots first, so the products read VRAM: by the copy
  // engines in a layer with cold experts to copy. A layer the copier leaves alone reads them in place.
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
  }
  const GroupedExperts ge = copies ? StagedExperts(from, stage_) : t.ge;
  if ((!gate_q8 && !Note(cuda::GatherRows(a.h, n_embd, a.idx, rows, a.xg, s))) ||
      !Note(GroupedProducts(ge, pl, n_max, gate_q8 ? a.h : a.xg, gate_q8 ? a.idx : nullptr, h, a.yg, rows, a.n_tok,
                            skip, xq))) {
    return true;
  }
  Stamp("products");
  // With the CPU's share the selections come back for the layer's counts, written by the sum's kernel into mapped
  // memory: a copy of them would be a copy node in a recorded step, costing each layer.
  const bool back = tier_share;
  int32_t *sel_back = back ? hist_dev_ + static_cast<size_t>(a.layer) * kDeviceRouteMaxRows : nullptr;
  if ((hybrid && !Note(cpu_experts_->Finish(pl, n_max, skip, a.yg, s))) ||
      !Note(cuda::WeightedRowSum(a.yg, a.idx + rows, a.wts, a.n_tok, k, n_embd, a.out, s, a.sel, sel_back)) ||
      (join && !Note(stream_.Wait(pf_join_.get())))) {
    return true;
  }
  Stamp("sum");
  if (back) {
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
  // so with a VRAM tier (the backend's or a tier's tables) a group goes in one pass as before.
  const bool in_place = external_tables_;  // experts may be read over the link
  const int64_t q8_chunk = k > 0 && !in_place ? GroupChunkTokens(n_tok, k, ge.n_expert) : n_tok;
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

}  // namespace strata::cuda
