// Matrix products on the device: dequantize-GEMV (a warp per kGemvRows output rows, lanes decoding
// adjacent weights and dotting them with up to 8 tokens; the row dot lives in gemv.cuh, shared
// with the grouped expert kernels), dequantization and GetRows, and cuBLASLt GEMMs for batches. Per
// (row, token) the GEMV adds in a fixed order whatever the batch size.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "backends/cuda/codecs.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "backends/cuda/gemv.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

using dev::kGemvWarps;

template <class C>
int AlignOf() {
  return C::kAlign;
}

// y (NT, rows) = x (NT, cols) · wᵀ for chunk blockIdx.y of NT tokens (x and y start that many
// chunks further); y rows `rows` apart. Teams of team_warps warps take kGemvRows rows each.
template <class C, int NT, int TR = dev::kGemvRows>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvKernel(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                                              int64_t rows, int64_t cols, const float *__restrict__ x,
                                                              float *__restrict__ y, int team_warps) {
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * TR, t0 = static_cast<int64_t>(blockIdx.y) * NT;
  dev::PrefetchRows(w, row_bytes, r0, TR, rows, tm);
  dev::AwaitPrior();
  dev::GemvRows<C, NT, TR>(w, row_bytes, r0, rows, cols, x + t0 * cols, y + t0 * rows, rows, tm);
}

// h (NT, rows) = silu(gate · x) * (up · x): both matrices of a row read by the same warp; kSwiGluRows
// rows a team.
template <class C, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvSwiGluKernel(const uint8_t *__restrict__ wg,
                                                                    const uint8_t *__restrict__ wu, uint64_t row_bytes,
                                                                    int64_t rows, int64_t cols,
                                                                    const float *__restrict__ x, float *__restrict__ h,
                                                                    int team_warps) {
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * dev::kSwiGluRows;
  dev::PrefetchRows(wg, row_bytes, r0, dev::kSwiGluRows, rows, tm);
  dev::PrefetchRows(wu, row_bytes, r0, dev::kSwiGluRows, rows, tm);
  dev::AwaitPrior();
  dev::SwiGluRows<C, NT>(wg, wu, row_bytes, r0, rows, cols, x, h, tm);
}

// out rows: row ids[i] (or i when ids is null) of w, dequantized; one thread per 32-element item.
template <class C>
__global__ void DequantKernel(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t src_rows, int64_t cols,
                              const int32_t *__restrict__ ids, int64_t n_rows, float *__restrict__ out) {
  dev::AwaitPrior();
  const int64_t n_items = cols / dev::kItemElems;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_rows * n_items) return;
  const int64_t i = idx / n_items, it = idx % n_items;
  float *o = out + i * cols + it * dev::kItemElems;
  const int64_t r = ids != nullptr ? ids[i] : i;
  if (r < 0 || r >= src_rows) {
    const float nan = __int_as_float(0x7fc00000);
    for (int k = 0; k < dev::kItemElems; k += 4) *reinterpret_cast<float4 *>(o + k) = make_float4(nan, nan, nan, nan);
    return;
  }
  const typename C::Item item = C::Prepare(w + r * row_bytes, it);
