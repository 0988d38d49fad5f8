// Grouped experts: the grouping of routing selections by expert, made on the device in one block,
// and the GEMV kernels that run every group of a plan through its expert in one launch. A group's
// rows go through the shared row dot of gemv.cuh in chunks of 8, 4, 2, 1 tokens, so each (row,
// token) result is the same bits as GemvSwiGlu / Gemv on that expert alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/codecs.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "backends/cuda/gemv.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/q8act.cuh"
#include "backends/cuda/route.cuh"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

using dev::kGemvWarps;

// ---- Grouping ------------------------------------------------------------------------------------

constexpr int kGroupThreads = 512;
constexpr int kScanWarps = kRouteMaxExperts / 32;  // warps that hold one expert per thread
constexpr int64_t kGroupMaxSelections = int64_t{1} << 30;
static_assert(kRouteMaxExperts % 32 == 0 && kRouteMaxExperts <= kGroupThreads, "one thread per expert");

// Warp w takes the selections of segment w, [w seg, (w + 1) seg), 32 at a time. (1) Each warp counts
// its segment's selections of every expert; (2) a thread per expert turns the counts into the first
// grouped row of each (warp, expert) pair: the expert's first row (a scan over experts) plus the
// counts of the earlier segments; (3) each warp walks its segment again, placing selection i at its
// (warp, expert) cursor plus the number of lanes before it with the same expert (__match_any_sync).
// Segments in order, lanes in order: the placement is stable, and no atomics make it deterministic.
// Per step, only the highest lane of each set of equal experts updates the shared count.
// The grouping on a block of kThreads threads (kGroupWarps segments: the placement does not depend
// on their number). sel may have been written by this block before a barrier.
template <int kThreads>
__device__ __forceinline__ void GroupBlock(const int32_t *sel, int n, int k, int n_expert, int n_max, int32_t *idx,
                                           int32_t *plan) {
  constexpr int kGroupWarps = kThreads / 32;
  static_assert(kScanWarps <= kGroupWarps, "a thread per expert");
  __shared__ int cnt[kGroupWarps][kRouteMaxExperts];  // (1) counts, then (2) cursors
  __shared__ int warp_sum[kScanWarps][2];             // rows and groups of each scan warp's experts
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned lanes_before = (1u << lane) - 1u;
  for (int i = threadIdx.x; i < kGroupWarps * kRouteMaxExperts; i += kThreads) (&cnt[0][0])[i] = 0;
  __syncthreads();
  const int seg = ((n + kGroupWarps - 1) / kGroupWarps + 31) / 32 * 32;
  const int i0 = min(n, warp * seg), i1 = min(n, i0 + seg);
  // -1 for a lane past the segment or an expert out of range: such lanes only match each other.
  auto expert_of = [&](int i) {
    if (i >= i1) return -1;
    const int e = sel[i];
    return e >= 0 && e < n_expert ? e : -1;
  };

  for (int base = i0; base < i1; base += 32) {  // (1)
    const int e = expert_of(base + lane);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == 31 - __clz(peers)) cnt[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  // (2) Thread e: its expert's rows in each segment become cursors relative to the expert's first row.
  const int e = threadIdx.x;
  int rows = 0;
  if (e < n_expert) {
    for (int w = 0; w < kGroupWarps; ++w) {
      const int c = cnt[w][e];
      cnt[w][e] = rows;
      rows += c;
    }
  }
  // Inclusive scans over experts of the rows and of the used experts (groups).
  int rows_incl = rows, groups_incl = rows > 0 ? 1 : 0;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int r = __shfl_up_sync(0xffffffffu, rows_incl, o), g = __shfl_up_sync(0xffffffffu, groups_incl, o);
    if (lane >= o) {
      rows_incl += r;
      groups_incl += g;
    }
  }
  if (warp < kScanWarps && lane == 31) {
    warp_sum[warp][0] = rows_incl;
    warp_sum[warp][1] = groups_incl;
  }
  __syncthreads();
  if (warp < kScanWarps) {
    for (int w = 0; w < warp; ++w) {
      rows_incl += warp_sum[w][0];
      groups_incl += warp_sum[w][1];
    }
    const int first = rows_incl - rows;
    if (rows > 0) {
      plan[1 + groups_incl - 1] = e;
      plan[1 + n_max + groups_incl - 1] = first;
      for (int w = 0; w < kGroupWarps; ++w) cnt[w][e] += first;
    }
    if (e == kRouteMaxExperts - 1) {  // the last thread's inclusive sums cover every expert
      plan[0] = groups_incl;
      plan[1 + n_max + groups_incl] = rows_incl;
    }
  }
  __syncthreads();

  for (int base = i0; base < i1; base += 32) {  // (3)
    const int i = base + lane;
    const int ex = expert_of(i);
    const unsigned peers = __match_any_sync(0xffffffffu, ex);
    const int row = ex >= 0 ? cnt[warp][ex] + __popc(peers & lanes_before) : -1;
    __syncwarp();
    if (ex >= 0 && lane == 31 - __clz(peers)) cnt[warp][ex] += __popc(peers);
    __syncwarp();
    if (i < i1) {
      idx[n + i] = row;
      if (row >= 0) idx[row] = i / k;
    }
  }
}

