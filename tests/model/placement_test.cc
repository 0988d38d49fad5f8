// The hybrid placement cost model (lib/model/placement.h): which cold experts the CPU computes while
// the device reads the others over the link. Checked against exhaustive search on random layers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "lib/model/placement.h"

namespace {

using namespace strata::model;

// The later of the CPU's and the link's time when the CPU computes `cpu` (ids) of `cold`.
double Makespan(const std::vector<ColdExpert> &cold, const std::vector<int> &cpu, const PlacementRates &r) {
  double c = cpu.empty() ? 0 : r.cpu_fixed_s, l = cpu.size() < cold.size() ? r.link_fixed_s : 0;
  for (const ColdExpert &e : cold) {
    if (std::find(cpu.begin(), cpu.end(), e.expert) != cpu.end()) {
      c += CpuSeconds(e, r);
    } else {
      l += LinkSeconds(e, r);
    }
  }
  return std::max(c, l);
}

}  // namespace

TEST_CASE("placement: equal one-token experts split in the ratio of the two rates", "[placement]") {
  PlacementRates r;
  r.link_bytes_s = 50e9;
  r.cpu_bytes_s = 25e9;
  std::vector<ColdExpert> cold;
  for (int x = 0; x < 12; ++x) cold.push_back({100 - x * 3, 1, 3u << 20});
  // The CPU at half the link's rate ends with the link when it takes a third: 4 of 12.
  const std::vector<int> cpu = ChooseCpuExperts(cold, r);
  REQUIRE(cpu.size() == 4);
  CHECK(std::is_sorted(cpu.begin(), cpu.end()));
  // Equal costs: the lowest ids, whatever the input order.
  CHECK(cpu == std::vector<int>{67, 70, 73, 76});
  std::reverse(cold.begin(), cold.end());
  CHECK(ChooseCpuExperts(cold, r) == cpu);
}

TEST_CASE("placement: the CPU takes experts of few tokens, the link those of many", "[placement]") {
  PlacementRates r;
  r.link_bytes_s = 50e9;
  r.cpu_bytes_s = 40e9;
  r.cpu_token_share = 0.3;
  // Expert 5 has 8 tokens (one read over the link, 3.1x the CPU time), the others one each.
  const std::vector<ColdExpert> cold = {{5, 8, 3u << 20}, {9, 1, 3u << 20}, {2, 1, 3u << 20}, {7, 1, 3u << 20}};
  const std::vector<int> cpu = ChooseCpuExperts(cold, r);
  REQUIRE(!cpu.empty());
  CHECK(std::find(cpu.begin(), cpu.end(), 5) == cpu.end());
  // Seventeen tokens: the link reads it three times (chunks of 8).
  CHECK(LinkSeconds({0, 17, 1000}, r) == Approx(3 * 1000 / 50e9));
  CHECK(CpuSeconds({0, 17, 1000}, r) == Approx(1000 / 40e9 * (1 + 0.3 * 16)));
}

TEST_CASE("placement: no CPU, no link, or a round trip that costs more than it saves", "[placement]") {
  const std::vector<ColdExpert> cold = {{1, 1, 1u << 20}, {4, 1, 1u << 20}};
  PlacementRates r;
  r.link_bytes_s = 50e9;
  CHECK(ChooseCpuExperts(cold, r).empty());  // no CPU rate measured
  r.cpu_bytes_s = 30e9;
  r.link_bytes_s = 0;
  CHECK(ChooseCpuExperts(cold, r) == std::vector<int>{1, 4});
  r.link_bytes_s = 50e9;
  CHECK(ChooseCpuExperts(cold, r).size() == 1);
  r.cpu_fixed_s = 1e-3;  // 1 ms against 42 us of link time
  CHECK(ChooseCpuExperts(cold, r).empty());
  CHECK(ChooseCpuExperts({}, r).empty());
}

