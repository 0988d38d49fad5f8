// CudaBackend's VRAM expert tier, used when the routed experts do not all fit the budget: the
// slots (filled, evicted, staged), each layer's device table of expert addresses, route hotness,
// promotions and re-plans. A slot is refilled only after the last computation that read it.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/placement.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

namespace strata::cuda {

absl::Status CudaBackend::FillAtOpen(const std::vector<model::HotExpert> &hot, size_t hot_max) {
  if (slots_.empty() || !arena_registered_ || !tunables::Get().cuda_fill_at_open) return absl::OkStatus();
  std::vector<PendingCopy> copies;
  std::vector<int> filled;
  fill_sink_ = &copies;
  // Expert x of layer l into the next slot, unless it is resident, held already or not routed.
  const auto take = [&](int l, int x) -> absl::Status {
    if (l < 0 || l >= static_cast<int>(w_->layers.size()) || x < 0 ||
        x >= static_cast<int>(w_->layers[l].experts.size())) {
      return absl::OkStatus();
    }
    const model::ExpertWeights &e = w_->layers[l].experts[x];
    if (e.gate.data == nullptr || regions_.count(e.gate.data) != 0 || slot_of_.count(e.gate.data) != 0) {
      return absl::OkStatus();
    }
    const int v = static_cast<int>(filled.size());
    STRATA_RETURN_IF_ERROR(Fill(v, e, l, x));
    filled.push_back(v);
    return absl::OkStatus();
  };
  absl::Status st = absl::OkStatus();
  const size_t n_hot = std::min(slots_.size(), hot_max > 0 ? hot_max : slots_.size());
  for (size_t i = 0; i < hot.size() && filled.size() < n_hot && st.ok(); ++i) st = take(hot[i].layer, hot[i].expert);
  std::vector<int> layers;
  for (size_t l = 0; l < tables_.size(); ++l) {
    if (tables_[l].ok) layers.push_back(static_cast<int>(l));
  }
  bool more = !layers.empty();
  for (int x = 0; more && st.ok() && filled.size() < slots_.size(); ++x) {
    more = false;
    for (size_t j = 0; j < layers.size() && st.ok() && filled.size() < slots_.size(); ++j) {
      if (x >= tables_[layers[j]].ge.n_expert) continue;
      more = true;
      st = take(layers[j], x);
    }
  }
  fill_sink_ = nullptr;
  STRATA_RETURN_IF_ERROR(st);
  STRATA_RETURN_IF_ERROR(IssueCopies(copies));
  STRATA_RETURN_IF_ERROR(copy_stream_.Synchronize());
  defer_tables_ = true;
  for (int v : filled) {
    Slot &sl = slots_[v];
    const model::ExpertWeights &e = w_->layers[sl.layer].experts[sl.expert];
    SetTable(sl.layer, sl.expert, in_slots_[e.gate.data].dev, in_slots_[e.up.data].dev, in_slots_[e.down.data].dev);
    sl.in_table = true;
  }
  defer_tables_ = false;
  FlushTables();
  fills_ = fill_bytes_ = 0;  // the load's copies; the counters are the run's
  STRATA_RETURN_IF_ERROR(stream_.Synchronize());
  return TakeError();
}

absl::Status CudaBackend::IssueCopies(const std::vector<PendingCopy> &copies) {
  // In pieces of at most 1,024 copies a call.
  constexpr size_t kPiece = 1024;
  std::vector<void *> dsts;
  std::vector<const void *> srcs;
  std::vector<size_t> sizes;
  for (size_t a = 0; a < copies.size(); a += kPiece) {
    const size_t b = std::min(copies.size(), a + kPiece);
    dsts.clear();
    srcs.clear();
    sizes.clear();
    for (size_t i = a; i < b; ++i) {
      dsts.push_back(copies[i].dst);
      srcs.push_back(copies[i].src);
      sizes.push_back(copies[i].bytes);
    }
    // A packed file's experts lie as a slot holds them: one copy an expert (or a run of them).
    const size_t n = CoalesceCopies(dsts.data(), srcs.data(), sizes.data(), dsts.size());
    STRATA_RETURN_IF_ERROR(CopyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, copy_stream_.get(), &batch_copies_));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaBackend::Slot *> CudaBackend::SlotFor(const model::ExpertWeights &e) {
  STRATA_RETURN_IF_ERROR(HostRoundTrip("an expert fetched into a slot"));
  const uint8_t *key = e.gate.data;
  auto hit = slot_of_.find(key);
  if (hit != slot_of_.end()) {
    Slot &sl = slots_[hit->second];
    sl.last_use = ++use_clock_;
    if (!sl.in_table) STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // a promotion still in flight
    return &sl;
  }
  auto id = expert_id_.find(key);
  if (id == expert_id_.end()) return Errorf(MOE_ERR_INTERNAL, "%s is not a routed expert", e.gate.name);
  if (PromptStages(e)) return PromptStage(e);
  const int v = PromptVictim(id->second.first);
  STRATA_RETURN_IF_ERROR(Evict(v));
  STRATA_RETURN_IF_ERROR(Fill(v, e, id->second.first, id->second.second));
  Slot &sl = slots_[v];
  STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // the computation waits for the copy
  const Region &g = in_slots_[e.gate.data], &u = in_slots_[e.up.data], &d = in_slots_[e.down.data];
  SetTable(sl.layer, sl.expert, g.dev, u.dev, d.dev);
  sl.in_table = true;
  return &sl;
}

absl::Status CudaBackend::SlotsFor(const std::vector<const model::ExpertWeights *> &ew, size_t c0, size_t c1,
                                   std::vector<Slot *> *slots) {
  STRATA_RETURN_IF_ERROR(HostRoundTrip("experts fetched into slots"));
  slots->assign(c1 - c0, nullptr);
  std::vector<char> taken(slots_.size(), 0);
  std::vector<std::pair<size_t, int>> fills;  // (expert of the chunk, its victim)
  std::vector<size_t> staged;                  // experts of the chunk staged beside the tier
  for (size_t i = c0; i < c1; ++i) {
    const model::ExpertWeights &e = *ew[i];
    if (e.gate.data == nullptr || regions_.count(e.gate.data) != 0) continue;
    auto hit = slot_of_.find(e.gate.data);
    if (hit != slot_of_.end()) {
      Slot &sl = slots_[hit->second];
      sl.last_use = ++use_clock_;
      taken[hit->second] = 1;
      if (!sl.in_table) STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // a promotion still in flight
      (*slots)[i - c0] = &sl;
      continue;
    }
    auto id = expert_id_.find(e.gate.data);
    if (id == expert_id_.end()) return Errorf(MOE_ERR_INTERNAL, "%s is not a routed expert", e.gate.name);
    if (PromptStages(e)) {
      staged.push_back(i);
      continue;
    }
    const int v = PromptVictim(id->second.first, &taken);
    if (v < 0 || taken[v]) return Errorf(MOE_ERR_INTERNAL, "no free slot for %s", e.gate.name);
    taken[v] = 1;
    fills.emplace_back(i, v);
  }
  if (staged.size() > prompt_stage_.size()) {
    return Errorf(MOE_ERR_INTERNAL, "%zu experts to stage in %zu staging slots", staged.size(), prompt_stage_.size());
  }
  // The tables change in the host's mirror and reach the device in one upload a layer, after the
  // copies (nothing queued between reads them; a tiny upload a table entry cost the stream each time).
  defer_tables_ = true;
  absl::Status st = [&]() -> absl::Status {
    for (const auto &[i, v] : fills) STRATA_RETURN_IF_ERROR(Evict(v));
    // The direct fills' copies go in one batched call, as the copier's do (CopyBatchAsync).
    std::vector<PendingCopy> copies;
    if (batch_copies_) fill_sink_ = &copies;
    absl::Status fs = absl::OkStatus();
    for (const auto &[i, v] : fills) {
      const auto &id = expert_id_.at(ew[i]->gate.data);
      fs = Fill(v, *ew[i], id.first, id.second);
      if (!fs.ok()) break;
    }
    std::vector<Slot *> stage_slots;
    for (size_t k = 0; k < staged.size() && fs.ok(); ++k) {
      absl::StatusOr<Slot *> sl = PromptStage(*ew[staged[k]]);
      fs = sl.status();
      if (fs.ok()) stage_slots.push_back(*sl);
    }
    fill_sink_ = nullptr;
    const auto c0t = std::chrono::steady_clock::now();
    if (!copies.empty()) {
      STRATA_RETURN_IF_ERROR(IssueCopies(copies));
      // Every fill's event after the batch (a staged fill's again: later on the same stream).
      for (const auto &[i, v] : fills) STRATA_RETURN_IF_ERROR(slots_[v].fill.Record(copy_stream_.get()));
      for (Slot *sl : stage_slots) STRATA_RETURN_IF_ERROR(sl->fill.Record(copy_stream_.get()));
    }
    STRATA_RETURN_IF_ERROR(fs);
    for (size_t k = 0; k < staged.size(); ++k) {
      STRATA_RETURN_IF_ERROR(stream_.Wait(stage_slots[k]->fill.get()));  // the computation waits for the copy
      (*slots)[staged[k] - c0] = stage_slots[k];
    }
    if (PromptTrace()) {
      (void)copy_stream_.Synchronize();
      uint64_t bytes = 0;
      for (const PendingCopy &c : copies) bytes += c.bytes;
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0t).count();
      LogDebug("prompt experts: %zu fills, %zu staged, %zu batched copies of %.1f MiB in %.1f us (%.1f GB/s)\n",
               fills.size(), staged.size(), copies.size(), bytes / 1048576.0, us, us > 0 ? bytes / us * 1e-3 : 0.0);
    }
    for (const auto &[i, v] : fills) {
      Slot &sl = slots_[v];
      STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // the computation waits for the copy
      const model::ExpertWeights &e = *ew[i];
      const Region &g = in_slots_[e.gate.data], &u = in_slots_[e.up.data], &d = in_slots_[e.down.data];
      SetTable(sl.layer, sl.expert, g.dev, u.dev, d.dev);
      sl.in_table = true;
      (*slots)[i - c0] = &sl;
    }
    return absl::OkStatus();
  }();
  defer_tables_ = false;
  FlushTables();
  STRATA_RETURN_IF_ERROR(st);
  return TakeError();
}

int CudaBackend::PromptVictim(int layer, const std::vector<char> *taken) const {
  // An empty slot, else the coldest by route hotness (the least recently used among equals), so
  // that a prompt leaves the slots holding about the experts the re-plan after it wants: with
  // least-recently-used alone it left the last layers' experts, and the re-plan's copies held the
  // first decode step (with spread routing, thousands of copies). Slots of the
  // layer being computed are kept: its other experts may still be queued behind them, and the
  // host would wait for those computations before refilling. With prompt_lru_, the least recently
  // used slot.
  int v = -1;
  uint32_t v_heat = 0;
  for (int i = 0; i < static_cast<int>(slots_.size()) && !prompt_lru_; ++i) {
    if (taken != nullptr && (*taken)[i]) continue;
    const Slot &sl = slots_[i];
    if (sl.key == nullptr) return i;
    if (sl.layer == layer) continue;
    const store::RouteHeat &heat = tables_[sl.layer].heat;  // empty for a layer without a table
    const uint32_t h = sl.expert < static_cast<int>(heat.size()) ? heat[sl.expert] : 0;
    if (v < 0 || h < v_heat || (h == v_heat && sl.last_use < slots_[v].last_use)) {
      v = i;
      v_heat = h;
    }
  }
  if (v >= 0) return v;
  // Every slot holds an expert of this layer (fewer slots than its experts in a call), or lru.
  v = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (taken != nullptr && (*taken)[i]) continue;
    if (v < 0 || slots_[i].last_use < slots_[v].last_use) v = i;
  }
  return v;
}

