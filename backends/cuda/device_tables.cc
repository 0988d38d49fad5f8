// CudaBackend's device tables of expert addresses (a layer's experts for the grouped kernels,
// resident or a tier's), the staging ring a prompt's experts from RAM are copied into, the copy
// engines' set-up and the device's counters. The tiers themselves are lib/store's.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/placement.h"
#include "lib/util/log.h"

namespace strata::cuda {

bool CudaBackend::PromptStages(const model::ExpertWeights &e) const {
  if (prompt_stage_.empty() || tier_copies_ == nullptr || e.gate.data == nullptr) return false;
  for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
    if (m->tensor != nullptr && m->data != nullptr && NeedsConversion(*m)) return false;
  }
  // An expert the RAM tier serves lies in its slab (one in a VRAM slot does not).
  const Region &slab = regions_.at(tier_copies_);
  for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
    if (m->tensor != nullptr && (m->data < tier_copies_ || m->data + m->nbytes() > tier_copies_ + slab.bytes)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<CudaBackend::Slot *> CudaBackend::PromptStage(const model::ExpertWeights &e) {
  const size_t i = prompt_stage_next_;
  prompt_stage_next_ = (i + 1) % prompt_stage_.size();
  Slot &sl = prompt_stage_[i];
  Unstage(sl);
  STRATA_RETURN_IF_ERROR(AfterLastUse(sl));
  STRATA_ASSIGN_OR_RETURN(const uint64_t off,
                          CopyParts(e, stage_buf_.as<uint8_t>() + static_cast<uint64_t>(i) * slot_bytes_, &sl));
  STRATA_RETURN_IF_ERROR(sl.fill.Record(copy_stream_.get()));
  STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // the computation waits for the copy
  // A RAM tier's slab slot names no expert for good: its stage is the call's alone, and SlotUsed
  // unstages it before the slab slot may take another expert.
  auto id = expert_id_.find(e.gate.data);
  sl.key = e.gate.data;
  sl.layer = id != expert_id_.end() ? id->second.first : -1;
  sl.expert = id != expert_id_.end() ? id->second.second : -1;
  ++fills_;
  fill_bytes_ += off;
  return &sl;
}

void CudaBackend::Unstage(Slot &sl) {
  // Only entries that still point into this staging slot: the expert may have been staged again
  // elsewhere since.
  const uint8_t *lo = stage_buf_.as<uint8_t>() + static_cast<uint64_t>(&sl - prompt_stage_.data()) * slot_bytes_;
  for (const uint8_t *p : sl.parts) {
    auto it = in_slots_.find(p);
    if (it != in_slots_.end() && it->second.dev >= lo && it->second.dev < lo + slot_bytes_) in_slots_.erase(it);
  }
  sl.parts.clear();
  sl.key = nullptr;
}

absl::Status CudaBackend::AfterLastUse(const Slot &sl) {
  // With the copier the copy stream never waits for the compute stream on the device: a compute
  // stream held by WaitColdCopies would then wait for copies queued behind that wait. The host
  // waits instead (in decode the last use is a finished step's; in a prompt, the step so far).
  if (copier_ != nullptr) return sl.used.Synchronize();
  return copy_stream_.Wait(sl.used.get());
}

absl::StatusOr<uint64_t> CudaBackend::CopyParts(const model::ExpertWeights &e, uint8_t *dev, Slot *sl) {
  uint64_t off = 0;
  for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
    if (m->tensor == nullptr || m->data == nullptr) continue;
    STRATA_RETURN_IF_ERROR(CopyAsync(dev + off, m->data, m->nbytes(), copy_stream_.get()));
    in_slots_[m->data] = Region{m->nbytes(), m->row_bytes, m->cols, false, dev + off};
    sl->parts.push_back(m->data);
    off += Align(m->nbytes());
  }
  return off;
}

void CudaBackend::FlushTables() {
  tables_dirty_ = false;
  for (size_t l = 0; l < table_dirty_.size(); ++l) {
    if (!table_dirty_[l]) continue;
    table_dirty_[l] = 0;
    const LayerTable &t = tables_[l];
    Upload(tab_dev_.as<const void *>() + t.tab_off, tab_host_.data() + t.tab_off,
           3 * static_cast<size_t>(t.ge.n_expert) * sizeof(void *));
  }
}

absl::Status CudaBackend::SlotUsed(Slot *slot) {
  STRATA_RETURN_IF_ERROR(slot->used.Record(stream_.get()));
  Unstage(*slot);  // its bytes stay, protected by `used`, until the ring comes round
  return absl::OkStatus();
}

absl::Status CudaBackend::BuildTables(const model::ModelWeights &w) {
  w_ = &w;
  tables_.clear();
  tables_.resize(w.layers.size());
  std::vector<const void *> host;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto &ex = w.layers[l].experts;
    for (size_t x = 0; x < ex.size(); ++x) expert_id_[ex[x].gate.data] = {static_cast<int>(l), static_cast<int>(x)};
    if (ex.empty()) continue;
    LayerTable &t = tables_[l];
    const model::ExpertWeights &e0 = ex[0];
    auto shape = [](const model::Matrix &m) {
      return DeviceMatrix{m.codec->id, reinterpret_cast<const void *>(uintptr_t{256}), m.rows, m.cols, m.row_bytes};
    };
    auto same = [](const model::Matrix &a, const model::Matrix &b) {
      return a.tensor != nullptr && a.data != nullptr && a.codec == b.codec && a.rows == b.rows && a.cols == b.cols &&
             a.row_bytes == b.row_bytes && !NeedsConversion(a);
    };
    bool ok = true;
    std::vector<const void *> g(ex.size()), u(ex.size()), d(ex.size());
    for (size_t x = 0; x < ex.size() && ok; ++x) {
      const model::ExpertWeights &e = ex[x];
      ok = !e.input_major && e.swiglu_limit == 0.f && e.gate_bias.tensor == nullptr && e.up_bias.tensor == nullptr &&
           e.down_bias.tensor == nullptr && same(e.gate, e0.gate) && same(e.up, e0.up) && same(e.down, e0.down);
      if (!ok) break;
      const model::Matrix *parts[3] = {&e.gate, &e.up, &e.down};
      std::vector<const void *> *cols[3] = {&g, &u, &d};
      for (int m = 0; m < 3 && ok; ++m) {
        const void *addr = nullptr;
        auto dm = Resolve(*parts[m]);
        ok = dm.ok();
        if (ok) addr = dm->data;
        if (ok) {
          DeviceMatrix dm = shape(*parts[m]);
          dm.data = addr;
          ok = CheckMatrix(dm).ok();  // mapped host bytes must meet the codec's alignment too
        }
        (*cols[m])[x] = addr;
      }
    }
    t.ge.gate_shape = shape(e0.gate);
    t.ge.up_shape = shape(e0.up);
    t.ge.down_shape = shape(e0.down);
    t.ge.n_expert = static_cast<int>(ex.size());
    {  // the check reads no device memory: stand-in table addresses until the tables exist
      GroupedExperts probe = t.ge;
      probe.gate = probe.up = probe.down = reinterpret_cast<const void *const *>(uintptr_t{256});
      ok = ok && CheckGroupedExperts(probe).ok() && t.ge.n_expert <= kRouteMaxExperts;
    }
    if (!ok) continue;
    t.ok = true;
    if (first_table_layer_ < 0) first_table_layer_ = static_cast<int>(l);
    STRATA_ASSIGN_OR_RETURN(t.hist_done, Event::Create());
    if (step_hist_done_.get() == nullptr) {
      STRATA_ASSIGN_OR_RETURN(step_hist_done_, Event::Create());
    }
    t.tab_off = host.size();
    host.insert(host.end(), g.begin(), g.end());
    host.insert(host.end(), u.begin(), u.end());
    host.insert(host.end(), d.begin(), d.end());
  }
  if (host.empty()) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(tab_dev_, DeviceBuffer::Allocate(host.size() * sizeof(void *)));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(tab_dev_.data(), host.data(), host.size() * sizeof(void *), cudaMemcpyHostToDevice));
  tab_host_ = host;
  PlaceTables();
  return absl::OkStatus();
}

