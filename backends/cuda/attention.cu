// Causal attention over a contiguous float32 KV cache (GQA, optional sliding window). Decode: one
// block per (token, head), keys spread over warps, each warp an online softmax, merged at the end.
// Prefill: a block takes 16 queries of one head; 32-key K/V tiles staged in shared memory serve all
// 16 (a lane scores one key against 4 queries per pass), with the same online softmax.
#include <cuda_runtime.h>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"

namespace strata::cuda {
namespace {

constexpr int kDecodeWarps = 8;
constexpr int kPrefillWarps = 4;
constexpr int kQueriesPerWarp = 4;
constexpr int kTileQ = kPrefillWarps * kQueriesPerWarp;  // 16 queries per block
constexpr int kTileK = 32;                               // keys per shared-memory tile (one per lane)

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct AttnShape {
  int pos0, n_tok, n_head, group, kv_dim, window;
  float scale;
};

__device__ __forceinline__ int FirstKey(int pos, int window) { return window > 0 ? max(0, pos - window + 1) : 0; }

// DPL = head_dim / 32: the dimensions each lane owns (d = lane + 32 i).
template <int DPL>
__global__ void __launch_bounds__(kDecodeWarps * 32) AttnDecodeKernel(const float *__restrict__ q,
                                                                      const float *__restrict__ kc,
                                                                      const float *__restrict__ vc, AttnShape sh,
                                                                      float *__restrict__ out) {
  dev::AwaitPrior();
  constexpr int HD = 32 * DPL;
  __shared__ float s_m[kDecodeWarps], s_l[kDecodeWarps];
  __shared__ float s_o[kDecodeWarps][HD];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = h / sh.group;
  const int pos = sh.pos0 + static_cast<int>(t);
  const float *qh = q + (t * sh.n_head + h) * HD;
  float qr[DPL], o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    qr[i] = qh[lane + 32 * i];
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = FirstKey(pos, sh.window) + warp; j <= pos; j += kDecodeWarps) {
    const float *kj = kc + static_cast<int64_t>(j) * sh.kv_dim + kvh * HD;
    const float *vj = vc + static_cast<int64_t>(j) * sh.kv_dim + kvh * HD;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) s = fmaf(qr[i], kj[lane + 32 * i], s);
    s = WarpSum(s) * sh.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // exp(-inf) = 0 on the first key
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] = fmaf(p, vj[lane + 32 * i], o[i] * corr);
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) s_o[warp][lane + 32 * i] = o[i];
  __syncthreads();
  // Merge the warps' partial softmaxes; a warp that saw no key has m = -inf and weight 0.
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float wt[kDecodeWarps], total = 0.f;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) {
    wt[w] = s_m[w] == -INFINITY ? 0.f : expf(s_m[w] - mx);
    total += s_l[w] * wt[w];
  }
  float *oh = out + (t * sh.n_head + h) * HD;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) acc = fmaf(s_o[w][d], wt[w], acc);
    oh[d] = acc / total;
  }
}

