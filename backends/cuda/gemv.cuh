// The dequantize-GEMV building blocks shared by the per-matrix kernels (matmul.cu) and the grouped
// expert kernels (grouped.cu): a team of warps per kGemvRows output rows, the columns split over the
// team's warps as GemvTeamWarps (kernels.h) sets from the codec and the matrix shape alone, a fixed
// per-lane order of fused multiply-adds, a fixed butterfly across lanes and the warps' sums added in
// warp order, so a (row, token) result is the same bits whichever kernel, batch or chunk of tokens
// it is computed in.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/codecs.cuh"
#include "backends/cuda/kernels.h"
#include "lib/util/tunables.h"

namespace strata::cuda::dev {

constexpr int kGemvWarps = 8;  // warps per block: the warps of a block share x through L1

// Blocks of an 8-bit-activation grouped expert kernel a multiprocessor holds at once, by the
// registers its launch bound leaves a thread (65,536 / (256 x blocks)), for kernels taking up to
// kMaxNT tokens a chunk. The 2-token kernels fit 80 registers without spilling and run the groups of
// 1-3 tokens that many sessions' decode forms: many sessions decode faster with 3 blocks than with
// 2 at the same chunks (bench/README.md); the 1-token kernel spills at 80, the 4- and
// 8-token ones more.
template <int kMaxNT>
constexpr int GroupedQ8MinBlocks() {
  return kMaxNT == 2 ? 3 : 2;
}

// The warps that share a set of rows: a row's columns are split over them (warp w of W takes every
// W-th stretch of 32 lanes' work), and their partial sums meet in shared memory in warp order.
// Small decode matrices need it: a warp per row alone keeps too few loads in flight.
struct Team {
  int lane;    // lane in the warp
  int warp;    // warp in the team
  int warps;   // warps in the team: 1, 2, 4 or 8
  float *red;  // the team's shared scratch: warps x kTeamRedFloats
};
constexpr int kTeamRedFloats = 16;  // partial sums a warp hands over at once

// The calling thread's team when the block's warps form teams of `warps` (a divisor of the block's
// warp count); red: the block's scratch, kGemvWarps x kTeamRedFloats floats.
__device__ __forceinline__ Team BlockTeam(int warps, float *red) {
  const int wb = static_cast<int>(threadIdx.x >> 5);
  return {static_cast<int>(threadIdx.x & 31), wb % warps, warps, red + (wb - wb % warps) * kTeamRedFloats};
}

// The calling thread's team among the teams of every block along x.
__device__ __forceinline__ int64_t TeamIndex(int warps) {
  return (static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) / warps;
}

// The exact float of byte k of v less `bias` (an integer below 256; k a compile-time constant): the
// byte as the low mantissa bits of 2^23, less 2^23 + bias (a permute and an add instead of a
// quarter-rate integer conversion).
__device__ __forceinline__ float ByteAsFloat(uint32_t v, int k, float bias = 0.0f) {
  return __int_as_float(static_cast<int>(__byte_perm(v, 0x4b000000u, 0x7540u | k))) - (8388608.0f + bias);
}

// Q4_K rows, float x: lane l of team warp w takes the 16 code bytes 16 (l % 8).. of super-blocks
// l / 8 + 4 w, then 4 W further each time (one 16-byte load for the header, one for the codes):
// 16 weights of sub-block 2c (low nibbles) and the same 16 positions of sub-block 2c + 1 (high
// nibbles), c = (l % 8) / 2. Each sub-block's scale and offset factor out of its dot: (d sc) Σ q x -
// (dmin m) Σ x, so a weight costs a permute, an add and one fused multiply-add per token. Rows must
// be 16-byte aligned.
template <int NT, int R>
__device__ __forceinline__ void RowDotsQ4K(const uint8_t *const (&rows)[R], const float *x, int64_t cols,
                                           const Team &tm, float (&acc)[R][NT]) {
  const int64_t n_sb = cols / 256;
  const int part = tm.lane & 7, c = part >> 1;
  const int e0 = 64 * c + 16 * (part & 1);  // the lane's first element in sub-block 2c; 2c + 1 at +32
#pragma unroll(NT == 1 || R * NT <= 2 ? 2 : 1)
  for (int64_t sb = (tm.lane >> 3) + 4 * tm.warp; sb < n_sb; sb += 4 * tm.warps) {
    uint4 q[R];
    float dl[R][2], ml[R][2];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const uint8_t *b = rows[m] + sb * 144;
      const uint4 h = __ldg(reinterpret_cast<const uint4 *>(b));
      q[m] = __ldg(reinterpret_cast<const uint4 *>(b + 16) + part);
      // Scales of sub-blocks j = 2c, 2c + 1 (lib/quant: 6-bit sc and m, packed over 12 bytes).
      const float d = HalfBits(static_cast<uint16_t>(h.x & 0xffffu)), dmin = HalfBits(static_cast<uint16_t>(h.x >> 16));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t sc, mn;
        K4ScaleMin(h, 2 * c + i, &sc, &mn);
        dl[m][i] = __fmul_rn(d, static_cast<float>(sc));
        ml[m][i] = __fmul_rn(dmin, static_cast<float>(mn));
      }
    }
    const float *xs = x + sb * 256 + e0;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float xa[16], xb[16];
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(xs + t * cols) + v);
        const float4 b = __ldg(reinterpret_cast<const float4 *>(xs + t * cols + 32) + v);
        xa[4 * v] = a.x; xa[4 * v + 1] = a.y; xa[4 * v + 2] = a.z; xa[4 * v + 3] = a.w;
        xb[4 * v] = b.x; xb[4 * v + 1] = b.y; xb[4 * v + 2] = b.z; xb[4 * v + 3] = b.w;
      }
      float sa = 0.f, sb2 = 0.f;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        sa = __fadd_rn(sa, xa[k]);
        sb2 = __fadd_rn(sb2, xb[k]);
      }
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const uint32_t words[4] = {q[m].x, q[m].y, q[m].z, q[m].w};
        float pa = 0.f, pb = 0.f;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const uint32_t lo = words[v] & 0x0f0f0f0fu, hi = (words[v] >> 4) & 0x0f0f0f0fu;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            pa = fmaf(ByteAsFloat(lo, k), xa[4 * v + k], pa);
            pb = fmaf(ByteAsFloat(hi, k), xb[4 * v + k], pb);
          }
        }
        float s = acc[m][t];
        s = fmaf(dl[m][0], pa, s);
        s = fmaf(-ml[m][0], sa, s);
        s = fmaf(dl[m][1], pb, s);
        s = fmaf(-ml[m][1], sb2, s);
        acc[m][t] = s;
      }
    }
  }
}

