// CudaBackend: weight adoption (one copy of the host arena, float32 copies of matrices without a
// device kernel, one packed buffer of vectors), pointer resolution from host weight addresses to
// device ones, and each Backend operation as kernel-layer launches on one stream.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "lib/quant/codec.h"

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

template <typename F>
void ForEachExpert(const model::LayerWeights &L, F &&f) {
  for (const auto &e : L.experts) f(e);
  f(L.dense);
  f(L.shared);
}

// Every matrix and vector of the model, for adoption.
template <typename FM, typename FV>
void ForEachWeight(const model::ModelWeights &w, FM &&fm, FV &&fv) {
  fm(w.tok_embd);
  fm(w.output);
  fv(w.output_norm);
  for (const auto &L : w.layers) {
    for (const model::Matrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wk_b,
                                   &L.wv_b, &L.router, &L.shared_gate}) {
      fm(*m);
    }
    for (const model::Vec *v : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.q_norm, &L.k_norm, &L.sinks,
                                &L.q_a_norm, &L.kv_a_norm, &L.ffn_norm, &L.router_bias, &L.expert_select_bias}) {
      fv(*v);
    }
    ForEachExpert(L, [&](const model::ExpertWeights &e) {
      fm(e.gate);
      fm(e.up);
      fm(e.down);
      fv(e.gate_bias);
      fv(e.up_bias);
      fv(e.down_bias);
    });
  }
}

size_t Align(size_t n) { return (n + 255) & ~size_t{255}; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::ModelWeights &w, const uint8_t *arena,
                                                                 size_t arena_bytes) {
  if (DeviceCount() <= 0) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "no CUDA device");
  auto be = std::unique_ptr<CudaBackend>(new CudaBackend());
  STRATA_ASSIGN_OR_RETURN(be->stream_, Stream::Create());
  STRATA_ASSIGN_OR_RETURN(be->blas_, Blas::Create(Blas::Compute::kF32));
  STRATA_RETURN_IF_ERROR(be->Adopt(w, arena, arena_bytes));
  return be;
}

CudaBackend::~CudaBackend() {
  // Work still queued may use the scratch buffers about to be freed.
  if (stream_.get() != nullptr) (void)stream_.Synchronize();
}

absl::Status CudaBackend::Adopt(const model::ModelWeights &w, const uint8_t *arena, size_t arena_bytes) {
  host_arena_ = arena;
  arena_bytes_ = arena_bytes;
  STRATA_ASSIGN_OR_RETURN(dev_arena_, DeviceBuffer::Allocate(arena_bytes));
  if (arena_bytes > 0) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_arena_.data(), arena, arena_bytes, cudaMemcpyHostToDevice));
  }
  // Matrices the kernels cannot read in their codec (no device kernel, or a shape / alignment the
  // kernels reject) are held as float32: exact, since the host dequantizer defines the values.
  absl::Status st;
  std::vector<const model::Matrix *> convert;
  std::map<const uint8_t *, bool> seen;
  size_t conv_bytes = 0;
  auto on_matrix = [&](const model::Matrix &m) {
    if (m.tensor == nullptr || m.data == nullptr || m.rows <= 0) return;
    if (m.data < arena || m.data + m.nbytes() > arena + arena_bytes) {
      st.Update(Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s is not in the resident weights", m.name));
      return;
    }
    if (m.codec->id == quant::TypeId::kF32 && m.row_bytes == static_cast<uint64_t>(m.cols) * 4) return;
    const DeviceMatrix dm{m.codec->id, dev_arena_.as<uint8_t>() + (m.data - arena), m.rows, m.cols, m.row_bytes};
    if (HasDeviceCodec(m.codec->id) && CheckMatrix(dm).ok()) return;
    if (seen.emplace(m.data, true).second) {
      convert.push_back(&m);
      conv_bytes += Align(static_cast<size_t>(m.rows * m.cols) * sizeof(float));
    }
  };
  std::vector<const model::Vec *> vecs;
  size_t vec_floats = 0;
  auto on_vec = [&](const model::Vec &v) {
    if (v.tensor == nullptr || v.values.empty()) return;
    vecs.push_back(&v);
    vec_floats += Align(v.values.size() * sizeof(float)) / sizeof(float);
  };
  ForEachWeight(w, on_matrix, on_vec);
  STRATA_RETURN_IF_ERROR(st);
  STRATA_ASSIGN_OR_RETURN(conv_buf_, DeviceBuffer::Allocate(conv_bytes));
  size_t off = 0;
  std::vector<float> tmp;
  for (const model::Matrix *m : convert) {
    tmp.resize(static_cast<size_t>(m->rows * m->cols));
    for (int64_t r = 0; r < m->rows; ++r) m->codec->dequantize(m->row(r), tmp.data() + r * m->cols, m->cols);
    float *dev = reinterpret_cast<float *>(conv_buf_.as<uint8_t>() + off);
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev, tmp.data(), tmp.size() * sizeof(float), cudaMemcpyHostToDevice));
    converted_[m->data] = Converted{m->nbytes(), m->row_bytes, m->cols, dev};
    off += Align(tmp.size() * sizeof(float));
  }
  std::vector<float> packed(vec_floats, 0.f);
  STRATA_ASSIGN_OR_RETURN(vec_buf_, DeviceBuffer::Allocate(vec_floats * sizeof(float)));
  off = 0;
  for (const model::Vec *v : vecs) {
    std::copy(v->values.begin(), v->values.end(), packed.begin() + off);
    vecs_[v->values.data()] = DeviceVec{static_cast<int64_t>(v->values.size()), vec_buf_.as<float>() + off};
    off += Align(v->values.size() * sizeof(float)) / sizeof(float);
  }
  if (!packed.empty()) {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(vec_buf_.data(), packed.data(), packed.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  weight_bytes_ = arena_bytes + conv_bytes + vec_floats * sizeof(float);
  return absl::OkStatus();
}

absl::StatusOr<DeviceMatrix> CudaBackend::Resolve(const model::Matrix &w) const {
  if (w.data == nullptr) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s has no resident bytes", w.name);
  auto it = converted_.upper_bound(w.data);
  if (it != converted_.begin()) {
    --it;
    const Converted &c = it->second;
    if (w.data < it->first + c.bytes) {
      const uint64_t off = static_cast<uint64_t>(w.data - it->first);
      if (off % c.host_row_bytes != 0 || w.cols != c.cols) {
        return Errorf(MOE_ERR_INTERNAL, "%s is not a row range of a converted matrix", w.name);
      }
      const int64_t row = static_cast<int64_t>(off / c.host_row_bytes);
      return DeviceMatrix{quant::TypeId::kF32, c.dev + row * c.cols, w.rows, w.cols,
                          static_cast<uint64_t>(c.cols) * 4};
    }
  }
  if (w.data < host_arena_ || w.data + w.nbytes() > host_arena_ + arena_bytes_) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s is not resident on the device (streamed experts need the VRAM tier)",
                  w.name);
  }
  return DeviceMatrix{w.codec->id, dev_arena_.as<uint8_t>() + (w.data - host_arena_), w.rows, w.cols, w.row_bytes};
}

