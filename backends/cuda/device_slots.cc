// CUDA device slots for the VRAM expert tier.
#include "backends/cuda/device_slots.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/placement.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

namespace strata::cuda {

CudaDeviceSlots::~CudaDeviceSlots() {
  // Copies still queued read or write the slots and host memory: they finish first.
  if (up_.get() != nullptr) {
    (void)up_.Synchronize();
    (void)down_.Synchronize();
  }
  if (buf_.data() != nullptr) be_->ForgetDeviceRegion(buf_.as<uint8_t>());
}

absl::Status CudaDeviceSlots::Allocate(uint32_t n, uint64_t slot_bytes) {
  if (buf_.data() != nullptr) return Errorf(MOE_ERR_INTERNAL, "the device slots are allocated once");
  if (n == 0 || slot_bytes == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%u device slots of %u bytes", n, slot_bytes);
  // Each slot starts 256-byte aligned, as the kernels' vector loads and every device copy expect.
  stride_ = (slot_bytes + 255) / 256 * 256;
  STRATA_ASSIGN_OR_RETURN(after_compute_, Event::Create());
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(static_cast<size_t>(stride_) * n);
  if (!b.ok()) {
    return Errorf(MOE_ERR_NO_MEMORY, "the GPU cannot hold %u expert slots of %u bytes (%.2f GiB): %s", n, stride_,
                  static_cast<double>(stride_) * n / (1ull << 30), std::string(b.status().message()));
  }
  buf_ = std::move(*b);
  n_ = n;
  be_->AddDeviceRegion(buf_.as<uint8_t>(), buf_.size());
  return absl::OkStatus();
}

absl::Status CudaDeviceSlots::CheckSlot(uint32_t s, uint64_t bytes, cudaMemcpyKind kind) const {
  if (s < n_ && bytes <= stride_) return absl::OkStatus();
  return Errorf(MOE_ERR_INTERNAL, "copy of %u bytes %s slot %u of %u", bytes,
                kind == cudaMemcpyHostToDevice ? "into" : "out of", s, n_);
}

absl::Status CudaDeviceSlots::Enqueue(cudaStream_t stream, void *dst, const void *src, uint64_t bytes,
                                      cudaMemcpyKind kind) {
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Errorf(MOE_ERR_BACKEND, "copying an expert of %u bytes %s VRAM: %s", bytes,
                  kind == cudaMemcpyHostToDevice ? "into" : "out of", cudaGetErrorString(e));
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceSlots::Copy(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind) {
  STRATA_RETURN_IF_ERROR(be_->TakeError());
  STRATA_RETURN_IF_ERROR(after_compute_.Record(be_->compute_stream()));
  const Stream &copy = be_->copy_stream();
  STRATA_RETURN_IF_ERROR(copy.Wait(after_compute_.get()));
  STRATA_RETURN_IF_ERROR(Enqueue(copy.get(), dst, src, bytes, kind));
  return copy.Synchronize();
}

absl::Status CudaDeviceSlots::CopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckSlot(s, bytes, cudaMemcpyHostToDevice));
  return Copy(slot(s), src, bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaDeviceSlots::CopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckSlot(s, bytes, cudaMemcpyDeviceToHost));
  return Copy(dst, slot(s), bytes, cudaMemcpyDeviceToHost);
}

absl::Status CudaDeviceSlots::Queue(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind) {
  STRATA_RETURN_IF_ERROR(be_->TakeError());
  if (up_.get() == nullptr) {
    STRATA_ASSIGN_OR_RETURN(up_, Stream::Create());
    STRATA_ASSIGN_OR_RETURN(down_, Stream::Create());
    STRATA_ASSIGN_OR_RETURN(queued_after_, Event::Create());
  }
  if (!batch_open_) {
    // One record of the compute stream covers the batch's copies (queued on the host between steps).
    STRATA_RETURN_IF_ERROR(queued_after_.Record(be_->compute_stream()));
    STRATA_RETURN_IF_ERROR(up_.Wait(queued_after_.get()));
    STRATA_RETURN_IF_ERROR(down_.Wait(queued_after_.get()));
    batch_open_ = true;
  }
  return Enqueue((kind == cudaMemcpyHostToDevice ? up_ : down_).get(), dst, src, bytes, kind);
}

absl::Status CudaDeviceSlots::QueueCopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckSlot(s, bytes, cudaMemcpyHostToDevice));
  return Queue(slot(s), src, bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaDeviceSlots::QueueCopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckSlot(s, bytes, cudaMemcpyDeviceToHost));
  return Queue(dst, slot(s), bytes, cudaMemcpyDeviceToHost);
}

