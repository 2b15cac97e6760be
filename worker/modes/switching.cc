// Trainer: the live mode-switch protocol (see trainer.h): poll the coordinator's
// schedule, barrier, hand the state to the new placement, acknowledge.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/modes/trainer.h"

namespace pscluster::modes {

absl::Status Trainer::SwitchTo(Mode mode, int64_t step, double* seconds) {
  const absl::Time start = absl::Now();
  // The coordinator refuses such switches; one scheduled before this worker registered fails
  // here, before the state is gathered.
  RETURN_IF_ERROR(coord::CheckModeFits(mode, ModeLimitsOf(model_->spec()), options_.world));
  // Every worker has finished step - 1 (its pushes included) before anyone reads state.
  if (comm_ != nullptr) RETURN_IF_ERROR(comm_->Barrier());
  ASSIGN_OR_RETURN(ModelState state, placement_->Gather(step, /*with_slots=*/true));
  placement_.reset();  // the old placement's buffers go before the new ones come
  ASSIGN_OR_RETURN(placement_, MakePlacement(mode, Context()));
  RETURN_IF_ERROR(placement_->Load(state, step));
  if (seconds != nullptr) *seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status Trainer::MaybeSwitch(int64_t step, TrainSummary* summary) {
  CoordinatorClient* c = options_.coordinator;
  if (c == nullptr || !options_.connect) return absl::OkStatus();
  if (step >= next_poll_ || step < polled_at_) {  // the last answer covers [polled_at_, next_poll_)
    ASSIGN_OR_RETURN(PendingSwitch pending, c->PollSwitch(step, options_.switch_poll_steps));
    polled_at_ = step;
    next_poll_ = step + std::max(1, options_.switch_poll_steps);
    known_ =
        pending.pending && pending.at_step < next_poll_ ? std::optional(pending) : std::nullopt;
  }
  if (!known_ || known_->at_step != step) return absl::OkStatus();
  const PendingSwitch pending = *known_;
  known_.reset();
  next_poll_ = step + 1;  // another switch may follow within the polled window
  const Mode to = pending.mode;
  const Mode from = placement_->mode();
  double seconds = 0;
  if (to != from) RETURN_IF_ERROR(SwitchTo(to, step, &seconds));
  RecordSwitch(&summary->switches, {step, ModeName(from), ModeName(to), seconds});
  if (options_.metrics != nullptr) options_.metrics->Switched(seconds);
  LogInfo("worker %d: step %lld: switched from %s to %s (hand-over %.3f s)", options_.rank,
          static_cast<long long>(step), ModeName(from), ModeName(to), seconds);
  return c->ReportSwitch(pending, from, seconds).status();
}

}  // namespace pscluster::modes
