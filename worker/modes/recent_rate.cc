#include "worker/modes/recent_rate.h"

namespace pscluster::modes {

void RecentRate::Add(absl::Time now, int64_t samples, absl::Duration paused) {
  if (points_.empty()) {
    points_.push_back({now, 0, absl::ZeroDuration()});
    return;
  }
  const Point& last = points_.back();
  points_.push_back({now, last.samples + samples, last.paused + paused});
  // The oldest point kept is the last one at or before the window's start, so the rate always
  // spans the whole window once the run is that long.
  while (points_.size() > 2 && points_[1].at <= now - window_) points_.pop_front();
}

double RecentRate::PerSecond() const {
  if (points_.size() < 2) return 0;
  const Point &first = points_.front(), &last = points_.back();
  const double seconds = absl::ToDoubleSeconds((last.at - first.at) - (last.paused - first.paused));
  return seconds > 0 ? static_cast<double>(last.samples - first.samples) / seconds : 0;
}

}  // namespace pscluster::modes