template <int DPL>
__global__ void __launch_bounds__(kPrefillWarps * 32) AttnPrefillKernel(const float *__restrict__ q,
                                                                        const float *__restrict__ kc,
                                                                        const float *__restrict__ vc, AttnShape sh,
                                                                        float *__restrict__ out) {
  dev::AwaitPrior();
  constexpr int HD = 32 * DPL;
  constexpr int KS = HD + 1;  // padded K rows: lane-indexed rows fall in distinct banks
  extern __shared__ float smem[];
  float *qs = smem;                  // (kTileQ, HD)
  float *ks = qs + kTileQ * HD;      // (kTileK, HD + 1)
  float *vs = ks + kTileK * KS;      // (kTileK, HD)
  const int h = blockIdx.y;
  const int t0 = blockIdx.x * kTileQ;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = h / sh.group;
  for (int idx = threadIdx.x; idx < kTileQ * HD; idx += blockDim.x) {
    const int t = t0 + idx / HD;
    qs[idx] = t < sh.n_tok ? q[(static_cast<int64_t>(t) * sh.n_head + h) * HD + idx % HD] : 0.f;
  }
  const int t_last = min(t0 + kTileQ, sh.n_tok) - 1;
  const int pos_hi = sh.pos0 + t_last;
  const int key_lo = FirstKey(sh.pos0 + t0, sh.window);

  int qpos[kQueriesPerWarp], qfirst[kQueriesPerWarp];
  bool qvalid[kQueriesPerWarp];
  float m[kQueriesPerWarp], l[kQueriesPerWarp], o[kQueriesPerWarp][DPL];
#pragma unroll
  for (int a = 0; a < kQueriesPerWarp; ++a) {
    const int t = t0 + warp * kQueriesPerWarp + a;
    qvalid[a] = t < sh.n_tok;
    qpos[a] = sh.pos0 + t;
    qfirst[a] = FirstKey(qpos[a], sh.window);
    m[a] = -INFINITY;
    l[a] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[a][i] = 0.f;
  }

  for (int kb = key_lo; kb <= pos_hi; kb += kTileK) {
    __syncthreads();  // the previous tile is no longer read
    for (int idx = threadIdx.x; idx < kTileK * HD; idx += blockDim.x) {
      const int kk = idx / HD, d = idx % HD, j = kb + kk;
      const bool ok = j <= pos_hi;
      const int64_t off = static_cast<int64_t>(j) * sh.kv_dim + kvh * HD + d;
      ks[kk * KS + d] = ok ? kc[off] : 0.f;
      vs[kk * HD + d] = ok ? vc[off] : 0.f;
    }
    __syncthreads();
    // Scores: lane = key kb + lane, against the warp's 4 queries.
    float s[kQueriesPerWarp] = {};
    const float *krow = ks + lane * KS;
    const float *qw = qs + warp * kQueriesPerWarp * HD;
#pragma unroll 8
    for (int d = 0; d < HD; ++d) {
      const float kd = krow[d];
#pragma unroll
      for (int a = 0; a < kQueriesPerWarp; ++a) s[a] = fmaf(qw[a * HD + d], kd, s[a]);
    }
    const int j = kb + lane;
    float p[kQueriesPerWarp];
#pragma unroll
    for (int a = 0; a < kQueriesPerWarp; ++a) {
      const bool ok = qvalid[a] && j <= qpos[a] && j >= qfirst[a];
      const float sc = ok ? s[a] * sh.scale : -INFINITY;
      const float m_new = fmaxf(m[a], WarpMax(sc));
      float corr = 1.f;
      p[a] = 0.f;
      if (m_new != -INFINITY) {  // warp-uniform: m_new is the same in every lane
        p[a] = ok ? expf(sc - m_new) : 0.f;
        corr = expf(m[a] - m_new);
      }
      l[a] = l[a] * corr + WarpSum(p[a]);
#pragma unroll
      for (int i = 0; i < DPL; ++i) o[a][i] *= corr;
      m[a] = m_new;
    }
    // o += P · V: key kk's probability comes from lane kk.
#pragma unroll 4
    for (int kk = 0; kk < kTileK; ++kk) {
      float v[DPL];
#pragma unroll
      for (int i = 0; i < DPL; ++i) v[i] = vs[kk * HD + lane + 32 * i];
#pragma unroll
      for (int a = 0; a < kQueriesPerWarp; ++a) {
        const float pk = __shfl_sync(0xffffffffu, p[a], kk);
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[a][i] = fmaf(pk, v[i], o[a][i]);
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kQueriesPerWarp; ++a) {
    if (!qvalid[a]) continue;
    const int t = t0 + warp * kQueriesPerWarp + a;
    float *oh = out + (static_cast<int64_t>(t) * sh.n_head + h) * HD;
#pragma unroll
    for (int i = 0; i < DPL; ++i) oh[lane + 32 * i] = o[a][i] / l[a];
  }
}

absl::Status CheckAttention(const float *q, const DeviceKv &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                            int head_dim, int window, const float *out) {
  if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "attention with %d query heads and %d KV heads", n_head, n_head_kv);
  }
  if (head_dim <= 0 || head_dim % 32 != 0 || head_dim > 256) {
    return Errorf(MOE_ERR_UNSUPPORTED, "attention kernels need head_dim a multiple of 32 up to 256, got %d", head_dim);
  }
  if (n_tok < 0 || pos0 < 0 || window < 0 || pos0 + n_tok > kv.n_ctx || n_tok > 65535 * kTileQ) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "attention for positions %d..%d in a context of %d", pos0, pos0 + n_tok - 1,
                  kv.n_ctx);
  }
  if (n_tok > 0 && (q == nullptr || kv.k == nullptr || kv.v == nullptr || out == nullptr)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "attention pointer is null");
  }
  return absl::OkStatus();
}

