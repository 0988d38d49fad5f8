// Flash attention for prompts over the KV cache's block tables (AttentionExt's prompt path): tiles of
// a GQA group's (token, head) rows against double-buffered key tiles, online softmax, no score
// matrix; both products on tensor cores in 3xTF32 (about float32's accuracy, not its bits).
//
// 3xTF32: an operand x splits into big = tf32(x) and small = tf32(x - big), and a b is taken as
// big_a small_b + small_a big_b + big_a big_b (the dropped small_a small_b is ~2^-21 relative). A
// tile's 64 rows are (token, head) pairs of one KV head, so each K/V tile in shared memory serves
// the whole group; K/V tiles come by cp.async, tile i + 1 in flight while tile i is used.
//
// Typed rows (f16, q8_0; the kTyped instantiation): a typed operand's tile i + 1 is loaded into
// registers while tile i is used and decoded into the same float tile after it (f16 exactly, q8_0
// as q d, both as DecodeKvCols gives them), so the products see the values the other kernels do.
// An f32 operand still comes by cp.async; the f32 instantiation is untouched by any of this.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kv_rows.cuh"
#include "backends/cuda/launch.cuh"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

constexpr int kRows = 64;           // query rows of a tile: (token, head) pairs
constexpr int kWarps = kRows / 16;  // a warp's 16 rows are one mma row block
constexpr int kFlashThreads = kWarps * 32;
// A call takes the flash kernel with at least 16 tokens, or with 2 or more whose rows fill half a
// tile (a group of 8: 4 tokens). Fewer keep the per-(token, head) kernels, which need no tile of
// mostly padding rows; a lone token (decode) always does.
constexpr int kMinTokens = 16;
constexpr int kMinRows = kRows / 2;

// Query tiles of a call: kRows / group tokens each.
int64_t QueryTiles(const AttentionExtArgs &a, int64_t n_tok) {
  const int tq = kRows / (a.n_head / a.n_head_kv);
  return (n_tok + tq - 1) / tq;
}

// Shared memory row strides (floats). Fragment reads are conflict-free when a row's stride is
// 4 mod 32 for Q, K and P (lanes read rows lane / 4, columns lane % 4) and 8 mod 32 for V (lanes
// read rows lane % 4, columns lane / 4).
template <int D>
struct FlashShape {
  static constexpr int kKeys = D <= 64 ? 64 : 32;  // keys of a K/V tile
  static constexpr int kQStride = D + 4, kKStride = D + 4, kVStride = D + 8, kPStride = kKeys + 4;
  static constexpr int kQFloats = kRows * kQStride;
  static constexpr int kKFloats = kKeys * kKStride, kVFloats = kKeys * kVStride;
  static constexpr int kPFloats = kRows * kPStride;
  // Q, two K and two V buffers, P, then the tile's mask flags (one int a key, two buffers).
  static constexpr size_t kBytes =
      (static_cast<size_t>(kQFloats) + 2 * kKFloats + 2 * kVFloats + kPFloats + 2 * kKeys) * sizeof(float);
};

// x as big + small tf32 parts, with integer operations rather than conversions: big rounds x's
// mantissa to 10 bits (half up in magnitude), small is the rest truncated to 10 bits, so a
// product of two splits is within ~2^-21 of float32's. Both have their 13 low bits zero, as the
// tf32 operands of mma take them.
__device__ __forceinline__ void Split(float x, uint32_t &big, uint32_t &small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xffffe000u;
}

// c += a b over one m16n8k8 tile (tf32 inputs, float32 accumulation).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// 3xTF32: the small cross terms first, then the big product.
__device__ __forceinline__ void Mma3(float (&c)[4], const uint32_t (&ab)[4], const uint32_t (&as)[4],
                                     const uint32_t (&bb)[2], const uint32_t (&bs)[2]) {
  Mma(c, ab, bs);
  Mma(c, as, bb);
  Mma(c, ab, bb);
}

using dev::CpAsync16;
using dev::CpAsyncCommit;
using dev::CpAsyncWait;

