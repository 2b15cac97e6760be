// The median of a benchmark's rounds (the mean of the middle two for an even count).
#pragma once

#include <algorithm>
#include <vector>

namespace pscluster::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace pscluster::bench
