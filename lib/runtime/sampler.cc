// Sampler: penalties, then softmax with temperature over the candidates that survive top-k, then
// top-p and min-p. Stop strings: a held-back suffix, never longer than the longest stop string.
#include "lib/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
  if (p.repeat_penalty == 1.f && p.presence_penalty == 0.f && p.frequency_penalty == 0.f) return;
  std::vector<int32_t> ids(recent.begin(), recent.end());
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    const int32_t id = ids[i];
    size_t count = 0;
    for (; i < ids.size() && ids[i] == id; ++i) ++count;
    if (id < 0 || id >= n_vocab) continue;
    float &l = logits[id];
    if (p.repeat_penalty != 1.f) l = l > 0.f ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= p.presence_penalty;
    if (p.frequency_penalty != 0.f) l -= static_cast<float>(count) * p.frequency_penalty;
  }
}

// In a loop the compiler can vectorize (bench/sampler_bench measures it).
int32_t Greedy(const float *l, int32_t n) {
  if (n <= 0 || std::isnan(l[0])) return 0;
  constexpr int kLanes = 16;
  float m[kLanes];
  std::fill(m, m + kLanes, l[0]);
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
  }
  float mx = m[0];
  for (int j = 1; j < kLanes; ++j) mx = m[j] > mx ? m[j] : mx;
  for (; i < n; ++i) mx = l[i] > mx ? l[i] : mx;
  for (i = 0; i < n; ++i) {
    if (l[i] == mx) return i;
  }
  return 0;
}

namespace {

// The candidates' order: higher logit first, the lower id first among equal logits.
struct ByLogit {
  const float *l;
  bool operator()(int32_t a, int32_t b) const { return l[a] > l[b] || (l[a] == l[b] && a < b); }
};

// The k first ids in ByLogit order (0 < k < n), as std::partial_sort leaves them, from one pass
// that keeps the k best so far in a heap whose top is the worst of them; an id enters only with a
// logit above that worst one (a later id never wins a tie).
std::vector<int32_t> TopK(const float *l, int32_t n, int32_t k) {
  const ByLogit by{l};
  std::vector<int32_t> heap(k);
  std::iota(heap.begin(), heap.end(), 0);
  std::make_heap(heap.begin(), heap.end(), by);  // the top is the last in ByLogit order
  float worst = l[heap.front()];
  for (int32_t i = k; i < n; ++i) {
    if (!(l[i] > worst)) continue;
    std::pop_heap(heap.begin(), heap.end(), by);
    heap.back() = i;
    std::push_heap(heap.begin(), heap.end(), by);
    worst = l[heap.front()];
  }
  std::sort(heap.begin(), heap.end(), by);
  return heap;
}

// Every id in ByLogit order: a stable radix sort of the ids (in id order) by an unsigned key whose
// ascending order is the logits' descending order (-0 as +0: they tie), so equal logits keep the
// lower id first (faster than a comparison sort, the exponentials now the larger part of Sample
// over every id; bench/sampler_bench).
std::vector<int32_t> SortAll(const float *l, int32_t n) {
  std::vector<uint32_t> key(n), key2(n);
  std::vector<int32_t> id(n), id2(n);
  for (int32_t i = 0; i < n; ++i) {
    const float v = l[i] == 0.f ? 0.f : l[i];
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);  // ascending with the value
    key[i] = ~u;                                            // ascending with -value
    id[i] = i;
  }
  constexpr int kBits = 11, kBuckets = 1 << kBits;
  std::vector<int32_t> count(kBuckets);
  for (int shift = 0; shift < 32; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (int32_t i = 0; i < n; ++i) ++count[(key[i] >> shift) & (kBuckets - 1)];
    int32_t at = 0;
    for (int32_t &c : count) {
      const int32_t here = c;
      c = at;
      at += here;
    }
    for (int32_t i = 0; i < n; ++i) {
      const int32_t to = count[(key[i] >> shift) & (kBuckets - 1)]++;
      key2[to] = key[i];
      id2[to] = id[i];
    }
    key.swap(key2);
    id.swap(id2);
  }
  return id;
}

}  // namespace

std::vector<int32_t> SampleCandidates(const float *logits, int32_t n_vocab, int32_t top_k) {
  return top_k > 0 && top_k < n_vocab ? TopK(logits, n_vocab, top_k) : SortAll(logits, n_vocab);
}

int32_t Sample(const float *logits_in, int32_t n_vocab, const SamplerParams &p, Rng &rng,
               absl::Span<const int32_t> recent) {
  const float *logits = logits_in;
  std::vector<float> penalized;
  if (p.penalty_last_n > 0 && !recent.empty() &&
      (p.repeat_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f)) {
    if (recent.size() > static_cast<size_t>(p.penalty_last_n)) {
      recent = recent.subspan(recent.size() - p.penalty_last_n);
    }
    penalized.assign(logits_in, logits_in + n_vocab);
    ApplyPenalties(penalized.data(), n_vocab, p, recent);
    logits = penalized.data();
  }
  if (p.temperature <= 0.f) return Greedy(logits, n_vocab);
  const std::vector<int32_t> idx = SampleCandidates(logits, n_vocab, p.top_k);
  int32_t n = static_cast<int32_t>(idx.size());
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