// A thread's share of a typed K or V tile, held in registers from its loads to its decode.
// f16: four pieces of 8 halves, rows threadIdx.x / (D / 8) + u kFlashThreads / (D / 8), columns
// (threadIdx.x % (D / 8)) 8 (rows of a piece's warp are contiguous bytes). q8_0: one 32-value block,
// row threadIdx.x / (D / 32), columns (threadIdx.x % (D / 32)) 32: its scale read once, then its
// codes two at a time (a block is only 2-byte aligned). Rows past the last position are zeros.
struct TypedShare {
  uint32_t raw[16];  // f16: 8 halves a uint4; q8_0: the block's codes, two in the low half-word each
  float d;           // q8_0: the block's scale
};
template <int D, int kKeys>
__device__ __forceinline__ void LoadTypedShare(model::KvType t, const float *const *blocks, int block_tokens,
                                               int64_t stride, int kvh, int kt, int p_hi, TypedShare &s) {
  const int64_t row_bytes = dev::KvRowBytesDev(t, static_cast<int>(stride));
  if (t == model::KvType::kF16) {
    constexpr int kChunks = D / 8, kStep = kFlashThreads / kChunks;
    static_assert(kKeys == 4 * kStep, "four pieces a thread");
    const int row0 = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 8;
    const uint8_t *src[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int kp = kt + row0 + u * kStep;
      src[u] = kp <= p_hi ? reinterpret_cast<const uint8_t *>(blocks[kp / block_tokens]) +
                                (kp % block_tokens) * row_bytes + (static_cast<int64_t>(kvh) * D + col) * 2
                          : nullptr;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint4 w = src[u] != nullptr ? *reinterpret_cast<const uint4 *>(src[u]) : make_uint4(0u, 0u, 0u, 0u);
      s.raw[4 * u] = w.x;
      s.raw[4 * u + 1] = w.y;
      s.raw[4 * u + 2] = w.z;
      s.raw[4 * u + 3] = w.w;
    }
  } else {
    constexpr int kSegs = D / model::kKvQ8Elems;
    static_assert(kKeys * kSegs == kFlashThreads, "one q8_0 block a thread");
    const int kp = kt + static_cast<int>(threadIdx.x) / kSegs, seg = threadIdx.x % kSegs;
    s.d = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) s.raw[k] = 0u;
    if (kp <= p_hi) {
      const uint8_t *b = reinterpret_cast<const uint8_t *>(blocks[kp / block_tokens]) + (kp % block_tokens) * row_bytes +
                         static_cast<int64_t>(kvh * kSegs + seg) * model::kKvQ8Bytes;
      s.d = __half2float(*reinterpret_cast<const __half *>(b));
      const uint16_t *c = reinterpret_cast<const uint16_t *>(b + 2);
#pragma unroll
      for (int k = 0; k < 16; ++k) s.raw[k] = c[k];
    }
  }
}
// The share decoded into its places of a float tile of row stride `stride` (floats).
template <int D>
__device__ __forceinline__ void StoreTypedShare(model::KvType t, const TypedShare &s, float *tile, int stride) {
  if (t == model::KvType::kF16) {
    constexpr int kChunks = D / 8, kStep = kFlashThreads / kChunks;
    const int row0 = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 8;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float *dst = tile + (row0 + u * kStep) * stride + col;
      float2 f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t w = s.raw[4 * u + e];
        f[e] = __half22float2(*reinterpret_cast<const __half2 *>(&w));
      }
      *reinterpret_cast<float4 *>(dst) = make_float4(f[0].x, f[0].y, f[1].x, f[1].y);
      *reinterpret_cast<float4 *>(dst + 4) = make_float4(f[2].x, f[2].y, f[3].x, f[3].y);
    }
  } else {
    constexpr int kSegs = D / model::kKvQ8Elems;
    float *dst = tile + (threadIdx.x / kSegs) * stride + (threadIdx.x % kSegs) * model::kKvQ8Elems;
#pragma unroll
    for (int k = 0; k < 16; k += 2) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int8_t q = static_cast<int8_t>((s.raw[k + e / 2] >> (8 * (e & 1))) & 0xffu);
        v[e] = __fmul_rn(static_cast<float>(q), s.d);  // as dev::KvLoad and DecodeKvCols
      }
      *reinterpret_cast<float4 *>(dst + 2 * k) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Pieces both flash kernels share. A tile's query rows: row r is token t0 + r / group, head
// kvh group + r % group; rows past the tile's tokens are zeros.
template <int D, int kStride>
__device__ __forceinline__ void LoadQueryRows(const float *q, const AttentionExtArgs &a, int64_t t0, int64_t t_end,
                                              int kvh, float *qs) {
  const int group = a.n_head / a.n_head_kv, tq = kRows / group;
  for (int c = threadIdx.x; c < kRows * D; c += kFlashThreads) {
    const int r = c / D, col = c % D;
    const int64_t t = t0 + r / group;
    const bool valid = r < tq * group && t < t_end;
    qs[r * kStride + col] = valid ? q[(t * a.n_head + kvh * group + r % group) * D + col] : 0.f;
  }
}

// A thread's two rows (lane / 4 and lane / 4 + 8 of its warp's 16): position and first key; a
// padding row gets position -1, which sees no key.
__device__ __forceinline__ void ThreadRows(const AttentionExtArgs &a, int64_t t0, int64_t t_end, int warp, int qr,
                                           int (&rpos)[2], int (&rfirst)[2]) {
  const int group = a.n_head / a.n_head_kv, tq = kRows / group;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + qr + 8 * h;
    const int64_t t = t0 + r / group;
    const bool valid = r < tq * group && t < t_end;
    rpos[h] = valid ? a.pos0 + static_cast<int>(t) : -1;
    rfirst[h] = valid && a.window > 0 ? max(0, rpos[h] - a.window + 1) : 0;
  }
}

