// GEMV with 8-bit activations: x quantized once per call in the CPU backend's q8 blocks (32
// elements for Q8_0, 256 with 16-element partial sums for the K-quants), then each weight block
// dotted with the activation codes by integer dot products (dp4a: four multiply-adds an
// instruction), scaled in float once per block. Against the float-activation GEMV this cuts the
// instructions per weight several-fold and the activation bytes read per token four-fold.
// The integer sums are exact, so a result equals the CPU backend's q8 mode up to the order of the
// float sums of block products.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/gemv.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/q8act.cuh"
#include "lib/quant/codec.h"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

using dev::kGemvRows;
using dev::kGemvWarps;
using TypeIdInt = uint32_t;  // a TypeId as a template argument

using dev::QuantizeOne;
using dev::RowOf;
using dev::XRow;

// ---- Quantization -----------------------------------------------------------------------------------

// Block (c, r): elements 256 c .. 256 c + 255 of row r, a thread an element. Block32: a warp a
// block; block256: the whole thread block one block.
template <int kBlock>
__global__ void __launch_bounds__(256) QuantizeQ8Kernel(const float *__restrict__ x, int64_t cols, uint8_t *xq,
                                                        int64_t row_bytes) {
  dev::AwaitPrior();
  __shared__ float warp_max[8];
  dev::QuantizeStretch<kBlock>(x, cols, xq, row_bytes, blockIdx.y, blockIdx.x, warp_max);
}

// out = d q per element, the values the CPU's generic q8 dot multiplies weights by (same grid as
// QuantizeQ8Kernel). out may be x: a thread reads its element before any thread writes.
template <int kBlock>
__global__ void __launch_bounds__(256) RoundQ8Kernel(const float *x, int64_t cols, float *out) {
  dev::AwaitPrior();
  __shared__ float warp_max[8];
  const int64_t r = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  const int warp = threadIdx.x >> 5;
  if (kBlock == 32 && static_cast<int64_t>(blockIdx.x) * 256 + 32 * warp >= cols) return;  // warp-uniform
  int q;
  float d;
  QuantizeOne<kBlock>(i < cols ? x[r * cols + i] : 0.f, warp_max, &q, &d);
  if (i < cols) out[r * cols + i] = __fmul_rn(d, static_cast<float>(q));
}

// ---- Row dots ------------------------------------------------------------------------------------------

__device__ __forceinline__ int Dp4a(uint32_t a, uint32_t b, int c) {
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
}

// Q8_0 rows against block32 codes: lane l of team warp w takes 8-element groups 32 w + l, then
// 32 W further each time (as RowDots); a group's integer dot is scaled by d_w d_x.
template <int NT, int R>
__device__ __forceinline__ void RowDotsQ8_0(const uint8_t *const (&rows)[R], const XRow (&x)[NT], int64_t cols,
                                            const dev::Team &tm, float (&acc)[R][NT]) {
  const int64_t n_groups = cols / 8;
#pragma unroll(NT * R <= 2 ? 4 : 2)
  for (int64_t gi = tm.warp * 32 + tm.lane; gi < n_groups; gi += 32 * tm.warps) {
    uint2 w[R];
    float dw[R];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const uint8_t *b = rows[m] + (gi >> 2) * 34;
      dw[m] = dev::HalfBits(dev::LoadU16(b));
      w[m] = dev::Load8Unaligned(b + 2 + 8 * (gi & 3));
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint2 a = __ldg(reinterpret_cast<const uint2 *>(x[t].q) + gi);
      const float dx = __ldg(x[t].d + (gi >> 2));
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const int s = Dp4a(w[m].y, a.y, Dp4a(w[m].x, a.x, 0));
        acc[m][t] = fmaf(__fmul_rn(dw[m], dx), static_cast<float>(s), acc[m][t]);
      }
    }
  }
}

// Q4_K rows against block256 codes, the super-block walk of RowDotsQ4K (gemv.cuh): a lane's 16 code
// bytes hold 16 weights of sub-block 2c (low nibbles) and the same positions of 2c + 1 (high); per
// token, sc_2c Σ q x + sc_2c+1 Σ q x and m_2c bsum + m_2c+1 bsum are integers, scaled by d d_x and
// dmin d_x. One token (or one row pair of two) keeps two super-block steps in flight, as the float
// walk does: an expert's 2,048 columns are two steps a lane, each a memory round trip otherwise.
template <int NT, int R>
__device__ __forceinline__ void RowDotsQ4_K(const uint8_t *const (&rows)[R], const XRow (&x)[NT], int64_t cols,
                                            const dev::Team &tm, float (&acc)[R][NT]) {
  const int64_t n_sb = cols / 256;
  const int part = tm.lane & 7, c = part >> 1;
  const int e0 = 64 * c + 16 * (part & 1);
#pragma unroll(NT == 1 || R * NT <= 2 ? 2 : 1)
  for (int64_t sb = (tm.lane >> 3) + 4 * tm.warp; sb < n_sb; sb += 4 * tm.warps) {
    uint4 q[R];
    int sc[R][2], mn[R][2];
    float d[R], dmin[R];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const uint8_t *b = rows[m] + sb * 144;
      const uint4 h = __ldg(reinterpret_cast<const uint4 *>(b));
      q[m] = __ldg(reinterpret_cast<const uint4 *>(b + 16) + part);
      d[m] = dev::HalfBits(static_cast<uint16_t>(h.x & 0xffffu));
      dmin[m] = dev::HalfBits(static_cast<uint16_t>(h.x >> 16));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t s, n;
        dev::K4ScaleMin(h, 2 * c + i, &s, &n);
        sc[m][i] = static_cast<int>(s);
        mn[m][i] = static_cast<int>(n);
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int8_t *xs = x[t].q + sb * 256 + e0;
      const uint4 xa = __ldg(reinterpret_cast<const uint4 *>(xs));
      const uint4 xb = __ldg(reinterpret_cast<const uint4 *>(xs + 32));
      const float dx = __ldg(x[t].d + sb);
      const auto *bs = static_cast<const int16_t *>(x[t].s) + sb * 16;
      const int bsa = __ldg(bs + e0 / 16), bsb = __ldg(bs + (e0 + 32) / 16);
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const uint32_t words[4] = {q[m].x, q[m].y, q[m].z, q[m].w};
        const uint32_t xaw[4] = {xa.x, xa.y, xa.z, xa.w}, xbw[4] = {xb.x, xb.y, xb.z, xb.w};
        int pa = 0, pb = 0;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          pa = Dp4a(words[v] & 0x0f0f0f0fu, xaw[v], pa);
          pb = Dp4a((words[v] >> 4) & 0x0f0f0f0fu, xbw[v], pb);
        }
        const int dot = sc[m][0] * pa + sc[m][1] * pb, mins = mn[m][0] * bsa + mn[m][1] * bsb;
        float s = acc[m][t];
        s = fmaf(__fmul_rn(d[m], dx), static_cast<float>(dot), s);
        s = fmaf(-__fmul_rn(dmin[m], dx), static_cast<float>(mins), s);
        acc[m][t] = s;
      }
    }
  }
}

template <TypeIdInt kType>
constexpr int BlockOf() {
  return kType == static_cast<TypeIdInt>(quant::TypeId::kQ8_0) ? 32 : 256;
}

