// The CUDA backend: the Backend interface (lib/model/backend.h) over the kernel layer
// (backends/cuda/kernels.h). The model's resident weights are copied to VRAM once at creation
// (matrices whose codec has no device kernel are held dequantized to float32); activations and KV
// caches are device buffers; all work is queued on one stream, and only Route (the selections) and
// Download (logits) wait for it. Errors are kept (the first one) and returned by TakeError.
#pragma once

#include <map>
#include <memory>

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
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const model::ModelWeights &w, const uint8_t *arena,
                                                             size_t arena_bytes);
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

  // Bytes of VRAM the weights took at creation.
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  CudaBackend() = default;
  // A matrix held dequantized: rows of cols float32 at dev, for host rows of host_row_bytes.
  struct Converted {
    uint64_t bytes = 0;
    uint64_t host_row_bytes = 0;
    int64_t cols = 0;
    float *dev = nullptr;
  };
  struct DeviceVec {
    int64_t n = 0;
    const float *dev = nullptr;
  };
  absl::Status Adopt(const model::ModelWeights &w, const uint8_t *arena, size_t arena_bytes);
  absl::StatusOr<DeviceMatrix> Resolve(const model::Matrix &w) const;
  absl::StatusOr<const float *> Resolve(const float *host_vec) const;
  absl::Status MatMulDevice(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y);
  absl::Status ExpertFfnImpl(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y);
  absl::Status AttentionImpl(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                             int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p);
  // A device scratch buffer of at least `bytes`, grown (after the stream drains) when smaller.
  absl::StatusOr<void *> Grow(DeviceBuffer &b, size_t bytes);
  bool Note(absl::Status s) {
    if (!s.ok() && err_.ok()) err_ = std::move(s);
    return err_.ok();
  }

  Stream stream_;
  Blas blas_;
  const uint8_t *host_arena_ = nullptr;
  size_t arena_bytes_ = 0;
  DeviceBuffer dev_arena_, vec_buf_, conv_buf_;
  std::map<const uint8_t *, Converted> converted_;  // keyed by host start
  std::map<const float *, DeviceVec> vecs_;         // keyed by host values.data()
  DeviceBuffer mm_ws_, ffn_ws_, deq_ws_, sel_dev_;
  size_t weight_bytes_ = 0;
  absl::Status err_;
};

}  // namespace strata::cuda
