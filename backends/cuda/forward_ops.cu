// Device kernels the forward pass needs beyond the kernel layer's core set: the family options
// (RoPE with a frequency table and YaRN scale, attention with sinks / windows / latent values / a
// set scale, the routing variants, expert biases and gpt-oss's clamped SwiGLU, input-major
// products) and the element-wise glue (residual adds, gathers, weighted slot sums). Each forms
// its results with the CPU backend's float32 operations in the same order where it can
// (transcendentals in double, rounded once, as glibc's float functions round).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kv_rows.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/route.cuh"
#include "backends/cuda/rows.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

using dev::ExpF;

// ---- element-wise ----

__global__ void AddKernel(float *x, const float *y, int64_t n) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void AddBiasKernel(float *x, int64_t n_rows, int64_t n, const float *bias) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_rows * n) x[i] = __fadd_rn(x[i], bias[i % n]);
}

__global__ void SigmoidScaleRowsKernel(float *x, const float *g, int64_t n_rows, int64_t n) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * n) return;
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, ExpF(-g[i / n])));
  x[i] = __fmul_rn(x[i], s);
}

__global__ void GatherRowsKernel(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t r = i / width, c = i % width;
  dst[i] = src[static_cast<int64_t>(idx[r]) * width + c];
}

__global__ void WeightedRowSumKernel(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                                     int64_t width, float *out, const int32_t *sel, int32_t *sel_back) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (sel_back != nullptr && i < n_tok * k) sel_back[i] = sel[i];
  if (i >= n_tok * width) return;
  const int64_t t = i / width, d = i % width;
  float acc = 0.f;
  for (int j = 0; j < k; ++j) {
    acc = __fadd_rn(acc, __fmul_rn(wts[t * k + j], rows[static_cast<int64_t>(idx[t * k + j]) * width + d]));
  }
  out[i] = acc;
}

// h = act(gate, up) per (token, f): gate element (t, f) at g[t * g_row + f * step], up likewise, so
// the same kernel reads separate gate/up outputs (step 1) or interleaved gate/up columns (step 2).
__global__ void GatedActKernel(const float *g, const float *u, int64_t row, int step, int64_t n_tok, int64_t n_ff,
                               float limit, float *h) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tok * n_ff) return;
  const int64_t t = i / n_ff, f = i % n_ff;
  const float a0 = g[t * row + f * step], b0 = u[t * row + f * step];
  if (limit > 0.f) {
    const float a = fminf(a0, limit);
    const float b = fminf(fmaxf(b0, -limit), limit);
    const float sig = __fdiv_rn(a, __fadd_rn(1.0f, ExpF(__fmul_rn(-1.702f, a))));
    h[i] = __fmul_rn(__fadd_rn(b, 1.0f), sig);
  } else {
    const float silu = __fdiv_rn(a0, __fadd_rn(1.0f, ExpF(-a0)));
    h[i] = __fmul_rn(silu, b0);
  }
}

// y (n_tok, cols) = x (n_tok, rows) · w (rows, cols): one thread per output, rows accumulated in
// order as the CPU does.
__global__ void InputMajorKernel(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
                                 float *y) {
  dev::AwaitPrior();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tok * cols) return;
  const int64_t t = i / cols, c = i % cols;
  float acc = 0.f;
  for (int64_t r = 0; r < rows; ++r) acc = __fadd_rn(acc, __fmul_rn(x[t * rows + r], w[r * cols + c]));
  y[i] = acc;
}

// ---- RoPE with a frequency table ----

struct RopeTable {
  float inv_freq[kRopeMaxHalf];
};