// rows[m] · x[t] over the team (as TeamRowDots, gemv.cuh): on lane m NT + t of team warp 0.
template <TypeIdInt kType, int NT, int R>
__device__ __forceinline__ float TeamRowDotsQ8(const uint8_t *const (&rows)[R], const XRow (&x)[NT], int64_t cols,
                                               const dev::Team &tm) {
  float acc[R][NT];
#pragma unroll
  for (int m = 0; m < R; ++m) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[m][t] = 0.f;
  }
  if constexpr (BlockOf<kType>() == 32) {
    RowDotsQ8_0<NT, R>(rows, x, cols, tm, acc);
  } else {
    RowDotsQ4_K<NT, R>(rows, x, cols, tm, acc);
  }
  return dev::TeamTotals(reinterpret_cast<float(&)[R * NT]>(acc), tm);
}

template <TypeIdInt kType, int NT>
__device__ __forceinline__ void RowsOf(const uint8_t *xq, int64_t xq_bytes, int64_t cols, XRow (&x)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) x[t] = RowOf(xq, xq_bytes, cols, BlockOf<kType>(), t);
}

// Rows t .. t + NT - 1 of a grouped input, read through tok (grouped row -> xq row) when given.
template <TypeIdInt kType, int NT>
__device__ __forceinline__ void GroupedRowsOf(const uint8_t *xq, int64_t xq_bytes, int64_t cols, int64_t t,
                                              const int32_t *tok, XRow (&x)[NT]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) x[i] = RowOf(xq, xq_bytes, cols, BlockOf<kType>(), tok != nullptr ? tok[t + i] : t + i);
}

// y rows r0 .. r0 + kGemvRows - 1 (those below `rows`) for NT tokens, as GemvRows (gemv.cuh).
template <TypeIdInt kType, int NT>
__device__ __forceinline__ void GemvRowsQ8(const uint8_t *w, uint64_t row_bytes, int64_t r0, int64_t rows, int64_t cols,
                                           const uint8_t *xq, int64_t xq_bytes, float *y, const dev::Team &tm) {
  constexpr int RB = dev::RowsAtOnce<NT>();
  XRow x[NT];
  RowsOf<kType, NT>(xq, xq_bytes, cols, x);
#pragma unroll 1
  for (int b = 0; b < kGemvRows; b += RB) {
    const uint8_t *rp[RB];
#pragma unroll
    for (int m = 0; m < RB; ++m) rp[m] = w + min(r0 + b + m, rows - 1) * row_bytes;
    dev::PutRows<NT, RB>(TeamRowDotsQ8<kType, NT, RB>(rp, x, cols, tm), r0 + b, rows, y, rows, tm);
  }
}

// h rows r0 .. r0 + kSwiGluRows - 1 = silu(gate · x) * (up · x), as SwiGluRows (gemv.cuh).
template <TypeIdInt kType, int NT>
__device__ __forceinline__ void SwiGluRowsQ8(const uint8_t *wg, const uint8_t *wu, uint64_t row_bytes, int64_t r0,
                                             int64_t rows, int64_t cols, const XRow (&x)[NT], float *h,
                                             const dev::Team &tm) {
  constexpr int RB = dev::RowsAtOnce<NT>() < 2 ? 2 : dev::RowsAtOnce<NT>(), PB = RB / 2;
#pragma unroll 1
  for (int b = 0; b < dev::kSwiGluRows; b += PB) {
    const uint8_t *rp[RB];
#pragma unroll
    for (int i = 0; i < PB; ++i) {
      const int64_t r = min(r0 + b + i, rows - 1);
      rp[2 * i] = wg + r * row_bytes;
      rp[2 * i + 1] = wu + r * row_bytes;
    }
    dev::PutSwiGlu<NT, PB>(TeamRowDotsQ8<kType, NT, RB>(rp, x, cols, tm), r0 + b, rows, h, tm);
  }
}

// The grouped kernels of grouped.cu with 8-bit activations: block (x, g) computes group g's rows of
// block x over the group's tokens (xq rows in grouped order, or token rows read through tok), in
// chunks of 8, 4, 2 and 1.
template <TypeIdInt kType, int kMaxNT>
__global__ void __launch_bounds__(kGemvWarps * 32, dev::GroupedQ8MinBlocks<kMaxNT>())
    GroupedSwiGluQ8Kernel(const void *const *__restrict__ gate, const void *const *__restrict__ up,
                          uint64_t row_bytes, int64_t rows, int64_t cols, const int32_t *__restrict__ plan, int n_max,
                          const uint8_t *xq, int64_t xq_bytes, float *__restrict__ h, int team_warps,
                          const uint8_t *__restrict__ skip, const int32_t *__restrict__ tok) {
  dev::AwaitPrior();
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * dev::kSwiGluRows;
  dev::ForBlockGroups(plan, n_max, skip, [&](const dev::PlanGroup &pg) {
    const auto *wg = static_cast<const uint8_t *>(gate[pg.e]), *wu = static_cast<const uint8_t *>(up[pg.e]);
    dev::ForChunks<kMaxNT>(pg.t0, pg.t1, [&](auto nt, int64_t t) {
      constexpr int kNT = decltype(nt)::value;
      XRow x[kNT];
      GroupedRowsOf<kType, kNT>(xq, xq_bytes, cols, t, tok, x);
      SwiGluRowsQ8<kType, kNT>(wg, wu, row_bytes, r0, rows, cols, x, h + t * rows, tm);
    });
  });
}

template <TypeIdInt kType, int kMaxNT>
__global__ void __launch_bounds__(kGemvWarps * 32, dev::GroupedQ8MinBlocks<kMaxNT>())
    GroupedGemvQ8Kernel(const void *const *__restrict__ tab, uint64_t row_bytes, int64_t rows, int64_t cols,
                        const int32_t *__restrict__ plan, int n_max, const uint8_t *xq, int64_t xq_bytes,
                        float *__restrict__ y, int team_warps, const uint8_t *__restrict__ skip) {
  dev::AwaitPrior();
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * kGemvRows;
  dev::ForBlockGroups(plan, n_max, skip, [&](const dev::PlanGroup &pg) {
    const auto *w = static_cast<const uint8_t *>(tab[pg.e]);
    dev::ForChunks<kMaxNT>(pg.t0, pg.t1, [&](auto nt, int64_t t) {
      GemvRowsQ8<kType, decltype(nt)::value>(w, row_bytes, r0, rows, cols, xq + t * xq_bytes, xq_bytes,
                                             y + t * rows, tm);
    });
  });
}

template <TypeIdInt kType, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvQ8Kernel(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                                                int64_t rows, int64_t cols, const uint8_t *xq,
                                                                int64_t xq_bytes, float *__restrict__ y,
                                                                int team_warps) {
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * kGemvRows;
  dev::PrefetchRows(w, row_bytes, r0, kGemvRows, rows, tm);
  dev::AwaitPrior();
  GemvRowsQ8<kType, NT>(w, row_bytes, r0, rows, cols, xq, xq_bytes, y, tm);
}

