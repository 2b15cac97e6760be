// Samples per second over the last stretch of a run, for progress lines, ETAs and the
// samples/s gauge. An average since the start lied for minutes after an outage (679
// samples/s and an ETA of 5m52s right after a recovery, against 3,600 before); this one
// forgets a stall once it leaves the window. Not thread-safe: the training thread's.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/time/time.h"

namespace pscluster::modes {

class RecentRate {
 public:
  explicit RecentRate(absl::Duration window = absl::Seconds(30)) : window_(window) {}

  // `samples` more were trained by `now`, of whose time since the last call `paused` was not
  // training (evaluation). The first call only starts the clock.
  void Add(absl::Time now, int64_t samples, absl::Duration paused = absl::ZeroDuration());
  // Samples per second over the window ending at the last Add; 0 before two calls.
  double PerSecond() const;

 private:
  struct Point {
    absl::Time at;
    int64_t samples;        // trained by `at`, since the first call
    absl::Duration paused;  // not training by `at`, likewise
  };
  absl::Duration window_;
  std::deque<Point> points_;  // the last before the window, then every one inside it
};

}  // namespace pscluster::modes
