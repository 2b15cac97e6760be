// The training loop's observers that need no trainer: Prometheus metrics and the progress
// lines (with the coordinator's progress reports).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "worker/modes/placement.h"
#include "worker/modes/recent_rate.h"
#include "worker/modes/train_loop.h"
#include "worker/modes/worker_metrics.h"

namespace pscluster::modes {

// Each step's time, communication and loss, the mode in effect, and rollbacks.
class MetricsObserver final : public StepObserver {
 public:
  // metrics: not owned. mode: the mode steps run in now. learning_rate (may be null): the
  // scheduled rate at a step.
  MetricsObserver(WorkerMetrics* metrics, int batch_size, std::function<Mode()> mode,
                  std::function<double(int64_t step)> learning_rate = nullptr)
      : metrics_(metrics),
        batch_size_(batch_size),
        mode_(std::move(mode)),
        learning_rate_(std::move(learning_rate)) {}
  absl::Status AfterStep(const StepDone& done) override;
  void RolledBack(int64_t, int64_t) override { metrics_->RolledBack(); }

 private:
  WorkerMetrics* const metrics_;
  const int batch_size_;
  const std::function<Mode()> mode_;
  const std::function<double(int64_t)> learning_rate_;
  Mode reported_ = coord::TRAINING_MODE_UNSPECIFIED;
};

// A line every `every` (and at the last step) with the epoch's loss, the samples/s of the
// last 30 s (not an average since the start, which after an outage lied for minutes) and
// the ETA; the same figures go to `report` (the coordinator) and the metrics' gauges.
class ProgressPrinter final : public StepObserver {
 public:
  struct Options {
    int rank = 0;
    int batch_size = 0;
    int epochs = 0;
    absl::Duration every = absl::Seconds(5);
    std::function<Mode()> mode;
    // May be null. `time`: the mean step's split since the last report.
    std::function<void(int64_t step, double loss, double rate, const coord::StepTime& time)> report;
    WorkerMetrics* metrics = nullptr;  // may be null
  };
  explicit ProgressPrinter(Options options);
  absl::Status AfterStep(const StepDone& done) override;

 private:
  const Options options_;
  RecentRate recent_;
  absl::Time last_line_;
  int64_t steps_done_ = 0, reported_steps_ = 0;  // replayed steps after a rollback count
  absl::Duration reported_paused_;
  absl::Duration took_, comm_;  // the steps' time since the last report, and communication's
  // The mean step's split since the last report (took_ and comm_ start again).
  coord::StepTime SplitSince(absl::Time now);
};

}  // namespace pscluster::modes