// Whether any of the warp's rows sees a key of the tile starting at kt.
template <int kKeys>
__device__ __forceinline__ bool WarpSeesTile(const int (&rpos)[2], const int (&rfirst)[2], int kt) {
  bool any = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) any |= rpos[h] >= kt && rpos[h] >= 0 && rfirst[h] <= kt + kKeys - 1;
  return __any_sync(0xffffffffu, any);
}

// The tile's scores scaled and masked (a masked key is no key but for its own position's query),
// then the online softmax's step: the rows' new maxima into m, l and o rescaled to them, and mt
// the base each weight's exponent subtracts (0 for a row with no key yet).
template <int kKeys, int D>
__device__ __forceinline__ void ScoresToBase(float (&s)[kKeys / 8][4], const int *fl, int kt, int qc,
                                             const int (&rpos)[2], const int (&rfirst)[2], float scale,
                                             float (&m)[2], float (&l)[2], float (&o)[D / 8][4], float (&mt)[2]) {
  mt[0] = mt[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2, j = n * 8 + qc * 2 + (e & 1), kp = kt + j;
      const bool vis = kp <= rpos[h] && kp >= rfirst[h] && (kp == rpos[h] || fl[j] == 0);
      s[n][e] = vis ? __fmul_rn(s[n][e], scale) : -INFINITY;
      mt[h] = fmaxf(mt[h], s[n][e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
    mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
    const float mn = fmaxf(m[h], mt[h]);
    const float base = mn == -INFINITY ? 0.f : mn;  // a row with no key yet stays at zero
    const float alpha = expf(m[h] - base);
    m[h] = mn;
    mt[h] = base;
    l[h] *= alpha;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][2 * h] *= alpha;
      o[n][2 * h + 1] *= alpha;
    }
  }
}

// Row sums over the quad, the sink logit, and the normalised rows out; with n_split > 1 each row's
// max, sum and unnormalised output go to part (the split path's layout) for AttentionCombine.
template <int D>
__device__ __forceinline__ void WriteRows(const AttentionExtArgs &a, int64_t t0, int kvh, int warp, int qr, int qc,
                                          const int (&rpos)[2], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                          int n_split, float *part, float *out) {
  const int group = a.n_head / a.n_head_kv;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = warp * 16 + qr + 8 * h;
    if (rpos[h] < 0) continue;
    const int head = kvh * group + r % group;
    const int64_t th = (t0 + r / group) * a.n_head + head;
    if (n_split > 1) {
      float *dst = part + (th * n_split + blockIdx.z) * (a.v_dim + 2);
      if (qc == 0) {
        dst[0] = m[h];
        dst[1] = l[h];
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int c = n * 8 + qc * 2;
        if (c < a.v_dim) dst[2 + c] = o[n][2 * h];
        if (c + 1 < a.v_dim) dst[2 + c + 1] = o[n][2 * h + 1];
      }
      continue;
    }
    float scale_o = 1.f;
    if (a.sinks != nullptr) {  // one more logit whose value row is zero
      const float sink = a.sinks[head];
      const float mn = fmaxf(m[h], sink);
      scale_o = expf(m[h] - mn);
      l[h] = l[h] * scale_o + expf(sink - mn);
    }
    const float inv = scale_o / l[h];
    float *dst = out + th * a.v_dim;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int c = n * 8 + qc * 2;
      if (c < a.v_dim) dst[c] = o[n][2 * h] * inv;
      if (c + 1 < a.v_dim) dst[c + 1] = o[n][2 * h + 1] * inv;
    }
  }
}

