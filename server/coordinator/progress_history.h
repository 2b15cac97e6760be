// Every worker's reported progress over the run (loss and samples/s per report, the test
// metric per evaluation), for the status page's curves. Bounded: past max_points a
// worker's series keeps every second point, so a long run keeps its whole shape in
// constant memory. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

struct ProgressPoint {
  int64_t step;
  double value;
};

struct WorkerCurves {
  std::vector<ProgressPoint> loss;
  std::vector<ProgressPoint> samples_per_sec;
  std::vector<ProgressPoint> metric;  // test accuracy (or the run's metric)
};

class ProgressHistory {
 public:
  explicit ProgressHistory(size_t max_points = 512) : max_points_(max_points) {}

  // An accepted ReportProgress. A report with samples_per_sec 0 carries only a metric.
  void Record(const ReportProgressRequest& report);
  std::map<int32_t, WorkerCurves> Curves() const;

 private:
  void Append(std::vector<ProgressPoint>* series, ProgressPoint point) const;

  const size_t max_points_;
  mutable absl::Mutex mu_;
  std::map<int32_t, WorkerCurves> curves_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::coord