// Adds row[m] · x[t] into acc[m][t] for R rows of the same shape and NT tokens (x rows `cols`
// apart). Q4_K takes its own walk above (rows not 16-byte aligned take this one). Each row is
// walked in groups of 8 elements, lane l of team warp w taking groups 32 w + l, then 32 W further each time:
// neighbouring lanes read neighbouring bytes, so each load instruction of the warp covers one
// contiguous span of a row (coalesced). The R rows are walked together so their loads are in flight
// at once; a (row, token) sum is formed in the same order for every R and NT.
template <class C, int NT, int R>
__device__ __forceinline__ void RowDots(const uint8_t *const (&rows)[R], const float *x, int64_t cols, const Team &tm,
                                        float (&acc)[R][NT]) {
  if constexpr (std::is_same_v<C, Q4_K>) {
    bool aligned = true;
#pragma unroll
    for (int m = 0; m < R; ++m) aligned = aligned && (reinterpret_cast<uintptr_t>(rows[m]) & 15u) == 0;
    if (aligned) {
      RowDotsQ4K<NT, R>(rows, x, cols, tm, acc);
      return;
    }
  }
  const int64_t n_groups = cols / kGroupElems;
  // More groups in flight where few tokens and rows leave registers to spare (decode).
#pragma unroll(NT * R <= 2 ? 4 : 2)
  for (int64_t gi = tm.warp * 32 + tm.lane; gi < n_groups; gi += 32 * tm.warps) {
    // Q8_0: the codes as integer-valued floats (a permute and an add a weight), each group's dot
    // scaled by its block's d once. Other codecs: the weights decoded as lib/quant does.
    constexpr bool kQ8 = std::is_same_v<C, Q8_0>;
    const int g = static_cast<int>(gi % kGroupsPerItem);
    float w[R][8], d[R];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      if constexpr (kQ8) {
        const uint8_t *b = rows[m] + (gi >> 2) * 34;
        d[m] = HalfBits(LoadU16(b));
        const uint2 v = Load8Unaligned(b + 2 + 8 * (gi & 3));
        const uint32_t u0 = v.x ^ 0x80808080u, u1 = v.y ^ 0x80808080u;  // q + 128, as unsigned bytes
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w[m][k] = ByteAsFloat(u0, k, 128.0f);
          w[m][k + 4] = ByteAsFloat(u1, k, 128.0f);
        }
      } else {
        const typename C::Item item = C::Prepare(rows[m], gi / kGroupsPerItem);
        C::Group(item, g, w[m]);
      }
    }
    const float *xg = x + gi * kGroupElems;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 a = __ldg(reinterpret_cast<const float4 *>(xg + t * cols));
      const float4 b = __ldg(reinterpret_cast<const float4 *>(xg + t * cols + 4));
