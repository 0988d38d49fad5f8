// Decode attention over a long KV cache (AttentionExt's split path for GQA heads of 128): a block
// per (token, KV head, split of the keys) serves the group's heads at once, each key and value row
// read once for all of them, and reaches the HBM's bandwidth by staging key and value tiles in shared
// memory with cp.async, the next tile in flight while the warp uses the current one.
//
// Layout of the work. A row (token) sees n keys; its keys go in DecodeSplits(n, fill) splits of
// DecodeChunk(n, fill) keys, functions of n and of the device and model alone (`fill`: the splits per
// KV head that make one full wave of blocks), so a row's numbers do not depend on the other rows of
// the call (rows mode: each row its own n, the grid sized for the largest). A split's keys go to
// the block's warps a tile of kTileKeys at a time, round robin; each warp keeps its own online
// softmax (max, sum, unnormalised output) per head, and the warps' states are merged in warp order.
// The block writes its split's (m, l, out) per head in the split path's layout, and
// AttentionCombine adds the splits; one split writes the output directly.
//
// Within a tile: scores with lane = key (lanes l and l + 16 take the two halves of the head
// dimension of key l % 16, summed by one shuffle), then the online softmax across the tile's keys by
// shuffles, the weights into shared memory, and the values with lane = 4 output columns. Rows in f16
// or q8_0 are staged as stored and read through dev::KvLoad4 (the values DecodeKvCols gives).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kv_rows.cuh"
#include "backends/cuda/launch.cuh"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

constexpr int kD = 128;           // head_dim = v_dim the kernel serves
constexpr int kTileKeys = 16;     // keys a warp stages at a time
constexpr int kDecWarps = 2;      // warps of a block
constexpr int kDecThreads = 32 * kDecWarps;
constexpr int kMaxGroup = 8;      // heads a KV head serves (GQA group), at most
constexpr int kMaxDecSplits = 512;
constexpr int kSplitKeys = 64;    // keys a split takes at least: two tiles of each warp

// Splits of a row that sees n keys: `fill` of them (enough blocks for one full wave of the device),
// at least kSplitKeys keys each. A function of n and the call's constants alone, so a row's numbers do
// not depend on the other rows of the call.
__host__ __device__ inline int DecodeSplits(int n, int fill) {
  int s = (n + kSplitKeys - 1) / kSplitKeys;
  if (s > fill) s = fill;
  return s < 1 ? 1 : (s > kMaxDecSplits ? kMaxDecSplits : s);
}
// Keys of a split: n over the splits, rounded up to whole tiles of every warp.
__host__ __device__ inline int DecodeChunk(int n, int fill) {
  const int s = DecodeSplits(n, fill), per = (n + s - 1) / s, q = kTileKeys * kDecWarps;
  return (per + q - 1) / q * q;
}

// Bytes of one head's slice of a stored row, and the copy unit for it: f32 and f16 rows 16 bytes,
// q8_0 rows 4 (a 34-byte block is only 2-byte aligned; 4 heads of 128 keep 4).
__host__ __device__ __forceinline__ int HeadBytes(model::KvType t) {
  return t == model::KvType::kF32 ? kD * 4 : t == model::KvType::kF16 ? kD * 2 : (kD / model::kKvQ8Elems) * model::kKvQ8Bytes;
}
// Bytes of a staged row: the wider of the key and value slices, 16-byte aligned plus an odd number of
// 16-byte units, so the 16 rows a quarter warp reads at one column fall in distinct banks.
inline int StagePitch(model::KvType k, model::KvType v) {
  int p = (std::max(HeadBytes(k), HeadBytes(v)) + 15) / 16 * 16 + 16;
  if ((p / 16) % 2 == 0) p += 16;
  return p;
}
constexpr int StageBytes(int pitch) { return 2 * kTileKeys * pitch; }  // a tile's key rows then its value rows
// Shared memory: the group's queries, then each warp's two stages and its tile's weights.
constexpr size_t DecodeSmem(int pitch) {
  return static_cast<size_t>(kMaxGroup) * kD * 4 +
         static_cast<size_t>(kDecWarps) * (2 * StageBytes(pitch) + kTileKeys * kMaxGroup * 4);
}

