// Expert parallelism's exchange, each rank on a thread of its own over the in-process transport:
// every (token, k) pair is computed once, on the rank the placement names, and each rank's outputs
// equal bit for bit those one device forms for the same tokens; a bad selection is refused.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "include/strata/moe.h"
#include "lib/model/expert_exchange.h"

namespace {

using strata::model::ExchangeExperts;
using strata::model::ExchangeStats;
using strata::model::ExpertRowsFn;
using strata::model::LocalTransport;
using strata::store::DevicePlacement;
using strata::store::DevicePlacementInputs;

// A small dense expert per id: y = tanh(W_e x), row by row, so a row's result does not depend on the
// rows computed with it. Counts the rows each rank computes of each expert.
struct Experts {
  int n = 0;
  int64_t width = 0;
  std::vector<std::vector<float>> w;
  Experts(int n_experts, int64_t d, std::mt19937 &rng) : n(n_experts), width(d), w(n_experts) {
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (auto &m : w) {
      m.resize(d * d);
      for (auto &v : m) v = nd(rng);
    }
  }
  void Row(int e, const float *x, float *y) const {
    for (int64_t r = 0; r < width; ++r) {
      float s = 0.f;
      for (int64_t c = 0; c < width; ++c) s += w[e][r * width + c] * x[c];
      y[r] = std::tanh(s);
    }
  }
};

}  // namespace

