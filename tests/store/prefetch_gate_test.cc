// The prefetch gate: open on its prior, closed by poor measured precision, reopened by good
// precision, and its memory halves every 16 decode tokens.
#include <catch2/catch.hpp>

#include <random>

#include "lib/store/policy.h"

using strata::store::PrefetchGate;

TEST_CASE("the prefetch gate follows measured precision", "[store][prefetch]") {
  std::mt19937 rng(std::random_device{}());
  const double min = std::uniform_real_distribution<double>(0.3, 0.7)(rng);
  PrefetchGate gate(min);
  CHECK(gate.open());                 // the prior: predictions start enabled
  CHECK(gate.precision() == 1.0);

  // Predictions that the routing rarely uses close it...
  const int per_token = std::uniform_int_distribution<int>(20, 60)(rng);
  const int used_low = static_cast<int>(per_token * (min - 0.25));
  for (int t = 0; t < 8; ++t) gate.Score(used_low, per_token);
  const double expect_low = (8.0 * used_low + 4) / (8.0 * per_token + 4);
  CHECK(gate.precision() == Approx(expect_low));
  CHECK_FALSE(gate.open());

  // ... and predictions that are used open it again, the old scores fading every 16 tokens.
  for (int t = 0; t < 64; ++t) {
    gate.Score(per_token, per_token);
    gate.OnDecodeToken();
  }
  CHECK(gate.open());
  CHECK(gate.precision() > min);
}

TEST_CASE("the prefetch gate halves its counts every 16 decode tokens", "[store][prefetch]") {
  PrefetchGate gate(0.5);
  gate.Score(10, 100);  // precision (10 + 4) / (100 + 4)
  for (int t = 0; t < 15; ++t) gate.OnDecodeToken();
  CHECK(gate.precision() == Approx(14.0 / 104.0));
  gate.OnDecodeToken();  // the 16th: counts halve, the prior does not
  CHECK(gate.precision() == Approx(9.0 / 54.0));
  gate.Score(0, 0);
  CHECK(gate.precision() == Approx(9.0 / 54.0));
}