using dev::CpAsync16;
using dev::CpAsync4;
using dev::CpAsyncCommit;
using dev::CpAsyncWait;

struct RowTables {
  const float *const *kb;
  const float *const *vb;
  const uint8_t *masked;
  int pos, window;
};
__device__ __forceinline__ RowTables TablesOf(const AttentionExtArgs &a, int64_t t) {
  if (a.rows != nullptr) {
    const model::KvRowRef r = a.rows[t];
    return RowTables{r.k_blocks, r.v_blocks, r.masked, r.pos, r.window};
  }
  return RowTables{a.k_blocks, a.v_blocks, a.masked, a.pos0 + static_cast<int>(t), a.window};
}

// Block (token t x KV head, split y). G: the group rounded up to a power of two (heads past the group
// repeat the last one's query and are not written).
template <int G>
__global__ void __launch_bounds__(kDecThreads) FlashDecodeKernel(const float *q, AttentionExtArgs a, int n_split, int fill,
                                                                 int pitch, float *part, float *out, bool direct) {
  dev::AwaitPrior();
  extern __shared__ __align__(16) uint8_t dsm[];
  float *qs = reinterpret_cast<float *>(dsm);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int stage_bytes = StageBytes(pitch);
  uint8_t *stage = dsm + kMaxGroup * kD * 4 + warp * (2 * stage_bytes + kTileKeys * kMaxGroup * 4);
  float *pw = reinterpret_cast<float *>(stage + 2 * stage_bytes);  // (kTileKeys, kMaxGroup) weights
  const int group = a.n_head / a.n_head_kv;
  const int64_t t = blockIdx.x / a.n_head_kv;
  const int kvh = static_cast<int>(blockIdx.x % a.n_head_kv);
  const int h0 = kvh * group;
  const RowTables rv = TablesOf(a, t);
  const int first = rv.window > 0 ? max(0, rv.pos - rv.window + 1) : 0;
  const int n = rv.pos + 1 - first;
  const int chunk = DecodeChunk(n, fill);
  const int c0 = static_cast<int>(blockIdx.y) * chunk, c1 = min(n, c0 + chunk);
  auto dst_of = [&](int h) { return part + ((t * a.n_head + h0 + h) * n_split + blockIdx.y) * (kD + 2); };
  if (c0 >= c1) {  // a split past this row's keys: no term of the combine
    if (!direct && threadIdx.x < group) {
      float *dst = dst_of(threadIdx.x);
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    return;
  }
  for (int i = threadIdx.x; i < G * kD; i += kDecThreads) {
    const int h = min(i / kD, group - 1);
    qs[i] = q[(t * a.n_head + h0 + h) * kD + i % kD];
  }

  const int kbytes = HeadBytes(a.k_type), vbytes = HeadBytes(a.v_type);
  const int64_t krow = dev::KvRowBytesDev(a.k_type, static_cast<int>(a.k_stride));
  const int64_t vrow = dev::KvRowBytesDev(a.v_type, static_cast<int>(a.v_stride));
  // The warp's tiles: tile i of the split starts at key c0 + (i kDecWarps + warp) kTileKeys.
  const int n_tiles = (c1 - c0 + kTileKeys - 1) / kTileKeys;
  auto tile_key0 = [&](int i) { return c0 + (i * kDecWarps + warp) * kTileKeys; };
  const int my_tiles = n_tiles > warp ? (n_tiles - warp + kDecWarps - 1) / kDecWarps : 0;
  // Tile i's key and value rows into stage i % 2. Lane r < 16 finds key r's row in the block tables
  // and lane 16 + r its value row (null past the split's keys), each with one table read; then the
  // warp copies the rows' 16-byte (q8_0: 4-byte) pieces, piece c = lane + 32 k of a part at row
  // c unit / hb, the row's address passed by shuffle. Every part's bytes are a multiple of 32 pieces,
  // so every lane takes the same number of pieces; rows past the split's keys are zeros.
  struct Part {
    int hb, unit, r0, o0;
  };
  Part parts[2];
#pragma unroll
  for (int part_v = 0; part_v < 2; ++part_v) {
    const int hb = part_v ? vbytes : kbytes;
    const int unit = (part_v ? a.v_type : a.k_type) == model::KvType::kQ8_0 ? 4 : 16;
    parts[part_v] = Part{hb, unit, lane * unit / hb, lane * unit % hb};
  }
  auto load_tile = [&](int i) {
    uint8_t *ks = stage + (i & 1) * stage_bytes, *vs = ks + kTileKeys * pitch;
    const uint8_t *mine = nullptr;
    {
      const int j = tile_key0(i) + (lane & 15);
      const bool v = lane >= 16;
      if (j < c1) {
        const int p = first + j;
        const float *blk = (v ? rv.vb : rv.kb)[p / a.block_tokens];
        mine = reinterpret_cast<const uint8_t *>(blk) + (p % a.block_tokens) * (v ? vrow : krow) +
               static_cast<int64_t>(kvh) * (v ? vbytes : kbytes);
      }
    }
#pragma unroll
    for (int part_v = 0; part_v < 2; ++part_v) {
      const Part pt = parts[part_v];
      uint8_t *base = part_v ? vs : ks;
      const int step = 32 * pt.unit, total = kTileKeys * pt.hb;
      int r = pt.r0, o = pt.o0;
      for (int b = lane * pt.unit; b < total; b += step) {
        const uint8_t *row = reinterpret_cast<const uint8_t *>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), r + 16 * part_v));
        const bool valid = row != nullptr;
        const uint8_t *src = valid ? row + o : reinterpret_cast<const uint8_t *>(q);  // any valid address
        if (pt.unit == 16) {
          CpAsync16(base + r * pitch + o, src, valid);
        } else {
          CpAsync4(base + r * pitch + o, src, valid);
        }
        o += step;
        while (o >= pt.hb) {
          o -= pt.hb;
          ++r;
        }
      }
    }
  };
  if (my_tiles > 0) load_tile(0);
  CpAsyncCommit();
  __syncthreads();  // the queries

  float m[G], l[G];
  float4 o[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
    o[h] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int kk = lane & 15, half = lane >> 4;
  for (int i = 0; i < my_tiles; ++i) {
    if (i + 1 < my_tiles) load_tile(i + 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncwarp();
    const uint8_t *ks = stage + (i & 1) * stage_bytes, *vs = ks + kTileKeys * pitch;
    const int j0 = tile_key0(i), cnt = min(kTileKeys, c1 - j0);
    // Scores: key kk, this lane's half of the columns, then the other half's sum.
    float s[G];
#pragma unroll
    for (int h = 0; h < G; ++h) s[h] = 0.f;
    const uint8_t *krow_s = ks + kk * pitch;
#pragma unroll 4
    for (int d = half * (kD / 2); d < (half + 1) * (kD / 2); d += 4) {
      const float4 k4 = dev::KvLoad4(a.k_type, krow_s, d);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float4 q4 = *reinterpret_cast<const float4 *>(qs + h * kD + d);
        s[h] = fmaf(q4.x, k4.x, s[h]);
        s[h] = fmaf(q4.y, k4.y, s[h]);
        s[h] = fmaf(q4.z, k4.z, s[h]);
        s[h] = fmaf(q4.w, k4.w, s[h]);
      }
    }
    const int j = j0 + kk, p = first + j;
    const bool vis = kk < cnt && (p == rv.pos || rv.masked == nullptr || rv.masked[p] == 0);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float other = __shfl_xor_sync(0xffffffffu, s[h], 16);
      const float full = half == 0 ? s[h] + other : other + s[h];
      s[h] = vis ? __fmul_rn(full, a.scale) : -INFINITY;
    }
    // Online softmax over the tile's keys (the 16 lanes of each half hold the same numbers).
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float mt = s[h];
#pragma unroll
      for (int x = 8; x > 0; x >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
      const float mn = fmaxf(m[h], mt);
      const float base = mn == -INFINITY ? 0.f : mn;
      const float alpha = m[h] == -INFINITY ? 0.f : expf(m[h] - base);
      const float e = s[h] == -INFINITY ? 0.f : expf(s[h] - base);
      float sum = e;
#pragma unroll
      for (int x = 8; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
      m[h] = mn;
      l[h] = l[h] * alpha + sum;
      o[h].x *= alpha;
      o[h].y *= alpha;
      o[h].z *= alpha;
      o[h].w *= alpha;
      if (half == 0) pw[kk * kMaxGroup + h] = e;
    }
    __syncwarp();
    // Values: this lane's 4 columns of each key, in key order.
    for (int jj = 0; jj < cnt; ++jj) {
      const float4 v4 = dev::KvLoad4(a.v_type, vs + jj * pitch, 4 * lane);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float e = pw[jj * kMaxGroup + h];
        o[h].x = fmaf(e, v4.x, o[h].x);
        o[h].y = fmaf(e, v4.y, o[h].y);
        o[h].z = fmaf(e, v4.z, o[h].z);
        o[h].w = fmaf(e, v4.w, o[h].w);
      }
    }
    __syncwarp();  // the stage and the weights are free for tile i + 2
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp done with its stages: warp 1's state goes through them

  // Warp 1's state to shared memory, merged into warp 0's in warp order.
  static_assert(kDecWarps == 2, "two warps merged");
  float *xs = reinterpret_cast<float *>(dsm + kMaxGroup * kD * 4);  // (G) m, (G) l, (G, kD) out
  if (warp == 1) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (lane == 0) {
        xs[h] = m[h];
        xs[G + h] = l[h];
      }
      *reinterpret_cast<float4 *>(xs + 2 * G + h * kD + 4 * lane) = o[h];
    }
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h >= group) break;
    const float m1 = xs[h], l1 = xs[G + h];
    const float4 o1 = *reinterpret_cast<const float4 *>(xs + 2 * G + h * kD + 4 * lane);
    const float mn = fmaxf(m[h], m1);
    const float w0 = m[h] == -INFINITY ? 0.f : expf(m[h] - mn), w1 = m1 == -INFINITY ? 0.f : expf(m1 - mn);
    const float lt = l[h] * w0 + l1 * w1;
    const float4 ot = make_float4(o[h].x * w0 + o1.x * w1, o[h].y * w0 + o1.y * w1, o[h].z * w0 + o1.z * w1,
                                  o[h].w * w0 + o1.w * w1);
    if (direct) {
      const float inv = 1.0f / lt;
      *reinterpret_cast<float4 *>(out + (t * a.n_head + h0 + h) * kD + 4 * lane) =
          make_float4(ot.x * inv, ot.y * inv, ot.z * inv, ot.w * inv);
    } else {
      float *dst = dst_of(h);
      if (lane == 0) {
        dst[0] = mn;
        dst[1] = lt;
      }
      dst[2 + 4 * lane] = ot.x;
      dst[3 + 4 * lane] = ot.y;
      dst[4 + 4 * lane] = ot.z;
      dst[5 + 4 * lane] = ot.w;
    }
  }
}

