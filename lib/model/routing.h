// Routing arithmetic on the host: router logits of one token -> selected experts and their weights,
// as transformers computes them in float32. The CPU backend's Route runs it per token; device
// backends are tested against it.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/model/backend.h"

namespace strata::model {

// logits (p.n_expert) -> sel (p.k) expert ids and wts (p.k) weights:
//  kSoftmax: softmax over all experts, top-k (within the topk_group best groups by their best
//    expert when n_group > 1, DeepSeek-V2), optional renormalisation;
//  kSigmoid: sigmoid scores; the selection ranks score + select_bias within the topk_group groups
//    whose two best biased scores sum highest (DeepSeek-V3); the weights are the unbiased scores;
//  kSoftmaxSelected: top-k of the logits, softmax over those k (gpt-oss).
// Ties go to the lower index. The weights are finally multiplied by routed_scale.
void RouteToken(const RouteParams &p, const float *logits, int32_t *sel, float *wts);

// Tokens grouped by selected expert, as every backend runs a MoE layer: the distinct experts of
// sel (n_tok, k) ascending in `used`, group u being grouped rows [first[u], first[u + 1]); within a
// group the selections i = t k + j ascending. idx (2 n_tok k): idx[r] = token of grouped row r,
// idx[n_tok k + i] = grouped row of selection i. Selections must lie in [0, n_expert).
struct ExpertGroups {
  std::vector<int32_t> used;
  std::vector<int64_t> first;
  std::vector<int32_t> idx;
};
ExpertGroups GroupByExpert(const int32_t *sel, int64_t n_tok, int k, int n_expert);

// The RouteParams of a layer's router.
RouteParams RouteParamsFor(const HParams &hp, const Vec &select_bias);

}  // namespace strata::model