__global__ void __launch_bounds__(kGroupThreads)
    GroupByExpertKernel(const int32_t *__restrict__ sel, int n, int k, int n_expert, int n_max,
                        int32_t *__restrict__ idx, int32_t *__restrict__ plan) {
  dev::AwaitPrior();
  GroupBlock<kGroupThreads>(sel, n, k, n_expert, n_max, idx, plan);
}

// ---- Grouped GEMV ----------------------------------------------------------------------------------

// Block (x, g): the rows of group g's expert that block x of GemvSwiGluKernel (GemvKernel for the
// down projection) computes at kGemvWarps warps a block, over the group's tokens.
template <class C, int kMaxNT>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
    GroupedSwiGluKernel(const void *const *__restrict__ gate, const void *const *__restrict__ up, uint64_t row_bytes,
                        int64_t rows, int64_t cols, const int32_t *__restrict__ plan, int n_max,
                        const float *__restrict__ x, float *__restrict__ h, int team_warps,
                        const uint8_t *__restrict__ skip) {
  dev::AwaitPrior();
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * dev::kSwiGluRows;
  dev::ForBlockGroups(plan, n_max, skip, [&](const dev::PlanGroup &pg) {
    const auto *wg = static_cast<const uint8_t *>(gate[pg.e]), *wu = static_cast<const uint8_t *>(up[pg.e]);
    dev::ForChunks<kMaxNT>(pg.t0, pg.t1, [&](auto nt, int64_t t) {
      dev::SwiGluRows<C, decltype(nt)::value>(wg, wu, row_bytes, r0, rows, cols, x + t * cols, h + t * rows, tm);
    });
  });
}

template <class C, int kMaxNT>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
    GroupedGemvKernel(const void *const *__restrict__ tab, uint64_t row_bytes, int64_t rows, int64_t cols,
                      const int32_t *__restrict__ plan, int n_max, const float *__restrict__ x,
                      float *__restrict__ y, int team_warps, const uint8_t *__restrict__ skip) {
  dev::AwaitPrior();
  __shared__ float red[kGemvWarps * dev::kTeamRedFloats];
  const dev::Team tm = dev::BlockTeam(team_warps, red);
  const int64_t r0 = dev::TeamIndex(team_warps) * dev::kGemvRows;
  dev::ForBlockGroups(plan, n_max, skip, [&](const dev::PlanGroup &pg) {
    const auto *w = static_cast<const uint8_t *>(tab[pg.e]);
    dev::ForChunks<kMaxNT>(pg.t0, pg.t1, [&](auto nt, int64_t t) {
      dev::GemvRows<C, decltype(nt)::value>(w, row_bytes, r0, rows, cols, x + t * cols, y + t * rows, rows, tm);
    });
  });
}

// Block (x, g): group g's rows, when its expert is skipped, copied from src to dst.
__global__ void CopySkippedGroupsKernel(const int32_t *__restrict__ plan, int n_max, const uint8_t *__restrict__ skip,
                                        const float *__restrict__ src, float *__restrict__ dst, int64_t width) {
  dev::AwaitPrior();
  const int g = static_cast<int>(blockIdx.y);
  if (g >= plan[0] || skip[plan[1 + g]] == 0) return;  // block-uniform
  const int64_t r0 = plan[1 + n_max + g], r1 = plan[2 + n_max + g];
  const int64_t n = (r1 - r0) * width, base = r0 * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[base + i] = src[base + i];
  }
}

// ---- Staging cold experts ---------------------------------------------------------------------------

constexpr int kStageThreads = 512, kStageInFlight = 4;
static_assert(kRouteMaxExperts <= kStageThreads, "a thread per group");

// What a staging kernel's blocks (of kThreads) share: the slot of each expert (-1: none), each
// slot's matrices.
template <int kThreads>
struct StageShared {
  static_assert(kRouteMaxExperts <= kThreads, "a thread per group");
  int slot[kRouteMaxExperts];
  const int4 *src[3][kRouteMaxExperts];
  int warp[kThreads / 32];
};

// The staged experts, found the same way by every block: thread g takes group g, a block-wide
// ordered count gives the cold groups their slots. Block 0 writes the staged tables and counters.
// Returns the experts staged (s.src[m][j] for j below it).
template <int kThreads>
__device__ int AssignColdSlots(const StageTables &t, int n_expert, const ExpertStage &st,
                               const int32_t *__restrict__ plan, int n_max, const uint8_t *__restrict__ skip,
                               StageShared<kThreads> &s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < n_expert) s.slot[tid] = -1;
  const int n_groups = min(max(plan[0], 0), n_max);
  int e = -1;
  bool cold = false, hit = false;
  if (tid < n_groups) {
    e = plan[1 + tid];
    if (e >= 0 && e < n_expert) {
      const auto p = reinterpret_cast<uintptr_t>(t.from[0][e]);
      hit = p >= st.hit_lo && p < st.hit_hi;
    }
    if (e >= 0 && e < n_expert && (skip == nullptr || skip[e] == 0)) {
      cold = true;
      for (int m = 0; m < 3; ++m) {
        const auto p = reinterpret_cast<uintptr_t>(t.from[m][e]);
        cold = cold && p >= st.host_lo && p < st.host_hi && p % 16 == 0;
      }
    }
  }
  const unsigned ballot = __ballot_sync(0xffffffffu, cold);
  if (lane == 0) s.warp[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), n_cold = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? s.warp[w] : 0;
    n_cold += s.warp[w];
  }
  if (cold && before < st.n_slots) {
    s.slot[e] = before;
    for (int m = 0; m < 3; ++m) s.src[m][before] = static_cast<const int4 *>(t.from[m][e]);
  }
  const int n_hits = __syncthreads_count(hit);  // also the barrier after the slots' assignment
  const int n_staged = min(n_cold, st.n_slots);
  if (st.counts != nullptr && blockIdx.x == 0 && tid == 0) {
    atomicAdd(&st.counts[0], static_cast<unsigned long long>(n_staged));
    atomicAdd(&st.counts[1], static_cast<unsigned long long>(n_hits));
  }
  if (blockIdx.x == 0) {
    for (int x = tid; x < n_expert; x += kThreads) {
      const int j = s.slot[x];
      for (int m = 0; m < 3; ++m) {
        t.to[m][x] = j >= 0 ? static_cast<const void *>(st.slots + j * st.slot_bytes + t.off[m]) : t.from[m][x];
      }
    }
  }
  return n_staged;
}