#pragma unroll
      for (int m = 0; m < R; ++m) {
        if constexpr (kQ8) {
          float p = w[m][0] * a.x;
          p = fmaf(w[m][1], a.y, p); p = fmaf(w[m][2], a.z, p); p = fmaf(w[m][3], a.w, p);
          p = fmaf(w[m][4], b.x, p); p = fmaf(w[m][5], b.y, p); p = fmaf(w[m][6], b.z, p); p = fmaf(w[m][7], b.w, p);
          acc[m][t] = fmaf(d[m], p, acc[m][t]);
        } else {
          float s = acc[m][t];
          s = fmaf(w[m][0], a.x, s); s = fmaf(w[m][1], a.y, s); s = fmaf(w[m][2], a.z, s); s = fmaf(w[m][3], a.w, s);
          s = fmaf(w[m][4], b.x, s); s = fmaf(w[m][5], b.y, s); s = fmaf(w[m][6], b.z, s); s = fmaf(w[m][7], b.w, s);
          acc[m][t] = s;
        }
      }
    }
  }
}

// Combines the lanes' partial sums in a fixed butterfly order (every lane gets the total).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int N>
constexpr int Log2Of() {
  return N <= 1 ? 0 : 1 + Log2Of<N / 2>();
}

// The team's totals of v[i], N a power of two the scratch holds: lane i < N of team warp 0 returns
// the total of v[i] (other lanes: unspecified). Each warp adds its lanes in WarpSum's butterfly --
// lanes 16, 8, 4, 2, 1 apart, the same sums in the same order, so the same bits -- but hands half of
// its values on at each of the first log2 N levels (each lane keeps the half its partner does not),
// N - 1 shuffles instead of 5 N; then the warps' totals are added in warp order. With several warps
// a team it synchronises the block, so every warp of the block must call it alike.
template <int N>
__device__ __forceinline__ float TeamTotals(float (&v)[N], const Team &tm) {
  static_assert(N >= 1 && (N & (N - 1)) == 0 && N <= kTeamRedFloats, "a power of two the scratch holds");
  constexpr int kLog = Log2Of<N>(), kShift = 5 - kLog;  // value k ends on lanes k << kShift ..
#pragma unroll
  for (int st = 0; st < kLog; ++st) {
    const int o = 16 >> st, half = (N >> st) / 2;
    const bool upper = (tm.lane & o) != 0;  // this lane keeps the upper half of its values
#pragma unroll
    for (int k = 0; k < half; ++k) {
      const float keep = upper ? v[k + half] : v[k], pass = upper ? v[k] : v[k + half];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, pass, o);
    }
  }
  float total = v[0];