#pragma unroll
  for (int g = 0; g < dev::kGroupsPerItem; ++g) {
    float v[8];
    C::Group(item, g, v);
    reinterpret_cast<float4 *>(o + 8 * g)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(o + 8 * g)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

bool Aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

absl::Status CheckActivations(const float *p, const char *what) {
  if (p == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s is null", what);
  if (!Aligned(p, 16)) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s is not 16-byte aligned", what);
  return absl::OkStatus();
}

// Block (b, m): the rows of matrix m that block b of GemvKernel would compute.
template <class C, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvManyKernel(const __grid_constant__ ManyArgs a, int64_t cols, const float *__restrict__ x, int64_t x_stride,
                   int64_t t0, int team_warps) {
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const int m = blockIdx.y;
  const int64_t r0 = dev::TeamIndex(team_warps) * dev::kGemvRows;
  const int64_t block_r0 = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) / team_warps * dev::kGemvRows;
  if (block_r0 >= a.rows[m]) return;  // the whole block is past this matrix (block-uniform: no team waits on it)
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  dev::PrefetchRows(a.w[m], a.row_bytes[m], r0, dev::kGemvRows, a.rows[m], tm);
  dev::AwaitPrior();
  dev::GemvRows<C, NT>(a.w[m], a.row_bytes[m], r0, a.rows[m], cols, x + t0 * x_stride, a.y[m] + t0 * a.rows[m],
                       a.rows[m], tm);
}

// Launch shape of a GEMV over `rows` rows, `per_team` rows a team of team_warps warps: blocks of
// kGemvWarps warps, halved (down to one team) while that leaves fewer than two blocks per
// multiprocessor (a 128-row router then spreads over more blocks). What a team computes, and its
// bits, do not depend on it.
struct GemvGrid {
  unsigned blocks, threads;
};
GemvGrid GemvGridFor(int64_t rows, int per_team, int team_warps) {
  const int n_sm = SmCount();
  int warps = kGemvWarps;
  const int64_t teams = (rows + per_team - 1) / per_team;
  auto blocks = [&](int w) { return (teams + w / team_warps - 1) / (w / team_warps); };
  while (warps > team_warps && blocks(warps) < 2 * static_cast<int64_t>(n_sm)) warps /= 2;
  return {static_cast<unsigned>(blocks(warps)), static_cast<unsigned>(warps) * 32};
}

// `chunks` chunks of NT tokens in one launch (grid rows), each computed as a launch of its own.
template <class C, int NT>
void LaunchGemv(const DeviceMatrix &w, const float *x, float *y, cudaStream_t s, unsigned chunks = 1) {
  const int tw = GemvTeamWarps(w.type, w.cols, w.rows);
  // A float matrix too short to give every multiprocessor a team of kGemvRows rows (a router) takes
  // a row a team for 4 or more tokens, whose walk goes one row at a time: its rows then run side by
  // side instead of one after another in each team.
  if constexpr (std::is_same_v<C, dev::F32> && dev::RowsAtOnce<NT>() == 1) {
    if ((w.rows + dev::kGemvRows - 1) / dev::kGemvRows < SmCount()) {
      const GemvGrid g = GemvGridFor(w.rows, 1, tw);
      Launch(GemvKernel<C, NT, 1>, dim3(g.blocks, chunks), g.threads, 0, s, static_cast<const uint8_t *>(w.data),
             w.row_bytes, w.rows, w.cols, x, y, tw);
      return;
    }
  }
  const GemvGrid g = GemvGridFor(w.rows, dev::kGemvRows, tw);
  Launch(GemvKernel<C, NT>, dim3(g.blocks, chunks), g.threads, 0, s, static_cast<const uint8_t *>(w.data),
         w.row_bytes, w.rows, w.cols, x, y, tw);
}

template <class C, int NT>
void LaunchGemvSwiGlu(const DeviceMatrix &g, const DeviceMatrix &u, const float *x, float *h, cudaStream_t s) {
  const int tw = GemvTeamWarps(g.type, g.cols, g.rows);
  const GemvGrid gr = GemvGridFor(g.rows, dev::kSwiGluRows, tw);
  Launch(GemvSwiGluKernel<C, NT>, gr.blocks, gr.threads, 0, s, static_cast<const uint8_t *>(g.data),
         static_cast<const uint8_t *>(u.data), g.row_bytes, g.rows, g.cols, x, h, tw);
}

// Splits n_tok into chunks of 8, 4, 2, 1 tokens; `launch(nt, t0)` queues one chunk.
template <class F>
void ForTokenChunks(int64_t n_tok, F &&launch) {
  int64_t t0 = 0;
  for (int nt : {8, 4, 2, 1}) {
    for (; n_tok - t0 >= nt; t0 += nt) launch(nt, t0);
  }
}

// RAII for cuBLASLt descriptors created per call.
struct LtDeleter {
  void operator()(cublasLtMatmulDescOpaque_t *d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t *d) const { cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t *d) const { cublasLtMatmulPreferenceDestroy(d); }
};
template <class T>
using LtPtr = std::unique_ptr<T, LtDeleter>;

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

int GemvTeamWarps(quant::TypeId type, int64_t cols, int64_t rows) {
  if (rows >= kGemvWholeRows) return 1;
  // A warp covers 32 x 8 elements of a row per step (Q4_K: 4 super-blocks); keep >= 2 steps a lane.
  const int64_t per_step = type == quant::TypeId::kQ4_K ? 1024 : 32 * dev::kGroupElems;
  const int64_t steps = (cols + per_step - 1) / per_step;
  const int64_t split = tunables::Get().cuda_gemv_split;
  const int64_t cap = split > 0 ? split : kGemvWarps;
  int w = 1;
  while (w < cap && 4 * w <= steps) w *= 2;
  return w;
}

bool HasDeviceCodec(quant::TypeId type) { return STRATA_CUDA_DISPATCH_CODEC(type, (void)sizeof(C)); }

absl::Status CheckMatrix(const DeviceMatrix &w) {
  const quant::Codec *codec = quant::FindCodec(w.type);
  int align = 0;
  if (codec == nullptr || !STRATA_CUDA_DISPATCH_CODEC(w.type, align = AlignOf<C>())) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no CUDA kernels for tensor type %s",
                  quant::TypeName(static_cast<uint32_t>(w.type)));
  }
  if (w.rows < 0 || w.cols <= 0 || w.cols % dev::kItemElems != 0 || w.cols % codec->block_elems != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "a %s matrix of %d x %d: columns must be a positive multiple of 32 and of %d",
                  codec->name, w.rows, w.cols, codec->block_elems);
  }
  const uint64_t need = static_cast<uint64_t>(w.cols / codec->block_elems * codec->block_bytes);
  if (w.row_bytes < need) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s rows of %d elements need %u bytes, row_bytes is %u", codec->name,
                  w.cols, need, w.row_bytes);
  }
  if (w.rows > 0 && (w.data == nullptr || !Aligned(w.data, align) || w.row_bytes % align != 0)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s weights must be %d-byte aligned (rows too)", codec->name, align);
  }
  return absl::OkStatus();
}