// Every block assigns the slots (AssignColdSlots), then all blocks copy the staged experts' bytes,
// 16 at a time, kStageInFlight loads in flight a thread.
__global__ void __launch_bounds__(kStageThreads)
    StageColdExpertsKernel(StageTables t, int n_expert, ExpertStage st, const int32_t *__restrict__ plan, int n_max,
                           const uint8_t *__restrict__ skip) {
  dev::AwaitPrior();
  __shared__ StageShared<kStageThreads> s;
  const int tid = threadIdx.x;
  const int n_staged = AssignColdSlots<kStageThreads>(t, n_expert, st, plan, n_max, skip, s);
  uint8_t *const slots = st.slots;
  const uint64_t slot_bytes = st.slot_bytes;
  const uint64_t per_expert = t.units[0] + t.units[1] + t.units[2];
  const uint64_t total = per_expert * static_cast<uint64_t>(n_staged);
  const uint64_t stride = uint64_t{gridDim.x} * kStageThreads;
  // Unit u of the staged bytes: slot u / per_expert, then the matrix its remainder falls in.
  auto at = [&](uint64_t u, const int4 *&src, int4 *&dst) {
    const uint64_t j = u / per_expert;
    uint64_t r = u - j * per_expert;
    int m = 0;
    if (r >= t.units[0]) {
      r -= t.units[0];
      m = 1;
      if (r >= t.units[1]) {
        r -= t.units[1];
        m = 2;
      }
    }
    src = s.src[m][j] + r;
    dst = reinterpret_cast<int4 *>(slots + j * slot_bytes + t.off[m]) + r;
  };
  for (uint64_t u0 = uint64_t{blockIdx.x} * kStageThreads + tid; u0 < total; u0 += kStageInFlight * stride) {
    int4 v[kStageInFlight];
    int4 *dst[kStageInFlight];
#pragma unroll
    for (int i = 0; i < kStageInFlight; ++i) {
      const uint64_t u = u0 + i * stride;
      dst[i] = nullptr;
      if (u < total) {
        const int4 *src;
        at(u, src, dst[i]);
        v[i] = *src;
      }
    }
#pragma unroll
    for (int i = 0; i < kStageInFlight; ++i) {
      if (dst[i] != nullptr) *dst[i] = v[i];
    }
  }
}

// One block of kThreads: the slots as StageColdExperts assigns them, then the request for their
// copies in the mailbox's ring (the body first, each thread's stores fenced for the host, then the
// number). plan as the block's grouping wrote it, visible to every thread.
template <int kThreads>
__device__ void PostColdPlan(const ColdPlan &c, const int32_t *__restrict__ plan, int n_max, StageShared<kThreads> &s) {
  const int tid = threadIdx.x;
  const ExpertStage &st = c.stage;
  const int n = AssignColdSlots<kThreads>(c.t, c.n_expert, st, plan, n_max, c.skip, s);
  const ColdMailbox &mb = c.mb;
  const uint32_t seq = *mb.next + 1;  // one block; the requests of a stream are posted in its order
  if (n == 0) {
    // Nothing to copy: no request. An urgent one's wait waits for those posted before (the
    // layer's prediction), often landed already, so the layer costs no round trip to the host.
    if (c.urgent && tid == 0) *mb.want = seq - 1;
    return;
  }
  ColdRequest &r = mb.ring[seq % kColdRing];
  for (int j = tid; j < n; j += kThreads) {
    for (int m = 0; m < 3; ++m) r.src[j][m] = reinterpret_cast<uint64_t>(s.src[m][j]);
  }
  if (tid == 0) {
    r.slots = reinterpret_cast<uint64_t>(st.slots);
    r.slot_bytes = st.slot_bytes;
    for (int m = 0; m < 3; ++m) {
      r.off[m] = c.t.off[m];
      r.bytes[m] = c.t.units[m] * 16;
    }
    r.n = n;
    r.layer = c.layer;
    r.urgent = c.urgent ? 1 : 0;
  }
  __threadfence_system();
  __syncthreads();
  if (tid == 0) {
    *reinterpret_cast<volatile uint32_t *>(&r.seq) = seq;
    *mb.next = seq;
    if (c.urgent) *mb.want = seq;
  }
}