// Block (query tile x, KV head y): tokens t0 .. t0 + tq - 1 (tq = kRows / group) and the group's
// heads; row r is token t0 + r / group, head y group + r % group. Keys from the first one the
// tile's first token sees to the last token's own position, kKeys at a time.
//
// With n_split > 1 (few tiles over many keys), block z takes the z-th of n_split runs of the tile's
// key tiles and writes each row's max score, sum of weights and unnormalised output to part in the
// split path's layout (AttentionCombine adds the runs and the sink); a run with no key of a row
// writes m = -inf, l = 0.
template <int D, bool kTyped>
__global__ void __launch_bounds__(kFlashThreads, 2) FlashAttentionKernel(const float *q, AttentionExtArgs a,
                                                                      int64_t n_tok, float *out, int n_split,
                                                                      float *part) {
  using S = FlashShape<D>;
  constexpr int kKeys = S::kKeys;
  dev::AwaitPrior();
  extern __shared__ __align__(16) float sm[];
  float *qs = sm;
  float *ks = qs + S::kQFloats;           // 2 buffers
  float *vs = ks + 2 * S::kKFloats;       // 2 buffers
  float *ps = vs + 2 * S::kVFloats;
  int *flags = reinterpret_cast<int *>(ps + S::kPFloats);  // 2 buffers of kKeys
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = a.n_head / a.n_head_kv, tq = kRows / group;
  const int kvh = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tq;
  const int64_t t_end = min(n_tok, t0 + tq);
  const int p_lo = a.pos0 + static_cast<int>(t0), p_hi = a.pos0 + static_cast<int>(t_end) - 1;
  // Key tiles start at multiples of kKeys, so a row meets the same tiles in whatever query tile and
  // call it comes (a tile wholly outside a row's keys changes none of its numbers): unsplit, a
  // token's bits do not depend on how the prompt was cut into calls.
  const int k_begin = a.window > 0 ? max(0, p_lo - a.window + 1) / kKeys * kKeys : 0;
  const int n_all = (p_hi - k_begin) / kKeys + 1;  // key tiles of the query tile
  const int per_split = (n_all + n_split - 1) / n_split;
  const int i_begin = min(n_all, static_cast<int>(blockIdx.z) * per_split);
  const int i_end = min(n_all, i_begin + per_split);

  // The query rows, zeros past the tile's tokens (plain loads: q need not be 16-byte aligned).
  LoadQueryRows<D, S::kQStride>(q, a, t0, t_end, kvh, qs);
  constexpr int kChunks = D / 4;  // 16-byte pieces of a K/V row
  // Tile i's keys and values (the first v_dim floats of the key rows when latent: no V copy), zeros
  // past the last position (those cache rows may hold anything), and each key's mask flag.
  // A thread's pieces: kLoads of them, rows kRowStep apart, the same column. Their rows' addresses
  // (block table lookups) are all formed first so those loads are in flight together.
  constexpr int kLoads = kKeys * kChunks / kFlashThreads, kRowStep = kFlashThreads / kChunks;
  static_assert(kKeys * kChunks % kFlashThreads == 0 && kFlashThreads % kChunks == 0, "whole rows a pass");
  const int my_row = threadIdx.x / kChunks, my_col = (threadIdx.x % kChunks) * 4;
  // f32 rows of tile i by cp.async: keys with copy_k, values with copy_v.
  auto copy_f32 = [&](int i, bool copy_k, bool copy_v) {
    const int kt = k_begin + i * kKeys;
    float *kd = ks + (i & 1) * S::kKFloats, *vd = vs + (i & 1) * S::kVFloats;
    const float *krow[kLoads], *vrow[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int kp = kt + my_row + u * kRowStep;
      const bool valid = kp <= p_hi;
      const int blk = valid ? kp / a.block_tokens : 0;
      const int64_t off = static_cast<int64_t>(valid ? kp % a.block_tokens : 0);
      krow[u] = valid && copy_k ? a.k_blocks[blk] + off * a.k_stride + static_cast<int64_t>(kvh) * D + my_col : nullptr;
      vrow[u] = valid && copy_v ? a.v_blocks[blk] + off * a.v_stride + static_cast<int64_t>(kvh) * D + my_col
                                : nullptr;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int j = my_row + u * kRowStep;
      if (copy_k) CpAsync16(kd + j * S::kKStride + my_col, krow[u] != nullptr ? krow[u] : q, krow[u] != nullptr);
      if (copy_v) CpAsync16(vd + j * S::kVStride + my_col, vrow[u] != nullptr ? vrow[u] : q, vrow[u] != nullptr);
    }
  };
  // Typed operands: this thread's share of tile i in registers (load_tile), later decoded into the
  // tile's buffers (store_typed).
  [[maybe_unused]] TypedShare kshare, vshare;
  const bool k_typed = kTyped && a.k_type != model::KvType::kF32;
  const bool v_typed = kTyped && !a.latent && a.v_type != model::KvType::kF32;
  auto load_tile = [&](int i) {
    const int kt = k_begin + i * kKeys;
    if constexpr (kTyped) {
      copy_f32(i, !k_typed, !a.latent && !v_typed);
      if (k_typed) LoadTypedShare<D, kKeys>(a.k_type, a.k_blocks, a.block_tokens, a.k_stride, kvh, kt, p_hi, kshare);
      if (v_typed) LoadTypedShare<D, kKeys>(a.v_type, a.v_blocks, a.block_tokens, a.v_stride, kvh, kt, p_hi, vshare);
    } else {
      copy_f32(i, true, !a.latent);
    }
    for (int j = threadIdx.x; j < kKeys; j += kFlashThreads) {
      const int kp = kt + j;
      flags[(i & 1) * kKeys + j] = kp <= p_hi && a.masked != nullptr && a.masked[kp] != 0 ? 1 : 0;
    }
  };
  [[maybe_unused]] auto store_typed = [&](int i) {
    if (k_typed) StoreTypedShare<D>(a.k_type, kshare, ks + (i & 1) * S::kKFloats, S::kKStride);
    if (v_typed) StoreTypedShare<D>(a.v_type, vshare, vs + (i & 1) * S::kVFloats, S::kVStride);
  };
  if (i_begin < i_end) {
    load_tile(i_begin);
    CpAsyncCommit();
    if constexpr (kTyped) store_typed(i_begin);
  }

  int rpos[2], rfirst[2];
  ThreadRows(a, t0, t_end, warp, lane / 4, rpos, rfirst);
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float *qw = qs + warp * 16 * S::kQStride;
  float *pw = ps + warp * 16 * S::kPStride;
  const int qr = lane / 4, qc = lane % 4;

  for (int i = i_begin; i < i_end; ++i) {
    if (i + 1 < i_end) {
      load_tile(i + 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int kt = k_begin + i * kKeys;
    const float *kb = ks + (i & 1) * S::kKFloats;
    const float *vb = a.latent ? kb : vs + (i & 1) * S::kVFloats;
    const int vstride = a.latent ? S::kKStride : S::kVStride;
    const int *fl = flags + (i & 1) * kKeys;
    // A warp none of whose 16 rows sees a key of the tile (all before it, or past their window)
    // skips it.
    if (WarpSeesTile<kKeys>(rpos, rfirst, kt)) {
      // Scores s = Q K^T for the warp's 16 rows and the tile's keys.
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < D / 8; ++kk) {
        uint32_t ab[4], as[4];
        Split(qw[qr * S::kQStride + kk * 8 + qc], ab[0], as[0]);
        Split(qw[(qr + 8) * S::kQStride + kk * 8 + qc], ab[1], as[1]);
        Split(qw[qr * S::kQStride + kk * 8 + qc + 4], ab[2], as[2]);
        Split(qw[(qr + 8) * S::kQStride + kk * 8 + qc + 4], ab[3], as[3]);
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          uint32_t bb[2], bs[2];
          Split(kb[(n * 8 + qr) * S::kKStride + kk * 8 + qc], bb[0], bs[0]);
          Split(kb[(n * 8 + qr) * S::kKStride + kk * 8 + qc + 4], bb[1], bs[1]);
          Mma3(s[n], ab, as, bb, bs);
        }
      }
      // Scale, mask (a masked key is no key but for its own position's query), online softmax.
      float mt[2];
      ScoresToBase<kKeys, D>(s, fl, kt, qc, rpos, rfirst, a.scale, m, l, o, mt);
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const float p = expf(s[n][e] - mt[h]);
          l[h] += p;
          pw[(qr + 8 * h) * S::kPStride + n * 8 + qc * 2 + (e & 1)] = p;
        }
      }
      __syncwarp();
      // o += P V.
#pragma unroll 2
      for (int kk = 0; kk < kKeys / 8; ++kk) {
        uint32_t ab[4], as[4];
        Split(pw[qr * S::kPStride + kk * 8 + qc], ab[0], as[0]);
        Split(pw[(qr + 8) * S::kPStride + kk * 8 + qc], ab[1], as[1]);
        Split(pw[qr * S::kPStride + kk * 8 + qc + 4], ab[2], as[2]);
        Split(pw[(qr + 8) * S::kPStride + kk * 8 + qc + 4], ab[3], as[3]);
        const float *v0 = vb + (kk * 8 + qc) * vstride, *v1 = v0 + 4 * vstride;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          uint32_t bb[2], bs[2];
          Split(v0[n * 8 + qr], bb[0], bs[0]);
          Split(v1[n * 8 + qr], bb[1], bs[1]);
          Mma3(o[n], ab, as, bb, bs);
        }
      }
      __syncwarp();
    }
    // Tile i + 1's typed rows, loaded at the top of this iteration, into its buffers (free since the
    // end of tile i - 1; the next iteration's barrier publishes them).
    if constexpr (kTyped) {
      if (i + 1 < i_end) store_typed(i + 1);
    }
    __syncthreads();  // the buffers of tile i are free for tile i + 2
  }

  WriteRows<D>(a, t0, kvh, warp, qr, qc, rpos, m, l, o, n_split, part, out);
}