#pragma unroll
  for (int st = kLog; st < 5; ++st) total += __shfl_xor_sync(0xffffffffu, total, 16 >> st);
  if (tm.warps == 1) return __shfl_sync(0xffffffffu, total, (tm.lane % N) << kShift);
  if ((tm.lane & ((1 << kShift) - 1)) == 0) tm.red[tm.warp * kTeamRedFloats + (tm.lane >> kShift)] = total;
  __syncthreads();
  float sum = 0.f;
  if (tm.warp == 0 && tm.lane < N) {
    sum = tm.red[tm.lane];
    for (int w = 1; w < tm.warps; ++w) sum += tm.red[w * kTeamRedFloats + tm.lane];
  }
  __syncthreads();  // the scratch is written again by the next call
  return sum;
}

// Rows a GEMV warp computes together. Every row needs all of x, read from L1 (4 bytes a weight per
// token: seven times a Q4_K weight's bytes); walking rows together reads each x load once for all
// of them, which is what bounds the rate of a quantized GEMV.
constexpr int kGemvRows = 4;

// Rows RowDots walks at once for NT tokens: all kGemvRows for one token; for more, whose x values
// fill the registers, fewer (a row's sum is the same bits either way).
template <int NT>
constexpr int RowsAtOnce() {
  return NT >= 4 ? 1 : NT == 2 ? 2 : kGemvRows;
}

// Asks for the team's weight bytes [p, p + n) to be brought into L2, a 128-byte line a lane at a
// time (a hint: no value, no fault). The GEMV kernels call it before dev::AwaitPrior (launch.cuh),
// so a kernel started early fetches its weights while the kernel before it runs: no kernel writes
// weights, and a kernel with a copy or an event before it does not start early.
__device__ __forceinline__ void PrefetchL2(const uint8_t *p, uint64_t n, const Team &tm) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = first + 128 * static_cast<uintptr_t>(tm.warp * 32 + tm.lane); a < end;
       a += 128 * static_cast<uintptr_t>(tm.warps * 32)) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
}

// The team's rows r0 .. r0 + n - 1 (those below `rows`) of w, prefetched (PrefetchL2).
__device__ __forceinline__ void PrefetchRows(const uint8_t *w, uint64_t row_bytes, int64_t r0, int n, int64_t rows,
                                             const Team &tm) {
  if (r0 < rows) PrefetchL2(w + r0 * row_bytes, static_cast<uint64_t>(min(r0 + n, rows) - r0) * row_bytes, tm);
}

// rows[m] · x[t] over the team (RowDots, TeamTotals): on lane m NT + t of team warp 0.
template <class C, int NT, int R>
__device__ __forceinline__ float TeamRowDots(const uint8_t *const (&rows)[R], const float *x, int64_t cols,
                                             const Team &tm) {
  float acc[R][NT];
#pragma unroll
  for (int m = 0; m < R; ++m) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[m][t] = 0.f;
  }
  RowDots<C, NT, R>(rows, x, cols, tm, acc);
  return TeamTotals(reinterpret_cast<float(&)[R * NT]>(acc), tm);
}

// Writes a team walk's totals (on lane m NT + t of team warp 0, as TeamRowDots leaves them): y row
// r0 + m of token t, rows below `rows` only.
template <int NT, int R>
__device__ __forceinline__ void PutRows(float total, int64_t r0, int64_t rows, float *y, int64_t y_stride,
                                        const Team &tm) {
  const int m = tm.lane / NT, t = tm.lane % NT;
  if (tm.warp == 0 && tm.lane < R * NT && r0 + m < rows) y[t * y_stride + r0 + m] = total;
}

// y rows r0 .. r0 + TR - 1 (those below `rows`) = rows of w · x for NT tokens (x rows `cols` apart,
// y rows `y_stride` apart). Rows past the end read the last row again and are not written. TR (the
// team's rows: kGemvRows, or 1 to spread a short matrix over more teams) changes no row's bits.
template <class C, int NT, int TR = kGemvRows>
__device__ __forceinline__ void GemvRows(const uint8_t *w, uint64_t row_bytes, int64_t r0, int64_t rows, int64_t cols,
                                         const float *x, float *y, int64_t y_stride, const Team &tm) {
  static_assert(TR == 1 || TR == kGemvRows, "a team takes one row or kGemvRows");
  constexpr int RB = RowsAtOnce<NT>() < TR ? RowsAtOnce<NT>() : TR;
#pragma unroll 1
  for (int b = 0; b < TR; b += RB) {
    const uint8_t *rp[RB];
#pragma unroll
    for (int m = 0; m < RB; ++m) rp[m] = w + min(r0 + b + m, rows - 1) * row_bytes;
    PutRows<NT, RB>(TeamRowDots<C, NT, RB>(rp, x, cols, tm), r0 + b, rows, y, y_stride, tm);
  }
}