template <TypeIdInt kType, int NT>
void LaunchGemvQ8(const DeviceMatrix &w, const uint8_t *xq, int64_t xq_bytes, float *y, cudaStream_t s) {
  const int tw = GemvTeamWarps(w.type, w.cols, w.rows);
  const int64_t per_block = int64_t{kGemvWarps} / tw * kGemvRows;
  const unsigned blocks = static_cast<unsigned>((w.rows + per_block - 1) / per_block);
  Launch(GemvQ8Kernel<kType, NT>, blocks, kGemvWarps * 32, 0, s, static_cast<const uint8_t *>(w.data), w.row_bytes,
         w.rows, w.cols, xq, xq_bytes, y, tw);
}

// Block (b, m): the rows of matrix m that block b of GemvQ8Kernel would compute.
template <TypeIdInt kType, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvManyQ8Kernel(const __grid_constant__ ManyArgs a, int64_t cols, const uint8_t *xq, int64_t xq_bytes,
                     int team_warps) {
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const int m = blockIdx.y;
  const int64_t block_r0 = static_cast<int64_t>(blockIdx.x) * kGemvWarps / team_warps * kGemvRows;
  if (block_r0 >= a.rows[m]) return;  // block-uniform
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * kGemvRows;
  dev::PrefetchRows(a.w[m], a.row_bytes[m], r0, kGemvRows, a.rows[m], tm);
  dev::AwaitPrior();
  GemvRowsQ8<kType, NT>(a.w[m], a.row_bytes[m], r0, a.rows[m], cols, xq, xq_bytes, a.y[m], tm);
}

// ---- On the tensor cores -----------------------------------------------------------------------------
// Q8_0 and Q4_K rows against 8-bit activation codes with 8-bit matrix-multiply tiles (mma m16n8k32:
// 16 rows x 8 tokens x 32 columns, exact int32 sums). A block of kMmaWarps warps takes 16 rows; warp w
// walks column steps w, w + kMmaWarps, ... (Q8_0: a 32-column block; Q4_K: a 256-column super-block),
// turns each step's integer sums into float as the codec's scales say and adds them in that order;
// the warps' sums are then added in warp order. Each (row, token) result goes through the same
// operations whatever the other tokens of the call, so a token's bits do not depend on its batch,
// and the tensor cores take 8 tokens for the instructions of one.
constexpr int kMmaRows = 16, kMmaWarps = 8, kMmaMaxTiles = 4;  // up to 32 tokens a launch

// d[i] = Σ_k a(row, k) b(k, token) for the fragment layout of mma.m16n8k32.row.col.s8: lane (g, c)
// = (lane / 4, lane % 4) holds a = {row g, row g + 8} x {k 4c..4c+3, k 16+4c..16+4c+3}, b = token g at
// the same k, and d = {row g, row g + 8} x {token 2c, 2c + 1}. A fragment's k positions only need to
// be the same ones in a and b, so lane c passes the 8 codes 8c..8c+7 of 32 columns as its two k words.
__device__ __forceinline__ void MmaS8(const uint32_t (&a)[4], uint2 b, int (&d)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}

// The activations lane (g, c) of a tile reads: token 8 i + g's codes (the b fragment) and tokens
// 8 i + 2c, 8 i + 2c + 1 (the d columns: their scales and sums).
template <int kTiles>
struct TileX {
  const int8_t *codes[kTiles];
  XRow cols[kTiles][2];
};

// Q8_0 (34 bytes / 32: f16 d | 32 codes): a step is one block, d_w d_x Σ q x.
struct TensorQ8_0 {
  static constexpr int kBlock = 32, kStep = 32;

  template <int kTiles>
  __device__ static void Tile(const uint8_t *wa, const uint8_t *wb, int64_t kb, int c, const TileX<kTiles> &x,
                              float (&acc)[kTiles][4]) {
    const uint8_t *pa = wa + kb * 34, *pb = wb + kb * 34;
    const float da = dev::HalfBits(dev::LoadU16(pa)), db = dev::HalfBits(dev::LoadU16(pb));
    const uint2 qa = dev::Load8Unaligned(pa + 2 + 8 * c), qb = dev::Load8Unaligned(pb + 2 + 8 * c);
    const uint32_t fa[4] = {qa.x, qb.x, qa.y, qb.y};
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      int s[4];
      MmaS8(fa, __ldg(reinterpret_cast<const uint2 *>(x.codes[i] + kb * 32 + 8 * c)), s);
      const float d0 = __ldg(x.cols[i][0].d + kb), d1 = __ldg(x.cols[i][1].d + kb);
      acc[i][0] = fmaf(__fmul_rn(da, d0), static_cast<float>(s[0]), acc[i][0]);
      acc[i][1] = fmaf(__fmul_rn(da, d1), static_cast<float>(s[1]), acc[i][1]);
      acc[i][2] = fmaf(__fmul_rn(db, d0), static_cast<float>(s[2]), acc[i][2]);
      acc[i][3] = fmaf(__fmul_rn(db, d1), static_cast<float>(s[3]), acc[i][3]);
    }
  }

  // Lane c of a quad: its 8 codes of block kb of row w against NT tokens, the block's sum over the
  // quad (exact), then Tile's float step. Every lane of the warp calls it (shuffles); in: kb is a
  // block of the row (quad-uniform).
  template <int NT>
  __device__ static void Quad(const uint8_t *w, int64_t kb, bool in, int c, const XRow (&x)[NT], float (&acc)[NT]) {
    const int64_t k = in ? kb : 0;
    const uint8_t *b = w + k * 34;
    const float dw = dev::HalfBits(dev::LoadU16(b));
    const uint2 q = dev::Load8Unaligned(b + 2 + 8 * c);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint2 xv = __ldg(reinterpret_cast<const uint2 *>(x[t].q + k * 32 + 8 * c));
      const float dx = __ldg(x[t].d + k);
      int s = Dp4a(q.y, xv.y, Dp4a(q.x, xv.x, 0));
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (in) acc[t] = fmaf(__fmul_rn(dw, dx), static_cast<float>(s), acc[t]);
    }
  }
};

// Q4_K (144 bytes / 256: f16 d | f16 dmin | 6-bit scales and mins of 8 sub-blocks | 128 nibble
// bytes, byte i of qs[32 j ..] holding element i of sub-block 2j low and of 2j + 1 high): a step is
// one super-block, d d_x Σ_s sc_s Σ q x - dmin d_x Σ_s m_s Σ x, both sums over sub-blocks integers
// (the activations' sums per 16 elements give Σ x).
struct TensorQ4_K {
  static constexpr int kBlock = 256, kStep = 256;
  static constexpr uint32_t kLow = 0x0f0f0f0fu;