// ---- f16 keys and values: the products on f16 tensor cores ----
//
// With both K and V stored in f16 (and not latent), a key or value is exactly an f16, so the
// products need no split of it: scores are Qh K + Ql K (Q as the f16 Qh plus the f16 rest Ql,
// about float32's precision of q), and the output adds P V with P rounded to f16 (the row sums
// add the rounded weights, so each row is normalised by what it multiplied). m16n8k16 products,
// the scores' accumulators feeding P V as its A fragments without a pass through shared memory.
// Tiles of 64 keys, K and V rows copied as stored by cp.async, tile i + 1 in flight.
template <int D>
struct F16Shape {
  static constexpr int kKeys = 64;
  static constexpr int kPitch = D + 8;      // halves a staged row takes: conflict-free fragment loads
  static constexpr int kQStride = D + 4;    // floats
  static constexpr int kTileHalves = kKeys * kPitch;
  static constexpr size_t kBytes = static_cast<size_t>(kRows) * kQStride * sizeof(float) +
                                   static_cast<size_t>(2 * 2 * kTileHalves) * sizeof(__half) + 2 * kKeys * sizeof(int);
};

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower index
  return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t PackHalves(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}
// c += a b over one m16n8k16 tile (f16 inputs, float32 accumulation).
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Block (query tile x, KV head y, run z) as FlashAttentionKernel's.
template <int D>
__global__ void __launch_bounds__(kFlashThreads, 2) FlashF16Kernel(const float *q, AttentionExtArgs a, int64_t n_tok,
                                                                  float *out, int n_split, float *part) {
  using S = F16Shape<D>;
  constexpr int kKeys = S::kKeys, kP = S::kPitch;
  dev::AwaitPrior();
  extern __shared__ __align__(16) float sm[];
  float *qs = sm;
  __half *kv = reinterpret_cast<__half *>(qs + kRows * S::kQStride);  // [stage][K | V][kKeys][kP]
  int *flags = reinterpret_cast<int *>(kv + 2 * 2 * S::kTileHalves);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = a.n_head / a.n_head_kv, tq = kRows / group;
  const int kvh = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tq;
  const int64_t t_end = min(n_tok, t0 + tq);
  const int p_lo = a.pos0 + static_cast<int>(t0), p_hi = a.pos0 + static_cast<int>(t_end) - 1;
  const int k_begin = a.window > 0 ? max(0, p_lo - a.window + 1) / kKeys * kKeys : 0;
  const int n_all = (p_hi - k_begin) / kKeys + 1;
  const int per_split = (n_all + n_split - 1) / n_split;
  const int i_begin = min(n_all, static_cast<int>(blockIdx.z) * per_split);
  const int i_end = min(n_all, i_begin + per_split);

  LoadQueryRows<D, S::kQStride>(q, a, t0, t_end, kvh, qs);
  const int64_t k_row = static_cast<int64_t>(a.k_stride) * 2, v_row = static_cast<int64_t>(a.v_stride) * 2;
  constexpr int kChunks = D / 8;  // 16-byte pieces of a head's f16 row
  auto load_tile = [&](int i) {
    const int kt = k_begin + i * kKeys;
    __half *kd = kv + (i & 1) * 2 * S::kTileHalves, *vd = kd + S::kTileHalves;
    for (int c = threadIdx.x; c < kKeys * kChunks; c += kFlashThreads) {
      const int j = c / kChunks, col = (c % kChunks) * 8, kp = kt + j;
      const bool valid = kp <= p_hi;
      const uint8_t *ks = reinterpret_cast<const uint8_t *>(q), *vs = ks;
      if (valid) {
        const int blk = kp / a.block_tokens;
        const int64_t off = kp % a.block_tokens;
        ks = reinterpret_cast<const uint8_t *>(a.k_blocks[blk]) + off * k_row + (static_cast<int64_t>(kvh) * D + col) * 2;
        vs = reinterpret_cast<const uint8_t *>(a.v_blocks[blk]) + off * v_row + (static_cast<int64_t>(kvh) * D + col) * 2;
      }
      CpAsync16(kd + j * kP + col, ks, valid);
      CpAsync16(vd + j * kP + col, vs, valid);
    }
    for (int j = threadIdx.x; j < kKeys; j += kFlashThreads) {
      const int kp = kt + j;
      flags[(i & 1) * kKeys + j] = kp <= p_hi && a.masked != nullptr && a.masked[kp] != 0 ? 1 : 0;
    }
  };
  if (i_begin < i_end) load_tile(i_begin);
  CpAsyncCommit();
  __syncthreads();  // the query rows

  const int g = lane / 4, tg = lane % 4;
  // The warp's query rows as f16 A fragments, the f16 value and the f16 rest of each float.
  uint32_t qh[D / 16][4], ql[D / 16][4];
  {
    const float *q0 = qs + (warp * 16 + g) * S::kQStride, *q1 = q0 + 8 * S::kQStride;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = kk * 16 + 2 * tg;
      const float x[4][2] = {{q0[c], q0[c + 1]}, {q1[c], q1[c + 1]}, {q0[c + 8], q0[c + 9]}, {q1[c + 8], q1[c + 9]}};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __half h0 = __float2half_rn(x[r][0]), h1 = __float2half_rn(x[r][1]);
        qh[kk][r] = PackHalves(h0, h1);
        ql[kk][r] = PackHalf2(x[r][0] - __half2float(h0), x[r][1] - __half2float(h1));
      }
    }
  }
  int rpos[2], rfirst[2];
  ThreadRows(a, t0, t_end, warp, g, rpos, rfirst);
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int i = i_begin; i < i_end; ++i) {
    if (i + 1 < i_end) load_tile(i + 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int kt = k_begin + i * kKeys;
    const __half *kb = kv + (i & 1) * 2 * S::kTileHalves, *vb = kb + S::kTileHalves;
    const int *fl = flags + (i & 1) * kKeys;
    if (WarpSeesTile<kKeys>(rpos, rfirst, kt)) {
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        const __half *krow = kb + (n * 8 + g) * kP + 2 * tg;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t b[2] = {*reinterpret_cast<const uint32_t *>(krow + kk * 16),
                                 *reinterpret_cast<const uint32_t *>(krow + kk * 16 + 8)};
          MmaF16(s[n], ql[kk], b);
          MmaF16(s[n], qh[kk], b);
        }
      }
      float mt[2];
      ScoresToBase<kKeys, D>(s, fl, kt, tg, rpos, rfirst, a.scale, m, l, o, mt);
      // Weights rounded to f16, in place of the scores (their row sums add the rounded values).
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const float p = __half2float(__float2half_rn(expf(s[n][e] - mt[h])));
          l[h] += p;
          s[n][e] = p;
        }
      }
      // o += P V: P's A fragments are the scores' accumulators of key groups 2 kk and 2 kk + 1.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t pa[4] = {PackHalf2(s[2 * kk][0], s[2 * kk][1]), PackHalf2(s[2 * kk][2], s[2 * kk][3]),
                                PackHalf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                PackHalf2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const __half *v0 = vb + (kk * 16 + 2 * tg) * kP + g;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          const __half *vc = v0 + n * 8;
          const uint32_t b[2] = {PackHalves(vc[0], vc[kP]), PackHalves(vc[8 * kP], vc[9 * kP])};
          MmaF16(o[n], pa, b);
        }
      }
    }
    __syncthreads();  // the buffers of tile i are free for tile i + 2
  }
  CpAsyncWait<0>();
  WriteRows<D>(a, t0, kvh, warp, g, tg, rpos, m, l, o, n_split, part, out);
}