__global__ void __launch_bounds__(kStageThreads)
    PlanColdCopiesKernel(ColdPlan c, const int32_t *__restrict__ plan, int n_max) {
  dev::AwaitPrior();
  __shared__ StageShared<kStageThreads> s;
  PostColdPlan<kStageThreads>(c, plan, n_max, s);
}

constexpr int kFusedThreads = 256, kFusedWarps = kFusedThreads / 32;
static_assert(kRouteGroupMaxTokens <= 2 * kFusedWarps, "at most two tokens a warp");

// Block 0 routes the n_tok tokens (warp w tokens w and w + 8) and groups their selections (sel and
// wts written before the barrier, read after it), then (cold.mb.ring set) plans the cold experts'
// copies over that plan; block 1 + b quantizes stretch b % chunks of row b / chunks of h.
template <int kBlock>
__global__ void __launch_bounds__(kFusedThreads)
    RouteGroupQuantizeKernel(RouteArgs p, const float *__restrict__ logits, int n_tok, int32_t *sel, float *wts,
                             int32_t *__restrict__ idx, int32_t *__restrict__ plan, int n_max,
                             const float *__restrict__ h, int64_t cols, uint8_t *xq, int64_t row_bytes,
                             ColdPlan cold) {
  dev::AwaitPrior();
  if (blockIdx.x > 0) {  // block-uniform
    __shared__ float warp_max[8];
    const int64_t chunks = (cols + 255) / 256, b = blockIdx.x - 1;
    dev::QuantizeStretch<kBlock>(h, cols, xq, row_bytes, b / chunks, b % chunks, warp_max);
    return;
  }
  __shared__ float s_pr[kFusedWarps][kRouteMaxExperts], s_choice[kFusedWarps][kRouteMaxExperts];
  __shared__ int32_t s_sel[kFusedWarps][kRouteMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = warp; t < n_tok; t += kFusedWarps) {
    dev::RouteWarpToken(p, logits, t, sel, wts, s_pr[warp], s_choice[warp], s_sel[warp], lane);
    __syncwarp();  // lane 0 may still read the scratch the next token overwrites
  }
  __syncthreads();
  GroupBlock<kFusedThreads>(sel, n_tok * p.k, p.k, p.n_expert, n_max, idx, plan);
  if (cold.mb.ring == nullptr) return;
  __shared__ StageShared<kFusedThreads> st;
  __syncthreads();  // the plan's global writes, visible to the block
  PostColdPlan<kFusedThreads>(cold, plan, n_max, st);
}

// One thread's wait for a counter that the host or the copy engines advance (serial numbers,
// wrap-safe): looks at *counter every nap_ns until it reaches `want`. kGaveUp, without waiting, where
// an earlier wait gave up (*timed_out set): the step then fails at its end whatever follows, in one
// timeout rather than one a layer. kTimedOut after timeout_ns: the caller writes what it saw into
// timed_out[1..] and then raises timed_out[0] (GiveUp). The time waited goes to *waited_ns if given.
enum class Awaited { kReached, kGaveUp, kTimedOut };

__device__ Awaited AwaitCounter(const uint32_t *counter, uint32_t want, const uint32_t *timed_out, uint64_t timeout_ns,
                                unsigned long long *waited_ns, unsigned nap_ns) {
  const volatile uint32_t *c = counter;
  if (static_cast<int32_t>(*c - want) >= 0) return Awaited::kReached;
  if (*reinterpret_cast<const volatile uint32_t *>(timed_out) != 0) return Awaited::kGaveUp;
  const uint64_t t0 = dev::GlobalTimerNs();
  Awaited r = Awaited::kReached;
  while (static_cast<int32_t>(*c - want) < 0) {
    if (dev::GlobalTimerNs() - t0 > timeout_ns) {
      r = Awaited::kTimedOut;
      break;
    }
    __nanosleep(nap_ns);
  }
  if (waited_ns != nullptr) atomicAdd(waited_ns, static_cast<unsigned long long>(dev::GlobalTimerNs() - t0));
  return r;
}

// After AwaitCounter's kTimedOut and the caller's report in timed_out[1..]: the report reaches the
// host before the flag that says it is there.
__device__ void GiveUp(uint32_t *timed_out) {
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t *>(timed_out) = 1;
  __threadfence_system();
}

// One thread waits for the request mb.want (ColdCopier::status reports a wait that gave up).
__global__ void WaitColdCopiesKernel(ColdMailbox mb) {
  dev::AwaitPriorOnly();
  if (threadIdx.x != 0) return;
  const uint32_t want = *reinterpret_cast<volatile const uint32_t *>(mb.want);
  if (AwaitCounter(mb.done, want, mb.timed_out, mb.timeout_ns, mb.waited_ns, 200) == Awaited::kTimedOut) {
    // What the wait saw, for the copier's report: [1] the request waited for, [2] the last landed.
    volatile uint32_t *to = mb.timed_out;
    to[1] = want;
    to[2] = *reinterpret_cast<volatile const uint32_t *>(mb.done);
    GiveUp(mb.timed_out);
  }
}