  __device__ static void ScalesMins(const uint4 &h, int (&sc)[8], int (&mn)[8]) {
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a, b;
      dev::K4ScaleMin(h, s, &a, &b);
      sc[s] = static_cast<int>(a);
      mn[s] = static_cast<int>(b);
    }
  }
  // Σ_s m_s Σ x over super-block sb of a token (sums: its int16 per 16 elements, 4-byte aligned).
  __device__ static int Mins(const int (&mn)[8], const void *sums, int64_t sb) {
    const auto *p = static_cast<const uint32_t *>(sums) + sb * 8;
    int v = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint32_t u = __ldg(p + s);
      v += mn[s] * (static_cast<int>(static_cast<int16_t>(u & 0xffffu)) + static_cast<int>(static_cast<int16_t>(u >> 16)));
    }
    return v;
  }
  __device__ static void Step(float &acc, float d, float dmin, float dx, int dots, int mins) {
    acc = fmaf(__fmul_rn(d, dx), static_cast<float>(dots), acc);
    acc = fmaf(-__fmul_rn(dmin, dx), static_cast<float>(mins), acc);
  }

  template <int kTiles>
  __device__ static void Tile(const uint8_t *wa, const uint8_t *wb, int64_t sb, int c, const TileX<kTiles> &x,
                              float (&acc)[kTiles][4]) {
    const uint8_t *pa = wa + sb * 144, *pb = wb + sb * 144;
    const uint4 ha = __ldg(reinterpret_cast<const uint4 *>(pa)), hb = __ldg(reinterpret_cast<const uint4 *>(pb));
    uint2 qa[4], qb[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      qa[j] = __ldg(reinterpret_cast<const uint2 *>(pa + 16 + 32 * j + 8 * c));
      qb[j] = __ldg(reinterpret_cast<const uint2 *>(pb + 16 + 32 * j + 8 * c));
    }
    int sca[8], mna[8], scb[8], mnb[8];
    ScalesMins(ha, sca, mna);
    ScalesMins(hb, scb, mnb);
    const float da = dev::HalfBits(static_cast<uint16_t>(ha.x & 0xffffu)), dma = dev::HalfBits(static_cast<uint16_t>(ha.x >> 16));
    const float db = dev::HalfBits(static_cast<uint16_t>(hb.x & 0xffffu)), dmb = dev::HalfBits(static_cast<uint16_t>(hb.x >> 16));
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      int dots[4] = {};
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int j = s >> 1, sh = 4 * (s & 1);
        const uint32_t fa[4] = {(qa[j].x >> sh) & kLow, (qb[j].x >> sh) & kLow, (qa[j].y >> sh) & kLow,
                                (qb[j].y >> sh) & kLow};
        int d[4];
        MmaS8(fa, __ldg(reinterpret_cast<const uint2 *>(x.codes[i] + sb * 256 + 32 * s + 8 * c)), d);
        dots[0] += sca[s] * d[0];
        dots[1] += sca[s] * d[1];
        dots[2] += scb[s] * d[2];
        dots[3] += scb[s] * d[3];
      }
      const float d0 = __ldg(x.cols[i][0].d + sb), d1 = __ldg(x.cols[i][1].d + sb);
      Step(acc[i][0], da, dma, d0, dots[0], Mins(mna, x.cols[i][0].s, sb));
      Step(acc[i][1], da, dma, d1, dots[1], Mins(mna, x.cols[i][1].s, sb));
      Step(acc[i][2], db, dmb, d0, dots[2], Mins(mnb, x.cols[i][0].s, sb));
      Step(acc[i][3], db, dmb, d1, dots[3], Mins(mnb, x.cols[i][1].s, sb));
    }
  }

  // Lane c of a quad: elements 8c .. 8c + 7 of each sub-block of super-block sb of row w, weighted by
  // the sub-blocks' scales (an integer: summed over the quad it is Tile's dots exactly), then Tile's
  // float step. Every lane of the warp calls it (shuffles); in: sb is a super-block of the row.
  template <int NT>
  __device__ static void Quad(const uint8_t *w, int64_t sb, bool in, int c, const XRow (&x)[NT], float (&acc)[NT]) {
    const int64_t k = in ? sb : 0;
    const uint8_t *p = w + k * 144;
    const uint4 h = __ldg(reinterpret_cast<const uint4 *>(p));
    uint2 q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = __ldg(reinterpret_cast<const uint2 *>(p + 16 + 32 * j + 8 * c));
    int sc[8], mn[8];
    ScalesMins(h, sc, mn);
    const float d = dev::HalfBits(static_cast<uint16_t>(h.x & 0xffffu)), dmin = dev::HalfBits(static_cast<uint16_t>(h.x >> 16));
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int8_t *xs = x[t].q + k * 256 + 8 * c;
      int dots = 0;
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int j = s >> 1, sh = 4 * (s & 1);
        const uint2 xv = __ldg(reinterpret_cast<const uint2 *>(xs + 32 * s));
        dots += sc[s] * Dp4a((q[j].y >> sh) & kLow, xv.y, Dp4a((q[j].x >> sh) & kLow, xv.x, 0));
      }
      dots += __shfl_xor_sync(0xffffffffu, dots, 1);
      dots += __shfl_xor_sync(0xffffffffu, dots, 2);
      const int mins = Mins(mn, x[t].s, k);
      if (in) Step(acc[t], d, dmin, __ldg(x[t].d + k), dots, mins);
    }
  }
};

// A block of the tensor-core kernels takes rows r0 .. r0 + n - 1 of matrix m: false (block-uniform)
// when none is below the matrix's row count, else their weights are prefetched and the kernel
// before awaited.
__device__ __forceinline__ bool EnterRows(const ManyArgs &a, int m, int64_t r0, int n) {
  const int64_t rows = a.rows[m];
  if (r0 >= rows) return false;
  const uint64_t rb = a.row_bytes[m];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  dev::PrefetchL2(a.w[m] + r0 * rb, static_cast<uint64_t>(min(r0 + n, rows) - r0) * rb,
                  dev::Team{lane, warp, kMmaWarps, nullptr});
  dev::AwaitPrior();
  return true;
}

// Tokens 0 .. n - 1 (n <= 8 kTiles) of xq against matrix rows wa, wb (the lane's two rows of the
// block's 16): warp w's sums over column steps w, w + kMmaWarps, ... in acc.
template <class C, int kTiles>
__device__ __forceinline__ void MmaTile(const uint8_t *wa, const uint8_t *wb, int64_t cols, const uint8_t *xq,
                                        int64_t xq_bytes, int n, int warp, int g, int c, float (&acc)[kTiles][4]) {
  TileX<kTiles> x;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    x.codes[i] = RowOf(xq, xq_bytes, cols, C::kBlock, min(8 * i + g, n - 1)).q;
    x.cols[i][0] = RowOf(xq, xq_bytes, cols, C::kBlock, min(8 * i + 2 * c, n - 1));
    x.cols[i][1] = RowOf(xq, xq_bytes, cols, C::kBlock, min(8 * i + 2 * c + 1, n - 1));
  }
  const int64_t nb = cols / C::kStep;
#pragma unroll(C::kStep == 32 ? 4 : 1)
  for (int64_t kb = warp; kb < nb; kb += kMmaWarps) C::template Tile<kTiles>(wa, wb, kb, c, x, acc);
}

// acc into red[warp][token][row] (8 kTiles tokens), for the sum over warps in warp order.
template <int kTiles>
__device__ __forceinline__ void MmaSpill(const float (&acc)[kTiles][4], float *red, int warp, int g, int c) {
  constexpr int kTok = 8 * kTiles;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    float *p = red + warp * kTok * kMmaRows + (8 * i + 2 * c) * kMmaRows + g;
    p[0] = acc[i][0];
    p[kMmaRows] = acc[i][1];
    p[8] = acc[i][2];
    p[kMmaRows + 8] = acc[i][3];
  }
}