bool CudaBackend::PromptStages(const model::ExpertWeights &e) const {
  if (prompt_stage_.empty() || e.gate.data == nullptr) return false;
  for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
    if (m->tensor != nullptr && m->data != nullptr && NeedsConversion(*m)) return false;
  }
  if (tier_copies_ != nullptr) {
    // The tiers' tables: an expert the RAM tier serves lies in its slab (one in a VRAM slot does not).
    const Region &slab = regions_.at(tier_copies_);
    for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
      if (m->tensor != nullptr && (m->data < tier_copies_ || m->data + m->nbytes() > tier_copies_ + slab.bytes)) {
        return false;
      }
    }
    return true;
  }
  if (regions_.count(e.gate.data) != 0 || slot_of_.count(e.gate.data) != 0) return false;  // in VRAM
  auto id = expert_id_.find(e.gate.data);
  return id != expert_id_.end() && tables_[id->second.first].ok;
}

absl::StatusOr<CudaBackend::Slot *> CudaBackend::PromptStage(const model::ExpertWeights &e) {
  const size_t i = prompt_stage_next_;
  prompt_stage_next_ = (i + 1) % prompt_stage_.size();
  Slot &sl = prompt_stage_[i];
  Unstage(sl);
  STRATA_RETURN_IF_ERROR(AfterLastUse(sl));
  STRATA_ASSIGN_OR_RETURN(const uint64_t off,
                          CopyParts(e, stage_buf_.as<uint8_t>() + static_cast<uint64_t>(i) * slot_bytes_, &sl));
  if (fill_sink_ == nullptr) {
    STRATA_RETURN_IF_ERROR(sl.fill.Record(copy_stream_.get()));
    STRATA_RETURN_IF_ERROR(stream_.Wait(sl.fill.get()));  // the computation waits for the copy
  }
  // A RAM tier's slab slot names no expert for good: its stage is the call's alone (no heat, no
  // promotion), and SlotUsed unstages it before the slab slot may take another expert.
  auto id = expert_id_.find(e.gate.data);
  sl.key = e.gate.data;
  sl.layer = id != expert_id_.end() ? id->second.first : -1;
  sl.expert = id != expert_id_.end() ? id->second.second : -1;
  ++fills_;
  fill_bytes_ += off;
  return &sl;
}