TEST_CASE("placement: the choice is within one expert of the best split, never worse than the link alone",
          "[placement]") {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    PlacementRates r;
    r.link_bytes_s = std::uniform_real_distribution<double>(10e9, 60e9)(rng);
    r.cpu_bytes_s = std::uniform_real_distribution<double>(5e9, 60e9)(rng);
    r.cpu_token_share = std::uniform_real_distribution<double>(0, 0.5)(rng);
    r.cpu_fixed_s = std::uniform_real_distribution<double>(0, 50e-6)(rng);
    r.link_fixed_s = trial % 2 == 0 ? 0.0 : std::uniform_real_distribution<double>(0, 80e-6)(rng);
    const int n = std::uniform_int_distribution<int>(1, 10)(rng);
    std::vector<ColdExpert> cold;
    double biggest = std::max(r.cpu_fixed_s, r.link_fixed_s);
    for (int i = 0; i < n; ++i) {
      ColdExpert e{i * 2 + 1, std::uniform_int_distribution<int64_t>(1, 20)(rng),
                   std::uniform_int_distribution<uint64_t>(1 << 16, 8 << 20)(rng)};
      biggest = std::max({biggest, CpuSeconds(e, r), LinkSeconds(e, r)});
      cold.push_back(e);
    }
    double best = Makespan(cold, {}, r);
    for (int mask = 1; mask < (1 << n); ++mask) {
      std::vector<int> ids;
      for (int i = 0; i < n; ++i) {
        if (mask & (1 << i)) ids.push_back(cold[i].expert);
      }
      best = std::min(best, Makespan(cold, ids, r));
    }
    const double link_only = Makespan(cold, {}, r);
    const double got = Makespan(cold, ChooseCpuExperts(cold, r), r);
    INFO("trial " << trial << ": chosen " << got << " s, best " << best << " s, link alone " << link_only << " s");
    CHECK(got <= link_only * (1 + 1e-12));
    CHECK(got <= best + biggest + 1e-15);
  }
}

TEST_CASE("placement: the link's fixed cost moves experts to the CPU, all of them where it pays", "[placement]") {
  PlacementRates r;
  r.link_bytes_s = 50e9;
  r.cpu_bytes_s = 50e9;
  r.cpu_fixed_s = 60e-6;
  const uint64_t expert = 2500000;  // 50 us a side
  std::vector<ColdExpert> cold;
  for (int x = 0; x < 5; ++x) cold.push_back({x, 1, expert});
  // Bytes alone: CPU 60 + 50 k us against the link's 50 (5 - k): k = 2 (160 against 150 us).
  CHECK(ChooseCpuExperts(cold, r).size() == 2);
  // 80 us more on the link side: k = 3 (210 against 180 us beats 160 against 230 us).
  r.link_fixed_s = 80e-6;
  CHECK(ChooseCpuExperts(cold, r).size() == 3);
  CHECK(Makespan(cold, ChooseCpuExperts(cold, r), r) == Approx(210e-6));
  // Two experts, 30 us: one each (110 against 80 us) beats the link alone (130) and the CPU alone (160).
  cold.resize(2);
  r.link_fixed_s = 30e-6;
  CHECK(ChooseCpuExperts(cold, r).size() == 1);
  // A latency that dwarfs the bytes: both to the CPU, which frees the link of its fixed cost too.
  r.link_fixed_s = 400e-6;
  CHECK(ChooseCpuExperts(cold, r) == std::vector<int>{0, 1});
  CHECK(HybridSavingSeconds(2.0 * expert, expert, r) == Approx(500e-6 - 160e-6));
}

TEST_CASE("placement: a layer's saving from its cold bytes", "[placement]") {
  PlacementRates r;
  r.link_bytes_s = 50e9;
  r.cpu_bytes_s = 25e9;
  const uint64_t expert = 3u << 20;
  // Twelve one-token experts: the link alone takes 12 e / L, split 8 e / L.
  CHECK(HybridSavingSeconds(12.0 * expert, expert, r) == Approx(4.0 * expert / 50e9));
  CHECK(HybridSavingSeconds(0, expert, r) == 0);
  r.cpu_fixed_s = 1.0;
  CHECK(HybridSavingSeconds(12.0 * expert, expert, r) == 0);
  r.cpu_fixed_s = 0;
  r.cpu_bytes_s = 0;
  CHECK(HybridSavingSeconds(12.0 * expert, expert, r) == 0);
}

