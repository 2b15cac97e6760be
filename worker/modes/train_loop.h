// The training loop: steps from a start to the run's end, each followed by its observers
// (metrics, progress, checkpoints, evaluation), a failure handed to a recovery that says
// where to resume. The loop knows nothing of modes, shards or the coordinator: what runs
// before a step, the step and the recovery come as hooks, and what follows a step comes
// as observers, so adding one does not touch the loop.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster::modes {

// What observers learn of a step that ran.
struct StepDone {
  int64_t step = 0;   // the step (the next one is step + 1)
  int64_t epoch = 0;  // the epoch it is in, from 1
  int64_t total = 0;  // the run's steps
  float loss = 0;
  absl::Duration took, comm;  // the step's time, and the part of it spent communicating
  double epoch_loss = 0;      // mean training loss over the epoch's steps so far
  bool epoch_end = false;     // the last step of an epoch, or of a run cut short
  // Time the epoch ends' work took so far (checkpoints, evaluation): not training.
  absl::Duration paused;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // After each step, in the order the observers were added. An error fails the step: the
  // loop's recovery decides what follows.
  virtual absl::Status AfterStep(const StepDone& done) = 0;
  // After a rollback: the step `failed` failed, and training resumes at `resumed`.
  virtual void RolledBack(int64_t failed, int64_t resumed) {}
};

struct TrainLoopHooks {
  // Before each step (a due mode switch); an error fails the step.
  std::function<absl::Status(int64_t step)> before;
  std::function<absl::StatusOr<float>(int64_t step)> step;
  // Communication time so far (the step's share of it is reported); null: none.
  std::function<absl::Duration()> comm_clock;
  // A failed step's recovery: the step to resume at, or the failure that ends the run.
  std::function<absl::StatusOr<int64_t>(int64_t step, absl::Status failure)> recover;
};

class TrainLoop {
 public:
  TrainLoop(TrainLoopHooks hooks, int64_t per_epoch, int64_t total)
      : hooks_(std::move(hooks)), per_epoch_(per_epoch), total_(total) {}
  void Observe(StepObserver* observer) { observers_.push_back(observer); }  // not owned

  struct Result {
    absl::Duration training;                             // wall time less the epoch ends' work
    double final_loss = 0;                               // mean training loss over the last epoch
    std::vector<std::pair<int64_t, int64_t>> rollbacks;  // (failed step, resumed at)
  };
  // Runs steps [start, total).
  absl::StatusOr<Result> Run(int64_t start);

 private:
  absl::Status RunStep(int64_t step);

  const TrainLoopHooks hooks_;
  const int64_t per_epoch_, total_;
  std::vector<StepObserver*> observers_;
  double epoch_loss_ = 0;
  int64_t epoch_steps_ = 0;
  double final_loss_ = 0;
  absl::Duration paused_;
};

}  // namespace pscluster::modes