// One block: the call's data, then (after every thread's writes are out) the call, its number last.
__global__ void PostCpuCallKernel(CpuCallBox b, CpuCall c, const int32_t *__restrict__ sel,
                                  const float *__restrict__ h, int64_t n_h, const void *const *__restrict__ tab,
                                  const void *const *__restrict__ up_tab, const void *const *__restrict__ down_tab) {
  dev::AwaitPrior();
  const int64_t n_sel = c.n_tok * c.k;
  for (int64_t i = threadIdx.x; i < n_sel; i += blockDim.x) b.sel[i] = sel[i];
  if (n_h % 4 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0 && reinterpret_cast<uintptr_t>(b.h) % 16 == 0) {
    const float4 *src = reinterpret_cast<const float4 *>(h);
    float4 *dst = reinterpret_cast<float4 *>(b.h);
    for (int64_t i = threadIdx.x; i < n_h / 4; i += blockDim.x) dst[i] = src[i];
  } else {
    for (int64_t i = threadIdx.x; i < n_h; i += blockDim.x) b.h[i] = h[i];
  }
  for (int i = threadIdx.x; i < c.n_expert; i += blockDim.x) b.tab[i] = tab[i];
  if (up_tab != nullptr && down_tab != nullptr) {
    for (int i = threadIdx.x; i < c.n_expert; i += blockDim.x) {
      b.tab[c.n_expert + i] = up_tab[i];
      b.tab[2 * c.n_expert + i] = down_tab[i];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t n = *b.next + 1;
  *b.next = n;
  volatile CpuCall *call = b.call;
  call->layer = c.layer;
  call->k = c.k;
  call->n_expert = c.n_expert;
  call->n_tok = c.n_tok;
  __threadfence_system();
  call->seq = n;
  __threadfence_system();
}

// Thread 0 polls the answer; then the block copies the flags (all 0 after a wait that gave up).
__global__ void WaitCpuCallKernel(CpuCallBox b, int stage, const uint8_t *skip_host, uint8_t *skip_dev, int n_skip) {
  dev::AwaitPriorOnly();
  __shared__ int answered;
  if (threadIdx.x == 0) {
    const uint32_t want = *reinterpret_cast<volatile const uint32_t *>(b.next);
    const Awaited r = AwaitCounter(b.answer + stage, want, b.timed_out, b.timeout_ns,
                                   b.waited_ns != nullptr ? b.waited_ns + stage : nullptr, 100);
    if (r == Awaited::kTimedOut) {
      // For the host's report (CpuExperts::TakeStatus): [1] the stage, [2] the call, [3] the answer seen.
      volatile uint32_t *to = b.timed_out;
      to[1] = static_cast<uint32_t>(stage);
      to[2] = want;
      to[3] = *reinterpret_cast<volatile const uint32_t *>(b.answer + stage);
      GiveUp(b.timed_out);
    }
    __threadfence();  // the flags are read after the answer
    answered = r == Awaited::kReached;
  }
  __syncthreads();
  if (skip_dev == nullptr) return;
  const volatile uint8_t *src = skip_host;
  for (int i = threadIdx.x; i < n_skip; i += blockDim.x) skip_dev[i] = answered ? src[i] : 0;
}

// ---- Validation ------------------------------------------------------------------------------------

constexpr int kMaxGridY = 65535;

bool Aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// The shape with a 256-byte-aligned stand-in address, so CheckMatrix checks all but the address.
DeviceMatrix Shape(const DeviceMatrix &m) {
  DeviceMatrix s = m;
  s.data = reinterpret_cast<const void *>(uintptr_t{256});
  return s;
}

absl::Status CheckPlanArgs(const int32_t *plan, int n_max, const float *x, const float *y, const char *what) {
  if (n_max < 0 || n_max > kMaxGridY) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s over at most %d groups: between 0 and %d", what, n_max, kMaxGridY);
  }
  if (n_max == 0) return absl::OkStatus();
  if (plan == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s plan is null", what);
  if (x == nullptr || !Aligned(x, 16)) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s input null or not 16-byte aligned", what);
  if (y == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s output is null", what);
  return absl::OkStatus();
}

// The distinct experts n_tok tokens of k different selections each reach, expected when every
// expert is equally likely.
double ExpectedGroups(int64_t n_tok, int k, int n_expert) {
  const double miss = std::pow(1.0 - static_cast<double>(k) / n_expert, static_cast<double>(n_tok));
  return static_cast<double>(n_expert) * (1.0 - miss);
}

}  // namespace

absl::Status CheckGroupGrid(int n_max, int n_grid, const char *what) {
  if (n_grid < 0 || n_grid > n_max) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s: a grid of %d rows of groups for %d groups", what, n_grid, n_max);
  }
  return absl::OkStatus();
}

int GroupGridGroups(int64_t n_tok, int k, int n_expert) {
  const int64_t n_max = GroupMaxGroups(n_tok, k, n_expert);
  const bool full = !tunables::Get().cuda_group_grid;
  if (full || n_max <= 0 || k <= 0 || k > n_expert) return static_cast<int>(n_max);
  const double want = std::ceil(ExpectedGroups(n_tok, k, n_expert) * 1.05);
  return static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(want), 1, n_max));
}