TEST_CASE("placement: the CPU cost fit recovers a fixed cost and a rate", "[placement]") {
  std::mt19937 rng(std::random_device{}());
  const double rate = std::uniform_real_distribution<double>(10e9, 50e9)(rng);
  const double fixed = std::uniform_real_distribution<double>(5e-6, 80e-6)(rng);
  INFO("rate " << rate << ", fixed " << fixed);
  CpuCostFit fit;
  CHECK(fit.rate() == 0);
  for (int i = 0; i < 200; ++i) {
    const double x = std::uniform_real_distribution<double>(1e6, 20e6)(rng);
    const double noise = std::uniform_real_distribution<double>(0.97, 1.03)(rng);
    fit.Add(x, (fixed + x / rate) * noise);
  }
  CHECK(fit.rate() == Approx(rate).epsilon(0.1));
  CHECK(fit.fixed() == Approx(fixed).margin(0.15 * fixed + 5e-6));
  // The CPU slows down (another load on the memory): the fit follows within a few hundred jobs.
  CpuCostFit one = fit;
  for (int i = 0; i < 400; ++i) {
    const double x = std::uniform_real_distribution<double>(1e6, 20e6)(rng);
    one.Add(x, fixed + x / (rate / 2));
  }
  CHECK(one.rate() == Approx(rate / 2).epsilon(0.1));
  CHECK(one.fixed() == Approx(fixed).margin(0.15 * fixed + 5e-6));
  // Jobs of one size cannot separate the terms: all of it is rate, until sizes vary.
  CpuCostFit same;
  for (int i = 0; i < 10; ++i) same.Add(4e6, fixed + 4e6 / rate);
  CHECK(same.fixed() == 0);
  CHECK(same.rate() == Approx(4e6 / (fixed + 4e6 / rate)));
  // With the fixed cost held, noisy jobs of one or two sizes move the rate and leave the fixed cost.
  CpuCostFit held = fit;
  held.HoldFixed();
  const double was = held.fixed();
  for (int i = 0; i < 400; ++i) {
    const double x = (i % 2 + 1) * 10e6;
    const double noise = std::uniform_real_distribution<double>(0.9, 1.1)(rng);
    held.Add(x, (fixed + x / (rate / 3)) * noise);
  }
  CHECK(held.fixed() == was);
  CHECK(held.rate() == Approx(rate / 3).epsilon(0.1));
  // A held fixed cost above what whole jobs take (calibration jobs that each waited ~1.3 ms for
  // the pool, whatever their size) gives way to the jobs: the fit then predicts their time again.
  CpuCostFit slow_start;
  for (int i = 0; i < 60; ++i) {
    const double x = std::uniform_real_distribution<double>(0.1e6, 10e6)(rng);
    slow_start.Add(x, 1.3e-3 + x / 1e12);
  }
  slow_start.HoldFixed();
  CHECK(slow_start.fixed() > 1e-3);
  const double job_x = 12e6, job_s = fixed + job_x / rate;
  for (int i = 0; i < 300; ++i) {
    const double noise = std::uniform_real_distribution<double>(0.97, 1.03)(rng);
    slow_start.Add(job_x, job_s * noise);
  }
  INFO("after decode's jobs: fixed " << slow_start.fixed() << ", rate " << slow_start.rate());
  CHECK(slow_start.fixed() <= 0.5 * 1.03 * job_s);
  CHECK(slow_start.fixed() + job_x / slow_start.rate() == Approx(job_s).epsilon(0.05));
  // Nonsense is ignored.
  one.Add(-1, 1);
  one.Add(1e6, 0);
  one.Add(NAN, 1);
  CHECK(std::isfinite(one.rate()));
}

