// The routing of one token on one warp, shared by the routing kernel (forward_ops.cu) and the
// kernel that routes and groups a few tokens in one launch (grouped.cu).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backends/cuda/kernels.h"

namespace strata::cuda::dev {

// exp in double, rounded once: as glibc's expf rounds.
__device__ __forceinline__ float ExpF(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// k largest of v[0..n) (ties to the lower index) into out, by repeated argmax. Chosen indices are
// kept as a bit set in the thread's own memory: `out` may be global memory, never read back here.
__device__ __forceinline__ void TopKDev(const float *v, int n, int k, int32_t *out) {
  uint32_t taken[kRouteMaxExperts / 32];
  for (int w = 0; w < kRouteMaxExperts / 32; ++w) taken[w] = 0u;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = 0.f;
    for (int i = 0; i < n; ++i) {
      if ((taken[i >> 5] >> (i & 31)) & 1u) continue;
      const float x = v[i];
      if (best < 0 || x > bv) {
        best = i;
        bv = x;
      }
    }
    taken[best >> 5] |= 1u << (best & 31);
    out[j] = best;
  }
}

// The k largest of v[0..n) (shared memory; ties to the lower index) into out, by k warp-wide
// argmax rounds: each lane scans its own elements (lane, lane + 32, ...) and the lanes' bests are
// combined by value, then index — the argmax the host's ascending scan finds (for values that are
// not NaN). Every lane returns with out written.
__device__ __forceinline__ void WarpTopK(const float *v, int n, int k, int lane, int32_t *out) {
  constexpr int kPerLane = kRouteMaxExperts / 32;
  float mine[kPerLane];  // the lane's elements, read once
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) mine[m] = lane + 32 * m < n ? v[lane + 32 * m] : 0.f;
  uint32_t taken = 0;  // bit m: element lane + 32 m already chosen
  for (int j = 0; j < k; ++j) {
    int bi = -1;
    float bv = 0.f;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const int i = lane + 32 * m;
      if (i >= n || ((taken >> m) & 1u)) continue;
      if (bi < 0 || mine[m] > bv) {
        bi = i;
        bv = mine[m];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
        bi = oi;
        bv = ov;
      }
    }
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == 0) out[j] = bi;
  }
  __syncwarp();
}

// Routes token t on one warp (every lane calls it), the host RouteToken's steps in its order (see
// lib/model/routing.h): the element-wise steps spread over the lanes, every sum taken by lane 0 in
// expert order (so it rounds as the host's does), top-k by warp argmax. pr, choice and ss are the
// warp's own kRouteMaxExperts-entry scratch (shared memory); writes sel[t k ..] and wts[t k ..].
__device__ __forceinline__ void RouteWarpToken(const RouteArgs &p, const float *logits, int64_t t, int32_t *sel,
                                               float *wts, float *pr, float *choice, int32_t *ss, int lane) {
  const int n_expert = p.n_expert, k = p.k;
  const float *l = logits + t * n_expert;
  int32_t *s = sel + t * k;
  float *w = wts + t * k;
  for (int e = lane; e < n_expert; e += 32) pr[e] = l[e];
  __syncwarp();
  if (p.gating == 1) {  // softmax over the selected
    WarpTopK(pr, n_expert, k, lane, ss);
    if (lane == 0) {
      const float mx = pr[ss[0]];
      float sum = 0.f;
      for (int j = 0; j < k; ++j) {
        w[j] = ExpF(pr[ss[j]] - mx);
        sum = __fadd_rn(sum, w[j]);
      }
      for (int j = 0; j < k; ++j) {
        w[j] = __fdiv_rn(w[j], sum);
        s[j] = ss[j];
      }
    }
    return;
  }
  if (p.gating == 2) {
    for (int e = lane; e < n_expert; e += 32) pr[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, ExpF(-pr[e])));
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, pr[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < n_expert; e += 32) pr[e] = ExpF(pr[e] - mx);
    __syncwarp();
    float sum = 0.f;
    if (lane == 0) {
#pragma unroll 16
      for (int e = 0; e < n_expert; ++e) sum = __fadd_rn(sum, pr[e]);
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int e = lane; e < n_expert; e += 32) pr[e] = __fdiv_rn(pr[e], sum);
  }
  for (int e = lane; e < n_expert; e += 32) {
    choice[e] = p.gating == 2 && p.select_bias != nullptr ? __fadd_rn(pr[e], p.select_bias[e]) : pr[e];
  }
  __syncwarp();
  if (p.n_group > 1) {  // group-limited selection (DeepSeek-V3): lane 0, groups are few
    if (lane == 0) {
      const int per = n_expert / p.n_group;
      float group[kRouteMaxExperts];
      for (int g = 0; g < p.n_group; ++g) {
        float b0 = -INFINITY, b1 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const float v = choice[e];
          if (v > b0) {
            b1 = b0;
            b0 = v;
          } else if (v > b1) {
            b1 = v;
          }
        }
        group[g] = p.gating == 2 ? __fadd_rn(b0, b1) : b0;
      }
      int32_t keep[kRouteMaxExperts];
      TopKDev(group, p.n_group, p.topk_group, keep);
      const float drop = p.gating == 2 ? -INFINITY : 0.f;
      for (int e = 0; e < n_expert; ++e) {
        bool kept = false;
        for (int m = 0; m < p.topk_group; ++m) kept = kept || keep[m] == e / per;
        if (!kept) choice[e] = drop;
      }
    }
    __syncwarp();
  }
  WarpTopK(choice, n_expert, k, lane, ss);
  if (lane != 0) return;
  float sum = 0.f;
  for (int j = 0; j < k; ++j) {
    w[j] = pr[ss[j]];
    s[j] = ss[j];
    sum = __fadd_rn(sum, w[j]);
  }
  if (p.norm_topk_prob) {
    if (p.gating == 2) sum = __fadd_rn(sum, 1e-20f);
    for (int j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], sum);
  }
  if (p.routed_scale != 1.f) {
    for (int j = 0; j < k; ++j) w[j] = __fmul_rn(w[j], p.routed_scale);
  }
}

}  // namespace strata::cuda::dev