std::vector<std::pair<int, const uint8_t *>> CudaBackend::PromptPromotions(
    const std::vector<const model::ExpertWeights *> &ew, const std::vector<int64_t> &row0,
    const std::vector<int64_t> &row1, const std::vector<char> &stages) const {
  std::vector<std::pair<int, const uint8_t *>> to(ew.size(), {-1, nullptr});
  if (!prompt_promote_ || prompt_stage_.empty() || slots_.empty() || ew.empty()) return to;
  auto id0 = expert_id_.find(ew[0]->gate.data);
  if (id0 == expert_id_.end()) return to;
  const int l = id0->second.first;
  const LayerTable &t = tables_[l];
  if (!t.ok) return to;
  // The layer's hotness once this call's tokens are counted (SlotUsed adds them after the products).
  std::vector<uint32_t> heat = t.heat.counts();
  std::vector<size_t> at(heat.size(), SIZE_MAX);  // each expert's place in the call
  for (size_t u = 0; u < ew.size(); ++u) {
    auto id = expert_id_.find(ew[u]->gate.data);
    if (id == expert_id_.end() || id->second.first != l) continue;
    const int x = id->second.second;
    const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(row1[u] - row0[u], 0));
    heat[x] = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{heat[x]} + n, UINT32_MAX));
    at[x] = u;
  }
  size_t held = 0;
  for (const Slot &sl : slots_) held += sl.key != nullptr && sl.layer == l ? 1 : 0;
  if (held == 0) return to;
  std::vector<char> wanted(heat.size(), 0);
  std::vector<int> candidates;  // staged experts among the layer's hottest, hottest first
  for (size_t x : model::HottestExperts(heat, held)) {
    wanted[x] = 1;
    if (at[x] != SIZE_MAX && stages[at[x]]) candidates.push_back(static_cast<int>(x));
  }
  // Victims: settled residents (no promotion in flight) outside the hottest, coldest first.
  std::vector<std::pair<uint32_t, int>> victims;
  for (int v = 0; v < static_cast<int>(slots_.size()); ++v) {
    const Slot &sl = slots_[v];
    if (sl.key == nullptr || sl.layer != l || !sl.in_table || wanted[sl.expert]) continue;
    victims.emplace_back(heat[sl.expert], v);
  }
  std::sort(victims.begin(), victims.end());
  for (size_t i = 0; i < candidates.size() && i < victims.size(); ++i) {
    const uint32_t hot = heat[candidates[i]], cold = victims[i].first;
    if (promotion_margin_ ? !model::MarkedlyHotter(hot, cold, kReplanZ) : hot <= cold) break;  // so do all later pairs
    const int v = victims[i].second;
    to[at[candidates[i]]] = {v, slots_[v].key};
  }
  return to;
}