// The kernel for group G, opted in to the shared memory of f32 rows (the widest).
template <int G>
absl::Status OptIn() {
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(FlashDecodeKernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(DecodeSmem(StagePitch(model::KvType::kF32, model::KvType::kF32))));
  STRATA_CUDA_RETURN_IF_ERROR(opt_in);
  return absl::OkStatus();
}

template <int G>
int BlocksPerSm(size_t smem) {
  if (!OptIn<G>().ok()) return 1;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, FlashDecodeKernel<G>, kDecThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return std::max(n, 1);
}

int GroupRounded(const AttentionExtArgs &a) {
  const int group = a.n_head / a.n_head_kv;
  return group > 4 ? 8 : group > 2 ? 4 : 2;
}

// Splits per KV head that fill the device once: its multiprocessors times the blocks each holds at
// this call's shared memory, over the KV heads. Asked of the driver once per (group, row types).
int DecodeFill(const AttentionExtArgs &a) {
  const int g = GroupRounded(a);
  const int gi = g == 8 ? 2 : g == 4 ? 1 : 0;
  const int ki = static_cast<int>(a.k_type), vi = static_cast<int>(a.v_type);
  static std::atomic<int> per_sm_cache[3][4][4] = {};
  if (ki < 0 || ki > 3 || vi < 0 || vi > 3) return 1;
  int per_sm = per_sm_cache[gi][ki][vi].load(std::memory_order_relaxed);
  if (per_sm == 0) {
    const size_t smem = DecodeSmem(StagePitch(a.k_type, a.v_type));
    per_sm = g == 8 ? BlocksPerSm<8>(smem) : g == 4 ? BlocksPerSm<4>(smem) : BlocksPerSm<2>(smem);
    per_sm_cache[gi][ki][vi].store(per_sm, std::memory_order_relaxed);
  }
  const int blocks = std::max(1, SmCount()) * per_sm;
  return std::max(1, (blocks + a.n_head_kv - 1) / a.n_head_kv);
}