AttnShape Shape(int64_t n_tok, int pos0, int n_head, int n_head_kv, int head_dim, int window) {
  return {pos0, static_cast<int>(n_tok), n_head, n_head / n_head_kv, n_head_kv * head_dim, window,
          1.0f / sqrtf(static_cast<float>(head_dim))};
}

#define STRATA_ATTN_DISPATCH_DPL(dpl, ...)                  \
  switch (dpl) {                                            \
    case 1: { constexpr int D = 1; __VA_ARGS__; break; }    \
    case 2: { constexpr int D = 2; __VA_ARGS__; break; }    \
    case 3: { constexpr int D = 3; __VA_ARGS__; break; }    \
    case 4: { constexpr int D = 4; __VA_ARGS__; break; }    \
    case 5: { constexpr int D = 5; __VA_ARGS__; break; }    \
    case 6: { constexpr int D = 6; __VA_ARGS__; break; }    \
    case 7: { constexpr int D = 7; __VA_ARGS__; break; }    \
    default: { constexpr int D = 8; __VA_ARGS__; break; }   \
  }

template <int DPL>
absl::Status LaunchPrefill(const float *q, const DeviceKv &kv, const AttnShape &sh, int n_head, float *out,
                           cudaStream_t stream) {
  constexpr int HD = 32 * DPL;
  const size_t smem = sizeof(float) * (kTileQ * HD + kTileK * (HD + 1) + kTileK * HD);
  // Above 48 KB a block's dynamic shared memory must be allowed explicitly (head_dim > 128).
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(AttnPrefillKernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem)));
  const dim3 grid((sh.n_tok + kTileQ - 1) / kTileQ, n_head);
  Launch(AttnPrefillKernel<DPL>, grid, kPrefillWarps * 32, smem, stream, q, kv.k, kv.v, sh, out);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionDecode(const float *q, const DeviceKv &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                             int head_dim, int window, float *out, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckAttention(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out));
  if (n_tok == 0) return absl::OkStatus();
  const AttnShape sh = Shape(n_tok, pos0, n_head, n_head_kv, head_dim, window);
  const dim3 grid(n_head, static_cast<unsigned>(n_tok));
  STRATA_ATTN_DISPATCH_DPL(head_dim / 32,
                           Launch(AttnDecodeKernel<D>, grid, kDecodeWarps * 32, 0, stream, q, kv.k, kv.v, sh, out));
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status AttentionPrefill(const float *q, const DeviceKv &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                              int head_dim, int window, float *out, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckAttention(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out));
  if (n_tok == 0) return absl::OkStatus();
  const AttnShape sh = Shape(n_tok, pos0, n_head, n_head_kv, head_dim, window);
  switch (head_dim / 32) {
    case 1: return LaunchPrefill<1>(q, kv, sh, n_head, out, stream);
    case 2: return LaunchPrefill<2>(q, kv, sh, n_head, out, stream);
    case 3: return LaunchPrefill<3>(q, kv, sh, n_head, out, stream);
    case 4: return LaunchPrefill<4>(q, kv, sh, n_head, out, stream);
    case 5: return LaunchPrefill<5>(q, kv, sh, n_head, out, stream);
    case 6: return LaunchPrefill<6>(q, kv, sh, n_head, out, stream);
    case 7: return LaunchPrefill<7>(q, kv, sh, n_head, out, stream);
    default: return LaunchPrefill<8>(q, kv, sh, n_head, out, stream);
  }
}

absl::Status Attention(const float *q, const DeviceKv &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                       int head_dim, int window, float *out, cudaStream_t stream) {
  // A prefill block serves 16 queries; with only a few tokens most of its warps would idle.
  if (n_tok <= 4) return AttentionDecode(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, stream);
  return AttentionPrefill(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, stream);
}

}  // namespace strata::cuda