absl::StatusOr<bool> CudaBackend::PromoteStaged(const Slot &ring) {
  if (!Staging(&ring) || ring.key == nullptr) return false;
  auto plan = prompt_plan_.find(ring.key);
  if (plan == prompt_plan_.end()) return false;
  const auto [v, victim] = plan->second;
  prompt_plan_.erase(plan);
  Slot &sl = slots_[v];
  // A fill of the same call may have taken the slot since the plan, or the victim's own products
  // may be still to come (a layer of several codecs goes in several groups).
  if (sl.key != victim || !sl.in_table || prompt_pending_.count(victim) != 0 || slot_of_.count(ring.key) != 0) {
    return false;
  }
  const uint8_t *src = stage_buf_.as<uint8_t>() + static_cast<uint64_t>(&ring - prompt_stage_.data()) * slot_bytes_;
  uint8_t *dst = slot_buf_.as<uint8_t>() + static_cast<uint64_t>(v) * slot_bytes_;
  defer_tables_ = true;
  const absl::Status ev = Evict(v);  // the victim's table entries back to the host bytes
  defer_tables_ = false;
  STRATA_RETURN_IF_ERROR(ev);
  uint64_t bytes = 0;
  for (const uint8_t *p : ring.parts) {
    auto it = in_slots_.find(p);
    if (it == in_slots_.end()) return Errorf(MOE_ERR_INTERNAL, "a staged expert lost its matrices");
    it->second.dev = dst + (it->second.dev - src);
    bytes = std::max<uint64_t>(bytes, static_cast<uint64_t>(it->second.dev - dst) + it->second.bytes);
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  sl.key = ring.key;
  sl.layer = ring.layer;
  sl.expert = ring.expert;
  sl.parts = ring.parts;
  sl.in_table = true;
  sl.last_use = ++use_clock_;
  slot_of_[sl.key] = v;
  const model::ExpertWeights &e = w_->layers[sl.layer].experts[sl.expert];
  defer_tables_ = true;
  SetTable(sl.layer, sl.expert, in_slots_[e.gate.data].dev, in_slots_[e.up.data].dev, in_slots_[e.down.data].dev);
  defer_tables_ = false;
  ++promotions_;
  return true;
}

void CudaBackend::Unstage(Slot &sl) {
  // Only entries that still point into this staging slot: the expert may have been staged again
  // elsewhere since, or taken a tier slot.
  const uint8_t *lo = stage_buf_.as<uint8_t>() + static_cast<uint64_t>(&sl - prompt_stage_.data()) * slot_bytes_;
  for (const uint8_t *p : sl.parts) {
    auto it = in_slots_.find(p);
    if (it != in_slots_.end() && it->second.dev >= lo && it->second.dev < lo + slot_bytes_) in_slots_.erase(it);
  }
  sl.parts.clear();
  sl.key = nullptr;
}

absl::Status CudaBackend::Evict(int v) {
  Slot &sl = slots_[v];
  if (sl.key == nullptr) return absl::OkStatus();
  if (sl.in_table) HostTable(sl.layer, sl.expert);  // later reads go to the host bytes
  pending_fills_.erase(std::remove(pending_fills_.begin(), pending_fills_.end(), v), pending_fills_.end());
  slot_of_.erase(sl.key);
  for (const uint8_t *p : sl.parts) in_slots_.erase(p);
  sl.key = nullptr;
  sl.parts.clear();
  sl.in_table = false;
  sl.layer = sl.expert = -1;
  // Every computation queued so far (and the table switch) precedes the refill.
  return sl.used.Record(stream_.get());
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
    if (fill_sink_ != nullptr) {  // SlotsFor issues the chunk's copies in one call, then records the fill
      fill_sink_->push_back({dev + off, m->data, m->nbytes()});
    } else {
      STRATA_RETURN_IF_ERROR(CopyAsync(dev + off, m->data, m->nbytes(), copy_stream_.get()));
    }
    in_slots_[m->data] = Region{m->nbytes(), m->row_bytes, m->cols, false, dev + off};
    sl->parts.push_back(m->data);
    off += Align(m->nbytes());
  }
  return off;
}

