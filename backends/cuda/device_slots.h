// The VRAM tier's device slots over CUDA (lib/store/tier.h): one device allocation of fixed slots,
// entered into the backend's address map so a view into a slot resolves to itself, and copies in
// and out on the backend's copy stream, ordered after the compute stream's work queued so far. The
// device tables are the backend's own (CudaBackend::EnableExpertTables, PointExpert).
#pragma once

#include <vector>

#include "backends/cuda/memory.h"
#include "lib/store/tier.h"

namespace strata::cuda {

class CudaBackend;

class CudaDeviceSlots final : public store::DeviceSlots {
 public:
  explicit CudaDeviceSlots(CudaBackend *backend) : be_(backend) {}
  ~CudaDeviceSlots() override;
  std::string_view name() const override { return "cuda"; }
  absl::Status Allocate(uint32_t n, uint64_t slot_bytes) override;
  uint8_t *slot(uint32_t s) const override { return buf_.as<uint8_t>() + static_cast<uint64_t>(s) * stride_; }
  absl::Status CopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) override;
  absl::Status CopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) override;
  // Queued copies: on two streams of their own (one a direction, so a victim's bytes going down and
  // another expert's coming up overlap), each after the compute stream's work queued so far.
  absl::Status QueueCopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) override;
  absl::Status QueueCopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) override;
  // The victim's bytes down on the down stream, then the expert's up on the up stream once they left.
  absl::Status QueueSwap(uint32_t s, uint8_t *down_dst, uint64_t down_bytes, const uint8_t *up_src,
                         uint64_t up_bytes) override;
  // The compute stream waits for the up stream's copies so far.
  absl::Status ComputeAfterQueued() override;
  absl::StatusOr<uint64_t> Fence() override;
  absl::StatusOr<bool> Reached(uint64_t ticket, bool wait) override;
  bool EnableTables() override;
  uint64_t tables_bytes() const override;
  absl::Status Point(int layer, int expert, const model::ExpertWeights &where) override;

 private:
  // The copy on the copy stream after the compute stream's work so far, waited for.
  absl::Status Copy(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind);
  absl::Status Queue(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind);
  // MOE_ERR_INTERNAL unless slot s exists and holds `bytes`.
  absl::Status CheckSlot(uint32_t s, uint64_t bytes, cudaMemcpyKind kind) const;
  // The copy queued on `stream`, or the error naming it.
  static absl::Status Enqueue(cudaStream_t stream, void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind);
  CudaBackend *be_;
  DeviceBuffer buf_;
  uint64_t stride_ = 0;
  uint32_t n_ = 0;
  Event after_compute_;
  // The queued copies' streams, made at the first; the compute stream's work they wait for (recorded
  // once a batch, at its first copy); fences not yet known reached, oldest first (their events on
  // both streams), and spent events to record again.
  Stream up_, down_;
  Event queued_after_;
  Event swapped_out_, joined_;  // a swap's victim copied down; the up stream's copies so far
  bool batch_open_ = false;
  struct FenceEvents {
    uint64_t ticket = 0;
    Event up, down;
  };
  std::vector<FenceEvents> fences_;
  std::vector<Event> spare_events_;
  uint64_t next_ticket_ = 0, reached_ = 0;
};

}  // namespace strata::cuda
