// The CUDA backend: the Backend interface (lib/model/backend.h) over the kernel layer
// (backends/cuda/kernels.h). The model's weights are copied to VRAM once at creation (matrices
// whose codec has no device kernel are held dequantized to float32); activations and KV caches are
// device buffers; all work is queued on one compute stream, and only Route (the selections) and
// Download (logits) wait for it. Errors are kept (the first one) and returned by TakeError.
//
// VRAM expert tier: when the routed experts do not all fit the budget, they stay in host RAM and
// run from a fixed set of VRAM slots (allocated once; LRU), each filled on a copy stream through
// pinned staging buffers when an expert is needed. Events order a slot's refill after the last
// computation that read it and the computation after the copy. The bytes are the same, so results
// are bit-identical at any budget.
#pragma once

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "lib/model/backend.h"

namespace strata::cuda {

class CudaBackend final : public model::Backend {
 public:
  // Copies every resident matrix (those inside the host arena [arena, arena + arena_bytes), where
  // WeightStore keeps them) and every norm / bias vector of `w` to the device. MOE_ERR_NO_MEMORY when
  // VRAM cannot hold them; MOE_ERR_UNSUPPORTED_BACKEND without a device. `w` must outlive the backend
  // (its host addresses are the keys by which the forward pass names weights).
  // expert_vram_bytes: VRAM for routed experts; when it holds fewer than all of them they run from
  // max(bytes / slot size, n_min_slots) slots (see above). UINT64_MAX: every expert resident.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const model::ModelWeights &w, const uint8_t *arena,
                                                             size_t arena_bytes, uint64_t expert_vram_bytes = UINT64_MAX,
                                                             int n_min_slots = 1);
  ~CudaBackend() override;
  std::string_view name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<model::Buffer>> Allocate(size_t bytes) override;
  void Upload(void *dst, const void *src, size_t bytes) override;
  void Download(void *dst, const void *src, size_t bytes) override;
  absl::Status TakeError() override;

  void CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                int64_t width) override;
  void Add(float *x, const float *y, int64_t n) override;
  void AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) override;
  void SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) override;
  void GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) override;
  void WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k, int64_t width,
                      float *out) override;
  void Route(const model::RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host,
             float *wts) override;

  void MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) override;
  void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y) override;
  using model::Backend::Attention;
  using model::Backend::Rope;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
            model::RopeStyle style, const model::RopeParams &p) override;
  void Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                 int head_dim, int window, float *out, const model::AttentionParams &p) override;
  void ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) override;

  // Bytes of VRAM the weights took at creation (expert slots included).
  size_t weight_bytes() const { return weight_bytes_; }
  // Expert slots of the VRAM tier; 0 when every expert is resident.
  int expert_slots() const { return static_cast<int>(slots_.size()); }
  // Slot fills so far and the bytes they copied host -> device.
  uint64_t expert_fills() const { return fills_; }
  uint64_t expert_fill_bytes() const { return fill_bytes_; }

 private:
  CudaBackend() = default;
  // A host matrix's device copy: in its codec, or (converted) rows of cols float32.
  struct Region {
    uint64_t bytes = 0;           // host bytes covered
    uint64_t host_row_bytes = 0;
    int64_t cols = 0;
    bool converted = false;
    uint8_t *dev = nullptr;
  };
  struct Slot {
    const uint8_t *key = nullptr;   // the host gate bytes of the expert it holds
    std::vector<const uint8_t *> parts;
    uint64_t last_use = 0;
    Event used;                     // recorded after each computation that reads the slot
  };
  struct DeviceVec {
    int64_t n = 0;
    const float *dev = nullptr;
  };
  absl::Status Adopt(const model::ModelWeights &w, const uint8_t *arena, size_t arena_bytes, uint64_t expert_vram_bytes,
                     int n_min_slots);
  // Device bytes of m as held (its codec, or float32 when converted).
  static bool NeedsConversion(const model::Matrix &m);
  static uint64_t DeviceBytes(const model::Matrix &m);
  // The slot holding e, filled from host memory first when it holds another expert.
  absl::StatusOr<Slot *> SlotFor(const model::ExpertWeights &e);
  absl::StatusOr<DeviceMatrix> Resolve(const model::Matrix &w) const;
  absl::StatusOr<const float *> Resolve(const float *host_vec) const;
  absl::Status MatMulDevice(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y);
  absl::Status ExpertFfnImpl(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y);
  absl::Status AttentionImpl(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                             int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p);
  // A device scratch buffer of at least `bytes`, grown (after the stream drains) when smaller.
  absl::StatusOr<void *> Grow(DeviceBuffer &b, size_t bytes);
  absl::StatusOr<void *> GrowPinned(PinnedBuffer &b, size_t bytes);
  bool Note(absl::Status s) {
    if (!s.ok() && err_.ok()) err_ = std::move(s);
    return err_.ok();
  }

  Stream stream_;
  Blas blas_;
  const uint8_t *host_arena_ = nullptr;
  size_t arena_bytes_ = 0;
  DeviceBuffer weight_buf_, vec_buf_, slot_buf_;
  std::map<const uint8_t *, Region> regions_;        // resident matrices, keyed by host start
  std::unordered_map<const uint8_t *, Region> in_slots_;  // matrices of experts now in slots
  std::unordered_map<const uint8_t *, int> slot_of_;  // host gate bytes -> slot
  std::vector<Slot> slots_;
  uint64_t slot_bytes_ = 0, use_clock_ = 0, fills_ = 0, fill_bytes_ = 0;
  // Pinned bounce buffers for the forward pass's small transfers (inputs, expert groups, routing
  // selections, logits): pageable copies would be staged by the driver on every call. `up_done_`
  // marks when the last upload has left up_io_.
  PinnedBuffer up_io_, down_io_;
  Event up_done_;
  Stream copy_stream_;
  PinnedBuffer staging_[2];
  Event staged_[2];                                  // copy from staging_[i] done
  int next_staging_ = 0;
  // With the VRAM tier, the host arena is registered with the driver (page-locked) when it allows:
  // a slot fill of unconverted bytes is then DMA straight from the arena, no staging copy.
  bool arena_registered_ = false;
  Event filled_;                                     // the last direct fill's copies are done
  std::map<const float *, DeviceVec> vecs_;         // keyed by host values.data()
  DeviceBuffer mm_ws_, ffn_ws_, deq_ws_, sel_dev_, kv_tab_;
  size_t weight_bytes_ = 0;
  absl::Status err_;
};

}  // namespace strata::cuda