TEST_CASE("placement: the hottest experts, ties to the lower index, none never used", "[placement]") {
  CHECK(HottestExperts({0, 5, 2, 5, 9, 0, 1}, 3) == std::vector<size_t>{4, 1, 3});
  CHECK(HottestExperts({0, 5, 2, 5, 9, 0, 1}, 10) == std::vector<size_t>{4, 1, 3, 2, 6});
  CHECK(HottestExperts({0, 0}, 2).empty());
  CHECK(HottestExperts({}, 4).empty());
  std::mt19937 rng(std::random_device{}());
  std::vector<uint32_t> heat(500);
  for (uint32_t &h : heat) h = std::uniform_int_distribution<uint32_t>(0, 40)(rng);
  const size_t n = std::uniform_int_distribution<size_t>(1, 499)(rng);
  const std::vector<size_t> top = HottestExperts(heat, n);
  std::vector<size_t> want;
  for (size_t i = 0; i < heat.size(); ++i) {
    if (heat[i] > 0) want.push_back(i);
  }
  std::stable_sort(want.begin(), want.end(), [&](size_t a, size_t b) { return heat[a] > heat[b]; });
  if (want.size() > n) want.resize(n);
  CHECK(top == want);
}

TEST_CASE("placement: a re-plan trades experts only over a real difference in use", "[placement]") {
  CHECK_FALSE(MarkedlyHotter(0, 0));
  CHECK_FALSE(MarkedlyHotter(5, 5));
  CHECK_FALSE(MarkedlyHotter(3, 9));
  CHECK_FALSE(MarkedlyHotter(38, 26));  // 12 apart: 2 sqrt(64) = 16
  CHECK(MarkedlyHotter(44, 26));        // 18 apart: 2 sqrt(70) < 16.8
  CHECK(MarkedlyHotter(5, 0));          // 25 > 4 * 5
  CHECK_FALSE(MarkedlyHotter(4, 0));    // 16 = 4 * 4
  CHECK(MarkedlyHotter(UINT32_MAX, 0));
  CHECK_FALSE(MarkedlyHotter(44, 26, 3.0));  // 18 apart: 3 sqrt(70) = 25.1
  CHECK_FALSE(MarkedlyHotter(52, 26, 3.0));   // 26 apart: 3 sqrt(78) = 26.5
  CHECK(MarkedlyHotter(53, 26, 3.0));         // 27 apart: 3 sqrt(79) = 26.7
  // Two experts of one popularity (Poisson counts, fresh draws): rarely traded; one four times as
  // popular as the other: nearly always.
  std::mt19937 rng(std::random_device{}());
  int same = 0, apart = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    std::poisson_distribution<uint32_t> even(32.0), hot(64.0), cold(16.0);
    same += MarkedlyHotter(even(rng), even(rng)) ? 1 : 0;
    apart += MarkedlyHotter(hot(rng), cold(rng)) ? 1 : 0;
  }
  INFO("equal popularity traded " << same << " of " << kDraws << ", four times apart " << apart);
  CHECK(same < kDraws / 20);
  CHECK(apart > kDraws * 95 / 100);
}

TEST_CASE("placement: an expert not markedly hotter than a victim is not markedly hotter than a hotter one",
          "[placement]") {
  // The CUDA tier answers most promotion calls from a floor of the victims' heat, on this: the
  // rule can only turn false as the victim's heat rises. Fresh random heats over the range the tier
  // sees (halved every 16 uses) and past it, each z the tier uses.
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> small(0, 4096), any(0, UINT32_MAX);
  int falses = 0;
  for (double z : {2.0, 3.0}) {
    for (int i = 0; i < 20000; ++i) {
      const bool wide = i % 4 == 0;
      const uint32_t hot = wide ? any(rng) : small(rng);
      const uint32_t floor = wide ? any(rng) : small(rng);
      if (MarkedlyHotter(hot, floor, z)) continue;
      ++falses;
      const uint32_t above = floor + std::uniform_int_distribution<uint32_t>(0, UINT32_MAX - floor)(rng);
      const uint32_t near = floor + std::min<uint32_t>(UINT32_MAX - floor, i % 3);
      INFO("hot " << hot << ", floor " << floor << ", above " << above << ", z " << z);
      CHECK_FALSE(MarkedlyHotter(hot, above, z));
      CHECK_FALSE(MarkedlyHotter(hot, near, z));
    }
  }
  CHECK(falses > 1000);  // the property was asked often
}