absl::StatusOr<const float *> CudaBackend::Resolve(const float *host_vec) const {
  if (host_vec == nullptr) return static_cast<const float *>(nullptr);
  auto it = vecs_.upper_bound(host_vec);
  if (it != vecs_.begin()) {
    --it;
    if (host_vec < it->first + it->second.n) return it->second.dev + (host_vec - it->first);
  }
  return Errorf(MOE_ERR_INTERNAL, "a weight vector is not on the device");
}

absl::StatusOr<void *> CudaBackend::Grow(DeviceBuffer &b, size_t bytes) {
  if (b.size() < bytes) {
    STRATA_RETURN_IF_ERROR(stream_.Synchronize());  // queued work may still read the old buffer
    b.Reset();
    STRATA_ASSIGN_OR_RETURN(b, DeviceBuffer::Allocate(Align(bytes)));
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

// Pageable sources are staged by the driver before cudaMemcpyAsync returns, so the caller may free
// `src` at once.
void CudaBackend::Upload(void *dst, const void *src, size_t bytes) {
  if (!err_.ok() || bytes == 0) return;
  Note(CopyAsync(dst, src, bytes, stream_.get()));
}

void CudaBackend::Download(void *dst, const void *src, size_t bytes) {
  if (!err_.ok() || bytes == 0) return;
  if (Note(CopyAsync(dst, src, bytes, stream_.get()))) Note(stream_.Synchronize());
}

absl::Status CudaBackend::TakeError() {
  absl::Status s = std::move(err_);
  err_ = absl::OkStatus();
  return s;
}

// ---- element-wise ----

void CudaBackend::CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int64_t width) {
  if (!err_.ok() || rows <= 0 || width <= 0) return;
  const cudaError_t e =
      cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float), width * sizeof(float), rows,
                        cudaMemcpyDeviceToDevice, stream_.get());
  Note(CudaStatus(e, "cudaMemcpy2DAsync", __FILE__, __LINE__));
}

void CudaBackend::Add(float *x, const float *y, int64_t n) {
  if (err_.ok()) Note(cuda::Add(x, y, n, stream_.get()));
}

void CudaBackend::AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) {
  if (!err_.ok()) return;
  auto b = Resolve(bias);
  if (Note(b.status())) Note(cuda::AddBias(x, n_rows, n, *b, stream_.get()));
}

