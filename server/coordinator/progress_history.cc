#include "server/coordinator/progress_history.h"

namespace pscluster::coord {

void ProgressHistory::Append(std::vector<ProgressPoint>* series, ProgressPoint point) const {
  if (series->size() >= max_points_) {  // halve: keep the first, third, ... point
    size_t kept = 0;
    for (size_t i = 0; i < series->size(); i += 2) (*series)[kept++] = (*series)[i];
    series->resize(kept);
  }
  series->push_back(point);
}

void ProgressHistory::Record(const ReportProgressRequest& report) {
  absl::MutexLock lock(&mu_);
  WorkerCurves& c = curves_[report.rank()];
  if (report.samples_per_sec() > 0) {
    Append(&c.loss, {report.step(), report.loss()});
    Append(&c.samples_per_sec, {report.step(), report.samples_per_sec()});
  }
  if (report.has_metric()) Append(&c.metric, {report.step(), report.metric()});
}

std::map<int32_t, WorkerCurves> ProgressHistory::Curves() const {
  absl::MutexLock lock(&mu_);
  return curves_;
}

}  // namespace pscluster::coord