namespace {

// A decode loop around a RegimeProbe: a step in the link regime takes link_s, in the hybrid one
// hybrid_s, each times a random factor in [1 - noise, 1 + noise]; the first two steps after the
// regime changes take 40 times as long (a graph recorded, paths changed), which the probe must
// not count. `change`, where set, says which hybrid steps (counted from 0 over the world's life)
// change their paths as well: those are told to the probe and cost the same.
struct World {
  double t = 0;
  RegimeProbe::Regime last = RegimeProbe::Regime::kLink;
  int since = 0;
  int hybrid_steps = 0;
  std::function<bool(int)> change;
  // `decline`, where set, says which steps that would enter the share (counted from 0) the backend
  // holds on the link: those are told to the probe, run as link steps, and change no paths.
  std::function<bool(int)> decline;
  int declinable = 0;
  std::mt19937 rng{std::random_device{}()};

  // Runs `steps` steps of `n_tok` tokens; returns the regime of each.
  std::vector<RegimeProbe::Regime> Drive(RegimeProbe &p, int steps, int64_t n_tok, double link_s, double hybrid_s,
                                         double noise) {
    std::vector<RegimeProbe::Regime> out;
    std::uniform_real_distribution<double> f(1 - noise, 1 + noise);
    for (int i = 0; i < steps; ++i) {
      const RegimeProbe::Regime r = p.Step(n_tok, t);
      // A declined step runs on the link (the share's entry held), as the step before it did.
      RegimeProbe::Regime ran = r;
      if (r == RegimeProbe::Regime::kHybrid && last == RegimeProbe::Regime::kLink && decline &&
          decline(declinable++)) {
        p.Declined();
        ran = RegimeProbe::Regime::kLink;
      }
      since = ran == last ? since + 1 : 0;
      last = ran;
      if (ran == RegimeProbe::Regime::kHybrid && change && change(hybrid_steps++)) {
        p.Disturbed();
        since = 0;
      }
      t += (ran == RegimeProbe::Regime::kLink ? link_s : hybrid_s) * f(rng) * (since < 2 ? 40 : 1);
      out.push_back(ran);
    }
    return out;
  }
};

int64_t CountOf(const std::vector<RegimeProbe::Regime> &v, RegimeProbe::Regime r) {
  return std::count(v.begin(), v.end(), r);
}

// A link step's time, fresh each run: 5 to 30 ms.
double RandomLinkStep() {
  std::mt19937 rng(std::random_device{}());
  return std::uniform_real_distribution<double>(5e-3, 30e-3)(rng);
}

}  // namespace