void CudaBackend::SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) {
  if (err_.ok()) Note(cuda::SigmoidScaleRows(x, g, n_rows, n, stream_.get()));
}

void CudaBackend::GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) {
  if (err_.ok()) Note(cuda::GatherRows(src, width, idx, n, dst, stream_.get()));
}

void CudaBackend::WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                                 int64_t width, float *out) {
  if (err_.ok()) Note(cuda::WeightedRowSum(rows, idx, wts, n_tok, k, width, out, stream_.get()));
}

void CudaBackend::Route(const model::RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host,
                        float *wts) {
  if (!err_.ok() || n_tok <= 0) return;
  RouteArgs a;
  a.gating = p.gating == model::Gating::kSoftmax ? 0 : p.gating == model::Gating::kSoftmaxSelected ? 1 : 2;
  a.n_expert = p.n_expert;
  a.k = p.k;
  a.n_group = std::max(p.n_group, 1);
  a.topk_group = p.n_group > 1 ? p.topk_group : 1;
  a.norm_topk_prob = p.norm_topk_prob;
  a.routed_scale = p.routed_scale;
  auto bias = Resolve(p.select_bias);
  if (!Note(bias.status())) return;
  a.select_bias = *bias;
  const size_t bytes = static_cast<size_t>(n_tok) * p.k * sizeof(int32_t);
  auto sel = Grow(sel_dev_, bytes);
  if (!Note(sel.status())) return;
  if (!Note(cuda::Route(a, logits, n_tok, static_cast<int32_t *>(*sel), wts, stream_.get()))) return;
  // The host needs the selections now (grouping, the expert source): one small copy per layer.
  Download(sel_host, *sel, bytes);
}

// ---- compute ----

absl::Status CudaBackend::MatMulDevice(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y) {
  if (CheckMatrix(w).ok()) {
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
  if (!err_.ok() || n_tok <= 0 || w.rows <= 0) return;
  auto dm = Resolve(w);
  if (Note(dm.status())) Note(MatMulDevice(*dm, x, n_tok, y));
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
  if (!err_.ok()) return;
  auto wd = Resolve(weight);
  if (Note(wd.status())) Note(cuda::RmsNorm(x, *wd, n_rows, n, eps, y, stream_.get()));
}

void CudaBackend::Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                       model::RopeStyle style, const model::RopeParams &p) {
  if (!err_.ok()) return;
  // The table as the CPU backend forms it, passed to the kernel by value.
  const int half = head_dim / 2;
  std::vector<float> inv(std::max(half, 1));
  for (int i = 0; i < half; ++i) {
    inv[i] = p.inv_freq != nullptr
                 ? p.inv_freq[i]
                 : 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  Note(RopeWithTable(x, n_tok, n_heads, head_dim, pos, inv.data(), p.mscale, style, stream_.get()));
}

absl::Status CudaBackend::AttentionImpl(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                                        int n_head_kv, int head_dim, int window, float *out,
                                        const model::AttentionParams &p) {
  // Plain grouped-query attention with the default scale runs the kernel layer's tuned kernels.
  const bool plain = !p.latent && p.sinks == nullptr && p.scale == 0.f && head_dim % 32 == 0 && head_dim <= 256 &&
                     kv.k_width == n_head_kv * head_dim && kv.v_width == n_head_kv * head_dim;
  if (plain) {
    return cuda::Attention(q, DeviceKv{kv.k, kv.v, kv.n_ctx}, n_tok, pos0, n_head, n_head_kv, head_dim, window, out,
                           stream_.get());
  }
  AttentionExtArgs a;
  a.k = kv.k;
  a.v = kv.v;
  a.k_stride = kv.k_width;
  a.v_stride = kv.v_width;
  a.pos0 = pos0;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.v_dim = p.latent ? p.v_dim : head_dim;
  a.window = window;
  a.latent = p.latent;
  a.scale = p.scale != 0.f ? p.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  STRATA_ASSIGN_OR_RETURN(a.sinks, Resolve(p.sinks));
  return AttentionExt(q, a, n_tok, out, stream_.get());
}

void CudaBackend::Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                            int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p) {
  if (err_.ok()) Note(AttentionImpl(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, p));
}

absl::Status CudaBackend::ExpertFfnImpl(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  const bool biased = e.gate_bias.tensor != nullptr || e.up_bias.tensor != nullptr || e.down_bias.tensor != nullptr;
  if (!e.input_major && !biased && e.swiglu_limit == 0.f) {
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
  if (err_.ok() && n_tok > 0) Note(ExpertFfnImpl(e, x, n_tok, y));
}

}  // namespace strata::cuda