template <int D>
absl::Status LaunchFlashF16(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, int n_split,
                            float *part, cudaStream_t stream) {
  using S = F16Shape<D>;
  static const cudaError_t opt_in = cudaFuncSetAttribute(FlashF16Kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         static_cast<int>(S::kBytes));
  STRATA_CUDA_RETURN_IF_ERROR(opt_in);
  const int64_t tiles = QueryTiles(a, n_tok);
  if (tiles > INT32_MAX) return Errorf(MOE_ERR_INVALID_ARGUMENT, "flash attention over %d tokens", n_tok);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_split));
  Launch(FlashF16Kernel<D>, grid, kFlashThreads, S::kBytes, stream, q, a, n_tok, out, n_split, part);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  if (n_split > 1) return AttentionCombine(part, a, n_tok, n_split, out, stream);
  return absl::OkStatus();
}

// Whether a call's rows take the f16 kernel: both K and V in f16 (not latent), their strides in
// whole 16-byte pieces.
bool TakesF16(const AttentionExtArgs &a) {
  return tunables::Get().cuda_flash_f16 && !a.latent && a.k_type == model::KvType::kF16 &&
         a.v_type == model::KvType::kF16 && a.k_stride % 8 == 0 && a.v_stride % 8 == 0;
}

template <int D, bool kTyped>
absl::Status LaunchFlash(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, int n_split,
                         float *part, cudaStream_t stream) {
  using S = FlashShape<D>;
  // Opt in to the shared memory once per instantiation (the kernels run on one device per process).
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      FlashAttentionKernel<D, kTyped>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(S::kBytes));
  STRATA_CUDA_RETURN_IF_ERROR(opt_in);
  const int64_t tiles = QueryTiles(a, n_tok);
  if (tiles > INT32_MAX) return Errorf(MOE_ERR_INVALID_ARGUMENT, "flash attention over %d tokens", n_tok);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_split));
  Launch(FlashAttentionKernel<D, kTyped>, grid, kFlashThreads, S::kBytes, stream, q, a, n_tok, out, n_split, part);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  if (n_split > 1) return AttentionCombine(part, a, n_tok, n_split, out, stream);
  return absl::OkStatus();
}

