// Token sampling from logits: repetition, presence and frequency penalties over the session's recent tokens,
// then greedy, or temperature with top-k, top-p and min-p, driven by a seeded SplitMix64/xoshiro
// generator whose output (and so every sampled token) is identical on every platform for the same
// seed and inputs (no std::*_distribution; probabilities in double). Also the stop-string filter
// that holds back text which might be the start of a stop string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace strata::runtime {

struct SamplerParams {
  float temperature = 0.f;      // <= 0: greedy
  int32_t top_k = 0;            // <= 0: off
  float top_p = 1.f;            // >= 1: off
  float min_p = 0.f;            // <= 0: off; keeps tokens with p >= min_p * p(most likely), after top-p
  float repeat_penalty = 1.f;   // 1: off; a recent token's logit l becomes l / r if l > 0, else l * r
  float presence_penalty = 0.f; // 0: off; subtracted once from the logit of every recent token
  float frequency_penalty = 0.f; // 0: off; subtracted from a recent token's logit once per occurrence
  int32_t penalty_last_n = 64;  // the window: the last N tokens of the session; 0: no penalties
};

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();  // [0, 1) with 53 random bits
  // The generator's whole state, for session snapshots; a state of all zeros is invalid.
  void GetState(uint64_t out[4]) const;
  void SetState(const uint64_t in[4]);

 private:
  uint64_t s_[4];
};

// Applies the penalties for the tokens of `recent` (the caller passes the window, the last
// penalty_last_n tokens) to logits[0, n_vocab): for each distinct token occurring c times, the
// repetition penalty once, then l -= presence_penalty + c * frequency_penalty (OpenAI's formula over
// the window, as llama.cpp's); ids outside the vocabulary are ignored.
void ApplyPenalties(float *logits, int32_t n_vocab, const SamplerParams &p, absl::Span<const int32_t> recent);

// Returns the sampled token id: penalties over `recent` (the last penalty_last_n of them), then
// greedy (ties go to the lower id) or: top-k, softmax with temperature, top-p, min-p, one draw.
int32_t Sample(const float *logits, int32_t n_vocab, const SamplerParams &p, Rng &rng,
               absl::Span<const int32_t> recent = {});

// The selections Sample makes, exposed for tests: the first index of the largest logit (as
// std::max_element: a NaN is taken only when it comes first), and the candidates a draw is made
// from, in order (higher logit first, the lower id first among equal logits; -0 and +0 equal): the
// top_k first when 0 < top_k < n_vocab, else every id.
int32_t Greedy(const float *logits, int32_t n_vocab);
std::vector<int32_t> SampleCandidates(const float *logits, int32_t n_vocab, int32_t top_k);

// Stop strings over streamed text. Push takes the next text and returns what may be shown: text
// that cannot be the start of a stop string; the rest is held back until it is decided. When the
// text reaches a stop string, Push returns the text before it, sets *stopped, and drops the rest.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  std::string Push(std::string_view text, bool *stopped);
  // The held-back text (no stop string came); resets for the next stream.
  std::string Finish();
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace strata::runtime