absl::Status CudaBackend::Fill(int v, const model::ExpertWeights &e, int l, int x) {
  Slot &sl = slots_[v];
  uint8_t *dev = slot_buf_.as<uint8_t>() + static_cast<uint64_t>(v) * slot_bytes_;
  bool direct = arena_registered_;
  for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
    if (m->tensor != nullptr && m->data != nullptr && NeedsConversion(*m)) direct = false;
  }
  uint64_t off = 0;
  if (direct) {
    // The parts go by DMA from the page-locked arena, after the last computation that read the slot
    // (a step's pass leaves that wait to IssuePassFills, after the step's launch).
    if (pass_fills_ != nullptr) {
      pass_fills_->push_back(v);
    } else {
      STRATA_RETURN_IF_ERROR(AfterLastUse(sl));
    }
    STRATA_ASSIGN_OR_RETURN(off, CopyParts(e, dev, &sl));
  } else {
    // Stage the expert's device form (gate | up | down, each 256-aligned) in pinned memory. The
    // staging buffer is reused every other fill: wait until its previous copy has left it.
    const int si = next_staging_;
    next_staging_ ^= 1;
    STRATA_RETURN_IF_ERROR(staged_[si].Synchronize());
    uint8_t *stage = staging_[si].as<uint8_t>();
    for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
      if (m->tensor == nullptr || m->data == nullptr) continue;
      const bool convert = NeedsConversion(*m);
      HostForm(*m, stage + off, convert);
      in_slots_[m->data] = Region{m->nbytes(), m->row_bytes, m->cols, convert, dev + off};
      sl.parts.push_back(m->data);
      off += Align(DeviceBytes(*m));
    }
    STRATA_RETURN_IF_ERROR(AfterLastUse(sl));
    STRATA_RETURN_IF_ERROR(CopyAsync(dev, stage, off, copy_stream_.get()));
    STRATA_RETURN_IF_ERROR(staged_[si].Record(copy_stream_.get()));
  }
  if (fill_sink_ == nullptr || !direct) STRATA_RETURN_IF_ERROR(sl.fill.Record(copy_stream_.get()));
  sl.key = e.gate.data;
  sl.layer = l;
  sl.expert = x;
  sl.in_table = false;
  sl.last_use = ++use_clock_;
  slot_of_[sl.key] = v;
  ++fills_;
  fill_bytes_ += off;
  return absl::OkStatus();
}

