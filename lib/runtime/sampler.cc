// Sampler: softmax with temperature over the candidates that survive top-k then top-p.
#include "lib/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace strata::runtime {

Rng::Rng(uint64_t seed) {
  // SplitMix64 expands the seed into xoshiro256** state.
  uint64_t z = seed;
  for (auto &s : s_) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t x = z;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    s = x ^ (x >> 31);
  }
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int32_t Sample(const float *logits, int32_t n_vocab, const SamplerParams &p, Rng &rng) {
  if (p.temperature <= 0.f) {
    return static_cast<int32_t>(std::max_element(logits, logits + n_vocab) - logits);
  }
  std::vector<int32_t> idx(n_vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int32_t n = n_vocab;
  if (p.top_k > 0 && p.top_k < n) {
    std::partial_sort(idx.begin(), idx.begin() + p.top_k, idx.end(), by_logit);
    n = p.top_k;
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  // Probabilities in double so the same logits give the same draw everywhere.
  std::vector<double> prob(n);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[idx[i]]) - mx) / p.temperature);
    sum += prob[i];
  }
  if (p.top_p < 1.f) {
    double acc = 0;
    int32_t keep = n;
    for (int32_t i = 0; i < n; ++i) {
      acc += prob[i] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = std::accumulate(prob.begin(), prob.begin() + n, 0.0);
  }
  double r = rng.Uniform() * sum;
  for (int32_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace strata::runtime
