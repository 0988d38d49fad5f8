// Expert parallelism's placement: every routed expert has one owner, each layer's load is balanced
// within one expert's load, replicas fill spare slots hottest first and never where the expert is
// already held, and bad inputs are refused by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "include/strata/moe.h"
#include "lib/store/device_placement.h"

namespace {

using strata::store::DevicePlacement;
using strata::store::DevicePlacementInputs;
using strata::store::PlaceExperts;

DevicePlacementInputs RandomInputs(std::mt19937 &rng) {
  DevicePlacementInputs in;
  in.n_devices = 1 + static_cast<int>(rng() % 6);
  in.n_layers = 1 + static_cast<int>(rng() % 5);
  in.n_experts = 1 + static_cast<int>(rng() % 40);
  const size_t n = static_cast<size_t>(in.n_layers) * in.n_experts;
  in.routed.assign(n, 1);
  // A dense layer now and then: no routed experts.
  for (int l = 0; l < in.n_layers; ++l) {
    if (rng() % 5 == 0) std::fill_n(in.routed.begin() + static_cast<size_t>(l) * in.n_experts, in.n_experts, 0);
  }
  // Skewed loads (a few hot experts), with ties.
  std::exponential_distribution<double> ex(0.5);
  in.load.resize(n);
  for (auto &v : in.load) v = rng() % 7 == 0 ? 3.0 : std::floor(ex(rng) * 4);
  for (int d = 0; d < in.n_devices; ++d) in.vram_slots.push_back(static_cast<uint32_t>(rng() % (n + 5)));
  return in;
}

}  // namespace

TEST_CASE("each routed expert has one owner and each layer's load is balanced", "[store][expert_parallel]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const DevicePlacementInputs in = RandomInputs(rng);
    auto r = PlaceExperts(in);
    REQUIRE(r.ok());
    const DevicePlacement &p = *r;
    REQUIRE(p.owner.size() == in.routed.size());
    std::vector<uint32_t> owned(in.n_devices, 0), replicas(in.n_devices, 0);
    for (int l = 0; l < in.n_layers; ++l) {
      std::vector<double> layer(in.n_devices, 0.0);
      double biggest = 0;
      for (int x = 0; x < in.n_experts; ++x) {
        const size_t key = static_cast<size_t>(l) * in.n_experts + x;
        if (!in.routed[key]) {
          CHECK(p.owner[key] == -1);
          CHECK(p.holders[key] == 0);
          continue;
        }
        REQUIRE(p.owner[key] >= 0);
        REQUIRE(p.owner[key] < in.n_devices);
        CHECK((p.holders[key] >> p.owner[key]) & 1u);
        CHECK(p.holders[key] >> in.n_devices == 0);
        layer[p.owner[key]] += in.load[key];
        biggest = std::max(biggest, in.load[key]);
        ++owned[p.owner[key]];
        for (int d = 0; d < in.n_devices; ++d) {
          if (d != p.owner[key] && ((p.holders[key] >> d) & 1u)) ++replicas[d];
          // A token computes where it is when its device holds the expert, else at the owner.
          CHECK(p.ComputeDevice(static_cast<uint32_t>(key), d) == (((p.holders[key] >> d) & 1u) ? d : p.owner[key]));
        }
      }
      const auto [lo, hi] = std::minmax_element(layer.begin(), layer.end());
      CHECK(*hi - *lo <= biggest + 1e-9);
      for (int d = 0; d < in.n_devices; ++d) CHECK(p.owned_load[static_cast<size_t>(l) * in.n_devices + d] == layer[d]);
    }
    for (int d = 0; d < in.n_devices; ++d) {
      CHECK(owned[d] == p.owned[d]);
      CHECK(replicas[d] == p.replicas[d]);
      // Replicas only in spare slots, and as many as there are experts to copy.
      const uint32_t spare = in.vram_slots[d] > owned[d] ? in.vram_slots[d] - owned[d] : 0;
      CHECK(p.replicas[d] <= spare);
      if (in.n_devices == 1) CHECK(p.replicas[d] == 0);
    }
  }
}

TEST_CASE("replicas take the hottest experts a device does not own", "[store][expert_parallel]") {
  DevicePlacementInputs in;
  in.n_devices = 2;
  in.n_layers = 1;
  in.n_experts = 8;
  in.routed.assign(8, 1);
  in.load = {1, 9, 2, 8, 3, 7, 4, 6};
  in.vram_slots = {6, 4};  // device 0 has 2 spare slots beyond the 4 it owns, device 1 none
  auto r = PlaceExperts(in);
  REQUIRE(r.ok());
  const DevicePlacement &p = *r;
  CHECK(p.owned[0] == 4);
  CHECK(p.owned[1] == 4);
  CHECK(p.replicas[0] == 2);
  CHECK(p.replicas[1] == 0);
  // Device 0's replicas are the two hottest experts device 1 owns.
  std::vector<std::pair<double, int>> theirs;
  for (int x = 0; x < 8; ++x) {
    if (p.owner[x] == 1) theirs.push_back({in.load[x], x});
  }
  std::sort(theirs.rbegin(), theirs.rend());
  for (size_t i = 0; i < theirs.size(); ++i) CHECK(((p.holders[theirs[i].second] & 1u) != 0) == (i < 2));
  // Without replication, none.
  in.replicate = false;
  auto r2 = PlaceExperts(in);
  REQUIRE(r2.ok());
  CHECK(r2->replicas[0] == 0);
  // Equal loads spread the experts evenly.
  in.load.clear();
  in.n_devices = 3;
  in.vram_slots = {0, 0, 0};
  auto r3 = PlaceExperts(in);
  REQUIRE(r3.ok());
  CHECK(r3->owned[0] == 3);
  CHECK(r3->owned[1] == 3);
  CHECK(r3->owned[2] == 2);
}

TEST_CASE("bad placement inputs are refused by name", "[store][expert_parallel]") {
  DevicePlacementInputs in;
  in.n_devices = 2;
  in.n_layers = 2;
  in.n_experts = 4;
  in.routed.assign(8, 1);
  in.vram_slots = {1, 1};
  REQUIRE(PlaceExperts(in).ok());
  auto refused = [](const DevicePlacementInputs &bad, const std::string &words) {
    auto r = PlaceExperts(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(strata::StatusToMoe(r.status()) == MOE_ERR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains(words));
  };
  DevicePlacementInputs b = in;
  b.n_devices = 0;
  refused(b, "0 devices");
  b.n_devices = 65;
  refused(b, "65 devices");
  b = in;
  b.routed.pop_back();
  refused(b, "routed flags cover 7");
  b = in;
  b.load.assign(5, 1.0);
  refused(b, "loads cover 5");
  b = in;
  b.load.assign(8, 1.0);
  b.load[3] = std::numeric_limits<double>::quiet_NaN();
  refused(b, "expert key 3");
  b.load[3] = -1;
  refused(b, "expert key 3");
  b = in;
  b.vram_slots = {1};
  refused(b, "for 1 devices");
  b = in;
  b.n_experts = 0;
  refused(b, "0 experts");
}
