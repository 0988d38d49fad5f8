#include "lib/model/placement.h"

#include <algorithm>
#include <cmath>

#include "lib/util/stats.h"

namespace strata::model {

double LinkSeconds(const ColdExpert &e, const PlacementRates &r) {
  if (r.link_bytes_s <= 0) return INFINITY;
  const int64_t reads = std::max<int64_t>(1, (e.tokens + 7) / 8);
  return static_cast<double>(e.bytes) * static_cast<double>(reads) / r.link_bytes_s;
}

double CpuSeconds(const ColdExpert &e, const PlacementRates &r) {
  if (r.cpu_bytes_s <= 0) return INFINITY;
  const double extra = r.cpu_token_share * static_cast<double>(std::max<int64_t>(0, e.tokens - 1));
  return static_cast<double>(e.bytes) / r.cpu_bytes_s * (1.0 + extra);
}

std::vector<int> ChooseCpuExperts(std::vector<ColdExpert> cold, const PlacementRates &r) {
  std::vector<int> out;
  if (cold.empty() || r.cpu_bytes_s <= 0) return out;
  if (r.link_bytes_s <= 0) {  // no link: the CPU takes them all
    for (const ColdExpert &e : cold) out.push_back(e.expert);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::stable_sort(cold.begin(), cold.end(), [&](const ColdExpert &a, const ColdExpert &b) {
    const double ra = CpuSeconds(a, r) / LinkSeconds(a, r), rb = CpuSeconds(b, r) / LinkSeconds(b, r);
    return ra != rb ? ra < rb : a.expert < b.expert;
  });
  double link = r.link_fixed_s;
  for (const ColdExpert &e : cold) link += LinkSeconds(e, r);
  double cpu = r.cpu_fixed_s;
  for (const ColdExpert &e : cold) {
    const bool last = out.size() + 1 == cold.size();
    const double c = cpu + CpuSeconds(e, r), l = last ? 0.0 : link - LinkSeconds(e, r);
    if (std::max(c, l) >= std::max(out.empty() ? 0.0 : cpu, link)) break;
    out.push_back(e.expert);
    cpu = c;
    link = l;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<size_t> HottestExperts(const std::vector<uint32_t> &heat, size_t n) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < heat.size(); ++i) {
    if (heat[i] > 0) idx.push_back(i);
  }
  auto hotter = [&](size_t a, size_t b) { return heat[a] != heat[b] ? heat[a] > heat[b] : a < b; };
  if (idx.size() > n) {
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), hotter);
    idx.resize(n);
  }
  std::sort(idx.begin(), idx.end(), hotter);
  return idx;
}

bool MarkedlyHotter(uint32_t hot, uint32_t cold, double z) {
  if (hot <= cold) return false;
  const double d = static_cast<double>(hot) - static_cast<double>(cold);
  return d * d > z * z * (static_cast<double>(hot) + static_cast<double>(cold));
}

void CpuCostFit::Add(double x, double secs) {
  if (!(x > 0) || !(secs > 0) || !std::isfinite(x) || !std::isfinite(secs)) return;
  // A job's time bounds the fixed cost from above. A job faster than a held fixed cost shows the
  // hold wrong (a host's calibration jobs can take longer whatever their size than decode's jobs
  // take): it drops to half that job's time, so the jobs move the rate again.
  if (hold_ && secs <= fixed_) fixed_ = 0.5 * secs;
  w_ = decay_ * w_ + 1;
  x_ = decay_ * x_ + x;
  y_ = decay_ * y_ + secs;
  xx_ = decay_ * xx_ + x * x;
  xy_ = decay_ * xy_ + x * secs;
  const double mx = x_ / w_, my = y_ / w_;
  const double var = xx_ / w_ - mx * mx, cov = xy_ / w_ - mx * my;
  if (!hold_ && var > 0.01 * mx * mx && cov > 0) {  // sizes spread enough to separate the two terms
    const double slope = cov / var;
    fixed_ = my - slope * mx;
    if (fixed_ < 0) {
      fixed_ = 0;
      rate_ = mx / my;
    } else {
      rate_ = 1 / slope;
    }
  } else if (my > fixed_) {
    rate_ = mx / (my - fixed_);
  }
}