// Pair i of a head row at position p: reads in, writes out (which may alias in).
__device__ __forceinline__ void RopePair(const float *in, float *out, int i, int half, int32_t p, const RopeTable &table,
                                         float mscale, bool neox) {
  const float angle = __fmul_rn(static_cast<float>(p), table.inv_freq[i]);
  float c = static_cast<float>(cos(static_cast<double>(angle)));
  float s = static_cast<float>(sin(static_cast<double>(angle)));
  if (mscale != 1.f) {
    c = __fmul_rn(c, mscale);
    s = __fmul_rn(s, mscale);
  }
  const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
  const float x0 = in[i0], x1 = in[i1];
  out[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  out[i1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

__global__ void RopeTableKernel(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos,
                                RopeTable table, float mscale, bool neox) {
  dev::AwaitPrior();
  const int half = head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * n_heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;
  const int64_t t = th / n_heads;
  float *v = x + th * head_dim;
  RopePair(v, v, i, half, pos[t], table, mscale, neox);
}

// Block b < n_tok n_head: query row b (token b / n_head), else key row b - n_tok n_head: the row
// normalised (dev::NormRow, as RmsNormKernel) into shared memory, then rotated back into place.
__global__ void NormRopeKernel(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim,
                               const float *q_weight, const float *k_weight, float eps, const int32_t *pos,
                               RopeTable table, float mscale, bool neox) {
  dev::AwaitPrior();
  extern __shared__ float row[];  // (head_dim)
  __shared__ float red[32];
  const int64_t b = blockIdx.x, nq = n_tok * n_head;
  const bool is_q = b < nq;
  const int64_t r = is_q ? b : b - nq;
  float *x = (is_q ? q : k) + r * head_dim;
  dev::NormRow(x, nullptr, is_q ? q_weight : k_weight, head_dim, eps, row, red);
  __syncthreads();
  const int half = head_dim / 2;
  const int32_t p = pos[r / (is_q ? n_head : n_head_kv)];
  for (int i = threadIdx.x; i < half; i += blockDim.x) RopePair(row, x, i, half, p, table, mscale, neox);
}

// ---- attention with the family options ----

__device__ float BlockReduceSum(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : 0.f;
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}
__device__ float BlockReduceMax(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
  return r;
}

// Values per lane of the attention output: v_dim up to 32 * kAttnMaxVPerLane.
constexpr int kAttnMaxVPerLane = 16;
constexpr int kAttnMaxHeadDim = 1024;  // query floats the split kernel holds
constexpr int kAttnWarps = kThreads / 32;
constexpr int kAttnUnroll = 4;  // keys a warp works on at once
constexpr int kAttnMaxSplits = 6144;  // chunks of the split path

// Where query token t's keys are: the call's block tables at position pos0 + t, or its own KvRowRef.
struct AttnRowView {
  const float *const *kb;
  const float *const *vb;
  const uint8_t *masked;
  int pos, window;
};
__device__ AttnRowView RowOf(const AttentionExtArgs &a, int64_t t) {
  if (a.rows != nullptr) {
    const model::KvRowRef r = a.rows[t];
    return AttnRowView{r.k_blocks, r.v_blocks, r.masked, r.pos, r.window};
  }
  return AttnRowView{a.k_blocks, a.v_blocks, a.masked, a.pos0 + static_cast<int>(t), a.window};
}

// Typed rows (AttentionExtArgs::k_type / v_type not all f32): a key or value row as its start and
// the first column the head reads, each value decoded by dev::KvLoad as it is loaded. The f32
// kernels (kTyped false) keep their float pointers and their bits.
struct TypedRow {
  const uint8_t *row;
  int col0;
};
__device__ __forceinline__ TypedRow KeyRowOf(const AttentionExtArgs &a, const AttnRowView &rv, int row, int kvh) {
  const uint8_t *blk = reinterpret_cast<const uint8_t *>(rv.kb[row / a.block_tokens]);
  return TypedRow{blk + (row % a.block_tokens) * dev::KvRowBytesDev(a.k_type, static_cast<int>(a.k_stride)),
                  kvh * a.head_dim};
}
__device__ __forceinline__ TypedRow ValueRowOf(const AttentionExtArgs &a, const AttnRowView &rv, int row, int kvh) {
  if (a.latent) return TypedRow{KeyRowOf(a, rv, row, 0).row, 0};
  const uint8_t *blk = reinterpret_cast<const uint8_t *>(rv.vb[row / a.block_tokens]);
  return TypedRow{blk + (row % a.block_tokens) * dev::KvRowBytesDev(a.v_type, static_cast<int>(a.v_stride)),
                  kvh * a.head_dim};
}
__device__ __forceinline__ model::KvType ValueType(const AttentionExtArgs &a) { return a.latent ? a.k_type : a.v_type; }

// One block per (token, head): the query in shared memory; scores with a warp per key (lanes split
// the head dimension, coalesced, combined by shuffles); softmax with the optional sink logit; then
// each warp sums its share of the keys (every kAttnWarps-th), lanes owning output elements, and the
// warps' partial outputs are added in warp order.
template <bool kTyped>
__global__ void __launch_bounds__(kThreads) AttentionExtKernel(const float *q, AttentionExtArgs a, float *out) {
  dev::AwaitPrior();
  extern __shared__ float sm[];
  __shared__ float red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x / a.n_head;
  const int h = static_cast<int>(blockIdx.x % a.n_head);
  const int kvh = h / (a.n_head / a.n_head_kv);
  const AttnRowView rv = RowOf(a, t);
  const int pos = rv.pos;
  const int first = rv.window > 0 ? max(0, pos - rv.window + 1) : 0;
  const int n = pos + 1 - first;
  float *qs = sm;                    // (head_dim)
  float *part = sm + a.head_dim;     // (kAttnWarps, v_dim) partial outputs
  float *sc = part + kAttnWarps * a.v_dim;  // (n)
  const float *qh = q + (t * a.n_head + h) * a.head_dim;
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) qs[d] = qh[d];
  __syncthreads();
  // Scores, kAttnUnroll keys per warp at a time so their loads are in flight together.
  float mx = -INFINITY;
  for (int j0 = warp * kAttnUnroll; j0 < n; j0 += kAttnWarps * kAttnUnroll) {
    float dot[kAttnUnroll];
    const float *kj[kAttnUnroll];
    TypedRow kt[kAttnUnroll];
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const int row = first + min(j0 + u, n - 1);
      if constexpr (kTyped) {
        kt[u] = KeyRowOf(a, rv, row, kvh);
      } else {
        kj[u] = rv.kb[row / a.block_tokens] + static_cast<int64_t>(row % a.block_tokens) * a.k_stride +
                static_cast<int64_t>(kvh) * a.head_dim;
      }
      dot[u] = 0.f;
    }
    for (int d = lane; d < a.head_dim; d += 32) {
      const float qd = qs[d];
#pragma unroll
      for (int u = 0; u < kAttnUnroll; ++u) {
        if constexpr (kTyped) {
          dot[u] = fmaf(qd, dev::KvLoad(a.k_type, kt[u].row, kt[u].col0 + d), dot[u]);
        } else {
          dot[u] = fmaf(qd, kj[u][d], dot[u]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
      const int j = j0 + u, row = first + j;
      if (j >= n) break;
      // A masked position takes no part: its weight becomes exp(-inf) = 0.
      const bool masked = row != pos && rv.masked != nullptr && rv.masked[row] != 0;
      const float sv = masked ? -INFINITY : __fmul_rn(dot[u], a.scale);
      if (lane == 0) sc[j] = sv;
      mx = fmaxf(mx, sv);
    }
  }
  mx = BlockReduceMax(mx, red);
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  mx = fmaxf(mx, sink);
  __syncthreads();  // every score written
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = ExpF(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = BlockReduceSum(sum, red);
  if (a.sinks != nullptr) sum += ExpF(sink - mx);
  const float inv = 1.0f / sum;
  __syncthreads();
  float acc[kAttnMaxVPerLane];
#pragma unroll
  for (int m = 0; m < kAttnMaxVPerLane; ++m) acc[m] = 0.f;
  for (int j0 = warp * kAttnUnroll; j0 < n; j0 += kAttnWarps * kAttnUnroll) {
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const int j = j0 + u;
      if (j >= n) break;
      const int row = first + j;
      const float p = __fmul_rn(sc[j], inv);
      if constexpr (kTyped) {
        const TypedRow vt = ValueRowOf(a, rv, row, kvh);
        const model::KvType vtype = ValueType(a);
#pragma unroll
        for (int m = 0; m < kAttnMaxVPerLane; ++m) {
          const int d = lane + 32 * m;
          if (d < a.v_dim) acc[m] = fmaf(p, dev::KvLoad(vtype, vt.row, vt.col0 + d), acc[m]);
        }
      } else {
        const int64_t in_block = row % a.block_tokens;
        const float *vj = a.latent ? rv.kb[row / a.block_tokens] + in_block * a.k_stride
                                   : rv.vb[row / a.block_tokens] + in_block * a.v_stride +
                                         static_cast<int64_t>(kvh) * a.head_dim;
#pragma unroll
        for (int m = 0; m < kAttnMaxVPerLane; ++m) {
          const int d = lane + 32 * m;
          if (d < a.v_dim) acc[m] = fmaf(p, vj[d], acc[m]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kAttnMaxVPerLane; ++m) {
    const int d = lane + 32 * m;
    if (d < a.v_dim) part[warp * a.v_dim + d] = acc[m];
  }
  __syncthreads();
  float *o = out + (t * a.n_head + h) * a.v_dim;
  for (int d = threadIdx.x; d < a.v_dim; d += blockDim.x) {
    float r = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) r += part[w * a.v_dim + d];
    o[d] = r;
  }
}

// Split attention, phase 1: block (token x KV head x run of GB heads of its group, chunk s) over keys
// [s kAttnChunk, (s + 1) kAttnChunk) of the visible range; for each of its heads the max score m,
// l = sum of exp(score - m) and the unnormalised output sum of exp(score - m) v, into
// part[(th * n_split + s) * (v_dim + 2)] as (m, l, out...) (th = token x head). A chunk past the
// visible range, or wholly masked, writes m = -inf, l = 0. With one chunk and no sink logit
// (`direct`), the block writes the outputs itself, the same bits the combine would.
//
// The block's heads share their keys and values: each key and value is read once for all of them.
// Each head's numbers are formed in the same order whatever GB is (and as with one head a block):
// a key's dot over d in order, the chunk's sum as a 256-thread block sum would add it, each warp's
// keys' values in key order, the warps' parts in warp order.
//
// Decode attention is a chain of dependent memory round trips, so each stage issues all of its loads
// before using any: a warp's keys' block tables, mask bytes and key rows together, then its values.
//
// Typed rows with head_dim and v_dim multiples of 4 (`vec`) are read 4 adjacent values a lane
// (dev::KvLoad4: f16 8 bytes at once, q8_0 a block's scale once a 4 values rather than a value):
// lane l takes key columns 4 l + 128 i and value columns 32 m0 + 4 l + i, the same set of columns
// the f32 kernel's lane + 32 m gives each warp, summed in another order.
template <int GB, bool kTyped>
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(const float *q, AttentionExtArgs a, int n_split,
                                                                 float *part, float *out, bool direct) {
  dev::AwaitPrior();
  extern __shared__ float sm[];  // (GB, head_dim) queries, (GB, kAttnChunk) scores, (GB, kAttnWarps, v_dim) parts
  __shared__ float red[GB][kAttnWarps];
  __shared__ float s_sum[GB], s_max[GB];
  float *qs = sm, *sc = qs + GB * a.head_dim, *parts = sc + GB * kAttnChunk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = a.n_head / a.n_head_kv, runs = (group + GB - 1) / GB;
  const int64_t t = blockIdx.x / (a.n_head_kv * runs);
  const int kr = static_cast<int>(blockIdx.x % (a.n_head_kv * runs));
  const int kvh = kr / runs;
  const int h0 = kvh * group + (kr % runs) * GB, nh = min(GB, kvh * group + group - h0);
  const AttnRowView rv = RowOf(a, t);
  const int pos = rv.pos;
  const int first = rv.window > 0 ? max(0, pos - rv.window + 1) : 0;
  const int n = pos + 1 - first;
  const int j0 = static_cast<int>(blockIdx.y) * kAttnChunk, j1 = min(n, j0 + kAttnChunk);
  auto dst_of = [&](int h) { return part + ((t * a.n_head + h0 + h) * n_split + blockIdx.y) * (a.v_dim + 2); };
  if (j0 >= n) {
    if (threadIdx.x < nh) {
      float *dst = dst_of(threadIdx.x);
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    return;
  }
  // Warp w takes keys j0 + w + kAttnWarps u, u < kKeysPerWarp (past the chunk: the last key read
  // again, unused).
  constexpr int kKeysPerWarp = kAttnChunk / kAttnWarps;
  const float *kj[kKeysPerWarp], *vj[kKeysPerWarp];
  TypedRow kt[kKeysPerWarp], vt[kKeysPerWarp];
  bool masked[kKeysPerWarp];
#pragma unroll
  for (int u = 0; u < kKeysPerWarp; ++u) {
    const int row = first + min(j0 + warp + kAttnWarps * u, j1 - 1);
    if constexpr (kTyped) {
      kt[u] = KeyRowOf(a, rv, row, kvh);
      vt[u] = ValueRowOf(a, rv, row, kvh);
    } else {
      const int64_t blk = row / a.block_tokens, in_block = row % a.block_tokens;
      kj[u] = rv.kb[blk] + in_block * a.k_stride + static_cast<int64_t>(kvh) * a.head_dim;
      vj[u] = a.latent ? rv.kb[blk] + in_block * a.k_stride
                       : rv.vb[blk] + in_block * a.v_stride + static_cast<int64_t>(kvh) * a.head_dim;
    }
    masked[u] = row != pos && rv.masked != nullptr && rv.masked[row] != 0;
  }
  // The run's queries (a head past the group repeats the last one, unused).
  for (int i = threadIdx.x; i < GB * a.head_dim; i += blockDim.x) {
    const int h = min(i / a.head_dim, nh - 1);
    qs[i] = q[(t * a.n_head + h0 + h) * a.head_dim + i % a.head_dim];
  }
  __syncthreads();
  float dot[GB][kKeysPerWarp];
#pragma unroll
  for (int h = 0; h < GB; ++h) {
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) dot[h][u] = 0.f;
  }
  const bool vec = kTyped && a.head_dim % 4 == 0 && a.v_dim % 4 == 0;
  if (vec) {
    for (int d = 4 * lane; d < a.head_dim; d += 128) {
      float4 kd[kKeysPerWarp];
#pragma unroll
      for (int u = 0; u < kKeysPerWarp; ++u) kd[u] = dev::KvLoad4(a.k_type, kt[u].row, kt[u].col0 + d);
#pragma unroll
      for (int h = 0; h < GB; ++h) {
        const float4 qd = *reinterpret_cast<const float4 *>(qs + h * a.head_dim + d);
#pragma unroll
        for (int u = 0; u < kKeysPerWarp; ++u) {
          dot[h][u] = fmaf(qd.x, kd[u].x, dot[h][u]);
          dot[h][u] = fmaf(qd.y, kd[u].y, dot[h][u]);
          dot[h][u] = fmaf(qd.z, kd[u].z, dot[h][u]);
          dot[h][u] = fmaf(qd.w, kd[u].w, dot[h][u]);
        }
      }
    }
  }
#pragma unroll(GB >= 4 ? 1 : 4)
  for (int d = vec ? a.head_dim : lane; d < a.head_dim; d += 32) {
    float kd[kKeysPerWarp];
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) {
      if constexpr (kTyped) {
        kd[u] = dev::KvLoad(a.k_type, kt[u].row, kt[u].col0 + d);
      } else {
        kd[u] = kj[u][d];
      }
    }
#pragma unroll
    for (int h = 0; h < GB; ++h) {
      const float qd = qs[h * a.head_dim + d];
#pragma unroll
      for (int u = 0; u < kKeysPerWarp; ++u) dot[h][u] = fmaf(qd, kd[u], dot[h][u]);
    }
  }
#pragma unroll
  for (int h = 0; h < GB; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) {
      const int j = j0 + warp + kAttnWarps * u;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot[h][u] += __shfl_xor_sync(0xffffffffu, dot[h][u], o);
      if (j >= j1) continue;
      const float sv = masked[u] ? -INFINITY : __fmul_rn(dot[h][u], a.scale);
      if (lane == 0) sc[h * kAttnChunk + j - j0] = sv;
      mx = fmaxf(mx, sv);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[h][warp] = mx;
  }
  __syncthreads();
  // Warp h forms head h's weights and their sum: key j's weight in lane j % 32 of half j / 32,
  // each half summed across the warp by shuffles and the halves added, as a block sum of the
  // chunk's keys, one a thread, adds them.
  static_assert(kAttnChunk == 64 && GB <= kAttnWarps, "one warp a head, two halves of the chunk");
  if (warp < GB) {
    const int h = warp, cnt = j1 - j0;
    float mx = red[h][0];
#pragma unroll
    for (int w = 1; w < kAttnWarps; ++w) mx = fmaxf(mx, red[h][w]);
    float e[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = lane + 32 * half;
      e[half] = 0.f;
      if (j < cnt) {
        e[half] = mx == -INFINITY ? 0.f : ExpF(sc[h * kAttnChunk + j] - mx);
        sc[h * kAttnChunk + j] = e[half];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) e[half] += __shfl_xor_sync(0xffffffffu, e[half], o);
    }
    if (lane == 0) {
      s_sum[h] = e[0] + e[1];
      s_max[h] = mx;
    }
  }
  __syncthreads();
  // The warp's values, kVChunk output elements a lane of all its keys loaded at once, then added in
  // key order for each head.
  constexpr int kVChunk = 4;
  int pidx[kKeysPerWarp];
#pragma unroll
  for (int u = 0; u < kKeysPerWarp; ++u) pidx[u] = min(j0 + warp + kAttnWarps * u, j1 - 1) - j0;
  const int n_mine = j1 - j0 > warp ? (j1 - j0 - warp + kAttnWarps - 1) / kAttnWarps : 0;  // the warp's keys
  // Column of element i of chunk m0 (see vec above).
  auto col_of = [&](int m0, int i) { return vec ? 32 * m0 + 4 * lane + i : lane + 32 * (m0 + i); };
  for (int m0 = 0; m0 < kAttnMaxVPerLane && col_of(m0, 0) < a.v_dim; m0 += kVChunk) {
    float v[kVChunk][kKeysPerWarp];
    if (vec) {
      static_assert(kVChunk == 4, "a lane's 4 adjacent values");
#pragma unroll
      for (int u = 0; u < kKeysPerWarp; ++u) {
        const float4 w = dev::KvLoad4(ValueType(a), vt[u].row, vt[u].col0 + col_of(m0, 0));
        v[0][u] = w.x;
        v[1][u] = w.y;
        v[2][u] = w.z;
        v[3][u] = w.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVChunk; ++i) {
        const int d = lane + 32 * (m0 + i);
#pragma unroll
        for (int u = 0; u < kKeysPerWarp; ++u) {
          if constexpr (kTyped) {
            v[i][u] = d < a.v_dim ? dev::KvLoad(ValueType(a), vt[u].row, vt[u].col0 + d) : 0.f;
          } else {
            v[i][u] = d < a.v_dim ? vj[u][d] : 0.f;
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < GB; ++h) {
#pragma unroll
      for (int i = 0; i < kVChunk; ++i) {
        const int d = col_of(m0, i);
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < kKeysPerWarp; ++u) {
          if (u < n_mine) acc = fmaf(sc[h * kAttnChunk + pidx[u]], v[i][u], acc);
        }
        if (d < a.v_dim) parts[(h * kAttnWarps + warp) * a.v_dim + d] = acc;
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * a.v_dim; i += blockDim.x) {
    const int h = i / a.v_dim, d = i % a.v_dim;
    float r = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) r += parts[(h * kAttnWarps + w) * a.v_dim + d];
    if (direct) {  // one chunk: the combine's arithmetic with a single term (exp(0) = 1)
      const float inv = 1.0f / s_sum[h];
      out[(t * a.n_head + h0 + h) * a.v_dim + d] = r * inv;
    } else {
      float *dst = dst_of(h);
      if (d == 0) {
        dst[0] = s_max[h];
        dst[1] = s_sum[h];
      }
      dst[2 + d] = r;
    }
  }
}

// Split attention, phase 2: one block per (token, head) combines its chunks in order with the
// optional sink logit: out = sum_s exp(m_s - M) out_s / (sum_s exp(m_s - M) l_s + exp(sink - M)).
// The chunks' (m, l) are read by one thread each and their weights kept in shared memory, so each
// output element's loads over the chunks are independent and in flight together.
__global__ void AttentionCombineKernel(const float *part, AttentionExtArgs a, int n_split, float *out) {
  dev::AwaitPrior();
  extern __shared__ float cw[];  // (n_split) exp(m_s - M), then (n_split) m_s
  __shared__ float red[32];
  __shared__ float s_inv;
  float *cm = cw + n_split;
  const int64_t th = blockIdx.x;
  const int h = static_cast<int>(th % a.n_head);
  const int64_t stride = a.v_dim + 2;
  const float *src = part + th * n_split * stride;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
    cm[s] = src[s * stride];
    mx = fmaxf(mx, cm[s]);
  }
  mx = BlockReduceMax(mx, red);
  if (a.sinks != nullptr) mx = fmaxf(mx, a.sinks[h]);
  for (int s = threadIdx.x; s < n_split; s += blockDim.x) cw[s] = cm[s] == -INFINITY ? 0.f : ExpF(cm[s] - mx);
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = a.sinks != nullptr ? ExpF(a.sinks[h] - mx) : 0.f;
    for (int s = 0; s < n_split; ++s) {
      if (cm[s] != -INFINITY) l += cw[s] * src[s * stride + 1];
    }
    s_inv = 1.0f / l;
  }
  __syncthreads();
  const float inv = s_inv;
  float *o = out + th * a.v_dim;
  for (int d = threadIdx.x; d < a.v_dim; d += blockDim.x) {
    float r = 0.f;
#pragma unroll 8
    for (int s = 0; s < n_split; ++s) {
      const float x = src[s * stride + 2 + d];
      if (cm[s] != -INFINITY) r = fmaf(cw[s], x, r);
    }
    o[d] = r * inv;
  }
}

// ---- routing ----

constexpr int kRouteWarps = 4;

// One warp per token (dev::RouteWarpToken).
__global__ void __launch_bounds__(kRouteWarps * 32) RouteKernel(RouteArgs p, const float *logits, int64_t n_tok,
                                                                int32_t *sel, float *wts) {
  dev::AwaitPrior();
  __shared__ float s_pr[kRouteWarps][kRouteMaxExperts], s_choice[kRouteWarps][kRouteMaxExperts];
  __shared__ int32_t s_sel[kRouteWarps][kRouteMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= n_tok) return;
  dev::RouteWarpToken(p, logits, t, sel, wts, s_pr[warp], s_choice[warp], s_sel[warp], lane);
}

// One thread: the device's clock once the stream's earlier kernels are done.
__global__ void StampKernel(unsigned long long *at) {
  dev::AwaitPrior();
  if (threadIdx.x == 0) *at = dev::GlobalTimerNs();
}

}  // namespace

absl::Status Stamp(unsigned long long *at, cudaStream_t stream) {
  if (at == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "stamp pointer is null");
  Launch(StampKernel, 1, 32, 0, stream, at);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status Add(float *x, const float *y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  Launch(AddKernel, Blocks(n), kThreads, 0, stream, x, y, n);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status AddBias(float *x, int64_t n_rows, int64_t n, const float *bias, cudaStream_t stream) {
  if (n_rows * n <= 0) return absl::OkStatus();
  Launch(AddBiasKernel, Blocks(n_rows * n), kThreads, 0, stream, x, n_rows, n, bias);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n, cudaStream_t stream) {
  if (n_rows * n <= 0) return absl::OkStatus();
  Launch(SigmoidScaleRowsKernel, Blocks(n_rows * n), kThreads, 0, stream, x, g, n_rows, n);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst,
                        cudaStream_t stream) {
  if (n * width <= 0) return absl::OkStatus();
  Launch(GatherRowsKernel, Blocks(n * width), kThreads, 0, stream, src, width, idx, n, dst);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                            int64_t width, float *out, cudaStream_t stream, const int32_t *sel,
                            int32_t *sel_back) {
  if (n_tok * width <= 0) return absl::OkStatus();
  if (sel_back != nullptr && sel == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "selections to send back are null");
  Launch(WeightedRowSumKernel, Blocks(std::max<int64_t>(n_tok * width, sel_back != nullptr ? n_tok * k : 0)), kThreads,
         0, stream, rows, idx, wts, n_tok, k, width, out, sel, sel_back);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GatedAct(const float *g, const float *u, int64_t row, int step, int64_t n_tok, int64_t n_ff,
                      float limit, float *h, cudaStream_t stream) {
  if (n_tok * n_ff <= 0) return absl::OkStatus();
  Launch(GatedActKernel, Blocks(n_tok * n_ff), kThreads, 0, stream, g, u, row, step, n_tok, n_ff, limit, h);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status MatMulInputMajorF32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n_tok, float *y,
                                 cudaStream_t stream) {
  if (n_tok * cols <= 0) return absl::OkStatus();
  Launch(InputMajorKernel, Blocks(n_tok * cols), kThreads, 0, stream, w, rows, cols, x, n_tok, y);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status RopeWithTable(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos,
                           const float *inv_freq, float mscale, model::RopeStyle style, cudaStream_t stream) {
  const int half = head_dim / 2;
  if (head_dim % 2 != 0 || half > kRopeMaxHalf) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "RoPE over head_dim %d (even, at most %d)", head_dim, 2 * kRopeMaxHalf);
  }
  const int64_t n = n_tok * n_heads * half;
  if (n <= 0) return absl::OkStatus();
  RopeTable table;
  std::copy(inv_freq, inv_freq + half, table.inv_freq);
  Launch(RopeTableKernel, Blocks(n), kThreads, 0, stream, x, n_tok, n_heads, head_dim, pos, table, mscale,
         style == model::RopeStyle::kNeox);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status NormRope(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim,
                      const float *q_weight, const float *k_weight, float eps, const int32_t *pos, const float *inv_freq,
                      float mscale, model::RopeStyle style, cudaStream_t stream) {
  const int half = head_dim / 2;
  if (head_dim <= 0 || head_dim % 2 != 0 || half > kRopeMaxHalf || n_head <= 0 || n_head_kv <= 0 || n_tok < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "q/k norm and RoPE over %d tokens, %d + %d heads of %d", n_tok, n_head,
                  n_head_kv, head_dim);
  }
  const int64_t blocks = n_tok * (n_head + n_head_kv);
  if (blocks == 0) return absl::OkStatus();
  RopeTable table;
  std::copy(inv_freq, inv_freq + half, table.inv_freq);
  Launch(NormRopeKernel, static_cast<unsigned>(blocks), dev::RowThreads(head_dim), head_dim * sizeof(float), stream, q,
         k, n_tok, n_head, n_head_kv, head_dim, q_weight, k_weight, eps, pos, table, mscale,
         style == model::RopeStyle::kNeox);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

namespace {

// Chunks of the split path for this call, or 0 for one pass: worth it when the (token, head) blocks
// are too few to fill the device and the keys span several chunks.
int AttentionSplits(const AttentionExtArgs &a, int64_t n_tok) {
  if (n_tok <= 0 || a.head_dim > kAttnMaxHeadDim || a.v_dim > 32 * kAttnMaxVPerLane) return 0;
  if (FlashAttentionApplies(a, n_tok)) return 0;
  if (a.rows != nullptr) return std::max(1, (a.max_keys + kAttnChunk - 1) / kAttnChunk);
  if (n_tok * a.n_head >= 256) return 0;
  const int last = a.pos0 + static_cast<int>(n_tok) - 1;
  const int n_keys = a.window > 0 ? std::min(a.window, last + 1) : last + 1;
  const int n = (n_keys + kAttnChunk - 1) / kAttnChunk;
  return n > 1 ? n : 0;
}

// Shared memory of a split block serving gb heads: their queries, scores and per-warp parts.
size_t SplitSmemBytes(const AttentionExtArgs &a, int gb) {
  return static_cast<size_t>(gb) * (a.head_dim + kAttnChunk + kAttnWarps * a.v_dim) * sizeof(float);
}

// Heads of a GQA group a split block serves (8, 4, 2 or 1): as many as the group has, within the
// 48 KiB a block gets without opting in (head_dim 128: 8; MLA's 576 / 512: 2).
int SplitHeads(const AttentionExtArgs &a) {
  const int group = a.n_head / a.n_head_kv;
  for (int gb : {8, 4, 2}) {
    if (gb <= group && SplitSmemBytes(a, gb) <= 48 * 1024) return gb;
  }
  return 1;
}

template <bool kTyped>
void LaunchSplit(int gb, dim3 grid, size_t smem, cudaStream_t stream, const float *q, const AttentionExtArgs &a,
                 int n_split, float *part, float *out, bool direct) {
  switch (gb) {
    case 8:
      Launch(AttentionSplitKernel<8, kTyped>, grid, kThreads, smem, stream, q, a, n_split, part, out, direct);
      break;
    case 4:
      Launch(AttentionSplitKernel<4, kTyped>, grid, kThreads, smem, stream, q, a, n_split, part, out, direct);
      break;
    case 2:
      Launch(AttentionSplitKernel<2, kTyped>, grid, kThreads, smem, stream, q, a, n_split, part, out, direct);
      break;
    default:
      Launch(AttentionSplitKernel<1, kTyped>, grid, kThreads, smem, stream, q, a, n_split, part, out, direct);
  }
}

// Whether a call takes the flash decode kernel: where the split path would serve it.
bool TakesFlashDecode(const AttentionExtArgs &a, int64_t n_tok) {
  if (FlashAttentionApplies(a, n_tok) || !FlashDecodeApplies(a, n_tok)) return false;
  return a.rows != nullptr || n_tok * a.n_head < 256;
}

}  // namespace

size_t AttentionExtWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok) {
  if (FlashAttentionApplies(a, n_tok)) return FlashAttentionWorkspaceBytes(a, n_tok);
  if (TakesFlashDecode(a, n_tok)) return FlashDecodeSplits(a, n_tok) > 1 ? FlashDecodeWorkspaceBytes(a, n_tok) : 0;
  const int n = AttentionSplits(a, n_tok);
  return n == 0 ? 0 : static_cast<size_t>(n_tok) * a.n_head * n * (a.v_dim + 2) * sizeof(float);
}

absl::Status AttentionExt(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, cudaStream_t stream,
                          Workspace ws) {
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.head_dim <= 0 || a.v_dim <= 0 ||
      a.block_tokens <= 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "attention over %d heads, %d KV heads, head_dim %d", a.n_head,
                  a.n_head_kv, a.head_dim);
  }
  if (n_tok <= 0) return absl::OkStatus();
  if (FlashAttentionApplies(a, n_tok)) return FlashAttention(q, a, n_tok, out, stream, ws);
  // Decode: the staged kernel, given its workspace when it splits (without it, a call of one
  // sequence runs in one pass below).
  if (TakesFlashDecode(a, n_tok) &&
      (a.rows != nullptr || FlashDecodeSplits(a, n_tok) == 1 || ws.bytes >= FlashDecodeWorkspaceBytes(a, n_tok))) {
    return FlashDecode(q, a, n_tok, out, stream, ws);
  }
  const bool typed = KvRowsTyped(a);
  const int n_split = AttentionSplits(a, n_tok);
  if (n_split > kAttnMaxSplits) {  // the combine keeps two floats a chunk in 48 KiB of shared memory
    return Errorf(MOE_ERR_UNSUPPORTED, "attention over %d keys (at most %d)", n_split * kAttnChunk,
                  kAttnMaxSplits * kAttnChunk);
  }
  if (a.rows != nullptr && (n_split == 0 || a.max_keys <= 0 || ws.data == nullptr ||
                            ws.bytes < AttentionExtWorkspaceBytes(a, n_tok))) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "attention over rows needs max_keys > 0, head_dim <= %d, v_dim <= %d and the split workspace",
                  kAttnMaxHeadDim, 32 * kAttnMaxVPerLane);
  }
  if (n_split > 0 && ws.data != nullptr && ws.bytes >= AttentionExtWorkspaceBytes(a, n_tok)) {
    float *part = static_cast<float *>(ws.data);
    const int gb = SplitHeads(a);
    const int runs = (a.n_head / a.n_head_kv + gb - 1) / gb;
    const dim3 grid(static_cast<unsigned>(n_tok * a.n_head_kv * runs), static_cast<unsigned>(n_split));
    const bool direct = n_split == 1 && a.sinks == nullptr;
    const size_t smem = SplitSmemBytes(a, gb);
    if (typed) {
      LaunchSplit<true>(gb, grid, smem, stream, q, a, n_split, part, out, direct);
    } else {
      LaunchSplit<false>(gb, grid, smem, stream, q, a, n_split, part, out, direct);
    }
    if (!direct) {
      Launch(AttentionCombineKernel, static_cast<unsigned>(n_tok * a.n_head), 128, 2 * n_split * sizeof(float), stream,
             part, a, n_split, out);
    }
    STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  }
  const int last = a.pos0 + static_cast<int>(n_tok) - 1;
  const int n_keys = a.window > 0 ? std::min(a.window, last + 1) : last + 1;
  if (a.v_dim > 32 * kAttnMaxVPerLane) {
    return Errorf(MOE_ERR_UNSUPPORTED, "attention values of %d floats (at most %d)", a.v_dim, 32 * kAttnMaxVPerLane);
  }
  const size_t smem =
      (static_cast<size_t>(n_keys) + a.head_dim + static_cast<size_t>(kAttnWarps) * a.v_dim) * sizeof(float);
  // The device's opt-in shared memory limit, read once (the kernels run on one device per process).
  static int max_smem = [] {
    int dev = 0, v = 48 * 1024;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 48 * 1024;
    }
    return v;
  }();
  if (smem + 32 * sizeof(float) > static_cast<size_t>(max_smem)) {
    return Errorf(MOE_ERR_UNSUPPORTED, "attention over %d keys exceeds the %d bytes of shared memory", n_keys,
                  max_smem);
  }
  auto *kernel = typed ? AttentionExtKernel<true> : AttentionExtKernel<false>;
  if (smem > 48 * 1024) {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  Launch(kernel, static_cast<unsigned>(n_tok * a.n_head), kThreads, smem, stream, q, a, out);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status AttentionCombine(const float *part, const AttentionExtArgs &a, int64_t n_tok, int n_split, float *out,
                              cudaStream_t stream) {
  if (n_split <= 0 || n_split > kAttnMaxSplits || n_tok < 0 || part == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "combining %d attention parts (at most %d)", n_split, kAttnMaxSplits);
  }
  if (n_tok == 0) return absl::OkStatus();
  Launch(AttentionCombineKernel, static_cast<unsigned>(n_tok * a.n_head), 128, 2 * n_split * sizeof(float), stream,
         part, a, n_split, out);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CheckRouteArgs(const RouteArgs &p) {
  if (p.n_expert <= 0 || p.n_expert > kRouteMaxExperts || p.k <= 0 || p.k > p.n_expert || p.n_group <= 0 ||
      p.n_expert % p.n_group != 0 || p.topk_group <= 0 || p.topk_group > p.n_group) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing %d experts (at most %d) to %d in %d groups", p.n_expert,
                  kRouteMaxExperts, p.k, p.n_group);
  }
  return absl::OkStatus();
}

absl::Status Route(const RouteArgs &p, const float *logits, int64_t n_tok, int32_t *sel, float *wts,
                   cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckRouteArgs(p));
  if (n_tok <= 0) return absl::OkStatus();
  const int64_t blocks = (n_tok + kRouteWarps - 1) / kRouteWarps;
  Launch(RouteKernel, static_cast<unsigned>(blocks), kRouteWarps * 32, 0, stream, p, logits, n_tok, sel, wts);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace strata::cuda