// Runs of key tiles a call splits into: as many as keep the (query tile, KV head, run) blocks within
// one wave of the device (two blocks a multiprocessor of an H200-sized part), each run at least
// kMinSplitTiles key tiles; 1 when the query tiles fill half the wave or more (a 512-token chunk of
// a group of 8 over 4 KV heads: 256 blocks, unsplit).
constexpr int64_t kFillBlocks = 264;
constexpr int kMinSplitTiles = 8;
int FlashSplits(const AttentionExtArgs &a, int64_t n_tok) {
  const int64_t blocks = QueryTiles(a, n_tok) * a.n_head_kv;
  if (2 * blocks > kFillBlocks) return 1;
  // Keys of the last query tile (the most any tile has).
  const int64_t last = a.pos0 + n_tok - 1;
  const int64_t keys = a.window > 0 ? std::min<int64_t>(last + 1, a.window + kRows + 64) : last + 1;
  const int64_t key_tiles = (keys + 31) / 32;  // tiles of the head_dim 128 kernel (64 has fewer)
  const int64_t by_keys = key_tiles / kMinSplitTiles, by_fill = kFillBlocks / blocks;
  return static_cast<int>(std::max<int64_t>(1, std::min(by_keys, by_fill)));
}

}  // namespace

size_t FlashAttentionWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok) {
  if (!FlashAttentionApplies(a, n_tok)) return 0;
  const int n = FlashSplits(a, n_tok);
  return n <= 1 ? 0 : static_cast<size_t>(n_tok) * a.n_head * n * (a.v_dim + 2) * sizeof(float);
}

