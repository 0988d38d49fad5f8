// CudaBackend: creation and teardown, and the Backend interface's plain operations (memory and
// transfers, element-wise ops, products, norms, RoPE, attention) as kernel-layer launches on one
// stream; the first error is kept for TakeError. Weights, tier, experts and steps have files of their own.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "lib/model/placement.h"
#include "lib/quant/codec.h"
#include "lib/util/tunables.h"
#include "lib/util/log.h"

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
                                                                 size_t arena_bytes, const CpuExpertOptions &cpu,
                                                                 bool q8_activations,
                                                                 const BackendChoices &choices) {
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
  be->cpu_opts_ = cpu;
  STRATA_ASSIGN_OR_RETURN(be->stream_, Stream::Create());
  STRATA_ASSIGN_OR_RETURN(be->copy_stream_, Stream::Create());
  STRATA_ASSIGN_OR_RETURN(be->up_done_, Event::Create());
  STRATA_ASSIGN_OR_RETURN(be->blas_, Blas::Create(Blas::Compute::kF32));
  STRATA_ASSIGN_OR_RETURN(be->ring_, PinnedBuffer::Allocate(kRingSegment * kRingSegments));
  for (Event &e : be->ring_done_) {
    STRATA_ASSIGN_OR_RETURN(e, Event::Create());
  }
  STRATA_RETURN_IF_ERROR(be->Adopt(w, arena, arena_bytes));
  STRATA_RETURN_IF_ERROR(be->BuildTables(w));
  STRATA_RETURN_IF_ERROR(be->WarmUpBlas());
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

CudaBackend::~CudaBackend() {
  if (regime_ != nullptr && cpu_experts_ != nullptr && cpu_experts_->tracing()) {
    LogDebug("cpu experts regime: %d probes, holding %s; last timed: link %.2f ms, hybrid %.2f ms a step; "
             "%lld path changes inside probes (their steps untimed), %lld probe steps of the share held on the "
             "link\n",
             regime_->probes(), regime_->held() == model::RegimeProbe::Regime::kLink ? "link" : "hybrid",
             regime_->link_s() * 1e3, regime_->hybrid_s() * 1e3, static_cast<long long>(regime_->resettles()),
             static_cast<long long>(regime_->declines()));
  }
  if (host_trace_ && host_n_ > 0) {
    const double n = static_cast<double>(host_n_);
    LogDebug("cuda host: %llu replayed steps; a step: %.1f us from the last download to BeginStep, %.1f us in "
             "it before the launch (%.1f the layers' tier, %.1f their paths), %.1f us launching, %.1f us "
             "waiting for the download\n",
             static_cast<unsigned long long>(host_n_), 1e6 * host_s_[0] / n, 1e6 * host_s_[1] / n,
             1e6 * host_s_[4] / n, 1e6 * host_s_[5] / n, 1e6 * host_s_[2] / n, 1e6 * host_s_[3] / n);
  }
  ReadStamps();
  if (!stamp_table_.empty()) {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(stamp_table_.begin(), stamp_table_.end());
    std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.first > b.second.first; });
    LogDebug("cuda stamps over %llu recorded steps: up to mark, marks, ms a step, us a mark\n",
             static_cast<unsigned long long>(stamped_steps_));
    for (auto &[name, r] : rows) {
      LogDebug("  %-20s %8llu %8.3f %8.2f\n", name.c_str(), static_cast<unsigned long long>(r.second),
               1e3 * r.first / std::max<uint64_t>(stamped_steps_, 1), 1e6 * r.first / std::max<uint64_t>(r.second, 1));
    }
  }
  if (profile_ && !profile_table_.empty()) {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(profile_table_.begin(), profile_table_.end());
    std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.first > b.second.first; });
    LogDebug("cuda profile: operation, calls, total s, us per call\n");
    for (auto &[op, r] : rows) {
      LogDebug("  %-16s %10llu %10.4f %10.2f\n", op.c_str(), static_cast<unsigned long long>(r.second),
               r.first, 1e6 * r.first / std::max<uint64_t>(r.second, 1));
    }
  }
  // Work still queued may use the buffers about to be freed. The compute stream first: its layers
  // may still post requests to the copier, whose thread serves them until it is stopped; then no
  // copy may read the mapped slab once it is unregistered.
  if (stream_.get() != nullptr) (void)stream_.Synchronize();
  copier_.reset();
  if (cold_copies_) g_copier_claimed.store(false);
  if (copy_stream_.get() != nullptr) (void)copy_stream_.Synchronize();
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
        LogDebug("cuda graphs: a recorded scratch buffer grew (%zu to %zu bytes): %zu graphs dropped\n",
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
    LogDebug("prompt matmul: %s (%lld x %lld, %s) x %lld tokens: %.1f us\n", w.name.c_str(),
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
  a.k_type = kv.k_type;
  a.v_type = kv.v_width > 0 ? kv.v_type : model::KvType::kF32;
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

void CudaBackend::WriteKvRows(const model::KvRowRef *rows, const model::KvRowRef *, int64_t n, const float *k,
                              const float *v, int k_width, int v_width) {
  Profile prof(this, "WriteKvRows");
  if (err_.ok()) Note(cuda::WriteKvRows(rows, n, k, v, k_width, v_width, model::kKvBlockTokens, stream_.get()));
}

void CudaBackend::WriteKvBytes(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                               int width, model::KvType t) {
  if (t == model::KvType::kF32) {  // device copies, as ever
    model::Backend::WriteKvBytes(dst, dst_stride, src, src_stride, rows, width, t);
    return;
  }
  Profile prof(this, "WriteKvBytes");
  if (err_.ok()) Note(cuda::EncodeKvRows(dst, dst_stride, src, src_stride, rows, width, t, stream_.get()));
}

void CudaBackend::ReadKvBytes(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows,
                              int width, model::KvType t) {
  if (t == model::KvType::kF32) {
    model::Backend::ReadKvBytes(dst, dst_stride, src, src_stride, rows, width, t);
    return;
  }
  Profile prof(this, "ReadKvBytes");
  if (err_.ok()) Note(cuda::DecodeKvRows(dst, dst_stride, src, src_stride, rows, width, t, stream_.get()));
}

void CudaBackend::AttentionRows(const float *q, const model::KvRowRef *rows, const model::KvRowRef *rows_host, int64_t n,
                                int max_keys, int n_head, int n_head_kv, int head_dim, int k_width, int v_width,
                                float *out, const model::AttentionParams &p) {
  Profile prof(this, "AttentionRows");
  if (!err_.ok() || n <= 0) return;
  auto args = AttentionArgs(n_head, n_head_kv, head_dim, k_width, v_width, p);
  if (!Note(args.status())) return;
  AttentionExtArgs a = *args;
  a.rows = rows;
  a.max_keys = max_keys;
  // One launch reads every row's cache in one pair of types: the first row's (the host copies say).
  a.k_type = rows_host[0].k_type;
  a.v_type = v_width > 0 ? rows_host[0].v_type : model::KvType::kF32;
  for (int64_t t = 1; t < n; ++t) {
    if (rows_host[t].k_type != a.k_type || (v_width > 0 && rows_host[t].v_type != a.v_type)) {
      Note(Errorf(MOE_ERR_INVALID_ARGUMENT, "attention rows over KV caches of different types"));
      return;
    }
  }
  auto ws = Grow(attn_ws_, std::max<size_t>(AttentionExtWorkspaceBytes(a, n), 1));
  if (Note(ws.status())) Note(AttentionExt(q, a, n, out, stream_.get(), Workspace{*ws, attn_ws_.size()}));
}

}  // namespace strata::cuda
