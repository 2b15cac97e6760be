#include "server/coordinator/progress_report.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pscluster::coord {
namespace {

// A step time is charted beside the others: it must be a number, and a sane one.
bool SaneMilliseconds(double ms) { return std::isfinite(ms) && ms >= 0 && ms <= 86'400'000; }

}  // namespace

absl::Status CheckProgressReport(const ReportProgressRequest& r) {
  if (r.step() < 0 || r.run_end_step() < 0 ||
      (r.run_end_step() > 0 && r.step() > r.run_end_step())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", r.rank(), " reported step ", r.step(), " and run end ", r.run_end_step(),
        ": they must not be negative, and the step not past the run's end"));
  }
  // A metric decides which checkpoint is kept as the best, and a rate is summed and
  // charted: those must be numbers.
  if (!std::isfinite(r.samples_per_sec()) || r.samples_per_sec() < 0 ||
      (r.has_metric() && !std::isfinite(r.metric()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", r.rank(), " reported samples/s ", r.samples_per_sec(),
                     " and metric ", r.has_metric() ? absl::StrCat(r.metric()) : "none",
                     ": samples/s must be a number >= 0 and a metric a finite number"));
  }
  const StepTime& t = r.step_time();
  if (!SaneMilliseconds(t.compute_ms()) || !SaneMilliseconds(t.communication_ms()) ||
      !SaneMilliseconds(t.other_ms())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", r.rank(), " reported a step time of ", t.compute_ms(),
                     " ms compute, ", t.communication_ms(), " ms communication and ", t.other_ms(),
                     " ms other: each must be a number of milliseconds from 0 to a day"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::coord
