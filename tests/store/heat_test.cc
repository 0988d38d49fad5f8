// RouteHeat, the one hotness rule of the expert tiers: Add(key, n) counts as n selections (and
// saturates as they do), counts() reads what operator[] reads, and the decay halves every count
// at each kDecayTokens-th decode token.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "lib/store/heat.h"

namespace strata::store {
namespace {

TEST_CASE("RouteHeat: Add is n selections, and the decay halves all counts", "[store][heat]") {
  std::mt19937 rng(std::random_device{}());
  const uint32_t n_keys = 3 + rng() % 40;
  RouteHeat by_add(n_keys), by_select(n_keys);
  std::vector<uint64_t> want(n_keys, 0);  // the rule written out: counts, halved every kDecayTokens tokens
  const int tokens = 3 * static_cast<int>(RouteHeat::kDecayTokens) + static_cast<int>(rng() % 20);
  for (int t = 0; t < tokens; ++t) {
    for (int s = 0; s < 5; ++s) {
      const uint32_t key = rng() % n_keys, n = 1 + rng() % 9;
      by_add.Add(key, n);
      for (uint32_t i = 0; i < n; ++i) by_select.OnSelect(key);
      want[key] += n;
    }
    const bool halved = (t + 1) % RouteHeat::kDecayTokens == 0;
    CHECK(by_add.OnDecodeToken() == halved);
    CHECK(by_select.OnDecodeToken() == halved);
    if (halved) {
      for (uint64_t &h : want) h >>= 1;
    }
  }
  REQUIRE(by_add.counts().size() == n_keys);
  for (uint32_t k = 0; k < n_keys; ++k) {
    CHECK(by_add[k] == want[k]);
    CHECK(by_select[k] == want[k]);
    CHECK(by_add.counts()[k] == by_add[k]);
  }
  by_add.OnNewPrompt();
  for (uint32_t k = 0; k < n_keys; ++k) CHECK(by_add[k] == 0);
}

TEST_CASE("RouteHeat: Add saturates at the count's largest value", "[store][heat]") {
  std::mt19937 rng(std::random_device{}());
  RouteHeat heat(2);
  const uint32_t near = UINT32_MAX - rng() % 1000;
  heat.Add(1, near);
  CHECK(heat[1] == near);
  heat.Add(1, 1000 + rng() % 1000);
  CHECK(heat[1] == UINT32_MAX);
  heat.OnSelect(1);
  CHECK(heat[1] == UINT32_MAX);
  CHECK(heat[0] == 0);
}

}  // namespace
}  // namespace strata::store
