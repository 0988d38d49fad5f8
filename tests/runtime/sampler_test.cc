// Sampler tests: each sampler's distribution on fixed logits (chi-square over many draws with a
// fixed seed), determinism per seed (pinned ids, so another platform that drifts fails), the
// penalties touching exactly the windowed tokens, and stop strings split across pieces.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lib/runtime/sampler.h"

namespace strata::runtime {
namespace {

// p = {0.40, 0.25, 0.15, 0.10, 0.06, 0.04} as logits (log p + 3, so some are positive, some not).
std::vector<float> Logits() {
  std::vector<float> l;
  for (double p : {0.40, 0.25, 0.15, 0.10, 0.06, 0.04}) l.push_back(static_cast<float>(std::log(p) + 1.5));
  return l;
}

std::vector<double> Softmax(const std::vector<float> &l, double temp, size_t keep) {
  std::vector<double> p(l.size(), 0.0);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(l[i] / temp);
  for (auto &v : p) v /= sum;
  return p;
}

// Pearson's chi-square of the counts of n draws against `expect`; tokens with p = 0 must never come.
double ChiSquare(const SamplerParams &sp, const std::vector<float> &l, const std::vector<double> &expect,
                 std::vector<int32_t> recent = {}, uint64_t seed = 1234, int n = 200000) {
  Rng rng(seed);
  std::vector<int> count(l.size(), 0);
  for (int i = 0; i < n; ++i) ++count[Sample(l.data(), static_cast<int32_t>(l.size()), sp, rng, recent)];
  double chi = 0;
  for (size_t k = 0; k < l.size(); ++k) {
    INFO("token " << k << " count " << count[k] << " expected p " << expect[k]);
    if (expect[k] == 0) {
      CHECK(count[k] == 0);
      continue;
    }
    const double e = expect[k] * n;
    chi += (count[k] - e) * (count[k] - e) / e;
  }
  return chi;
}

// Critical value of chi-square at p = 0.001 for up to 5 degrees of freedom is 20.5.
constexpr double kChiCritical = 20.5;

}  // namespace

TEST_CASE("sampler: temperature, top-k, top-p and min-p draw from the right distribution", "[sampler]") {
  const auto l = Logits();
  SamplerParams sp;
  sp.temperature = 1.f;
  SECTION("temperature 1") { CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 6)) < kChiCritical); }
  SECTION("temperature 0.5 sharpens") {
    sp.temperature = 0.5f;
    CHECK(ChiSquare(sp, l, Softmax(l, 0.5, 6)) < kChiCritical);
  }
  SECTION("temperature 2 flattens") {
    sp.temperature = 2.f;
    CHECK(ChiSquare(sp, l, Softmax(l, 2.0, 6)) < kChiCritical);
  }
  SECTION("top-k 2") {
    sp.top_k = 2;
    CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 2)) < kChiCritical);
  }
  SECTION("top-p 0.75 keeps the smallest prefix reaching it") {
    sp.top_p = 0.75f;  // 0.40 + 0.25 = 0.65 < 0.75 <= 0.80
    CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 3)) < kChiCritical);
  }
  SECTION("min-p 0.3 keeps p >= 0.3 * 0.40") {
    sp.min_p = 0.3f;  // 0.12: keeps 0.40, 0.25, 0.15
    CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 3)) < kChiCritical);
  }
  SECTION("min-p after top-k") {
    sp.top_k = 4;
    sp.min_p = 0.5f;  // 0.20: keeps 0.40, 0.25
    CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 2)) < kChiCritical);
  }
  SECTION("min-p 1 is greedy") {
    sp.min_p = 1.f;
    CHECK(ChiSquare(sp, l, Softmax(l, 1.0, 1), {}, 7, 2000) == 0);
  }
}

TEST_CASE("sampler: penalties change the distribution as their formulas say", "[sampler]") {
  const auto l = Logits();
  SamplerParams sp;
  sp.temperature = 1.f;
  sp.repeat_penalty = 1.5f;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = 0.25f;
  const std::vector<int32_t> recent = {0, 3, 0, 0};
  std::vector<float> pen = l;
  for (int id : {0, 3}) {
    const int count = id == 0 ? 3 : 1;
    pen[id] = (pen[id] > 0 ? pen[id] / 1.5f : pen[id] * 1.5f) - 0.5f - count * 0.25f;
  }
  std::vector<double> expect(l.size());
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += expect[i] = std::exp(static_cast<double>(pen[i]));
  for (auto &e : expect) e /= sum;
  CHECK(ChiSquare(sp, l, expect, recent) < kChiCritical);
}

