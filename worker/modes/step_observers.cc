#include "worker/modes/step_observers.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/training_mode.h"

namespace pscluster::modes {
namespace {

std::string FormatEta(double seconds) {
  int s = static_cast<int>(seconds);
  return absl::StrCat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s");
}

}  // namespace

absl::Status MetricsObserver::AfterStep(const StepDone& done) {
  metrics_->Step(batch_size_, done.took - done.comm, done.comm, done.loss);
  if (learning_rate_) metrics_->LearningRate(learning_rate_(done.step));
  if (const Mode now = mode_(); now != reported_) {
    reported_ = now;
    metrics_->SetMode(now);
  }
  return absl::OkStatus();
}

ProgressPrinter::ProgressPrinter(Options options)
    : options_(std::move(options)), last_line_(absl::Now()) {
  recent_.Add(last_line_, 0);
}

coord::StepTime ProgressPrinter::SplitSince(absl::Time now) {
  const double steps = static_cast<double>(std::max<int64_t>(steps_done_ - reported_steps_, 1));
  auto ms = [steps](absl::Duration d) {
    return std::max(0.0, absl::ToDoubleMilliseconds(d) / steps);
  };
  coord::StepTime t;
  t.set_compute_ms(ms(took_ - comm_));
  t.set_communication_ms(ms(comm_));
  t.set_other_ms(ms(now - last_line_ - took_));  // data, evaluation, checkpoints
  took_ = comm_ = absl::ZeroDuration();
  return t;
}

absl::Status ProgressPrinter::AfterStep(const StepDone& done) {
  ++steps_done_;
  took_ += done.took;
  comm_ += done.comm;
  const absl::Time now = absl::Now();
  if (now - last_line_ < options_.every && done.step + 1 != done.total) return absl::OkStatus();
  const coord::StepTime split = SplitSince(now);
  recent_.Add(now, (steps_done_ - reported_steps_) * options_.batch_size,
              done.paused - reported_paused_);
  reported_steps_ = steps_done_;
  reported_paused_ = done.paused;
  const double rate = recent_.PerSecond();
  const int64_t left = done.total - done.step - 1;
  LogInfo("worker %d (%s): epoch %lld/%d step %lld/%lld loss %.4f %.0f samples/s ETA %s",
          options_.rank, ModeName(options_.mode()), static_cast<long long>(done.epoch),
          options_.epochs, static_cast<long long>(done.step + 1),
          static_cast<long long>(done.total), done.epoch_loss, rate,
          rate > 0 ? FormatEta(left * options_.batch_size / rate).c_str() : "unknown");
  if (options_.report) options_.report(done.step + 1, done.epoch_loss, rate, split);
  if (options_.metrics != nullptr) {
    options_.metrics->Progress(rate, done.epoch);
  }
  last_line_ = now;
  return absl::OkStatus();
}

}  // namespace pscluster::modes