double HybridSavingSeconds(double cold_bytes, uint64_t expert_bytes, const PlacementRates &r) {
  if (cold_bytes <= 0 || expert_bytes == 0 || r.cpu_bytes_s <= 0 || r.link_bytes_s <= 0) return 0;
  // Whole experts of one token, as many as the bytes make (the last one partial).
  std::vector<ColdExpert> cold;
  double left = cold_bytes;
  for (int x = 0; left > 0 && x < 4096; ++x) {
    const uint64_t b = static_cast<uint64_t>(std::min<double>(left, static_cast<double>(expert_bytes)));
    if (b == 0) break;
    cold.push_back({x, 1, b});
    left -= static_cast<double>(b);
  }
  double link_all = r.link_fixed_s;
  for (const ColdExpert &e : cold) link_all += LinkSeconds(e, r);
  const std::vector<int> cpu = ChooseCpuExperts(cold, r);
  if (cpu.empty()) return 0;
  double c = r.cpu_fixed_s, l = cpu.size() < cold.size() ? r.link_fixed_s : 0.0;
  size_t j = 0;
  for (const ColdExpert &e : cold) {
    if (j < cpu.size() && cpu[j] == e.expert) {
      c += CpuSeconds(e, r);
      ++j;
    } else {
      l += LinkSeconds(e, r);
    }
  }
  return link_all - std::max(c, l);
}

void RegimeProbe::Restart(int64_t n_tok) {
  phase_ = Phase::kLink;
  shape_ = n_tok;
  steps_ = 0;
  resettles_ = 0;
  declined_ = 0;
  times_.clear();
}

void RegimeProbe::Disturbed() {
  // A step that already settles (the first of a phase: the switch changed the paths) costs nothing.
  if (phase_ == Phase::kNone || steps_ <= 1 || resettles_ >= o_.max_resettles) return;
  ++resettles_;
  ++resettles_total_;
  steps_ = 1;  // as the first step after a switch: it and the next settle
}

void RegimeProbe::Declined() {
  if (phase_ != Phase::kHybrid) return;
  ++declined_total_;
  steps_ = 0;  // the step that enters the share is the phase's first
  times_.clear();
  if (++declined_ >= o_.settle + o_.samples) Finish(Regime::kLink);
}

void RegimeProbe::Finish(Regime r) {
  if (verdicts_.size() >= o_.max_sizes && verdicts_.count(shape_) == 0) {
    auto oldest = std::min_element(verdicts_.begin(), verdicts_.end(),
                                   [](const auto &a, const auto &b) { return a.second.at < b.second.at; });
    verdicts_.erase(oldest);
  }
  verdicts_[shape_] = Verdict{r, step_};
  held_ = r;
  phase_ = Phase::kNone;
  times_.clear();
  ++probes_;
}

RegimeProbe::Regime RegimeProbe::Step(int64_t n_tok, double now_s) {
  const double dt = now_s - last_t_;
  const bool timed = have_last_ && dt >= 0;
  have_last_ = true;
  last_t_ = now_s;
  ++step_;
  if (auto v = verdicts_.find(n_tok); v != verdicts_.end() && step_ - v->second.at < o_.hold) {
    phase_ = Phase::kNone;  // a probe of another size ends here
    return v->second.regime;
  }
  if (phase_ == Phase::kNone || n_tok != shape_) {
    Restart(n_tok);
  } else {
    // The step that just ended ran this phase's regime at the probe's size (a step of another
    // size ended the probe): it is a sample unless it is still settling.
    if (timed && steps_ > o_.settle) times_.push_back(dt);
    if (phase_ == Phase::kLink && static_cast<int>(times_.size()) >= o_.samples) {
      link_s_ = Median(times_);
      phase_ = Phase::kHybrid;
      steps_ = 0;
      resettles_ = 0;
      declined_ = 0;
      times_.clear();
    } else if (phase_ == Phase::kHybrid) {
      const bool slower = times_.size() >= 2 && *std::min_element(times_.begin(), times_.end()) > 1.1 * link_s_;
      if (slower || static_cast<int>(times_.size()) >= o_.samples) {
        hybrid_s_ = Median(times_);
        Finish(!slower && hybrid_s_ <= (1.0 + o_.margin) * link_s_ ? Regime::kHybrid : Regime::kLink);
        return held_;
      }
    }
  }
  ++steps_;
  return phase_ == Phase::kHybrid ? Regime::kHybrid : Regime::kLink;
}

}  // namespace strata::model