// Block (b, m): rows 16 b .. 16 b + 15 of matrix m for tokens 0 .. n_tok - 1 (n_tok <= 8 kTiles).
template <class C, int kTiles>
__global__ void __launch_bounds__(kMmaWarps * 32)
    MmaKernel(const __grid_constant__ ManyArgs a, int64_t cols, const uint8_t *xq, int64_t xq_bytes, int n_tok) {
  __shared__ float red[kMmaWarps * kMmaRows * 8 * kTiles];
  constexpr int kTok = 8 * kTiles;
  const int m = blockIdx.y;
  const int64_t rows = a.rows[m], r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  if (!EnterRows(a, m, r0, kMmaRows)) return;  // block-uniform
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const uint64_t rb = a.row_bytes[m];
  const uint8_t *wa = a.w[m] + min(r0 + g, rows - 1) * rb, *wb = a.w[m] + min(r0 + g + 8, rows - 1) * rb;
  float acc[kTiles][4] = {};
  MmaTile<C, kTiles>(wa, wb, cols, xq, xq_bytes, n_tok, warp, g, c, acc);
  MmaSpill<kTiles>(acc, red, warp, g, c);
  __syncthreads();
  for (int j = threadIdx.x; j < kTok * kMmaRows; j += kMmaWarps * 32) {
    const int t = j / kMmaRows, r = j % kMmaRows;
    if (t >= n_tok || r0 + r >= rows) continue;
    float v = red[j];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) v += red[w * kTok * kMmaRows + j];
    a.y[m][t * rows + r0 + r] = v;
  }
}

// 1 to kSmallTok tokens: MmaKernel's operations on dp4a, which read a row in coalesced sweeps where
// the mma fragments read 16 rows 32 bytes at a time. Lane quad j of a warp (lanes 4j .. 4j + 3)
// stands for the mma kernel's warp j: it takes steps j, j + 8, ... of the row, sums each step's
// integers over its four lanes (exact), scales and adds them as the mma kernel does (C::Quad); the
// quads' sums are then added in quad order. The same operations in the same order, so the same bits
// as a batch of any size. A warp walks one row, 8 steps at a time (Q8_0: 272 bytes, Q4_K: 1,152)
// with up to 8 such sweeps in flight: the sum chains fix how far a row's walk splits, so the small
// matrices (k and v, 512 rows) get their parallelism from a block per 8 rows and loads issued ahead.
constexpr int kSmallTok = 4, kSmallBlockRows = kMmaWarps;

template <class C, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32)
    SmallKernel(const __grid_constant__ ManyArgs a, int64_t cols, const uint8_t *xq, int64_t xq_bytes, int n_tok) {
  const int m = blockIdx.y;
  const int64_t rows = a.rows[m], block_r0 = static_cast<int64_t>(blockIdx.x) * kSmallBlockRows;
  if (!EnterRows(a, m, block_r0, kSmallBlockRows)) return;  // block-uniform
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = lane >> 2, c = lane & 3;
  const uint64_t rb = a.row_bytes[m];
  const int64_t r = block_r0 + warp;
  if (r >= rows) return;  // warp-uniform
  const uint8_t *wr = a.w[m] + r * rb;
  XRow x[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) x[t] = RowOf(xq, xq_bytes, cols, C::kBlock, min(t, n_tok - 1));
  float acc[NT] = {};
  const int64_t nb = cols / C::kStep;
#pragma unroll(C::kStep == 32 ? 8 : 2)
  for (int64_t kb0 = 0; kb0 < nb; kb0 += kMmaWarps) C::template Quad<NT>(wr, kb0 + j, kb0 + j < nb, c, x, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = __shfl_sync(0xffffffffu, acc[t], 0);
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) v += __shfl_sync(0xffffffffu, acc[t], 4 * w);
    if (lane == 0 && t < n_tok) a.y[m][t * rows + r] = v;
  }
}

// The products of a (n matrices of codec C) over n_tok tokens, in launches of up to 8 kMmaMaxTiles
// tokens (SmallKernel for up to kSmallTok).
template <class C>
void LaunchTensor(const ManyArgs &a, int n, int64_t max_rows, int64_t cols, const uint8_t *xq, int64_t xq_bytes,
                  int64_t n_tok, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((max_rows + kMmaRows - 1) / kMmaRows), static_cast<unsigned>(n));
  const dim3 small_grid(static_cast<unsigned>((max_rows + kSmallBlockRows - 1) / kSmallBlockRows),
                        static_cast<unsigned>(n));
  for (int64_t t0 = 0; t0 < n_tok; t0 += 8 * kMmaMaxTiles) {
    const int nt = static_cast<int>(std::min<int64_t>(n_tok - t0, 8 * kMmaMaxTiles));
    ManyArgs at = a;
    for (int k = 0; k < n; ++k) at.y[k] = a.y[k] + t0 * a.rows[k];
    auto *kernel = nt > 16 ? MmaKernel<C, 4>
                   : nt > 8 ? MmaKernel<C, 2>
                   : nt > kSmallTok ? MmaKernel<C, 1>
                   : nt > 2 ? SmallKernel<C, 4>
                   : nt > 1 ? SmallKernel<C, 2>
                            : SmallKernel<C, 1>;
    Launch(kernel, nt > kSmallTok ? grid : small_grid, kMmaWarps * 32, 0, s, at, cols, xq + t0 * xq_bytes, xq_bytes,
           nt);
  }
}

// Q8_0 or Q4_K (a codec Q8ActFor accepts).
void LaunchTensorQ8(quant::TypeId type, const ManyArgs &a, int n, int64_t max_rows, int64_t cols, const uint8_t *xq,
                    int64_t n_tok, cudaStream_t s) {
  const int64_t xb = Q8ActRowBytes(Q8ActFor(type), cols);
  if (type == quant::TypeId::kQ8_0) {
    LaunchTensor<TensorQ8_0>(a, n, max_rows, cols, xq, xb, n_tok, s);
  } else {
    LaunchTensor<TensorQ4_K>(a, n, max_rows, cols, xq, xb, n_tok, s);
  }
}

// ---- Prompt-sized expert groups on the tensor cores ------------------------------------------------
// A prompt gives each expert of a layer tens of tokens (512 tokens of 8 selections over 128 experts:
// ~32 a group). PromptMmaKernel runs every group of a layer in one launch: block (b, y) takes rows
// 16 b .. 16 b + 15 of the matrices of groups y, y + gridDim.y, ..., and walks a group's grouped rows
// in chunks of up to 32 tokens with MmaKernel's operations (the weight rows stay in L1 and L2 across
// chunks), so every (row, token) result has GemvQ8's tensor-core bits.

constexpr int kPromptRed = kMmaWarps * kMmaRows * 8 * kMmaMaxTiles;  // floats of one matrix's spill