absl::Status CudaDeviceSlots::QueueSwap(uint32_t s, uint8_t *down_dst, uint64_t down_bytes, const uint8_t *up_src,
                                        uint64_t up_bytes) {
  STRATA_RETURN_IF_ERROR(CheckSlot(s, down_bytes, cudaMemcpyDeviceToHost));
  STRATA_RETURN_IF_ERROR(CheckSlot(s, up_bytes, cudaMemcpyHostToDevice));
  STRATA_RETURN_IF_ERROR(Queue(down_dst, slot(s), down_bytes, cudaMemcpyDeviceToHost));
  if (swapped_out_.get() == nullptr) {
    STRATA_ASSIGN_OR_RETURN(swapped_out_, Event::Create());
  }
  // Recorded again at each swap: the wait takes the copies queued before this record.
  STRATA_RETURN_IF_ERROR(swapped_out_.Record(down_.get()));
  STRATA_RETURN_IF_ERROR(up_.Wait(swapped_out_.get()));
  return Queue(slot(s), up_src, up_bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaDeviceSlots::ComputeAfterQueued() {
  if (up_.get() == nullptr) return absl::OkStatus();  // nothing was ever queued
  if (joined_.get() == nullptr) {
    STRATA_ASSIGN_OR_RETURN(joined_, Event::Create());
  }
  STRATA_RETURN_IF_ERROR(joined_.Record(up_.get()));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(be_->compute_stream(), joined_.get(), 0));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaDeviceSlots::Fence() {
  batch_open_ = false;
  if (up_.get() == nullptr) return next_ticket_;  // nothing was ever queued
  FenceEvents f;
  for (Event *e : {&f.up, &f.down}) {
    if (!spare_events_.empty()) {
      *e = std::move(spare_events_.back());
      spare_events_.pop_back();
    } else {
      STRATA_ASSIGN_OR_RETURN(*e, Event::Create());
    }
  }
  STRATA_RETURN_IF_ERROR(f.up.Record(up_.get()));
  STRATA_RETURN_IF_ERROR(f.down.Record(down_.get()));
  f.ticket = ++next_ticket_;
  fences_.push_back(std::move(f));
  return next_ticket_;
}

absl::StatusOr<bool> CudaDeviceSlots::Reached(uint64_t ticket, bool wait) {
  // Fences complete in order on each stream: the oldest ones are retired until `ticket`'s.
  while (reached_ < ticket && !fences_.empty()) {
    FenceEvents &f = fences_.front();
    if (wait) {
      STRATA_RETURN_IF_ERROR(f.up.Synchronize());
      STRATA_RETURN_IF_ERROR(f.down.Synchronize());
    } else {
      STRATA_ASSIGN_OR_RETURN(const bool up, f.up.Done());
      STRATA_ASSIGN_OR_RETURN(const bool down, f.down.Done());
      if (!up || !down) return false;
    }
    reached_ = f.ticket;
    spare_events_.push_back(std::move(f.up));
    spare_events_.push_back(std::move(f.down));
    fences_.erase(fences_.begin());
  }
  return reached_ >= ticket;
}

bool CudaDeviceSlots::EnableTables() { return be_->EnableExpertTables(); }

uint64_t CudaDeviceSlots::tables_bytes() const { return be_->tables_bytes(); }

absl::Status CudaDeviceSlots::Point(int layer, int expert, const model::ExpertWeights &where) {
  return be_->PointExpert(layer, expert, where);
}

bool CudaBackend::EnableExpertTables() {
  if (w_ == nullptr || external_tables_) return external_tables_;
  for (const LayerTable &t : tables_) {
    if (t.ok) return false;  // resident experts: the backend's own tables
  }
  auto shape = [](const model::Matrix &m) {
    return DeviceMatrix{m.codec->id, reinterpret_cast<const void *>(uintptr_t{256}), m.rows, m.cols, m.row_bytes};
  };
  auto same = [](const model::Matrix &a, const model::Matrix &b) {
    return a.tensor != nullptr && a.codec == b.codec && a.rows == b.rows && a.cols == b.cols &&
           a.row_bytes == b.row_bytes && !NeedsConversion(a);
  };
  size_t n_entries = 0;
  for (size_t l = 0; l < w_->layers.size() && l < tables_.size(); ++l) {
    const auto &ex = w_->layers[l].experts;
    if (ex.empty()) continue;
    const model::ExpertWeights &e0 = ex[0];
    bool ok = static_cast<int>(ex.size()) <= kRouteMaxExperts;
    for (size_t x = 0; x < ex.size() && ok; ++x) {
      const model::ExpertWeights &e = ex[x];
      ok = !e.input_major && e.swiglu_limit == 0.f && e.gate_bias.tensor == nullptr && e.up_bias.tensor == nullptr &&
           e.down_bias.tensor == nullptr && same(e.gate, e0.gate) && same(e.up, e0.up) && same(e.down, e0.down);
    }
    LayerTable &t = tables_[l];
    t.ge.gate_shape = shape(e0.gate);
    t.ge.up_shape = shape(e0.up);
    t.ge.down_shape = shape(e0.down);
    t.ge.n_expert = static_cast<int>(ex.size());
    GroupedExperts probe = t.ge;  // stand-in table addresses: the check reads no device memory
    probe.gate = probe.up = probe.down = reinterpret_cast<const void *const *>(uintptr_t{256});
    if (!ok || !CheckGroupedExperts(probe).ok()) continue;
    t.ok = true;
    t.tab_off = n_entries;
    n_entries += 3 * ex.size();
    if (first_table_layer_ < 0) first_table_layer_ = static_cast<int>(l);
  }
  if (n_entries == 0) return false;
  absl::StatusOr<DeviceBuffer> tab = DeviceBuffer::Allocate(n_entries * sizeof(void *));
  if (!tab.ok() || cudaMemset(tab->data(), 0, n_entries * sizeof(void *)) != cudaSuccess) {
    (void)cudaGetLastError();
    for (LayerTable &t : tables_) t.ok = false;
    first_table_layer_ = -1;
    return false;
  }
  tab_dev_ = std::move(*tab);
  tab_host_.assign(n_entries, nullptr);
  const int n_expert_max = PlaceTables();
  external_tables_ = true;
  tables_bytes_ = tab_dev_.size();
  // Best effort: without the copy engines the kernels read RAM's experts in place, the same bytes.
  if (absl::Status st = EnableTierCopies(n_expert_max); !st.ok()) {
    LogWarn("strata: the copy engines stay off for the tiers' tables: %s\n",
            std::string(st.message()).c_str());
  }
  // Best effort too: without it the device computes every expert.
  if (absl::Status st = EnableTierCpuShare(n_expert_max); !st.ok()) {
    if (cpu_opts_.mode == CpuExpertMode::kAlways) err_ = st;  // asked for: the steps say why they fail
    LogWarn("strata: CPU experts off for the tiers' tables: %s\n", std::string(st.message()).c_str());
    cpu_experts_.reset();
    regime_.reset();
  }
  return true;
}

absl::Status CudaBackend::EnableTierCpuShare(int n_expert_max) {
  if (cpu_opts_.mode == CpuExpertMode::kOff || tier_copies_ == nullptr || n_expert_max <= 0) {
    return absl::OkStatus();
  }
  const uint8_t *host = tier_copies_;
  const Region &r = regions_.at(host);
  // The calibration's experts: each table layer's shapes laid over the slab (what it holds now is
  // no expert yet; the rate is the codecs' over bytes in RAM either way).
  std::vector<model::ExpertWeights> calib;
  uint64_t off = 0;
  for (size_t l = 0; l < tables_.size(); ++l) {
    if (!tables_[l].ok) continue;
    const auto &ex = w_->layers[l].experts;
    for (size_t x = (l * 7) % ex.size(), n = 0; n < 3 && x < ex.size(); x += 5, ++n) {
      model::ExpertWeights e = ex[x];
      const uint64_t g = Align(e.gate.nbytes()), u = Align(e.up.nbytes()), d = Align(e.down.nbytes());
      if (g + u + d > r.bytes) break;
      if (off + g + u + d > r.bytes) off = 0;
      e.gate.data = host + off;
      e.up.data = host + off + g;
      e.down.data = host + off + g + u;
      off += g + u + d;
      calib.push_back(e);
    }
  }
  if (calib.empty()) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "the RAM tier's slab holds no expert");
  STRATA_RETURN_IF_ERROR(
      StartCpuExperts(*w_, cpu_opts_, n_expert_max, host, r.dev, r.bytes, std::move(calib)));
  // The selections come back to the host for each layer's count of cold experts.
  STRATA_ASSIGN_OR_RETURN(
      hist_, PinnedBuffer::Allocate(tables_.size() * kDeviceRouteMaxRows * sizeof(int32_t), cudaHostAllocMapped));
  STRATA_ASSIGN_OR_RETURN(hist_dev_, hist_.device<int32_t>());
  for (LayerTable &t : tables_) {
    if (t.ok) {
      STRATA_ASSIGN_OR_RETURN(t.hist_done, Event::Create());
    }
  }
  STRATA_ASSIGN_OR_RETURN(step_hist_done_, Event::Create());
  if (copier_ != nullptr && cpu_opts_.mode == CpuExpertMode::kAuto && tunables::Get().cuda_regime_probe) {
    regime_ = std::make_unique<model::RegimeProbe>();
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::UpdateTierLayer(int l) {
  LayerTable &t = tables_[l];
  const int32_t *sel = nullptr;
  STRATA_ASSIGN_OR_RETURN(const int64_t rows, TakeSelections(l, &sel));
  if (rows == 0) return absl::OkStatus();
  const int n = t.ge.n_expert;
  const void *const *gate = tab_host_.data() + t.tab_off;
  std::vector<char> seen(n, 0);
  int cold = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int x = sel[i];
    if (x < 0 || x >= n) return Errorf(MOE_ERR_INTERNAL, "layer %d routed to expert %d of %d", l, x, n);
    if (seen[x]) continue;
    seen[x] = 1;
    const auto a = reinterpret_cast<uintptr_t>(gate[x]);
    if (a >= stage_.host_lo && a < stage_.host_hi) ++cold;  // served from RAM's slab
  }
  zero_copy_uses_ += static_cast<uint64_t>(cold);  // read over the link, or computed by the CPU
  NoteColdExperts(t, cold, w_->layers[l].experts[0].nbytes());
  return absl::OkStatus();
}

absl::Status CudaBackend::EnableTierCopies(int n_expert_max) {
  // One mapped range: the RAM tier's slab.
  if (mapped_.size() != 1 || n_expert_max <= 0) return absl::OkStatus();
  const uint8_t *host = mapped_[0];
  const Region &r = regions_.at(host);
  // Staging slots of the largest expert's device size, each part aligned, as the backend's own slots.
  uint64_t slot = 0;
  for (size_t l = 0; l < tables_.size(); ++l) {
    if (!tables_[l].ok) continue;
    const model::ExpertWeights &e = w_->layers[l].experts[0];
    slot = std::max(slot, Align(DeviceBytes(e.gate)) + Align(DeviceBytes(e.up)) + Align(DeviceBytes(e.down)));
  }
  const int64_t set = cold_copies_choice_.value_or(tunables::Get().cuda_cold_copies);
  const int64_t want = set >= 0 ? set : 8;  // a batch-1 layer's experts (Qwen3-30B-A3B routes 8)
  if (want <= 0 || slot == 0) return absl::OkStatus();
  bool unclaimed = false;
  if (!g_copier_claimed.compare_exchange_strong(unclaimed, true)) return absl::OkStatus();  // another context's
  cold_copies_ = true;
  const uint64_t n_stage = static_cast<uint64_t>(std::clamp<int64_t>(want, 1, kRouteMaxExperts));
  absl::Status st = [&]() -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(stage_buf_, DeviceBuffer::Allocate(3 * n_stage * slot));
    stage_.slots = stage_buf_.as<uint8_t>();
    stage_.n_slots = static_cast<int>(n_stage);
    stage_.slot_bytes = slot;
    stage_.host_lo = reinterpret_cast<uintptr_t>(r.dev);
    stage_.host_hi = stage_.host_lo + r.bytes;
    for (int p = 0; p < 2; ++p) {
      pf_stage_[p] = stage_;
      pf_stage_[p].slots = stage_.slots + (1 + p) * n_stage * slot;
    }
    return SetUpColdCopies(n_expert_max, host, r.dev, r.bytes);
  }();
  if (!st.ok()) {
    copier_.reset();
    stage_ = ExpertStage();
    pf_stage_[0] = pf_stage_[1] = ExpertStage();
    for (LayerTable &t : tables_) t.stage = false;
    stage_buf_ = DeviceBuffer();
    cold_copies_ = false;
    g_copier_claimed.store(false);
    return st;
  }
  tier_copies_ = host;
  tables_bytes_ = tab_dev_.size() + stage_buf_.size();
  // The same memory stages a prompt's experts from RAM (PromptStage): one DMA copy each from the
  // page-locked slab, where the prompt's products would read them over the link once per tile.
  if (tunables::Get().cuda_prompt_stage) {
    slot_bytes_ = slot;
    prompt_stage_.resize(3 * n_stage);
    for (Slot &sl : prompt_stage_) {
      STRATA_ASSIGN_OR_RETURN(sl.used, Event::Create());
      STRATA_ASSIGN_OR_RETURN(sl.fill, Event::Create());
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::PointExpert(int l, int x, const model::ExpertWeights &e) {
  if (!external_tables_ || l < 0 || l >= static_cast<int>(tables_.size()) || !tables_[l].ok || x < 0 ||
      x >= tables_[l].ge.n_expert) {
    return Errorf(MOE_ERR_INTERNAL, "no device table entry for expert %d of layer %d", x, l);
  }
  const LayerTable &t = tables_[l];
  const model::Matrix *parts[3] = {&e.gate, &e.up, &e.down};
  const DeviceMatrix *shapes[3] = {&t.ge.gate_shape, &t.ge.up_shape, &t.ge.down_shape};
  const void *addr[3] = {};
  for (int m = 0; m < 3; ++m) {
    STRATA_ASSIGN_OR_RETURN(const DeviceMatrix dm, Resolve(*parts[m]));
    const DeviceMatrix &want = *shapes[m];
    if (dm.type != want.type || dm.rows != want.rows || dm.cols != want.cols || dm.row_bytes != want.row_bytes) {
      return Errorf(MOE_ERR_INTERNAL, "%s does not have its layer's expert shape", parts[m]->name);
    }
    STRATA_RETURN_IF_ERROR(CheckMatrix(dm));
    addr[m] = dm.data;
  }
  const int n = t.ge.n_expert;
  const void **mirror = tab_host_.data() + t.tab_off;
  mirror[x] = addr[0];
  mirror[n + x] = addr[1];
  mirror[2 * n + x] = addr[2];
  table_dirty_[l] = 1;
  tables_dirty_ = true;
  return absl::OkStatus();
}

}  // namespace strata::cuda