template <int G>
absl::Status LaunchDecode(const float *q, const AttentionExtArgs &a, int64_t n_tok, int n_split, float *part,
                          float *out, bool direct, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(OptIn<G>());
  const int pitch = StagePitch(a.k_type, a.v_type);
  const dim3 grid(static_cast<unsigned>(n_tok * a.n_head_kv), static_cast<unsigned>(n_split));
  Launch(FlashDecodeKernel<G>, grid, kDecThreads, DecodeSmem(pitch), stream, q, a, n_split, DecodeFill(a), pitch,
         part, out, direct);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace

int FlashDecodeSplits(const AttentionExtArgs &a, int64_t n_tok) {
  const int fill = DecodeFill(a);
  if (a.rows != nullptr) return DecodeSplits(a.max_keys, fill);
  const int last = a.pos0 + static_cast<int>(n_tok) - 1;
  return DecodeSplits(a.window > 0 ? std::min(a.window, last + 1) : last + 1, fill);
}

bool FlashDecodeApplies(const AttentionExtArgs &a, int64_t n_tok) {
  if (!tunables::Get().cuda_flash_decode || n_tok <= 0 || a.latent || a.sinks != nullptr) return false;
  if (a.head_dim != kD || a.v_dim != kD || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0) return false;
  const int group = a.n_head / a.n_head_kv;
  if (group < 2 || group > kMaxGroup) return false;  // a lone head reads its row better in the split kernel
  if (a.rows != nullptr && a.max_keys <= 0) return false;
  // Copies: f32 and f16 head slices 16 bytes at a time (row starts 16-byte aligned), q8_0 4 bytes.
  auto ok = [](model::KvType t, int64_t stride) {
    if (t == model::KvType::kF32) return stride % 4 == 0;
    if (t == model::KvType::kF16) return stride % 8 == 0;
    return stride % (2 * model::kKvQ8Elems) == 0;
  };
  return ok(a.k_type, a.k_stride) && ok(a.v_type, a.v_stride);
}

size_t FlashDecodeWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok) {
  const int s = FlashDecodeSplits(a, n_tok);
  return static_cast<size_t>(n_tok) * a.n_head * s * (kD + 2) * sizeof(float);
}