bool FlashAttentionApplies(const AttentionExtArgs &a, int64_t n_tok) {
  if (a.rows != nullptr || n_tok < 2 || !tunables::Get().cuda_flash_attention) return false;
  if (a.head_dim != 64 && a.head_dim != 128) return false;
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.n_head / a.n_head_kv > kRows) {
    return false;
  }
  if (n_tok < kMinTokens && n_tok * (a.n_head / a.n_head_kv) < kMinRows) return false;
  // f32 and f16 K/V rows are read 16 bytes at a time: strides in whole 4-float or 8-half pieces (the
  // block starts must be 16-byte aligned: they are allocations, or whole blocks into one). q8_0 rows
  // are read a 2-byte-aligned block at a time; head_dim 64 or 128 starts each head on a block.
  auto stride_ok = [](model::KvType t, int64_t stride) {
    return t == model::KvType::kQ8_0 ? true : stride % (t == model::KvType::kF16 ? 8 : 4) == 0;
  };
  if (!stride_ok(a.k_type, a.k_stride) || (!a.latent && !stride_ok(a.v_type, a.v_stride))) return false;
  // Latent values are the key rows' first v_dim floats (one KV head).
  if (a.latent ? (a.v_dim <= 0 || a.v_dim > a.head_dim || a.n_head_kv != 1) : a.v_dim != a.head_dim) return false;
  return a.pos0 >= 0 && static_cast<int64_t>(a.pos0) + n_tok <= INT32_MAX;
}

absl::Status FlashAttention(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out,
                            cudaStream_t stream, Workspace ws) {
  if (!FlashAttentionApplies(a, n_tok)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "flash attention over %d tokens, %d heads, %d KV heads, head_dim %d, v_dim %d (rows mode: %d)", n_tok,
                  a.n_head, a.n_head_kv, a.head_dim, a.v_dim, a.rows != nullptr ? 1 : 0);
  }
  if (a.k_blocks == nullptr || (!a.latent && a.v_blocks == nullptr) || a.block_tokens <= 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "flash attention without block tables");
  }
  // The split needs its workspace; without it the call runs unsplit.
  const size_t need = FlashAttentionWorkspaceBytes(a, n_tok);
  const bool split = need > 0 && ws.data != nullptr && ws.bytes >= need;
  const int n_split = split ? FlashSplits(a, n_tok) : 1;
  float *part = split ? static_cast<float *>(ws.data) : nullptr;
  if (TakesF16(a)) {
    return a.head_dim == 64 ? LaunchFlashF16<64>(q, a, n_tok, out, n_split, part, stream)
                            : LaunchFlashF16<128>(q, a, n_tok, out, n_split, part, stream);
  }
  if (KvRowsTyped(a)) {
    return a.head_dim == 64 ? LaunchFlash<64, true>(q, a, n_tok, out, n_split, part, stream)
                            : LaunchFlash<128, true>(q, a, n_tok, out, n_split, part, stream);
  }
  return a.head_dim == 64 ? LaunchFlash<64, false>(q, a, n_tok, out, n_split, part, stream)
                          : LaunchFlash<128, false>(q, a, n_tok, out, n_split, part, stream);
}

}  // namespace strata::cuda