absl::Status Gemv(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckMatrix(w));
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV over %d tokens", n_tok);
  if (n_tok == 0 || w.rows == 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckActivations(x, "GEMV input"));
  if (y == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV output is null");
  STRATA_CUDA_DISPATCH_CODEC(w.type, {
    // Whole chunks of 8 tokens share a launch (grid rows, up to 65,535 a launch): a 16-session
    // decode step's router takes one launch, not two. The rest as ForTokenChunks splits it.
    int64_t t0 = 0;
    while (n_tok - t0 >= 8) {
      const int64_t chunks = std::min<int64_t>((n_tok - t0) / 8, 65535);
      LaunchGemv<C, 8>(w, x + t0 * w.cols, y + t0 * w.rows, stream, static_cast<unsigned>(chunks));
      t0 += 8 * chunks;
    }
    ForTokenChunks(n_tok - t0, [&](int nt, int64_t t) {
      const float *xt = x + (t0 + t) * w.cols;
      float *yt = y + (t0 + t) * w.rows;
      switch (nt) {  // fewer than 8 tokens are left: 4, 2 or 1
        case 4: LaunchGemv<C, 4>(w, xt, yt, stream); break;
        case 2: LaunchGemv<C, 2>(w, xt, yt, stream); break;
        default: LaunchGemv<C, 1>(w, xt, yt, stream); break;
      }
    });
  });
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GemvSwiGlu(const DeviceMatrix &gate, const DeviceMatrix &up, const float *x, int64_t n_tok, float *h,
                        cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckMatrix(gate));
  STRATA_RETURN_IF_ERROR(CheckMatrix(up));
  if (gate.type != up.type || gate.rows != up.rows || gate.cols != up.cols || gate.row_bytes != up.row_bytes) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "fused SwiGLU needs gate and up of one codec and shape");
  }
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV over %d tokens", n_tok);
  if (n_tok == 0 || gate.rows == 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckActivations(x, "SwiGLU input"));
  if (h == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "SwiGLU output is null");
  STRATA_CUDA_DISPATCH_CODEC(gate.type, ForTokenChunks(n_tok, [&](int nt, int64_t t0) {
    const float *xt = x + t0 * gate.cols;
    float *ht = h + t0 * gate.rows;
    switch (nt) {
      case 8: LaunchGemvSwiGlu<C, 8>(gate, up, xt, ht, stream); break;
      case 4: LaunchGemvSwiGlu<C, 4>(gate, up, xt, ht, stream); break;
      case 2: LaunchGemvSwiGlu<C, 2>(gate, up, xt, ht, stream); break;
      default: LaunchGemvSwiGlu<C, 1>(gate, up, xt, ht, stream); break;
    }
  }));
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GemvMany(const DeviceMatrix *ws, float *const *ys, int n, const float *x, int64_t n_tok,
                      cudaStream_t stream) {
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV over %d tokens", n_tok);
  ManyArgs a;
  int64_t max_rows = 0;
  STRATA_RETURN_IF_ERROR(FillManyArgs("GemvMany", ws, ys, n, &a, &max_rows));
  if (n_tok == 0 || max_rows == 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckActivations(x, "GEMV input"));
  const int64_t cols = ws[0].cols;
  const int tw = GemvTeamWarps(ws[0].type, cols, max_rows);
  const GemvGrid g = GemvGridFor(max_rows, dev::kGemvRows, tw);
  const dim3 grid(g.blocks, static_cast<unsigned>(n));
  const unsigned threads = g.threads;
  STRATA_CUDA_DISPATCH_CODEC(ws[0].type, ForTokenChunks(n_tok, [&](int nt, int64_t t0) {
    auto *kernel = nt == 8 ? GemvManyKernel<C, 8> : nt == 4 ? GemvManyKernel<C, 4> : nt == 2 ? GemvManyKernel<C, 2>
                                                                                           : GemvManyKernel<C, 1>;
    Launch(kernel, grid, threads, 0, stream, a, cols, x, cols, t0, tw);
  }));
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

namespace {

absl::Status LaunchDequant(const DeviceMatrix &w, const int32_t *ids, int64_t n, float *out, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckMatrix(w));
  if (n < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "dequantizing %d rows", n);
  if (n == 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckActivations(out, "dequantize output"));
  const int64_t total = n * (w.cols / dev::kItemElems);
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 0x7fffffff) return Errorf(MOE_ERR_INVALID_ARGUMENT, "dequantizing %d x %d is too large", n, w.cols);
  STRATA_CUDA_DISPATCH_CODEC(w.type,
                             Launch(DequantKernel<C>, static_cast<unsigned>(blocks), threads, 0, stream,
                                    static_cast<const uint8_t *>(w.data), w.row_bytes, w.rows, w.cols, ids, n, out));
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace

absl::Status Dequantize(const DeviceMatrix &w, float *out, cudaStream_t stream) {
  return LaunchDequant(w, nullptr, w.rows, out, stream);
}

absl::Status GetRows(const DeviceMatrix &w, const int32_t *ids, int64_t n, float *out, cudaStream_t stream) {
  if (ids == nullptr && n > 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GetRows ids are null");
  return LaunchDequant(w, ids, n, out, stream);
}

// ---- cuBLASLt ------------------------------------------------------------------------------------

Blas::~Blas() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}
Blas::Blas(Blas &&o) noexcept : handle_(std::exchange(o.handle_, nullptr)), compute_(o.compute_) {}
Blas &Blas::operator=(Blas &&o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
    compute_ = o.compute_;
  }
  return *this;
}

