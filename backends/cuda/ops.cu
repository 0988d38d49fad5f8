// Per-row and element-wise device kernels: RMSNorm, RoPE, softmax + top-k routing, SwiGLU. Each
// forms its results with the CPU backend's float32 operations (transcendentals in double, rounded
// once, as glibc's float functions round); only reduction orders differ.
#include <cuda_runtime.h>

#include <cfloat>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/rows.cuh"

namespace strata::cuda {
namespace {


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

// Sum (or max) over the block; every thread gets the result. `red` holds one value per warp.
template <bool kMax>
__device__ float BlockReduce(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? red[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? WarpMax(r) : WarpSum(r);
}

__global__ void RmsNormKernel(const float *x, const float *weight, int64_t n, float eps, float *y) {
  dev::AwaitPrior();
  __shared__ float red[32];
  dev::NormRow(const_cast<float *>(x) + blockIdx.x * n, nullptr, weight, n, eps, y + blockIdx.x * n, red);
}

// RmsNormKernel after x += add (x written back).
__global__ void AddRmsNormKernel(float *x, const float *add, const float *weight, int64_t n, float eps, float *y) {
  dev::AwaitPrior();
  __shared__ float red[32];
  dev::NormRow(x + blockIdx.x * n, add + blockIdx.x * n, weight, n, eps, y + blockIdx.x * n, red);
}

// One thread per (token, head, pair i < head_dim / 2).
__global__ void RopeKernel(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                           bool neox) {
  dev::AwaitPrior();
  const int half = head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * n_heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // token * n_heads + head
  const int64_t t = th / n_heads;
  // The CPU's float inverse frequency 1 / powf(theta, 2i / d) and float angle pos * inv_freq.
  const float ex = static_cast<float>(2 * i) / static_cast<float>(head_dim);
  const float inv_freq = 1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(ex)));
  const float angle = __fmul_rn(static_cast<float>(pos[t]), inv_freq);
  const float c = static_cast<float>(cos(static_cast<double>(angle)));
  const float s = static_cast<float>(sin(static_cast<double>(angle)));
  float *v = x + th * head_dim;
  const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
  const float x0 = v[i0], x1 = v[i1];
  v[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  v[i1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// One block per token; p (n_expert) in shared memory.
__global__ void SoftmaxTopKKernel(const float *logits, int n_expert, int k, bool renorm, int32_t *sel, float *wts) {
  dev::AwaitPrior();
  extern __shared__ float p[];
  __shared__ float red[32];
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  const float *l = logits + static_cast<int64_t>(blockIdx.x) * n_expert;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = BlockReduce<true>(mx, red);
  float sum = 0.f;
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
    p[i] = static_cast<float>(exp(static_cast<double>(l[i] - mx)));
    sum += p[i];
  }
  sum = BlockReduce<false>(sum, red);
  for (int i = threadIdx.x; i < n_expert; i += blockDim.x) p[i] = p[i] / sum;
  __syncthreads();
  int32_t *s_out = sel + static_cast<int64_t>(blockIdx.x) * k;
  float *w_out = wts + static_cast<int64_t>(blockIdx.x) * k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  // k rounds of argmax: larger probability first, the lower index on ties; a taken expert is
  // marked with -1 (probabilities are >= 0).
  for (int j = 0; j < k; ++j) {
    float bv = -2.f;
    int bi = n_expert;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
      if (p[i] > bv) {  // strided ascending: the first maximum seen has the lowest index
        bv = p[i];
        bi = i;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      best_v[warp] = bv;
      best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = best_v[0];
      int b = best_i[0];
      for (int w = 1; w < n_warps; ++w) {
        if (best_v[w] > v || (best_v[w] == v && best_i[w] < b)) {
          v = best_v[w];
          b = best_i[w];
        }
      }
      s_out[j] = b;
      w_out[j] = v;
      p[b] = -1.f;
    }
    __syncthreads();
  }
  if (renorm && threadIdx.x == 0) {
    float s = 0.f;
    for (int j = 0; j < k; ++j) s += w_out[j];  // in slot order, as the CPU sums
    for (int j = 0; j < k; ++j) w_out[j] = w_out[j] / s;
  }
}

__global__ void SwiGluKernel(const float *g, const float *u, int64_t n, float *h) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = g[i];
  h[i] = (a / (1.0f + static_cast<float>(exp(-static_cast<double>(a))))) * u[i];
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

absl::Status RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y,
                     cudaStream_t stream) {
  if (n_rows < 0 || n <= 0 || n_rows > 0x7fffffff) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "RMSNorm of %d rows of %d", n_rows, n);
  }
  if (n_rows == 0) return absl::OkStatus();
  if (x == nullptr || weight == nullptr || y == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "RMSNorm pointer is null");
  Launch(RmsNormKernel, static_cast<unsigned>(n_rows), dev::RowThreads(n), 0, stream, x, weight, n, eps, y);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status AddRmsNorm(float *x, const float *add, const float *weight, int64_t n_rows, int64_t n, float eps, float *y,
                        cudaStream_t stream) {
  if (n_rows < 0 || n <= 0 || n_rows > 0x7fffffff) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "RMSNorm of %d rows of %d", n_rows, n);
  }
  if (n_rows == 0) return absl::OkStatus();
  if (x == nullptr || add == nullptr || weight == nullptr || y == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "RMSNorm pointer is null");
  }
  Launch(AddRmsNormKernel, static_cast<unsigned>(n_rows), dev::RowThreads(n), 0, stream, x, add, weight, n, eps, y);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                  model::RopeStyle style, cudaStream_t stream) {
  if (n_tok < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "RoPE over %d tokens x %d heads x %d", n_tok, n_heads, head_dim);
  }
  if (n_tok == 0) return absl::OkStatus();
  if (x == nullptr || pos == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "RoPE pointer is null");
  const int64_t n = n_tok * n_heads * (head_dim / 2);
  Launch(RopeKernel, Blocks(n, 256), 256, 0, stream, x, n_tok, n_heads, head_dim, pos, theta,
         style == model::RopeStyle::kNeox);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status SoftmaxTopK(const float *logits, int64_t n_tok, int n_expert, int k, bool renorm, int32_t *sel,
                         float *wts, cudaStream_t stream) {
  if (n_tok < 0 || n_tok > 0x7fffffff || n_expert <= 0 || n_expert > 8192 || k <= 0 || k > n_expert) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing %d tokens to %d of %d experts", n_tok, k, n_expert);
  }
  if (n_tok == 0) return absl::OkStatus();
  if (logits == nullptr || sel == nullptr || wts == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing pointer is null");
  }
  Launch(SoftmaxTopKKernel, static_cast<unsigned>(n_tok), 128, n_expert * sizeof(float), stream, logits, n_expert, k,
         renorm, sel, wts);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status SwiGlu(const float *g, const float *u, int64_t n, float *h, cudaStream_t stream) {
  if (n < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "SwiGLU over %d elements", n);
  if (n == 0) return absl::OkStatus();
  if (g == nullptr || u == nullptr || h == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "SwiGLU pointer is null");
  Launch(SwiGluKernel, Blocks(n, 256), 256, 0, stream, g, u, n, h);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace strata::cuda