int CudaBackend::PlaceTables() {
  table_dirty_.assign(tables_.size(), 0);
  int n_expert_max = 0;
  for (LayerTable &t : tables_) {
    if (!t.ok) continue;
    auto **base = tab_dev_.as<const void *>() + t.tab_off;
    t.ge.gate = base;
    t.ge.up = base + t.ge.n_expert;
    t.ge.down = base + 2 * t.ge.n_expert;
    n_expert_max = std::max(n_expert_max, t.ge.n_expert);
  }
  return n_expert_max;
}

// The staging tables, and with the copy engines (cold_copies_) the copier over [host, host + bytes)
// mapped at `dev`, the prediction's buffers and its stream: for stage_'s slots, set before.
absl::Status CudaBackend::SetUpColdCopies(int n_expert_max, const uint8_t *host, const uint8_t *dev, size_t bytes) {
  if (stage_.n_slots > 0) {
    const size_t tab_bytes = 3 * static_cast<size_t>(n_expert_max) * sizeof(void *);
    STRATA_ASSIGN_OR_RETURN(stage_tab_, DeviceBuffer::Allocate(tab_bytes));
    stage_.gate = stage_tab_.as<const void *>();
    stage_.up = stage_.gate + n_expert_max;
    stage_.down = stage_.up + n_expert_max;
    for (LayerTable &t : tables_) t.stage = t.ok && CheckExpertStage(t.ge, stage_).ok();
  }
  if (cold_copies_ && stage_.n_slots > 0) {
    const size_t n_x = static_cast<size_t>(n_expert_max);
    STRATA_ASSIGN_OR_RETURN(pf_tab_, DeviceBuffer::Allocate(2 * 3 * n_x * sizeof(void *)));
    for (int p = 0; p < 2; ++p) {
      pf_stage_[p].gate = pf_tab_.as<const void *>() + p * 3 * n_x;
      pf_stage_[p].up = pf_stage_[p].gate + n_x;
      pf_stage_[p].down = pf_stage_[p].up + n_x;
    }
    const size_t rows = kDeviceRouteMaxRows;
    STRATA_ASSIGN_OR_RETURN(pf_logits_, DeviceBuffer::Allocate(rows * n_x * sizeof(float)));
    STRATA_ASSIGN_OR_RETURN(pf_sel_, DeviceBuffer::Allocate(rows * sizeof(int32_t)));
    STRATA_ASSIGN_OR_RETURN(pf_wts_, DeviceBuffer::Allocate(rows * sizeof(float)));
    STRATA_ASSIGN_OR_RETURN(pf_idx_, DeviceBuffer::Allocate(2 * rows * sizeof(int32_t)));
    STRATA_ASSIGN_OR_RETURN(pf_plan_, DeviceBuffer::Allocate((2 + 2 * n_x) * sizeof(int32_t)));
    STRATA_ASSIGN_OR_RETURN(pf_counts_, DeviceBuffer::Allocate(4 * sizeof(unsigned long long)));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(pf_counts_.data(), 0, 4 * sizeof(unsigned long long)));
    pf_stage_[0].counts = pf_stage_[1].counts = pf_counts_.as<unsigned long long>();
    STRATA_ASSIGN_OR_RETURN(copier_, ColdCopier::Create(host, dev, bytes, copy_stream_.get()));
    // The copier's own kernels run once now, on an idle device (see RoutedExperts): an empty
    // plan (it posts nothing) and a wait for nothing.
    for (const LayerTable &t : tables_) {
      if (!t.ok || !t.stage) continue;
      cudaStream_t s = stream_.get();
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pf_plan_.data(), 0, pf_plan_.size(), s));
      STRATA_RETURN_IF_ERROR(PlanColdCopies(t.ge, pf_stage_[0], pf_plan_.as<int32_t>(), 0, nullptr,
                                            copier_->mailbox(), 0, false, s));
      STRATA_RETURN_IF_ERROR(WaitColdCopies(copier_->mailbox(), s));
      // And the routing launch that plans a prediction's copies, into no slots (nothing posted).
      ExpertStage none = pf_stage_[0];
      none.n_slots = 0;
      STRATA_ASSIGN_OR_RETURN(const ColdPlan cold, MakeColdPlan(t.ge, none, nullptr, copier_->mailbox(), 0, false));
      RouteArgs ra;
      ra.n_expert = t.ge.n_expert;
      ra.k = 1;
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pf_logits_.data(), 0, ra.n_expert * sizeof(float), s));
      STRATA_RETURN_IF_ERROR(RouteGroupQuantize(ra, pf_logits_.as<float>(), 1, pf_sel_.as<int32_t>(),
                                                pf_wts_.as<float>(), pf_idx_.as<int32_t>(), pf_plan_.as<int32_t>(),
                                                Q8Act::kNone, nullptr, 0, nullptr, s, &cold));
      STRATA_RETURN_IF_ERROR(stream_.Synchronize());
      break;
    }
    STRATA_ASSIGN_OR_RETURN(predict_stream_, Stream::Create());
    STRATA_ASSIGN_OR_RETURN(pf_fork_, Event::Create());
    STRATA_ASSIGN_OR_RETURN(pf_join_, Event::Create());
  }
  return absl::OkStatus();
}