absl::StatusOr<Blas> Blas::Create(Compute compute) {
  Blas b;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtCreate(&b.handle_));
  b.compute_ = compute;
  return b;
}

size_t Blas::MatMulWorkspaceBytes(const DeviceMatrix &w, int64_t n_tok, Path path) {
  if (Choose(n_tok, path) == Path::kGemv) return 0;
  size_t bytes = kLtWorkspaceBytes;
  if (w.type != quant::TypeId::kF32 || w.row_bytes != static_cast<uint64_t>(w.cols) * 4) {
    bytes += RoundUp(static_cast<size_t>(w.rows) * static_cast<size_t>(w.cols) * sizeof(float), 256);
  }
  return bytes;
}

absl::Status Blas::Sgemm(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n_tok, float *y,
                         Workspace ws, cudaStream_t stream) const {
  if (handle_ == nullptr) return Errorf(MOE_ERR_STATE, "cuBLASLt handle not created");
  if (rows <= 0 || cols <= 0 || n_tok <= 0) return absl::OkStatus();
  // Row-major y (n_tok, rows) = x (n_tok, cols) · wᵀ is, column-major, yᵀ (rows, n_tok) =
  // op(A) · xᵀ with A = w seen as a (cols, rows) column-major matrix and op = transpose.
  const cublasComputeType_t ct = compute_ == Compute::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op_raw = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op_raw, ct, CUDA_R_32F));
  LtPtr<cublasLtMatmulDescOpaque_t> op(op_raw);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t a_raw = nullptr, b_raw = nullptr, c_raw = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a_raw, CUDA_R_32F, cols, rows, cols));
  LtPtr<cublasLtMatrixLayoutOpaque_t> a(a_raw);
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b_raw, CUDA_R_32F, cols, n_tok, cols));
  LtPtr<cublasLtMatrixLayoutOpaque_t> b(b_raw);
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&c_raw, CUDA_R_32F, rows, n_tok, rows));
  LtPtr<cublasLtMatrixLayoutOpaque_t> c(c_raw);
  cublasLtMatmulPreference_t pref_raw = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref_raw));
  LtPtr<cublasLtMatmulPreferenceOpaque_t> pref(pref_raw);
  const size_t ws_bytes = ws.data != nullptr ? ws.bytes : 0;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                   &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur = {};
  int found = 0;
  STRATA_CUDA_RETURN_IF_ERROR(
      cublasLtMatmulAlgoGetHeuristic(handle_, op.get(), a.get(), b.get(), c.get(), c.get(), pref.get(), 1, &heur, &found));
  if (found == 0) {
    return Errorf(MOE_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for a %d x %d x %d float GEMM", rows, n_tok, cols);
  }
  const float alpha = 1.0f, beta = 0.0f;
  STRATA_CUDA_RETURN_IF_ERROR(cublasLtMatmul(handle_, op.get(), &alpha, w, a.get(), x, b.get(), &beta, y, c.get(), y,
                                             c.get(), &heur.algo, ws.data, ws_bytes, stream));
  return absl::OkStatus();
}

absl::Status Blas::MatMul(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y, Workspace ws,
                          cudaStream_t stream, Path path) const {
  if (Choose(n_tok, path) == Path::kGemv) return Gemv(w, x, n_tok, y, stream);
  STRATA_RETURN_IF_ERROR(CheckMatrix(w));
  if (n_tok <= 0 || w.rows == 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckActivations(x, "GEMM input"));
  const size_t need = MatMulWorkspaceBytes(w, n_tok, path);
  if (ws.bytes < need || (need > 0 && ws.data == nullptr)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMM workspace of %u bytes, %u needed", ws.bytes, need);
  }
  const float *dense = static_cast<const float *>(w.data);
  Workspace lt = ws;
  if (need > kLtWorkspaceBytes) {  // dequantize into the front of the workspace, GEMM from there
    float *deq = static_cast<float *>(ws.data);
    STRATA_RETURN_IF_ERROR(Dequantize(w, deq, stream));
    dense = deq;
    const size_t used = need - kLtWorkspaceBytes;
    lt = {static_cast<uint8_t *>(ws.data) + used, ws.bytes - used};
  }
  return Sgemm(dense, w.rows, w.cols, x, n_tok, y, lt, stream);
}

}  // namespace strata::cuda