TEST_CASE("placement: the regime probe keeps the faster way by measured step time", "[placement]") {
  using R = RegimeProbe::Regime;
  const double link = RandomLinkStep();
  INFO("link step " << link);
  RegimeProbe::Options o;
  o.hold = 100;
  const int probe = o.settle + o.samples;  // steps of one regime's probe
  {  // The CPU's share is much slower: the probe of it ends after its first two timed steps.
    RegimeProbe p(o);
    World w;
    w.t = 1000;
    const auto v = w.Drive(p, 60, 1, link, 1.6 * link, 0.05);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kLink);
    CHECK(p.link_s() == Approx(link).epsilon(0.06));
    CHECK(p.hybrid_s() > 1.1 * link);
    CHECK(CountOf(v, R::kHybrid) == 2 + 2);  // settle, then two timed steps
    for (int i = 0; i < probe; ++i) CHECK(v[i] == R::kLink);  // the link's probe comes first
    CHECK(v.back() == R::kLink);
  }
  {  // The CPU's share is faster: held after both probes, then measured again after `hold` steps.
    RegimeProbe p(o);
    World w;
    const auto v = w.Drive(p, 2 * probe + 100, 1, link, 0.7 * link, 0.05);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kHybrid);
    CHECK(p.hybrid_s() == Approx(0.7 * link).epsilon(0.06));
    CHECK(CountOf(v, R::kLink) == probe);
    CHECK(v.back() == R::kHybrid);
    // The hold ends: the link's probe comes first again.
    CHECK(w.Drive(p, 1, 1, link, 0.7 * link, 0.05)[0] == R::kLink);
  }
  {  // Within the margin, either side: the CPU's share, the cost model's choice.
    for (double f : {0.99, 1.02}) {
      RegimeProbe p(o);
      World w;
      w.Drive(p, 30, 4, link, f * link, 0.002);
      CHECK(p.probes() == 1);
      CHECK(p.held() == R::kHybrid);
    }
  }
  {  // Slower than the margin, not by a tenth: the probe times all its steps, then the link.
    RegimeProbe p(o);
    World w;
    const auto v = w.Drive(p, 30, 4, link, 1.06 * link, 0.002);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kLink);
    CHECK(CountOf(v, R::kHybrid) == probe);
  }
}

TEST_CASE("placement: steps that change their paths inside a regime probe are not timed", "[placement]") {
  using R = RegimeProbe::Regime;
  const double link = RandomLinkStep();
  INFO("link step " << link);
  RegimeProbe::Options o;
  {  // Two layers join the CPU's share during its probe (the fitted rate moves): still timed right.
    RegimeProbe p(o);
    World w;
    w.change = [](int i) { return i == 3 || i == 7; };
    const auto v = w.Drive(p, 40, 1, link, 0.7 * link, 0.01);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kHybrid);
    CHECK(p.hybrid_s() == Approx(0.7 * link).epsilon(0.02));
    CHECK(p.resettles() == 2);
    CHECK(CountOf(v, R::kHybrid) == 40 - (o.settle + o.samples));
  }
  {  // The first step of a phase already settles: telling the probe of it changes nothing.
    RegimeProbe p(o);
    World w;
    w.change = [](int i) { return i == 0; };
    w.Drive(p, 40, 1, link, 0.7 * link, 0.01);
    CHECK(p.held() == R::kHybrid);
    CHECK(p.resettles() == 0);
  }
  {  // Paths that change every step cannot hold the probe open: after max_resettles the slow
     // steps count, and the link is kept.
    RegimeProbe p(o);
    World w;
    w.change = [](int) { return true; };
    const auto v = w.Drive(p, 60, 1, link, 0.7 * link, 0.01);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kLink);
    CHECK(p.resettles() == o.max_resettles);
    CHECK(CountOf(v, R::kHybrid) <= o.settle + o.samples + 2 * o.max_resettles);
    CHECK(v.back() == R::kLink);
  }
}

TEST_CASE("placement: a regime probe whose share the backend holds on the link", "[placement]") {
  using R = RegimeProbe::Regime;
  const double link = RandomLinkStep();
  INFO("link step " << link);
  RegimeProbe::Options o;
  o.hold = 100;
  const int probe = o.settle + o.samples;
  {  // Held for the whole phase: no sample of the share, and the link is the verdict (the link's
     // steps timed as the share's would have called a tie, and the share then come in untimed).
    RegimeProbe p(o);
    World w;
    w.decline = [](int) { return true; };
    const auto v = w.Drive(p, probe + 50, 1, link, 0.7 * link, 0.01);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kLink);
    CHECK(p.hybrid_s() == 0);
    CHECK(p.declines() == probe);
    CHECK(CountOf(v, R::kHybrid) == 0);
  }
  {  // Held for its first two steps, then entered: the share is timed from its own settled steps.
    std::mt19937 rng(std::random_device{}());
    const double f = std::uniform_real_distribution<double>(0.5, 0.8)(rng);
    RegimeProbe p(o);
    World w;
    w.decline = [](int i) { return i < 2; };
    const auto v = w.Drive(p, 2 * probe + 40, 1, link, f * link, 0.01);
    CHECK(p.probes() == 1);
    CHECK(p.held() == R::kHybrid);
    CHECK(p.hybrid_s() == Approx(f * link).epsilon(0.03));  // no link step, no settling step counted
    CHECK(p.declines() == 2);
    CHECK(v.back() == R::kHybrid);
  }
  {  // Declines after the verdict (the cost model holds the layers' entry) leave it standing.
    RegimeProbe p(o);
    World w;
    w.Drive(p, 2 * probe + 2, 1, link, 0.7 * link, 0.01);
    REQUIRE(p.held() == R::kHybrid);
    p.Declined();
    CHECK(p.declines() == 0);
    CHECK(w.Drive(p, 1, 1, link, 0.7 * link, 0.01)[0] == R::kHybrid);
  }
}