TEST_CASE("the exchange computes each pair once where the placement says, as one device sums", "[model][expert_parallel]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 12; ++round) {
    const int n_ranks = 1 + static_cast<int>(rng() % 4);
    const int n_layers = 2, n_experts = 4 + static_cast<int>(rng() % 12);
    const int k = 1 + static_cast<int>(rng() % std::min(4, n_experts));
    const int64_t width = 1 + static_cast<int64_t>(rng() % 24);
    const int layer = static_cast<int>(rng() % n_layers);
    DevicePlacementInputs in;
    in.n_devices = n_ranks;
    in.n_layers = n_layers;
    in.n_experts = n_experts;
    in.routed.assign(static_cast<size_t>(n_layers) * n_experts, 1);
    in.load.resize(in.routed.size());
    for (auto &v : in.load) v = 1.0 + rng() % 10;
    for (int d = 0; d < n_ranks; ++d) in.vram_slots.push_back(static_cast<uint32_t>(rng() % (2 * n_experts)));
    auto placed = strata::store::PlaceExperts(in);
    REQUIRE(placed.ok());
    const DevicePlacement &pl = *placed;
    Experts ex(n_experts, width, rng);

    // Each rank's tokens: inputs, k distinct selections and weights (zero tokens on a rank at times).
    std::vector<int64_t> n_tok(n_ranks);
    std::vector<std::vector<float>> x(n_ranks), w(n_ranks), out(n_ranks);
    std::vector<std::vector<int32_t>> sel(n_ranks);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.05f, 1.f);
    for (int r = 0; r < n_ranks; ++r) {
      n_tok[r] = rng() % 4 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 9);
      x[r].resize(n_tok[r] * width);
      for (auto &v : x[r]) v = nd(rng);
      for (int64_t t = 0; t < n_tok[r]; ++t) {
        std::vector<int32_t> all(n_experts);
        for (int e = 0; e < n_experts; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < k; ++j) {
          sel[r].push_back(all[j]);
          w[r].push_back(ud(rng));
        }
      }
      out[r].assign(n_tok[r] * width, std::numeric_limits<float>::quiet_NaN());  // poison
    }

    // Rows each rank computes, of which expert: counted by the experts' function.
    std::vector<std::vector<std::atomic<int64_t>>> computed(n_ranks);
    for (auto &c : computed) c = std::vector<std::atomic<int64_t>>(n_experts);
    LocalTransport t(n_ranks);
    std::vector<absl::Status> st(n_ranks);
    std::vector<ExchangeStats> stats(n_ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_ranks; ++r) {
      threads.emplace_back([&, r] {
        const ExpertRowsFn fn = [&, r](int e, const float *xx, int64_t rows, float *y) {
          computed[r][e] += rows;
          for (int64_t i = 0; i < rows; ++i) ex.Row(e, xx + i * width, y + i * width);
          return absl::OkStatus();
        };
        st[r] = ExchangeExperts(t, pl, layer, r, x[r].data(), n_tok[r], width, k, sel[r].data(), w[r].data(), fn,
                                out[r].data(), &stats[r]);
      });
    }
    for (auto &th : threads) th.join();
    for (int r = 0; r < n_ranks; ++r) REQUIRE(st[r].ok());

    // The pairs each rank should compute, by the placement.
    std::vector<std::vector<int64_t>> want(n_ranks, std::vector<int64_t>(n_experts, 0));
    int64_t total = 0;
    for (int r = 0; r < n_ranks; ++r) {
      for (int64_t i = 0; i < n_tok[r] * k; ++i) {
        const uint32_t key = static_cast<uint32_t>(layer) * n_experts + sel[r][i];
        ++want[pl.ComputeDevice(key, r)][sel[r][i]];
        ++total;
      }
    }
    int64_t computed_total = 0;
    for (int r = 0; r < n_ranks; ++r) {
      for (int e = 0; e < n_experts; ++e) CHECK(computed[r][e].load() == want[r][e]);
      computed_total += stats[r].rows_computed;
      CHECK(stats[r].rows_local + stats[r].rows_sent == n_tok[r] * k);
    }
    CHECK(computed_total == total);

    // One device: each token's sum over its selections in k order.
    for (int r = 0; r < n_ranks; ++r) {
      std::vector<float> y(width), ref(width);
      for (int64_t tk = 0; tk < n_tok[r]; ++tk) {
        std::fill(ref.begin(), ref.end(), 0.f);
        for (int j = 0; j < k; ++j) {
          ex.Row(sel[r][tk * k + j], x[r].data() + tk * width, y.data());
          for (int64_t c = 0; c < width; ++c) ref[c] += w[r][tk * k + j] * y[c];
        }
        CHECK(std::memcmp(ref.data(), out[r].data() + tk * width, width * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("an exchange refuses a selection outside the layer's routed experts", "[model][expert_parallel]") {
  DevicePlacementInputs in;
  in.n_devices = 1;
  in.n_layers = 1;
  in.n_experts = 4;
  in.routed = {1, 1, 0, 1};
  in.vram_slots = {4};
  auto pl = strata::store::PlaceExperts(in);
  REQUIRE(pl.ok());
  LocalTransport t(1);
  const float x[2] = {1.f, 2.f}, wts[1] = {1.f};
  float out[2];
  const ExpertRowsFn fn = [](int, const float *, int64_t, float *) { return absl::OkStatus(); };
  for (int32_t bad : {-1, 2, 4}) {
    const int32_t sel[1] = {bad};
    const absl::Status st = ExchangeExperts(t, *pl, 0, 0, x, 1, 2, 1, sel, wts, fn, out);
    REQUIRE_FALSE(st.ok());
    CHECK(strata::StatusToMoe(st) == MOE_ERR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(st.message()), Catch::Contains("names expert " + std::to_string(bad)));
  }
  // A rank outside the group, a placement of another size.
  const int32_t sel[1] = {0};
  CHECK_FALSE(ExchangeExperts(t, *pl, 0, 1, x, 1, 2, 1, sel, wts, fn, out).ok());
  LocalTransport t2(2);
  CHECK_FALSE(ExchangeExperts(t2, *pl, 0, 0, x, 1, 2, 1, sel, wts, fn, out).ok());
  // A rank that fails leaves none of its peers waiting: each returns an error.
  {
    DevicePlacementInputs in2 = in;
    in2.n_devices = 2;
    in2.vram_slots = {0, 0};
    auto pl2 = strata::store::PlaceExperts(in2);
    REQUIRE(pl2.ok());
    LocalTransport t3(2);
    int32_t sels[2][2] = {{2, 0}, {0, 1}};  // rank 0 names the layer's missing expert
    const float xx[4] = {1.f, 2.f, 3.f, 4.f}, ww[2] = {0.5f, 0.5f};
    float o[2][4];
    absl::Status s2[2];
    std::thread other([&] { s2[1] = ExchangeExperts(t3, *pl2, 0, 1, xx, 2, 2, 1, sels[1], ww, fn, o[1]); });
    s2[0] = ExchangeExperts(t3, *pl2, 0, 0, xx, 2, 2, 1, sels[0], ww, fn, o[0]);
    other.join();
    CHECK(strata::StatusToMoe(s2[0]) == MOE_ERR_INVALID_ARGUMENT);
    // Rank 1 sent rank 0 rows (its experts 0 and 1 are not all its own) or not: it fails only then.
    bool sends = false;
    for (int j = 0; j < 2; ++j) sends = sends || pl2->ComputeDevice(static_cast<uint32_t>(sels[1][j]), 1) == 0;
    CHECK(s2[1].ok() == !sends);
  }
  // The experts' own error comes back.
  const ExpertRowsFn failing = [](int, const float *, int64_t, float *) {
    return strata::Errorf(MOE_ERR_BACKEND, "injected expert failure");
  };
  const absl::Status st = ExchangeExperts(t, *pl, 0, 0, x, 1, 2, 1, sel, wts, failing, out);
  CHECK(strata::StatusToMoe(st) == MOE_ERR_BACKEND);
}