absl::Status FlashDecode(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, cudaStream_t stream,
                         Workspace ws) {
  if (!FlashDecodeApplies(a, n_tok)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "flash decode over %d heads, %d KV heads, head_dim %d, v_dim %d",
                  a.n_head, a.n_head_kv, a.head_dim, a.v_dim);
  }
  const int n_split = FlashDecodeSplits(a, n_tok);
  const bool direct = n_split == 1;
  if (!direct && (ws.data == nullptr || ws.bytes < FlashDecodeWorkspaceBytes(a, n_tok))) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "flash decode needs %u bytes of workspace",
                  FlashDecodeWorkspaceBytes(a, n_tok));
  }
  float *part = static_cast<float *>(ws.data);
  const int group = a.n_head / a.n_head_kv;
  absl::Status st = group > 4   ? LaunchDecode<8>(q, a, n_tok, n_split, part, out, direct, stream)
                    : group > 2 ? LaunchDecode<4>(q, a, n_tok, n_split, part, out, direct, stream)
                                : LaunchDecode<2>(q, a, n_tok, n_split, part, out, direct, stream);
  STRATA_RETURN_IF_ERROR(st);
  if (direct) return absl::OkStatus();
  return AttentionCombine(part, a, n_tok, n_split, out, stream);
}

}  // namespace strata::cuda