TEST_CASE("placement: a step of another size ends a regime probe, each size keeping its verdict", "[placement]") {
  using R = RegimeProbe::Regime;
  RegimeProbe p;
  World w;
  // Into the CPU's probe, then a 512-token prompt: the probe starts over on the link.
  auto v = w.Drive(p, 10, 1, 10e-3, 5e-3, 0.01);
  CHECK(v.back() == R::kHybrid);
  v = w.Drive(p, 1, 512, 10e-3, 5e-3, 0.01);
  CHECK(v[0] == R::kLink);
  CHECK(p.probes() == 0);
  // A batch whose size changes every step never leaves the link, and never finishes a probe.
  for (int i = 0; i < 200; ++i) {
    v = w.Drive(p, 1, 1 + i % 3, 10e-3, 5e-3, 0.01);
    REQUIRE(v[0] == R::kLink);
  }
  CHECK(p.probes() == 0);
  // A settled size: the probe finishes and holds the faster (16 sessions: the CPU's share).
  v = w.Drive(p, 40, 16, 200e-3, 120e-3, 0.01);
  CHECK(p.probes() == 1);
  CHECK(p.held() == R::kHybrid);
  CHECK(v.back() == R::kHybrid);
  // Another size has no verdict: its own probe, the link first; one session, where the link wins.
  v = w.Drive(p, 40, 1, 10e-3, 15e-3, 0.01);
  CHECK(v.front() == R::kLink);
  CHECK(p.probes() == 2);
  CHECK(p.held() == R::kLink);
  CHECK(v.back() == R::kLink);
  // Sessions joining and leaving: each size runs its verdict at once, no probe.
  for (int i = 0; i < 20; ++i) {
    const bool many = i % 2 == 0;
    v = w.Drive(p, 3, many ? 16 : 1, many ? 200e-3 : 10e-3, many ? 120e-3 : 15e-3, 0.01);
    REQUIRE(CountOf(v, many ? R::kHybrid : R::kLink) == 3);
  }
  CHECK(p.probes() == 2);
}

TEST_CASE("placement: the regime probe keeps a bounded number of verdicts, the newest", "[placement]") {
  using R = RegimeProbe::Regime;
  RegimeProbe::Options o;
  o.max_sizes = 2;
  RegimeProbe p(o);
  World w;
  w.Drive(p, 40, 1, 10e-3, 5e-3, 0.01);
  w.Drive(p, 40, 2, 10e-3, 5e-3, 0.01);
  CHECK(p.probes() == 2);
  CHECK(w.Drive(p, 1, 1, 10e-3, 5e-3, 0.01)[0] == R::kHybrid);  // still known
  w.Drive(p, 40, 3, 10e-3, 5e-3, 0.01);                          // a third: the oldest verdict (size 1) goes
  CHECK(p.probes() == 3);
  CHECK(w.Drive(p, 1, 2, 10e-3, 5e-3, 0.01)[0] == R::kHybrid);
  CHECK(w.Drive(p, 1, 1, 10e-3, 5e-3, 0.01)[0] == R::kLink);    // timed again, the link first
}