// One chunk of n tokens (rows 0 .. n - 1 of xq and y, y of `rows` columns) for rows r0 .. r0 + 15:
// y = x · w0ᵀ, or with kSwiGlu silu(x · w0ᵀ) * (x · w1ᵀ). Every thread of the block calls it.
template <class C, int kTiles, bool kSwiGlu>
__device__ __forceinline__ void PromptChunk(const uint8_t *w0a, const uint8_t *w0b, const uint8_t *w1a,
                                            const uint8_t *w1b, int64_t cols, const uint8_t *xq, int64_t xq_bytes,
                                            int n, int64_t rows, int64_t r0, float *y, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  constexpr int kTok = 8 * kTiles;
  {
    float acc[kTiles][4] = {};
    MmaTile<C, kTiles>(w0a, w0b, cols, xq, xq_bytes, n, warp, g, c, acc);
    MmaSpill<kTiles>(acc, red, warp, g, c);
  }
  if constexpr (kSwiGlu) {
    float acc[kTiles][4] = {};
    MmaTile<C, kTiles>(w1a, w1b, cols, xq, xq_bytes, n, warp, g, c, acc);
    MmaSpill<kTiles>(acc, red + kPromptRed, warp, g, c);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kTok * kMmaRows; j += kMmaWarps * 32) {
    const int t = j / kMmaRows, r = j % kMmaRows;
    if (t >= n || r0 + r >= rows) continue;
    float v = red[j];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) v += red[w * kTok * kMmaRows + j];
    if constexpr (kSwiGlu) {
      const float *ru = red + kPromptRed;
      float u = ru[j];
#pragma unroll
      for (int w = 1; w < kMmaWarps; ++w) u += ru[w * kTok * kMmaRows + j];
      v = dev::SiluMul(v, u);
    }
    y[t * rows + r0 + r] = v;
  }
  __syncthreads();  // red is rewritten by the next chunk
}

// kDense: one matrix (dense) over n_tok tokens, group y the tokens 32 y .. 32 y + 31.
struct DenseRows {
  const void *w = nullptr;
  int64_t n_tok = 0;
};

template <class C, bool kSwiGlu, bool kDense>
__global__ void __launch_bounds__(kMmaWarps * 32)
    PromptMmaKernel(const __grid_constant__ PromptGroups p, const __grid_constant__ DenseRows dense, uint64_t rb,
                    int64_t rows, int64_t cols, const uint8_t *xq, int64_t xq_bytes, float *y) {
  __shared__ float red[(kSwiGlu ? 2 : 1) * kPromptRed];
  dev::AwaitPrior();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  if (r0 >= rows) return;  // block-uniform
  const int g = (threadIdx.x & 31) >> 2;
  const int64_t ra = min(r0 + g, rows - 1) * static_cast<int64_t>(rb), rb8 = min(r0 + g + 8, rows - 1) * static_cast<int64_t>(rb);
  for (int grp = blockIdx.y; grp < p.m; grp += gridDim.y) {
    int64_t f0, f1;
    const uint8_t *w0, *w1;
    if constexpr (kDense) {
      f0 = static_cast<int64_t>(grp) * 8 * kMmaMaxTiles;
      f1 = min(f0 + 8 * kMmaMaxTiles, dense.n_tok);
      w0 = w1 = static_cast<const uint8_t *>(dense.w);
    } else {
      f0 = p.span[2 * grp];
      f1 = p.span[2 * grp + 1];
      w0 = static_cast<const uint8_t *>(p.w0[grp]);
      w1 = kSwiGlu ? static_cast<const uint8_t *>(p.w1[grp]) : w0;
    }
    for (int64_t t0 = f0; t0 < f1; t0 += 8 * kMmaMaxTiles) {
      const int n = static_cast<int>(min(f1 - t0, static_cast<int64_t>(8 * kMmaMaxTiles)));
      const uint8_t *x = xq + t0 * xq_bytes;
      float *yt = y + t0 * rows;
      if (n > 16) {
        PromptChunk<C, 4, kSwiGlu>(w0 + ra, w0 + rb8, w1 + ra, w1 + rb8, cols, x, xq_bytes, n, rows, r0, yt, red);
      } else if (n > 8) {
        PromptChunk<C, 2, kSwiGlu>(w0 + ra, w0 + rb8, w1 + ra, w1 + rb8, cols, x, xq_bytes, n, rows, r0, yt, red);
      } else {
        PromptChunk<C, 1, kSwiGlu>(w0 + ra, w0 + rb8, w1 + ra, w1 + rb8, cols, x, xq_bytes, n, rows, r0, yt, red);
      }
    }
  }
}

// kDefault: STRATA_CUDA_Q8_TENSOR=1 or 0 puts every codec's products on the tensor cores or the
// GEMVs; unset, Q4_K on the tensor cores (as fast as its GEMV for one token, faster for batches)
// and Q8_0 on the GEMVs (its tensor-core kernels trail them for one session; bench/README.md).
bool OnTensorCores(Q8Kernels k, quant::TypeId type) {
  if (k != Q8Kernels::kDefault) return k == Q8Kernels::kTensor;
  const int64_t forced = tunables::Get().cuda_q8_tensor;
  return forced >= 0 ? forced == 1 : type == quant::TypeId::kQ4_K;
}

// Calls run(type constant) for the codec's kernels (a codec Q8ActFor accepts).
template <class F>
void WithQ8Type(quant::TypeId type, F &&run) {
  if (type == quant::TypeId::kQ8_0) {
    run(std::integral_constant<TypeIdInt, static_cast<TypeIdInt>(quant::TypeId::kQ8_0)>());
  } else {
    run(std::integral_constant<TypeIdInt, static_cast<TypeIdInt>(quant::TypeId::kQ4_K)>());
  }
}