int GroupChunkTokens(int64_t n_tok, int k, int n_expert) {
  if (n_tok <= 1 || k <= 0 || k > n_expert) return static_cast<int>(std::clamp<int64_t>(n_tok, 0, 8));
  const double mean = static_cast<double>(n_tok) * k / ExpectedGroups(n_tok, k, n_expert);
  int c = 2;
  while (c < 8 && c < std::lround(mean)) c *= 2;
  return static_cast<int>(std::min<int64_t>(c, n_tok));
}

int64_t GroupMaxGroups(int64_t n_tok, int k, int n_expert) {
  return std::max<int64_t>(0, std::min<int64_t>(n_tok * k, n_expert));
}

int64_t GroupPlanInts(int64_t n_tok, int k, int n_expert) { return 2 + 2 * GroupMaxGroups(n_tok, k, n_expert); }

absl::Status GroupByExpert(const int32_t *sel, int64_t n_tok, int k, int n_expert, int32_t *idx, int32_t *plan,
                           cudaStream_t stream) {
  if (n_expert < 1 || n_expert > kRouteMaxExperts) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouping over %d experts: between 1 and %d", n_expert, kRouteMaxExperts);
  }
  if (k < 1 || n_tok < 0 || n_tok > kGroupMaxSelections / k) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouping %d tokens of %d selections: at most %d selections", n_tok, k,
                  kGroupMaxSelections);
  }
  if (n_tok == 0) return absl::OkStatus();
  if (sel == nullptr || idx == nullptr || plan == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouping: selections, idx or plan is null");
  }
  const int n = static_cast<int>(n_tok * k);
  Launch(GroupByExpertKernel, 1, kGroupThreads, 0, stream, sel, n, k, n_expert,
         static_cast<int>(GroupMaxGroups(n_tok, k, n_expert)), idx, plan);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status RouteGroupQuantize(const RouteArgs &p, const float *logits, int64_t n_tok, int32_t *sel, float *wts,
                                int32_t *idx, int32_t *plan, Q8Act f, const float *h, int64_t cols, void *xq,
                                cudaStream_t stream, const ColdPlan *cold) {
  STRATA_RETURN_IF_ERROR(CheckRouteArgs(p));
  const bool quantize = f != Q8Act::kNone;
  const int block = f == Q8Act::kBlock32 ? 32 : 256;
  if (n_tok < 1 || n_tok > kRouteGroupMaxTokens || (quantize && (cols <= 0 || cols % block != 0))) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "routing, grouping and quantizing %lld tokens (1 to %d) of %lld columns (blocks of %d)",
                  static_cast<long long>(n_tok), kRouteGroupMaxTokens, static_cast<long long>(cols), block);
  }
  if (logits == nullptr || sel == nullptr || wts == nullptr || idx == nullptr || plan == nullptr ||
      (quantize && (h == nullptr || xq == nullptr))) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing, grouping and quantizing: a null buffer");
  }
  if (cold != nullptr && cold->mb.ring == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing and planning copies: a plan without a mailbox");
  }
  if (cold != nullptr && cold->n_expert != p.n_expert) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "routing and planning copies: a plan for %d experts, routing to %d",
                  cold->n_expert, p.n_expert);
  }
  const ColdPlan no_plan;
  const ColdPlan &cp = cold != nullptr ? *cold : no_plan;
  const int64_t blocks = quantize ? 1 + (cols + 255) / 256 * n_tok : 1;
  const int n_max = static_cast<int>(GroupMaxGroups(n_tok, p.k, p.n_expert));
  auto *out = static_cast<uint8_t *>(xq);
  const int64_t rb = Q8ActRowBytes(f, cols);
  const int nt = static_cast<int>(n_tok);
  if (f == Q8Act::kBlock32) {
    Launch(RouteGroupQuantizeKernel<32>, static_cast<unsigned>(blocks), kFusedThreads, 0, stream, p, logits, nt, sel,
           wts, idx, plan, n_max, h, cols, out, rb, cp);
  } else {
    Launch(RouteGroupQuantizeKernel<256>, static_cast<unsigned>(blocks), kFusedThreads, 0, stream, p, logits, nt,
           sel, wts, idx, plan, n_max, h, cols, out, rb, cp);
  }
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CheckGroupedExperts(const GroupedExperts &e) {
  if (e.gate == nullptr || e.up == nullptr || e.down == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped experts: a pointer table is null");
  }
  if (e.n_expert < 1) return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped experts: %d experts", e.n_expert);
  const DeviceMatrix &g = e.gate_shape, &u = e.up_shape, &d = e.down_shape;
  STRATA_RETURN_IF_ERROR(CheckMatrix(Shape(g)));
  STRATA_RETURN_IF_ERROR(CheckMatrix(Shape(u)));
  STRATA_RETURN_IF_ERROR(CheckMatrix(Shape(d)));
  if (g.type != u.type || g.rows != u.rows || g.cols != u.cols || g.row_bytes != u.row_bytes) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped experts need gate and up of one codec and shape (fused SwiGLU)");
  }
  if (d.rows != g.cols || d.cols != g.rows) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped experts: gate %dx%d needs down %dx%d, not %dx%d", g.rows, g.cols,
                  g.cols, g.rows, d.rows, d.cols);
  }
  return absl::OkStatus();
}