void CudaBackend::SetTable(int l, int x, const void *gate, const void *up, const void *down) {
  if (l < 0 || l >= static_cast<int>(tables_.size()) || !tables_[l].ok) return;
  const LayerTable &t = tables_[l];
  auto **tab = tab_dev_.as<const void *>() + t.tab_off;
  const int n = t.ge.n_expert;
  const void **mirror = tab_host_.data() + t.tab_off;
  mirror[x] = gate;
  mirror[n + x] = up;
  mirror[2 * n + x] = down;
  if (defer_tables_) {
    table_dirty_[l] = 1;
    return;
  }
  Upload(&tab[x], &gate, sizeof gate);
  Upload(&tab[n + x], &up, sizeof up);
  Upload(&tab[2 * n + x], &down, sizeof down);
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

void CudaBackend::HostTable(int l, int x) {
  if (l < 0 || l >= static_cast<int>(tables_.size()) || !tables_[l].ok || arena_dev_ == nullptr) return;
  const model::ExpertWeights &e = w_->layers[l].experts[x];
  auto mapped = [&](const model::Matrix &m) -> const void * { return arena_dev_ + (m.data - host_arena_); };
  SetTable(l, x, mapped(e.gate), mapped(e.up), mapped(e.down));
}

absl::Status CudaBackend::SlotUsed(Slot *slot, int64_t n_tok) {
  STRATA_RETURN_IF_ERROR(slot->used.Record(stream_.get()));
  // A batch on the host path (a prompt) counts into the route hotness the next step plans from.
  LayerTable *t = slot->layer >= 0 ? &tables_[slot->layer] : nullptr;
  if (t != nullptr && t->ok && slot->expert < static_cast<int>(t->heat.size())) {
    t->heat.Add(slot->expert, static_cast<uint32_t>(std::min<int64_t>(n_tok, 1 << 20)));
    replan_ = true;
  }
  if (Staging(slot)) Unstage(*slot);  // its bytes stay, protected by `used`, until the ring comes round
  return absl::OkStatus();
}

absl::Status CudaBackend::Replan() {
  replan_ = false;
  // STRATA_CUDA_REPLAN=0 keeps the slots as the prompt left them (a measuring knob: with spread
  // routing the re-plan's thousands of promotions hold the first decode step).
  if (!arena_registered_ || !tunables::Get().cuda_replan) return absl::OkStatus();
  // Every routed expert of the device-table layers in one list: layer l's expert x at first[l] + x.
  std::vector<uint32_t> heat;
  std::vector<std::pair<int, int>> id;
  std::vector<size_t> first(tables_.size(), SIZE_MAX);
  for (size_t l = 0; l < tables_.size(); ++l) {
    const LayerTable &t = tables_[l];
    if (!t.ok) continue;
    first[l] = heat.size();
    for (int x = 0; x < t.ge.n_expert; ++x) {
      heat.push_back(t.heat[x]);
      id.emplace_back(static_cast<int>(l), x);
    }
  }
  const std::vector<size_t> top = model::HottestExperts(heat, slots_.size());
  std::vector<char> wanted(heat.size(), 0);
  for (size_t i : top) wanted[i] = 1;
  // Victims: empty slots, then those holding experts outside the hottest set, coldest first. An
  // expert takes a held one's slot only when markedly hotter (model::MarkedlyHotter, three standard
  // deviations: the pairs are the extremes of thousands of experts, the hottest outside against the
  // coldest inside, which chance sets two apart): with the slots filled at open and a prompt's cold
  // experts staged beside them, even routing otherwise traded thousands of experts over noise after
  // a long prompt, holding the first decode step (at two deviations still hundreds).
  std::vector<std::tuple<bool, uint32_t, int>> victims;  // (held, its heat, slot): the empty ones first
  for (int v = 0; v < static_cast<int>(slots_.size()); ++v) {
    const Slot &sl = slots_[v];
    const size_t i = sl.key == nullptr ? SIZE_MAX : first[sl.layer];
    if (i == SIZE_MAX) {  // empty, or an expert of a layer without a table
      victims.emplace_back(false, 0, v);
    } else if (!wanted[i + sl.expert]) {
      victims.emplace_back(true, heat[i + sl.expert], v);
    }
  }
  std::sort(victims.begin(), victims.end());
  size_t next = 0;
  for (size_t i : top) {
    if (next == victims.size()) break;
    const auto [l, x] = id[i];
    const model::ExpertWeights &e = w_->layers[l].experts[x];
    if (slot_of_.count(e.gate.data) != 0) continue;  // already held
    const auto [held, v_heat, v] = victims[next];
    // Candidates come hottest first and victims coldest first: once one pair fails, all later do.
    if (promotion_margin_ && held && !model::MarkedlyHotter(heat[i], v_heat, kReplanZ)) break;
    ++next;
    STRATA_RETURN_IF_ERROR(Evict(v));
    STRATA_RETURN_IF_ERROR(Fill(v, e, l, x));
    pending_fills_.push_back(v);
    ++promotions_;
  }
  ++replans_;
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
        if (regions_.count(e.gate.data) != 0 || slots_.empty()) {
          auto dm = Resolve(*parts[m]);
          ok = dm.ok();
          if (ok) addr = dm->data;
        } else if (arena_dev_ != nullptr) {
          addr = arena_dev_ + (parts[m]->data - host_arena_);
        } else {
          ok = false;
        }
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
    t.heat = store::RouteHeat(static_cast<uint32_t>(ex.size()));
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
  STRATA_RETURN_IF_ERROR(SetUpColdCopies(PlaceTables(), host_arena_, arena_dev_, arena_bytes_));
  if (!slots_.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        hist_, PinnedBuffer::Allocate(w.layers.size() * kDeviceRouteMaxRows * sizeof(int32_t), cudaHostAllocMapped));
    STRATA_ASSIGN_OR_RETURN(hist_dev_, hist_.device<int32_t>());
  }
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
  st.slots = static_cast<uint32_t>(slots_.size());
  st.table_layers = static_cast<uint32_t>(
      std::count_if(tables_.begin(), tables_.end(), [](const LayerTable &t) { return t.ok; }));
  st.fills = fills_;
  st.fill_bytes = fill_bytes_;
  st.cpu_experts = cpu_experts_ != nullptr ? cpu_experts_->uses() : 0;
  st.zero_copy = zero_copy_uses_ - std::min(zero_copy_uses_, st.cpu_experts);
  st.cpu_layers = static_cast<uint32_t>(
      std::count_if(tables_.begin(), tables_.end(), [](const LayerTable &t) { return t.ok && t.hybrid; }));
  st.promotions = promotions_;
  st.replans = replans_;
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

absl::Status CudaBackend::EnterLandedFills() {
  for (size_t i = 0; i < pending_fills_.size();) {
    Slot &sl = slots_[pending_fills_[i]];
    STRATA_ASSIGN_OR_RETURN(bool done, sl.fill.Done());
    if (!done) {
      ++i;
      continue;
    }
    const model::ExpertWeights &e = w_->layers[sl.layer].experts[sl.expert];
    SetTable(sl.layer, sl.expert, in_slots_[e.gate.data].dev, in_slots_[e.up.data].dev, in_slots_[e.down.data].dev);
    sl.in_table = true;
    pending_fills_.erase(pending_fills_.begin() + i);
  }
  return absl::OkStatus();
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

absl::Status CudaBackend::UpdateTier(int l) {
  LayerTable &t = tables_[l];
  const int32_t *sel = nullptr;
  STRATA_ASSIGN_OR_RETURN(const int64_t rows, TakeSelections(l, &sel));
  if (rows == 0) return absl::OkStatus();
  if (t.heat.OnDecodeToken()) {
    victim_floor_ >>= 1;  // a slot's heat halves at most once for this layer's decay
  }
  const int n = t.ge.n_expert;
  std::vector<char> seen(n, 0);
  int best = -1, cold = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int x = sel[i];
    if (x < 0 || x >= n) return Errorf(MOE_ERR_INTERNAL, "layer %d routed to expert %d of %d", l, x, n);
    t.heat.OnSelect(x);
    if (seen[x]) continue;
    seen[x] = 1;
    const model::ExpertWeights &e = w_->layers[l].experts[x];
    auto in = slot_of_.find(e.gate.data);
    if (in != slot_of_.end() && slots_[in->second].in_table) continue;
    ++zero_copy_uses_;  // read over the link (or computed by the CPU, counted there)
    ++cold;
    fill_credit_ += static_cast<double>(slot_bytes_) / 8;
    if (in == slot_of_.end() && (best < 0 || t.heat[x] > t.heat[best])) best = x;
  }
  NoteColdExperts(t, cold, slot_bytes_);
  fill_credit_ = std::min(fill_credit_, 4.0 * static_cast<double>(slot_bytes_));
  if (best < 0 || fill_credit_ < static_cast<double>(slot_bytes_)) return absl::OkStatus();
  // The victim: an empty slot, else the coldest settled one; `best` must be markedly hotter (with
  // even routing, trading experts of one popularity over noise spent more of the link on
  // promotions).
  auto hotter = [&](uint32_t cold_heat) {
    return promotion_margin_ ? model::MarkedlyHotter(t.heat[best], cold_heat, decode_margin_z_)
                             : uint64_t{t.heat[best]} >= uint64_t{cold_heat} + 2;
  };
  // Inside a step's tier pass a floor of the victims' heat (the last scan's coldest, halved at each
  // decay since) answers most calls without the scan: the rule is monotone in the victim's heat, so
  // one not hotter than the floor is not hotter than the coldest. The scan over every slot, at every
  // layer with a cold expert, was most of the host's time between steps.
  if (victim_floor_ok_ && !hotter(victim_floor_)) return absl::OkStatus();
  int v = -1;
  uint32_t v_heat = 0;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const Slot &sl = slots_[i];
    if (sl.key == nullptr) {
      v = i;
      v_heat = 0;
      break;
    }
    if (!sl.in_table) continue;
    const uint32_t h = tables_[sl.layer].heat.size() == 0 ? 0 : tables_[sl.layer].heat[sl.expert];
    if (v < 0 || h < v_heat) {
      v = i;
      v_heat = h;
    }
  }
  // The victims only go from here to the pass's end, so the floor holds. An empty slot takes any
  // expert: no floor while there is one.
  if (tier_pass_ && (v < 0 || slots_[v].key != nullptr)) {
    victim_floor_ = v < 0 ? UINT32_MAX : v_heat;
    victim_floor_ok_ = true;
  }
  if (v < 0) return absl::OkStatus();
  if (slots_[v].key != nullptr && !hotter(v_heat)) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(Evict(v));
  STRATA_RETURN_IF_ERROR(Fill(v, w_->layers[l].experts[best], l, best));
  pending_fills_.push_back(v);
  fill_credit_ -= static_cast<double>(slot_bytes_);
  ++promotions_;
  return absl::OkStatus();
}

}  // namespace strata::cuda