absl::Status CheckQ8Grouped(const DeviceMatrix &shape, const int32_t *plan, int n_max, const void *xq, const void *y,
                            const char *what) {
  if (Q8ActFor(shape.type) == Q8Act::kNone) {
    const std::string name(quant::TypeName(static_cast<uint32_t>(shape.type)));
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no 8-bit-activation %s for %s", what, name.c_str());
  }
  if (n_max < 0 || n_max > 65535) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s over %d groups", what, n_max);
  if (n_max > 0 && (plan == nullptr || xq == nullptr || y == nullptr || (reinterpret_cast<uintptr_t>(xq) & 15u) != 0)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s: null or unaligned buffers", what);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GroupedSwiGluQ8(const GroupedExperts &e, const int32_t *plan, int n_max, const void *xq, float *hg,
                             cudaStream_t stream, int64_t n_tok, const uint8_t *skip, const int32_t *tok, int n_grid) {
  STRATA_RETURN_IF_ERROR(CheckGroupedExperts(e));
  STRATA_RETURN_IF_ERROR(CheckQ8Grouped(e.gate_shape, plan, n_max, xq, hg, "grouped SwiGLU"));
  STRATA_RETURN_IF_ERROR(CheckGroupGrid(n_max, n_grid, "grouped SwiGLU"));
  const DeviceMatrix &g = e.gate_shape;
  if (n_max > e.n_expert) return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped SwiGLU: %d groups of %d experts", n_max, e.n_expert);
  if (n_max == 0 || g.rows == 0) return absl::OkStatus();
  const int tw = GemvTeamWarps(g.type, g.cols, g.rows);
  const dim3 grid(RowBlocks(g.rows, dev::kSwiGluRows, tw), static_cast<unsigned>(n_grid > 0 ? n_grid : n_max));
  const int64_t xb = Q8ActRowBytes(Q8ActFor(g.type), g.cols);
  WithQ8Type(g.type, [&](auto type) {
    WithMaxChunk(n_tok, [&](auto nt) {
      Launch(GroupedSwiGluQ8Kernel<decltype(type)::value, decltype(nt)::value>, grid, kGemvWarps * 32, 0, stream,
             e.gate, e.up, g.row_bytes, g.rows, g.cols, plan, n_max, static_cast<const uint8_t *>(xq), xb, hg, tw,
             skip, tok);
    });
  });
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GroupedGemvQ8(const void *const *tab, const DeviceMatrix &shape, const int32_t *plan, int n_max,
                           const void *xq, float *y, cudaStream_t stream, int64_t n_tok, const uint8_t *skip,
                           int n_grid) {
  STRATA_RETURN_IF_ERROR(CheckQ8Grouped(shape, plan, n_max, xq, y, "grouped GEMV"));
  STRATA_RETURN_IF_ERROR(CheckGroupGrid(n_max, n_grid, "grouped GEMV"));
  if (n_max == 0 || shape.rows == 0) return absl::OkStatus();
  if (tab == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped GEMV: the pointer table is null");
  const int tw = GemvTeamWarps(shape.type, shape.cols, shape.rows);
  const dim3 grid(RowBlocks(shape.rows, kGemvRows, tw), static_cast<unsigned>(n_grid > 0 ? n_grid : n_max));
  const int64_t xb = Q8ActRowBytes(Q8ActFor(shape.type), shape.cols);
  WithQ8Type(shape.type, [&](auto type) {
    WithMaxChunk(n_tok, [&](auto nt) {
      Launch(GroupedGemvQ8Kernel<decltype(type)::value, decltype(nt)::value>, grid, kGemvWarps * 32, 0, stream, tab,
             shape.row_bytes, shape.rows, shape.cols, plan, n_max, static_cast<const uint8_t *>(xq), xb, y, tw, skip);
    });
  });
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

bool Q8RowsAligned(const DeviceMatrix &w) {
  return Q8ActFor(w.type) != Q8Act::kBlock256 || (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

Q8Act Q8ActFor(quant::TypeId type) {
  switch (type) {
    case quant::TypeId::kQ8_0: return Q8Act::kBlock32;
    case quant::TypeId::kQ4_K: return Q8Act::kBlock256;
    default: return Q8Act::kNone;
  }
}

int64_t Q8ActRowBytes(Q8Act f, int64_t cols) {
  if (f == Q8Act::kNone) return 0;
  const int block = f == Q8Act::kBlock32 ? 32 : 256;
  const int64_t sums = f == Q8Act::kBlock32 ? (cols / 32) * 4 : (cols / 16) * 2;
  return (cols + (cols / block) * 4 + sums + 15) / 16 * 16;
}

absl::Status QuantizeActivationsQ8(Q8Act f, const float *x, int64_t n_tok, int64_t cols, void *xq,
                                   cudaStream_t stream) {
  const int block = f == Q8Act::kBlock32 ? 32 : 256;
  if (f == Q8Act::kNone || n_tok < 0 || cols <= 0 || cols % block != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit activations of %lld x %lld (blocks of %d)",
                  static_cast<long long>(n_tok), static_cast<long long>(cols), block);
  }
  if (n_tok == 0) return absl::OkStatus();
  if (x == nullptr || xq == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit activations: null buffer");
  auto *out = static_cast<uint8_t *>(xq);
  const int64_t rb = Q8ActRowBytes(f, cols);
  constexpr int64_t kMaxRows = 65535;  // a launch's grid rows
  for (int64_t r0 = 0; r0 < n_tok; r0 += kMaxRows) {
    const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(std::min(kMaxRows, n_tok - r0)));
    const float *xr = x + r0 * cols;
    uint8_t *o = out + r0 * rb;
    if (f == Q8Act::kBlock32) {
      Launch(QuantizeQ8Kernel<32>, grid, 256, 0, stream, xr, cols, o, rb);
    } else {
      Launch(QuantizeQ8Kernel<256>, grid, 256, 0, stream, xr, cols, o, rb);
    }
    STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  return absl::OkStatus();
}

absl::Status RoundActivationsQ8(int block, const float *x, int64_t n_tok, int64_t cols, float *out,
                                cudaStream_t stream) {
  if ((block != 32 && block != 256) || n_tok < 0 || n_tok > 65535 || cols <= 0 || cols % block != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit rounding of %lld x %lld (blocks of %d)",
                  static_cast<long long>(n_tok), static_cast<long long>(cols), block);
  }
  if (n_tok == 0) return absl::OkStatus();
  if (x == nullptr || out == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit rounding: null buffer");
  const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(n_tok));
  if (block == 32) {
    Launch(RoundQ8Kernel<32>, grid, 256, 0, stream, x, cols, out);
  } else {
    Launch(RoundQ8Kernel<256>, grid, 256, 0, stream, x, cols, out);
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

namespace {

// The arguments GemvQ8 and PromptGemvQ8 share: false when there is nothing to compute.
absl::StatusOr<bool> CheckGemvQ8(const DeviceMatrix &w, const void *xq, int64_t n_tok, const float *y) {
  STRATA_RETURN_IF_ERROR(CheckMatrix(w));
  if (Q8ActFor(w.type) == Q8Act::kNone) {
    const std::string name(quant::TypeName(static_cast<uint32_t>(w.type)));
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no 8-bit-activation GEMV for %s", name.c_str());
  }
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV over %lld tokens", static_cast<long long>(n_tok));
  if (n_tok == 0 || w.rows == 0) return false;
  if (xq == nullptr || y == nullptr || (reinterpret_cast<uintptr_t>(xq) & 15u) != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit-activation GEMV: null or unaligned buffers");
  }
  return true;
}

}  // namespace

absl::Status GemvQ8(const DeviceMatrix &w, const void *xq, int64_t n_tok, float *y, cudaStream_t stream,
                    Q8Kernels k) {
  STRATA_ASSIGN_OR_RETURN(const bool work, CheckGemvQ8(w, xq, n_tok, y));
  if (!work) return absl::OkStatus();
  const Q8Act f = Q8ActFor(w.type);
  if (!Q8RowsAligned(w)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit-activation Q4_K GEMV: rows must be 16-byte aligned");
  }
  const int64_t rb = Q8ActRowBytes(f, w.cols);
  const auto *x = static_cast<const uint8_t *>(xq);
  if (OnTensorCores(k, w.type)) {
    ManyArgs a{};
    a.w[0] = static_cast<const uint8_t *>(w.data);
    a.row_bytes[0] = w.row_bytes;
    a.rows[0] = w.rows;
    a.y[0] = y;
    LaunchTensorQ8(w.type, a, 1, w.rows, w.cols, x, n_tok, stream);
    STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  }
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t left = n_tok - t0;
    const int nt = left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const uint8_t *xt = x + t0 * rb;
    float *yt = y + t0 * w.rows;
    WithQ8Type(w.type, [&](auto type) {
      constexpr TypeIdInt kT = decltype(type)::value;
      switch (nt) {
        case 16: LaunchGemvQ8<kT, 16>(w, xt, rb, yt, stream); break;
        case 8: LaunchGemvQ8<kT, 8>(w, xt, rb, yt, stream); break;
        case 4: LaunchGemvQ8<kT, 4>(w, xt, rb, yt, stream); break;
        case 2: LaunchGemvQ8<kT, 2>(w, xt, rb, yt, stream); break;
        default: LaunchGemvQ8<kT, 1>(w, xt, rb, yt, stream); break;
      }
    });
    t0 += nt;
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GemvManyQ8(const DeviceMatrix *ws, float *const *ys, int n, const void *xq, int64_t n_tok,
                        cudaStream_t stream, Q8Kernels k) {
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "GEMV over %lld tokens", static_cast<long long>(n_tok));
  ManyArgs a;
  int64_t max_rows = 0;
  STRATA_RETURN_IF_ERROR(FillManyArgs("GemvManyQ8", ws, ys, n, &a, &max_rows));
  if (Q8ActFor(ws[0].type) == Q8Act::kNone) {
    const std::string name(quant::TypeName(static_cast<uint32_t>(ws[0].type)));
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no 8-bit-activation GEMV for %s", name.c_str());
  }
  for (int m = 0; m < n; ++m) {
    if (!Q8RowsAligned(ws[m])) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit-activation Q4_K GEMV: rows must be 16-byte aligned");
    }
  }
  if (n_tok == 0 || max_rows == 0) return absl::OkStatus();
  if (xq == nullptr || (reinterpret_cast<uintptr_t>(xq) & 15u) != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit-activation GEMV: null or unaligned input");
  }
  const int64_t cols = ws[0].cols;
  if (OnTensorCores(k, ws[0].type)) {
    LaunchTensorQ8(ws[0].type, a, n, max_rows, cols, static_cast<const uint8_t *>(xq), n_tok, stream);
    STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  }
  // The team split of each matrix as GemvQ8 sets it: one width, so one split for all.
  const int tw = GemvTeamWarps(ws[0].type, cols, max_rows);
  for (int m = 1; m < n; ++m) {
    if (GemvTeamWarps(ws[m].type, cols, ws[m].rows) == tw) continue;
    for (int i = 0; i < n; ++i) STRATA_RETURN_IF_ERROR(GemvQ8(ws[i], xq, n_tok, ys[i], stream, k));
    return absl::OkStatus();  // matrices whose rows split differently: a launch each
  }
  const int64_t per_block = int64_t{kGemvWarps} / tw * kGemvRows;
  const dim3 grid(static_cast<unsigned>((max_rows + per_block - 1) / per_block), static_cast<unsigned>(n));
  const int64_t rb = Q8ActRowBytes(Q8ActFor(ws[0].type), cols);
  const auto *x = static_cast<const uint8_t *>(xq);
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t left = n_tok - t0;
    const int nt = left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    ManyArgs at = a;
    for (int m = 0; m < n; ++m) at.y[m] = a.y[m] + t0 * a.rows[m];
    WithQ8Type(ws[0].type, [&](auto type) {
      constexpr TypeIdInt kT = decltype(type)::value;
      auto *kernel = nt == 16  ? GemvManyQ8Kernel<kT, 16>
                     : nt == 8 ? GemvManyQ8Kernel<kT, 8>
                     : nt == 4 ? GemvManyQ8Kernel<kT, 4>
                     : nt == 2 ? GemvManyQ8Kernel<kT, 2>
                               : GemvManyQ8Kernel<kT, 1>;
      Launch(kernel, grid, kGemvWarps * 32, 0, stream, at, cols, x + t0 * rb, rb, tw);
    });
    t0 += nt;
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status PromptMmaQ8(const PromptGroups &p, const DeviceMatrix &shape, const void *xq, float *y,
                         cudaStream_t stream) {
  const Q8Act f = Q8ActFor(shape.type);
  if (f == Q8Act::kNone) {
    const std::string name(quant::TypeName(static_cast<uint32_t>(shape.type)));
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "no 8-bit-activation prompt experts for %s", name.c_str());
  }
  if (p.m < 0 || shape.rows < 0 || shape.cols <= 0 || shape.cols % (f == Q8Act::kBlock32 ? 32 : 256) != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "prompt experts: %d groups of a (%lld, %lld) matrix", p.m,
                  static_cast<long long>(shape.rows), static_cast<long long>(shape.cols));
  }
  if (p.m == 0 || shape.rows == 0) return absl::OkStatus();
  if (p.span == nullptr || p.w0 == nullptr || xq == nullptr || y == nullptr ||
      (reinterpret_cast<uintptr_t>(xq) & 15u) != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "prompt experts: null or unaligned buffers");
  }
  if (shape.row_bytes % 16 != 0 && f == Q8Act::kBlock256) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "prompt experts: Q4_K rows must be 16-byte aligned");
  }
  const bool swiglu = p.w1 != nullptr;
  const dim3 grid(static_cast<unsigned>((shape.rows + kMmaRows - 1) / kMmaRows),
                  static_cast<unsigned>(std::min(p.m, 65535)));
  const int64_t xb = Q8ActRowBytes(f, shape.cols);
  const auto *x = static_cast<const uint8_t *>(xq);
  auto run = [&](auto kernel) {
    Launch(kernel, grid, kMmaWarps * 32, 0, stream, p, DenseRows{}, shape.row_bytes, shape.rows, shape.cols, x, xb,
           y);
  };
  if (shape.type == quant::TypeId::kQ8_0) {
    swiglu ? run(PromptMmaKernel<TensorQ8_0, true, false>) : run(PromptMmaKernel<TensorQ8_0, false, false>);
  } else {
    swiglu ? run(PromptMmaKernel<TensorQ4_K, true, false>) : run(PromptMmaKernel<TensorQ4_K, false, false>);
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status PromptGemvQ8(const DeviceMatrix &w, const void *xq, int64_t n_tok, float *y, cudaStream_t stream) {
  STRATA_ASSIGN_OR_RETURN(const bool work, CheckGemvQ8(w, xq, n_tok, y));
  if (!work) return absl::OkStatus();
  if (!Q8RowsAligned(w)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "8-bit-activation Q4_K GEMV: rows must be 16-byte aligned");
  }
  const Q8Act f = Q8ActFor(w.type);
  const int64_t chunks = (n_tok + 8 * kMmaMaxTiles - 1) / (8 * kMmaMaxTiles);
  PromptGroups p;
  p.m = static_cast<int>(std::min<int64_t>(chunks, INT32_MAX));
  const DenseRows dense{w.data, n_tok};
  const dim3 grid(static_cast<unsigned>((w.rows + kMmaRows - 1) / kMmaRows),
                  static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  const int64_t xb = Q8ActRowBytes(f, w.cols);
  const auto *x = static_cast<const uint8_t *>(xq);
  if (w.type == quant::TypeId::kQ8_0) {
    Launch(PromptMmaKernel<TensorQ8_0, false, true>, grid, kMmaWarps * 32, 0, stream, p, dense, w.row_bytes, w.rows,
           w.cols, x, xb, y);
  } else {
    Launch(PromptMmaKernel<TensorQ4_K, false, true>, grid, kMmaWarps * 32, 0, stream, p, dense, w.row_bytes, w.rows,
           w.cols, x, xb, y);
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace strata::cuda