// A group of a GroupByExpert plan that a grouped kernel's block serves: its expert and its grouped
// rows [t0, t1).
struct PlanGroup {
  int e;
  int64_t t0, t1;
};

// Calls body(group) for the groups of the plan that this block serves: g = blockIdx.y, then every
// gridDim.y-th further, while g < plan[0] (a grid of fewer rows than n_max covers every group, a
// block taking several), leaving out experts flagged in skip (the CPU computes them). Block-uniform.
// The plan is read after dev::AwaitPrior (the grouping kernel before writes it); a group's four
// plan entries are read at once (entries past plan[0] are in bounds, unspecified and unused), so a
// block waits one round trip for its group where it waited two.
template <class F>
__device__ __forceinline__ void ForBlockGroups(const int32_t *plan, int n_max, const uint8_t *skip, F &&body) {
  for (int g = static_cast<int>(blockIdx.y); g < n_max; g += static_cast<int>(gridDim.y)) {
    const int n = plan[0], e = plan[1 + g], t0 = plan[1 + n_max + g], t1 = plan[2 + n_max + g];
    if (g >= n) return;
    if (skip != nullptr && skip[e] != 0) continue;
    body(PlanGroup{e, t0, t1});
  }
}

// Calls chunk(nt, t) for the tokens [t0, t1) in chunks of 8, 4, 2 and 1 (as Gemv splits a batch),
// none over kMaxNT tokens.
template <int kMaxNT, class F>
__device__ __forceinline__ void ForChunks(int64_t t0, int64_t t1, F &&chunk) {
  for (int64_t t = t0; t < t1;) {
    const int64_t left = t1 - t;
    if constexpr (kMaxNT >= 8) {
      if (left >= 8) {
        chunk(std::integral_constant<int, 8>(), t);
        t += 8;
        continue;
      }
    }
    if constexpr (kMaxNT >= 4) {
      if (left >= 4) {
        chunk(std::integral_constant<int, 4>(), t);
        t += 4;
        continue;
      }
    }
    if constexpr (kMaxNT >= 2) {
      if (left >= 2) {
        chunk(std::integral_constant<int, 2>(), t);
        t += 2;
        continue;
      }
    }
    chunk(std::integral_constant<int, 1>(), t);
    t += 1;
  }
}

// silu(g) * u as the CPU backend forms it: (g / (1 + exp(-g))) * u, exp in double so it rounds as
// glibc's expf does.
__device__ __forceinline__ float SiluMul(float g, float u) {
  return (g / (1.0f + static_cast<float>(exp(-static_cast<double>(g))))) * u;
}

// Writes the SwiGLU of a team walk over PB gate/up row pairs (gate of pair i in row 2 i, up in
// 2 i + 1; totals as TeamRowDots leaves them): h row r0 + i of token t = silu(gate) * up, rows below
// `rows` only.
template <int NT, int PB>
__device__ __forceinline__ void PutSwiGlu(float total, int64_t r0, int64_t rows, float *h, const Team &tm) {
  const int i = tm.lane / NT, t = tm.lane % NT;  // the output this lane writes
  const float g = __shfl_sync(0xffffffffu, total, 2 * i * NT + t);
  const float u = __shfl_sync(0xffffffffu, total, (2 * i + 1) * NT + t);
  if (tm.warp == 0 && tm.lane < PB * NT && r0 + i < rows) h[t * rows + r0 + i] = SiluMul(g, u);
}

// Rows an expert SwiGLU warp computes together: kGemvRows / 2 rows of gate and of up.
constexpr int kSwiGluRows = kGemvRows / 2;

