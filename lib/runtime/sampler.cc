// Sampler: penalties, then softmax with temperature over the candidates that survive top-k, then
// top-p and min-p. Stop strings: a held-back suffix, never longer than the longest stop string.
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

void Rng::GetState(uint64_t out[4]) const {
  for (int i = 0; i < 4; ++i) out[i] = s_[i];
}

void Rng::SetState(const uint64_t in[4]) {
  for (int i = 0; i < 4; ++i) s_[i] = in[i];
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

void ApplyPenalties(float *logits, int32_t n_vocab, const SamplerParams &p, absl::Span<const int32_t> recent) {
  if (p.repeat_penalty == 1.f && p.presence_penalty == 0.f) return;
  std::vector<int32_t> ids(recent.begin(), recent.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab) continue;
    float &l = logits[id];
    if (p.repeat_penalty != 1.f) l = l > 0.f ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= p.presence_penalty;
  }
}

int32_t Sample(const float *logits_in, int32_t n_vocab, const SamplerParams &p, Rng &rng,
               absl::Span<const int32_t> recent) {
  const float *logits = logits_in;
  std::vector<float> penalized;
  if (p.penalty_last_n > 0 && !recent.empty() && (p.repeat_penalty != 1.f || p.presence_penalty != 0.f)) {
    if (recent.size() > static_cast<size_t>(p.penalty_last_n)) {
      recent = recent.subspan(recent.size() - p.penalty_last_n);
    }
    penalized.assign(logits_in, logits_in + n_vocab);
    ApplyPenalties(penalized.data(), n_vocab, p, recent);
    logits = penalized.data();
  }
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
  if (p.min_p > 0.f) {
    // prob[0] is the most likely candidate's (unnormalised) probability; the list is sorted.
    const double floor = static_cast<double>(p.min_p) * prob[0];
    int32_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
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

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto &s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStrings::Push(std::string_view text, bool *stopped) {
  *stopped = false;
  held_.append(text);
  if (stops_.empty()) return std::move(held_);
  // The earliest stop string in the held text (held text never contains a whole one before).
  size_t cut = std::string::npos;
  for (const auto &s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    *stopped = true;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto &s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::Finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace strata::runtime
