#include "common/backoff.h"

#include <algorithm>

namespace pscluster {

absl::Duration Backoff::Next() {
  if (!rng_) rng_.emplace(std::random_device{}());
  const double fraction = std::uniform_real_distribution<double>(0.5, 1.0)(*rng_);
  const absl::Duration delay = ceiling_ * fraction;
  ceiling_ = std::min(ceiling_ * 2, max_);
  return delay;
}

}  // namespace pscluster