// h (NT, rows) rows r0 .. r0 + kSwiGluRows - 1 (those below `rows`) = silu(gate row · x) * (up row ·
// x) for NT tokens, gate and up rows read together: the fused first half of an expert
// (GemvSwiGluKernel and the grouped kernels).
template <class C, int NT>
__device__ __forceinline__ void SwiGluRows(const uint8_t *wg, const uint8_t *wu, uint64_t row_bytes, int64_t r0,
                                           int64_t rows, int64_t cols, const float *x, float *h, const Team &tm) {
  constexpr int RB = RowsAtOnce<NT>() < 2 ? 2 : RowsAtOnce<NT>(), PB = RB / 2;  // matrix rows, output rows at once
#pragma unroll 1
  for (int b = 0; b < kSwiGluRows; b += PB) {
    const uint8_t *rp[RB];
#pragma unroll
    for (int i = 0; i < PB; ++i) {
      const int64_t r = min(r0 + b + i, rows - 1);
      rp[2 * i] = wg + r * row_bytes;
      rp[2 * i + 1] = wu + r * row_bytes;
    }
    PutSwiGlu<NT, PB>(TeamRowDots<C, NT, RB>(rp, x, cols, tm), r0 + b, rows, h, tm);
  }
}

}  // namespace strata::cuda::dev

namespace strata::cuda {

// STRATA_CUDA_GROUP_CHUNK=1|2|4: the grouped kernels' largest token chunk at most that (a group of
// more tokens takes more chunks; each token's result is the same), to measure the chunk sizes
// against sessions' small groups. 8 (the default) otherwise.
inline int64_t GroupChunkCap() {
  const int64_t v = tunables::Get().cuda_group_chunk;
  return v == 1 || v == 2 || v == 4 ? v : 8;
}

// Calls run(integral_constant n) with n the largest chunk a group of at most n_tok tokens is taken
// in (8 when n_tok is unknown, < 0): a one-token step then runs kernels holding only the one-token
// row dot, whose registers leave room for more warps than the 8-token one's.
template <class F>
void WithMaxChunk(int64_t n_tok, F &&run) {
  const int64_t cap = GroupChunkCap();
  if (n_tok < 0 || n_tok > cap) n_tok = cap;
  if (n_tok >= 8) {
    run(std::integral_constant<int, 8>());
  } else if (n_tok >= 4) {
    run(std::integral_constant<int, 4>());
  } else if (n_tok >= 2) {
    run(std::integral_constant<int, 2>());
  } else {
    run(std::integral_constant<int, 1>());
  }
}

// Up to kGemvManyMax matrices of one codec and column count over one input, by value. Kernels read
// it in place (__grid_constant__): indexed by blockIdx.y, a by-value copy would be made in every
// thread's local memory first.
struct ManyArgs {
  const uint8_t *w[kGemvManyMax];
  uint64_t row_bytes[kGemvManyMax];
  int64_t rows[kGemvManyMax];
  float *y[kGemvManyMax];
};

// The table of n checked matrices of one codec and column count and their outputs; *max_rows the
// most rows of them.
inline absl::Status FillManyArgs(const char *what, const DeviceMatrix *ws, float *const *ys, int n, ManyArgs *a,
                                 int64_t *max_rows) {
  if (n <= 0 || n > kGemvManyMax) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s over %d matrices", what, n);
  *a = ManyArgs{};
  *max_rows = 0;
  for (int m = 0; m < n; ++m) {
    STRATA_RETURN_IF_ERROR(CheckMatrix(ws[m]));
    if (ws[m].type != ws[0].type || ws[m].cols != ws[0].cols) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s needs matrices of one codec and column count", what);
    }
    if (ys[m] == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV output is null");
    a->w[m] = static_cast<const uint8_t *>(ws[m].data);
    a->row_bytes[m] = ws[m].row_bytes;
    a->rows[m] = ws[m].rows;
    a->y[m] = ys[m];
    *max_rows = std::max(*max_rows, ws[m].rows);
  }
  return absl::OkStatus();
}

// Blocks of kGemvWarps warps over `rows`, `per_team` rows a team of team_warps warps.
inline unsigned RowBlocks(int64_t rows, int per_team, int team_warps) {
  const int64_t per_block = int64_t{dev::kGemvWarps} / team_warps * per_team;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

}  // namespace strata::cuda