absl::Status GroupedSwiGlu(const GroupedExperts &e, const int32_t *plan, int n_max, const float *xg, float *hg,
                           cudaStream_t stream, int64_t n_tok, const uint8_t *skip, int n_grid) {
  STRATA_RETURN_IF_ERROR(CheckGroupedExperts(e));
  STRATA_RETURN_IF_ERROR(CheckPlanArgs(plan, n_max, xg, hg, "grouped SwiGLU"));
  STRATA_RETURN_IF_ERROR(CheckGroupGrid(n_max, n_grid, "grouped SwiGLU"));
  if (n_max > e.n_expert) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped SwiGLU: %d groups of %d experts", n_max, e.n_expert);
  }
  const DeviceMatrix &g = e.gate_shape;
  if (n_max == 0 || g.rows == 0) return absl::OkStatus();
  const int tw = GemvTeamWarps(g.type, g.cols, g.rows);
  const dim3 grid(RowBlocks(g.rows, dev::kSwiGluRows, tw), static_cast<unsigned>(n_grid > 0 ? n_grid : n_max));
  STRATA_CUDA_DISPATCH_CODEC(g.type, {
    const auto run = [&](auto nt) {
      Launch(GroupedSwiGluKernel<C, decltype(nt)::value>, grid, kGemvWarps * 32, 0, stream, e.gate, e.up, g.row_bytes,
             g.rows, g.cols, plan, n_max, xg, hg, tw, skip);
    };
    WithMaxChunk(n_tok, run);
  });
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status GroupedGemv(const void *const *tab, const DeviceMatrix &shape, const int32_t *plan, int n_max,
                         const float *x, float *y, cudaStream_t stream, int64_t n_tok, const uint8_t *skip,
                         int n_grid) {
  STRATA_RETURN_IF_ERROR(CheckMatrix(Shape(shape)));
  STRATA_RETURN_IF_ERROR(CheckPlanArgs(plan, n_max, x, y, "grouped GEMV"));
  STRATA_RETURN_IF_ERROR(CheckGroupGrid(n_max, n_grid, "grouped GEMV"));
  if (n_max == 0 || shape.rows == 0) return absl::OkStatus();
  if (tab == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "grouped GEMV: the pointer table is null");
  const int tw = GemvTeamWarps(shape.type, shape.cols, shape.rows);
  const dim3 grid(RowBlocks(shape.rows, dev::kGemvRows, tw), static_cast<unsigned>(n_grid > 0 ? n_grid : n_max));
  STRATA_CUDA_DISPATCH_CODEC(shape.type, {
    const auto run = [&](auto nt) {
      Launch(GroupedGemvKernel<C, decltype(nt)::value>, grid, kGemvWarps * 32, 0, stream, tab, shape.row_bytes,
             shape.rows, shape.cols, plan, n_max, x, y, tw, skip);
    };
    WithMaxChunk(n_tok, run);
  });
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

namespace {

// A slot's layout for experts of from's shapes (gate | up | down, each 256-aligned) into t, from's
// and stage's tables too; the slot's bytes. MOE_ERR_INVALID_ARGUMENT for a matrix not of whole
// 16-byte units (the copy's unit).
absl::StatusOr<uint64_t> StageLayout(const GroupedExperts &from, const ExpertStage &stage, StageTables *t) {
  const DeviceMatrix *shapes[3] = {&from.gate_shape, &from.up_shape, &from.down_shape};
  const void *const *tabs[3] = {from.gate, from.up, from.down};
  const void **to[3] = {stage.gate, stage.up, stage.down};
  uint64_t off = 0;
  for (int m = 0; m < 3; ++m) {
    const uint64_t bytes = static_cast<uint64_t>(shapes[m]->rows) * shapes[m]->row_bytes;
    if (bytes % 16 != 0) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: a matrix of %llu bytes (a multiple of 16 is needed)",
                    static_cast<unsigned long long>(bytes));
    }
    t->from[m] = tabs[m];
    t->to[m] = to[m];
    t->units[m] = bytes / 16;
    t->off[m] = off;
    off += (bytes + 255) / 256 * 256;
  }
  return off;
}

// Every argument check of StageColdExperts but the plan's; fills t.
absl::Status CheckStage(const GroupedExperts &from, const ExpertStage &stage, StageTables *t) {
  STRATA_RETURN_IF_ERROR(CheckGroupedExperts(from));
  if (from.n_expert > kRouteMaxExperts) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts of %d experts (at most %d)", from.n_expert,
                  kRouteMaxExperts);
  }
  if (stage.gate == nullptr || stage.up == nullptr || stage.down == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: a staged table is null");
  }
  if (stage.n_slots < 0 || (stage.n_slots > 0 && (stage.slots == nullptr || !Aligned(stage.slots, 256)))) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: %d slots at %p (256-byte aligned)", stage.n_slots,
                  static_cast<const void *>(stage.slots));
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t need, StageLayout(from, stage, t));
  if (stage.slot_bytes % 256 != 0 || stage.slot_bytes < need) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: slots of %llu bytes for experts of %llu",
                  static_cast<unsigned long long>(stage.slot_bytes), static_cast<unsigned long long>(need));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ExpertStageSlotBytes(const GroupedExperts &e) {
  StageTables t;
  absl::StatusOr<uint64_t> bytes = StageLayout(e, ExpertStage{}, &t);
  return bytes.ok() ? *bytes : 0;
}