TEST_CASE("sampler: penalties touch exactly the windowed tokens, once each", "[sampler]") {
  const std::vector<float> base = {2.f, -1.f, 0.5f, -0.25f, 3.f, 0.f};
  SamplerParams sp;
  sp.repeat_penalty = 2.f;
  std::vector<float> l = base;
  ApplyPenalties(l.data(), 6, sp, std::vector<int32_t>{0, 1, 1, 1, 5, 99, -3});
  CHECK(l[0] == 1.f);    // positive: divided
  CHECK(l[1] == -2.f);   // negative: multiplied, once although it occurs three times
  CHECK(l[5] == 0.f);    // zero stays
  for (int i : {2, 3, 4}) CHECK(l[i] == base[i]);
  sp.repeat_penalty = 1.f;
  sp.presence_penalty = 0.75f;
  l = base;
  ApplyPenalties(l.data(), 6, sp, std::vector<int32_t>{2, 2, 3});
  CHECK(l[2] == 0.5f - 0.75f);
  CHECK(l[3] == -0.25f - 0.75f);
  for (int i : {0, 1, 4, 5}) CHECK(l[i] == base[i]);
  // The frequency penalty counts: once per occurrence in the window, negative values reward.
  sp.presence_penalty = 0.f;
  sp.frequency_penalty = 0.5f;
  l = base;
  ApplyPenalties(l.data(), 6, sp, std::vector<int32_t>{4, 1, 4, 4, 7});
  CHECK(l[4] == 3.f - 3 * 0.5f);
  CHECK(l[1] == -1.f - 0.5f);
  for (int i : {0, 2, 3, 5}) CHECK(l[i] == base[i]);
  sp.frequency_penalty = -2.f;
  l = base;
  ApplyPenalties(l.data(), 6, sp, std::vector<int32_t>{2, 2});
  CHECK(l[2] == 0.5f + 4.f);

  // The window is the last penalty_last_n tokens; greedy sees the penalties too.
  SamplerParams g;
  g.repeat_penalty = 10.f;
  g.penalty_last_n = 2;
  Rng rng(1);
  const std::vector<int32_t> hist = {4, 2, 3};  // 4 is the argmax, outside a window of 2
  CHECK(Sample(base.data(), 6, g, rng, hist) == 4);
  g.penalty_last_n = 3;
  CHECK(Sample(base.data(), 6, g, rng, hist) == 0);  // 3 / 10 < 2
  g.penalty_last_n = 0;                               // off
  CHECK(Sample(base.data(), 6, g, rng, hist) == 4);
}

TEST_CASE("sampler: the same seed gives the same tokens on every run and platform", "[sampler]") {
  std::vector<float> l(512);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(0.37 * i) * 4.0);
  SamplerParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 40;
  sp.top_p = 0.95f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.1f;
  sp.presence_penalty = 0.2f;
  auto run = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(Sample(l.data(), 512, sp, rng, out));
    return out;
  };
  const auto a = run(42);
  CHECK(a == run(42));
  CHECK(a != run(43));
  // Pinned: xoshiro256** seeded by SplitMix64, probabilities in double. A change here changes what
  // every host's seeded session generates.
  Rng rng(42);
  CHECK(rng.Next() == 0x15780b2e0c2ec716ull);
  const std::vector<int32_t> first = {a.begin(), a.begin() + 8};
  CHECK(first == std::vector<int32_t>{259, 106, 4, 39, 73, 479, 497, 428});
}

TEST_CASE("sampler: its selections are those of max_element, partial_sort and sort, ties and signed zeros included",
          "[sampler]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  for (int round = 0; round < 400; ++round) {
    const int32_t n = std::vector<int32_t>{1, 2, 3, 7, 16, 17, 100, 1000, 5000}[gen() % 9];
    // Continuous logits, or a few distinct values (ties everywhere), with zeros of both signs and
    // infinities mixed in.
    std::vector<float> l(n);
    const bool few = gen() % 2 == 0;
    std::normal_distribution<float> normal(0.f, 2.f + static_cast<float>(gen() % 8));
    for (float &v : l) {
      v = few ? static_cast<float>(static_cast<int>(gen() % 5) - 2) * 0.5f : normal(gen);
      const uint64_t r = gen() % 64;
      if (r == 0) v = 0.f;
      if (r == 1) v = -0.f;
      if (r == 2 && round % 3 == 0) v = -INFINITY;
      if (r == 3 && round % 5 == 0) v = INFINITY;
    }
    const int32_t top_k = std::vector<int32_t>{0, 1, 3, n - 1, n, n + 5, 40}[gen() % 7];
    INFO("round " << round << " n " << n << " top_k " << top_k << (few ? " (ties)" : ""));
    CHECK(Greedy(l.data(), n) == static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    std::vector<int32_t> want(n);
    std::iota(want.begin(), want.end(), 0);
    auto by = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    if (top_k > 0 && top_k < n) {
      std::partial_sort(want.begin(), want.begin() + top_k, want.end(), by);
      want.resize(top_k);
    } else {
      std::sort(want.begin(), want.end(), by);
    }
    REQUIRE(SampleCandidates(l.data(), n, top_k) == want);
  }
}

TEST_CASE("stop strings: cut at the first stop, hold back only what may begin one", "[sampler]") {
  bool stopped = false;
  StopStrings s({"STOP", "\n\nUser:"});
  CHECK(s.Push("Hello ", &stopped) == "Hello ");
  CHECK(!stopped);
  CHECK(s.Push("wor", &stopped) == "wor");
  CHECK(s.Push("ld S", &stopped) == "ld ");  // "S" might begin STOP
  CHECK(s.Push("T", &stopped) == "");         // "ST"
  CHECK(s.Push("ART", &stopped) == "START");  // not a stop after all
  CHECK(s.Push("\n", &stopped) == "");
  CHECK(s.Push("\nUs", &stopped) == "");
  CHECK(s.Push("er: more", &stopped) == "");
  CHECK(stopped);
  CHECK(s.Finish().empty());

  StopStrings t({"</s>"});
  CHECK(t.Push("a</", &stopped) == "a");
  CHECK(t.Push("s", &stopped) == "");
  CHECK(t.Push(">tail", &stopped) == "");
  CHECK(stopped);

  // Two stops in one push: the earlier wins; the held text is flushed when none comes.
  StopStrings u({"bb", "a"});
  CHECK(u.Push("xxbbya", &stopped) == "xx");
  CHECK(stopped);
  StopStrings v({"xyz"});
  CHECK(v.Push("abcxy", &stopped) == "abc");
  CHECK(v.Finish() == "xy");
  StopStrings none({});
  CHECK(none.Push("anything", &stopped) == "anything");
  CHECK(!stopped);
}

}  // namespace strata::runtime