model::DeviceTierStats CudaBackend::tier_stats() const {
  model::DeviceTierStats st;
  st.table_layers = static_cast<uint32_t>(
      std::count_if(tables_.begin(), tables_.end(), [](const LayerTable &t) { return t.ok; }));
  st.fills = fills_;
  st.fill_bytes = fill_bytes_;
  st.cpu_experts = cpu_experts_ != nullptr ? cpu_experts_->uses() : 0;
  st.zero_copy = zero_copy_uses_ - std::min(zero_copy_uses_, st.cpu_experts);
  st.cpu_layers = static_cast<uint32_t>(
      std::count_if(tables_.begin(), tables_.end(), [](const LayerTable &t) { return t.ok && t.hybrid; }));
  if (copier_ != nullptr) {
    unsigned long long c[4] = {};
    if (cudaMemcpy(c, pf_counts_.data(), sizeof c, cudaMemcpyDeviceToHost) == cudaSuccess) {
      st.prefetched = c[0];
      st.prefetch_used = c[3];
    } else {
      (void)cudaGetLastError();
    }
  }
  st.graph_captures = graph_captures_;
  st.graph_replays = graph_replays_;
  return st;
}

absl::StatusOr<int64_t> CudaBackend::TakeSelections(int l, const int32_t **sel) {
  LayerTable &t = tables_[l];
  if (t.hist_rows == 0) return 0;
  STRATA_ASSIGN_OR_RETURN(bool done, HistLanded(t));
  if (!done) return 0;  // the next call looks again
  *sel = hist_.as<int32_t>() + static_cast<size_t>(l) * kDeviceRouteMaxRows;
  return std::exchange(t.hist_rows, 0);
}

void CudaBackend::NoteColdExperts(LayerTable &t, int cold, uint64_t expert_bytes) {
  t.cold_avg = 0.75 * t.cold_avg + 0.25 * cold;
  if (cpu_experts_ == nullptr) return;
  // The saving of this call's cold experts, averaged: the saving at the average count would miss
  // that a layer with one cold expert half the time gains whenever it has one (Mixtral's 99 MB
  // experts: one is cheaper on the CPU than over the link).
  const double saving = model::HybridSavingSeconds(static_cast<double>(cold) * static_cast<double>(expert_bytes),
                                                   expert_bytes, cpu_experts_->rates());
  t.cpu_saving = 0.75 * t.cpu_saving + 0.25 * saving;
}

}  // namespace strata::cuda
