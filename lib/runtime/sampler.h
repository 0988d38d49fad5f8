// Token sampling from logits: greedy, or temperature with top-k and top-p, driven by a seeded
// SplitMix64/xoshiro generator whose output (and so every sampled token) is identical on every
// platform for the same seed and inputs.
#pragma once

#include <cstdint>

namespace strata::runtime {

struct SamplerParams {
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 0;        // <= 0: off
  float top_p = 1.f;        // >= 1: off
};

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

// Returns the sampled token id; ties in greedy go to the lower id.
int32_t Sample(const float *logits, int32_t n_vocab, const SamplerParams &p, Rng &rng);

}  // namespace strata::runtime
