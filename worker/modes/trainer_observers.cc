// The training loop's observers that work on the trainer's state: checkpoints (and the
// memory probe at the first epoch's end), and evaluation.
#include <malloc.h>

#include <cmath>
#include <cstdio>

#include "common/logging.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "worker/modes/trainer.h"

namespace pscluster::modes {

absl::Status Trainer::Checkpoints::AfterStep(const StepDone& done) {
  Trainer& t = *trainer_;
  if (!done.epoch_end) return t.CheckpointMidEpoch(done.step + 1, summary_);
  RETURN_IF_ERROR(t.placement_->Flush());  // the boundary's checkpoint sees every step before it
  if (t.options_.coordinator != nullptr) RETURN_IF_ERROR(t.Publish(done.step + 1));
  t.RequestCheckpoint(done.epoch, summary_);
  // Training's memory, before the first evaluation (which builds a model of its own): what
  // is live after the steps (free pages returned first), and the peak so far (with the
  // start's transient copies of the state: the initial state, the first checkpoint).
  if (t.memory_live_ == 0) {
    t.memory_peak_ = PeakResidentMemoryBytes();
    malloc_trim(0);
    t.memory_live_ = ResidentMemoryBytes();
  }
  return absl::OkStatus();
}

absl::Status Trainer::Evaluation::AfterStep(const StepDone& done) {
  Trainer& t = *trainer_;
  if (!done.epoch_end || !t.options_.evaluate || t.test_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(model::StepResult r, t.Evaluate(done.step + 1));
  summary_->test_accuracy = static_cast<double>(r.correct) / std::max(r.examples, 1);
  summary_->test_loss = r.loss;
  const int rank = t.options_.rank;
  if (t.model_->spec().label_width > 1) {  // a language model: the loss is what matters
    LogInfo(
        "worker %d: epoch %lld test loss %.4f (%.4f bits per token), next-token "
        "accuracy %.4f",
        rank, static_cast<long long>(done.epoch), r.loss, r.loss / std::log(2.0),
        summary_->test_accuracy);
  } else {
    LogInfo("worker %d: epoch %lld test accuracy %.4f", rank, static_cast<long long>(done.epoch),
            summary_->test_accuracy);
  }
  if (t.options_.metrics != nullptr) t.options_.metrics->Evaluated(summary_->test_accuracy);
  if (t.options_.coordinator != nullptr) {  // feeds keep-the-best checkpoints
    absl::Status s = t.options_.coordinator->ReportProgress(
        t.view_.version(), done.step + 1, done.epoch_loss, 0, summary_->test_accuracy);
    if (!s.ok()) LogWarning("worker %d: metric report: %s", rank, s.ToString().c_str());
  }
  return absl::OkStatus();
}

}  // namespace pscluster::modes
