// Exponential backoff with jitter for retry loops. Without jitter every member that lost the
// same server (a restarted coordinator, a shard failing over) retried in lockstep, at the same
// instants, on every round. Each delay is drawn uniformly from [d/2, d] ("equal jitter"), then
// d doubles up to the maximum. Not thread-safe: one per retry loop.
#pragma once

#include <cstdint>
#include <optional>
#include <random>

#include "absl/time/time.h"

namespace pscluster {

class Backoff {
 public:
  // Draws from a generator seeded from the system's entropy at the first Next() (a loop that
  // never retries pays nothing).
  Backoff(absl::Duration initial, absl::Duration max) : ceiling_(initial), max_(max) {}
  // Reproducible delays, for tests.
  Backoff(absl::Duration initial, absl::Duration max, uint64_t seed)
      : ceiling_(initial), max_(max), rng_(seed) {}

  // The delay before the next try, in [ceiling()/2, ceiling()]; then the ceiling doubles.
  absl::Duration Next();
  // The longest delay the next Next() can return: what a caller checks against its deadline.
  absl::Duration ceiling() const { return ceiling_; }
  // A new cap for the ceilings after the next Next() (a loop whose kind of wait changes).
  void set_max(absl::Duration max) { max_ = max; }

 private:
  absl::Duration ceiling_, max_;
  std::optional<std::mt19937_64> rng_;
};

}  // namespace pscluster
