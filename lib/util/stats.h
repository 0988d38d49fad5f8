// Order statistics of a few measured times (step times, probe samples).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace strata {

// The median of v (the mean of the middle two for an even count); 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The p-th percentile of v by nearest rank (p in (0, 100]: the ceil(p n / 100)-th smallest); 0 for none.
inline double NearestRank(std::vector<double> v, int p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size(), rank = (static_cast<size_t>(std::clamp(p, 1, 100)) * n + 99) / 100;
  return v[std::max<size_t>(rank, 1) - 1];
}

}  // namespace strata
