// --steps_file: one JSON line per step (its loss, time, communication and mode) and one per
// rollback, for plots and analysis that must not parse log lines. deploy/plot_run.py draws
// the per-step loss from it; a replacement worker appends to its rank's file.
//   {"step": 812, "epoch": 2, "loss": 0.4121, "seconds": 0.0031, "comm_seconds": 0.0012, "mode":
//   "ps"}
//   {"rollback": {"failed": 850, "resumed": 702}}
// A write that fails (a full disk) is said once and the file is given up: the run goes on.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/modes/placement.h"
#include "worker/modes/train_loop.h"

namespace pscluster::modes {

class StepsFile final : public StepObserver {
 public:
  // Appends to `path`; FAILED_PRECONDITION naming it when it cannot be opened. `mode`: the
  // mode steps run in now.
  static absl::StatusOr<std::unique_ptr<StepsFile>> Open(const std::string& path,
                                                         std::function<Mode()> mode);

  absl::Status AfterStep(const StepDone& done) override;
  void RolledBack(int64_t failed, int64_t resumed) override;

 private:
  StepsFile(std::string path, std::function<Mode()> mode);
  // Writes `line` and a newline, flushing at most once a second (and on rollbacks and
  // epoch ends), so a killed worker's file holds all but its last second.
  void Write(const std::string& line, bool flush_now);

  const std::string path_;
  const std::function<Mode()> mode_;
  std::ofstream out_;
  absl::Time flushed_;
  bool failed_ = false;
};

}  // namespace pscluster::modes