absl::Status CheckExpertStage(const GroupedExperts &from, const ExpertStage &stage) {
  StageTables t;
  return CheckStage(from, stage, &t);
}

absl::Status StageColdExperts(const GroupedExperts &from, const ExpertStage &stage, const int32_t *plan, int n_max,
                              const uint8_t *skip, cudaStream_t stream) {
  StageTables t;
  STRATA_RETURN_IF_ERROR(CheckStage(from, stage, &t));
  if (n_max < 0 || n_max > from.n_expert) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: %d groups of %d experts", n_max, from.n_expert);
  }
  if (n_max == 0) return absl::OkStatus();
  if (plan == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "staging experts: the plan is null");
  Launch(StageColdExpertsKernel, std::max(1, 2 * SmCount()), kStageThreads, 0, stream, t, from.n_expert, stage, plan,
         n_max, skip);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status PlanColdCopies(const GroupedExperts &from, const ExpertStage &stage, const int32_t *plan, int n_max,
                            const uint8_t *skip, const ColdMailbox &mb, int layer, bool urgent,
                            cudaStream_t stream) {
  STRATA_ASSIGN_OR_RETURN(const ColdPlan c, MakeColdPlan(from, stage, skip, mb, layer, urgent));
  if (n_max < 0 || n_max > from.n_expert) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "planning expert copies: %d groups of %d experts", n_max, from.n_expert);
  }
  if (plan == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "planning expert copies: the plan is null");
  // The kernel posts no request when nothing is cold (an urgent plan then points the wait at the
  // requests posted before).
  Launch(PlanColdCopiesKernel, 1, kStageThreads, 0, stream, c, plan, n_max);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::StatusOr<ColdPlan> MakeColdPlan(const GroupedExperts &from, const ExpertStage &stage, const uint8_t *skip,
                                      const ColdMailbox &mb, int layer, bool urgent) {
  ColdPlan c;
  STRATA_RETURN_IF_ERROR(CheckStage(from, stage, &c.t));
  if (mb.ring == nullptr || mb.next == nullptr || mb.done == nullptr || mb.want == nullptr || mb.timed_out == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "planning expert copies: an incomplete mailbox");
  }
  c.n_expert = from.n_expert;
  c.stage = stage;
  c.skip = skip;
  c.mb = mb;
  c.layer = layer;
  c.urgent = urgent;
  return c;
}

absl::Status WaitColdCopies(const ColdMailbox &mb, cudaStream_t stream) {
  if (mb.done == nullptr || mb.want == nullptr || mb.timed_out == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "waiting for expert copies: an incomplete mailbox");
  }
  Launch(WaitColdCopiesKernel, 1, 32, 0, stream, mb);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

GroupedExperts StagedExperts(const GroupedExperts &from, const ExpertStage &stage) {
  GroupedExperts e = from;
  e.gate = stage.gate;
  e.up = stage.up;
  e.down = stage.down;
  return e;
}

absl::Status CopySkippedGroups(const int32_t *plan, int n_max, const uint8_t *skip, const float *src, float *dst,
                               int64_t width, cudaStream_t stream) {
  if (n_max < 0 || n_max > kMaxGridY || width < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "copying skipped groups: %d groups of width %lld", n_max,
                  static_cast<long long>(width));
  }
  if (n_max == 0 || width == 0) return absl::OkStatus();
  if (plan == nullptr || skip == nullptr || src == nullptr || dst == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "copying skipped groups: a null plan, mask or buffer");
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((width + 255) / 256, 16)), static_cast<unsigned>(n_max));
  Launch(CopySkippedGroupsKernel, grid, 256, 0, stream, plan, n_max, skip, src, dst, width);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status PostCpuCall(const CpuCallBox &b, const CpuCall &c, const int32_t *sel, const float *h, int64_t n_embd,
                         const void *const *tab, cudaStream_t stream, const void *const *up_tab,
                         const void *const *down_tab) {
  if (b.call == nullptr || b.sel == nullptr || b.h == nullptr || b.tab == nullptr || b.next == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "posting a CPU call: an incomplete box");
  }
  if (c.n_tok <= 0 || c.k <= 0 || c.n_expert <= 0 || n_embd <= 0 || sel == nullptr || h == nullptr ||
      tab == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "posting a CPU call: %lld tokens of %d over %d experts, width %lld",
                  static_cast<long long>(c.n_tok), c.k, c.n_expert, static_cast<long long>(n_embd));
  }
  Launch(PostCpuCallKernel, 1, 1024, 0, stream, b, c, sel, h, c.n_tok * n_embd, tab, up_tab, down_tab);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status WaitCpuCall(const CpuCallBox &b, int stage, const uint8_t *skip_host, uint8_t *skip_dev, int n_skip,
                         cudaStream_t stream) {
  if (b.next == nullptr || b.answer == nullptr || b.timed_out == nullptr || stage < 0 || stage > 1) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "waiting for a CPU call: an incomplete box or stage %d", stage);
  }
  if (skip_dev != nullptr && (skip_host == nullptr || n_skip < 0)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "waiting for a CPU call: %d flags from a null buffer", n_skip);
  }
  Launch(WaitCpuCallKernel, 1, 128, 0, stream, b, stage, skip_host, skip_dev, n_skip);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace strata::cuda
