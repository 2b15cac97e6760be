// What a worker's progress report must hold before the coordinator takes it in.
#pragma once

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// INVALID_ARGUMENT naming the field for a negative step or run end, a step past the run's
// end, a rate or metric that is not a finite number (>= 0 for the rate), or a step time
// that is not a finite number of milliseconds >= 0 (at most a day). A diverged run's loss
// may be NaN or infinite: it is shown so.
absl::Status CheckProgressReport(const ReportProgressRequest& r);

}  // namespace pscluster::coord
