// Routing arithmetic on the host (see routing.h). Every step is float32 in the order transformers
// uses, so the selections match the golden fixtures.
#include "lib/model/routing.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

namespace strata::model {
namespace {

// k largest of v (ties to the lower index), written to idx[0..k).
void TopK(const std::vector<float> &v, int k, int32_t *out) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

void RouteToken(const RouteParams &rp, const float *logits, int32_t *sel, float *wts) {
  const int n_expert = rp.n_expert, k = rp.k;
  std::vector<float> p(logits, logits + n_expert);
  if (rp.gating == Gating::kSoftmaxSelected) {
    TopK(p, k, sel);
    float mx = p[sel[0]], sum = 0.f;
    for (int j = 0; j < k; ++j) {
      wts[j] = std::exp(p[sel[j]] - mx);
      sum += wts[j];
    }
    for (int j = 0; j < k; ++j) wts[j] /= sum;
    return;
  }
  if (rp.gating == Gating::kSigmoid) {
    for (auto &v : p) v = 1.0f / (1.0f + std::exp(-v));
  } else {
    float mx = *std::max_element(p.begin(), p.end());
    float sum = 0.f;
    for (auto &v : p) {
      v = std::exp(v - mx);
      sum += v;
    }
    for (auto &v : p) v /= sum;
  }
  std::vector<float> choice = p;
  if (rp.gating == Gating::kSigmoid && rp.select_bias != nullptr) {
    for (int e = 0; e < n_expert; ++e) choice[e] += rp.select_bias[e];
  }
  if (rp.n_group > 1) {
    const int per = n_expert / rp.n_group;
    std::vector<float> group(rp.n_group);
    for (int g = 0; g < rp.n_group; ++g) {
      std::vector<float> m(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(m.begin(), m.end(), std::greater<float>());
      group[g] = rp.gating == Gating::kSigmoid ? m[0] + m[1] : m[0];
    }
    std::vector<int32_t> keep(rp.topk_group);
    TopK(group, rp.topk_group, keep.data());
    std::vector<uint8_t> kept(rp.n_group, 0);
    for (int32_t g : keep) kept[g] = 1;
    // Experts of the other groups drop out (-inf for sigmoid, 0 probability for softmax, as
    // transformers masks them).
    const float drop = rp.gating == Gating::kSigmoid ? -INFINITY : 0.f;
    for (int e = 0; e < n_expert; ++e) {
      if (!kept[e / per]) choice[e] = drop;
    }
  }
  TopK(choice, k, sel);
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    wts[j] = p[sel[j]];
    s += wts[j];
  }
  if (rp.norm_topk_prob) {
    if (rp.gating == Gating::kSigmoid) s += 1e-20f;
    for (int j = 0; j < k; ++j) wts[j] /= s;
  }
  if (rp.routed_scale != 1.f) {
    for (int j = 0; j < k; ++j) wts[j] *= rp.routed_scale;
  }
}


ExpertGroups GroupByExpert(const int32_t *sel, int64_t n_tok, int k, int n_expert) {
  const int64_t n = n_tok * k;
  std::vector<std::vector<int64_t>> members(n_expert);  // indices into sel (t * k + slot)
  for (int64_t i = 0; i < n; ++i) members[sel[i]].push_back(i);
  ExpertGroups g;
  g.idx.resize(2 * n);
  int64_t row = 0;
  for (int e = 0; e < n_expert; ++e) {
    if (members[e].empty()) continue;
    g.used.push_back(e);
    g.first.push_back(row);
    for (int64_t i : members[e]) {
      g.idx[row] = static_cast<int32_t>(i / k);
      g.idx[n + i] = static_cast<int32_t>(row);
      ++row;
    }
  }
  g.first.push_back(row);
  return g;
}

RouteParams RouteParamsFor(const HParams &hp, const Vec &select_bias) {
  RouteParams p;
  p.gating = hp.gating;
  p.n_expert = hp.n_expert;
  p.k = hp.n_expert_used;
  p.n_group = hp.n_group;
  p.topk_group = hp.topk_group;
  p.norm_topk_prob = hp.norm_topk_prob;
  p.routed_scale = hp.routed_scale;
  p.select_bias = select_bias.tensor != nullptr ? select_bias.values.data() : nullptr;
  return p;
}

}  // namespace strata::model
