#include "worker/modes/train_loop.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pscluster::modes {

absl::StatusOr<TrainLoop::Result> TrainLoop::Run(int64_t start) {
  Result result;
  const absl::Time began = absl::Now();
  for (int64_t step = start; step < total_;) {
    absl::Status s = RunStep(step);
    if (s.ok()) {
      ++step;
      continue;
    }
    ASSIGN_OR_RETURN(const int64_t resumed, hooks_.recover(step, s));
    result.rollbacks.emplace_back(step, resumed);
    for (StepObserver* o : observers_) o->RolledBack(step, resumed);
    step = resumed;
    epoch_loss_ = 0;
    epoch_steps_ = 0;
  }
  result.training = absl::Now() - began - paused_;
  result.final_loss = final_loss_;
  return result;
}

absl::Status TrainLoop::RunStep(int64_t step) {
  if (hooks_.before) RETURN_IF_ERROR(hooks_.before(step));
  const absl::Time began = absl::Now();
  const absl::Duration comm_before = hooks_.comm_clock ? hooks_.comm_clock() : absl::Duration();
  ASSIGN_OR_RETURN(const float loss, hooks_.step(step));
  StepDone done;
  done.step = step;
  done.epoch = step / per_epoch_ + 1;
  done.total = total_;
  done.loss = loss;
  done.took = absl::Now() - began;
  // With a communication thread (ALLREDUCE, PS overlap_push) communication overlaps
  // compute: it counts up to the step's length.
  if (hooks_.comm_clock) done.comm = std::min(hooks_.comm_clock() - comm_before, done.took);
  epoch_loss_ += loss;
  ++epoch_steps_;
  done.epoch_loss = epoch_loss_ / epoch_steps_;
  done.epoch_end = (step + 1) % per_epoch_ == 0 || step + 1 == total_;
  done.paused = paused_;
  if (done.epoch_end) {
    final_loss_ = done.epoch_loss;
    epoch_loss_ = 0;
    epoch_steps_ = 0;
  }
  const absl::Time observed = absl::Now();
  for (StepObserver* o : observers_) {
    absl::Status s = o->AfterStep(done);
    if (!s.ok()) {
      if (done.epoch_end) paused_ += absl::Now() - observed;
      return s;
    }
  }
  if (done.epoch_end) paused_ += absl::Now() - observed;
  return absl::OkStatus();
}

}  // namespace pscluster::modes
