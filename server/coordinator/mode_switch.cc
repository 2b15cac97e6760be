#include "server/coordinator/mode_switch.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::coord {

absl::Status ValidateMode(TrainingMode mode, int num_shards) {
  RETURN_IF_ERROR(CheckMode("mode", mode));
  if (mode == PS && num_shards <= 0) {
    return absl::FailedPreconditionError(
        "mode 'ps' needs parameter-server shards, and this cluster has none "
        "(ps_coordinator --num_shards=0)");
  }
  return absl::OkStatus();
}

SwitchSchedule::SwitchSchedule(SwitchScheduleOptions options)
    : options_(std::move(options)), mode_(options_.initial_mode) {}

absl::StatusOr<PollSwitchResponse> SwitchSchedule::Poll(int rank, int64_t step, int64_t horizon) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("polled step ", step, " is negative"));
  }
  if (horizon < 0 || horizon > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("poll horizon ", horizon, " is outside [0, 1000000]"));
  }
  reached_[rank] = step + std::max<int64_t>(horizon, 1) - 1;  // lower after a rollback
  if (static_cast<int>(reached_.size()) >= options_.num_workers) floor_ = -1;
  PollSwitchResponse response;
  // Done switches count too: workers that rolled back to a checkpoint before one replay it
  // (their reports repeat, harmlessly) and so run every later step in the same mode again.
  for (auto it = by_step_.lower_bound(step); it != by_step_.end(); ++it) {
    response.set_pending(true);
    response.set_switch_id(it->second.record.switch_id());
    response.set_at_step(it->first);
    response.set_mode(it->second.record.to_mode());
    break;
  }
  return response;
}

absl::StatusOr<SwitchModeResponse> SwitchSchedule::Schedule(TrainingMode mode, int64_t at_step,
                                                            int64_t unix_ms) {
  RETURN_IF_ERROR(ValidateMode(mode, options_.num_shards));
  if (at_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at_step ", at_step, " is negative; use 0 for the next step boundary or a later step"));
  }
  const int64_t reached = max_polled();
  if (at_step != 0 && at_step <= reached) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", at_step, " already passed: workers are at step ", reached,
                     "; use a later step or 0 for the next boundary"));
  }
  const int64_t step = at_step == 0 ? reached + 1 : at_step;
  std::vector<const SwitchRecord*> all;
  for (const auto& [s, e] : by_step_) all.push_back(&e.record);
  const SwitchRecord* before = SwitchInEffectAt(step, all);
  SwitchModeResponse response;
  if (ModeAt(step, options_.initial_mode, all) == mode) {
    response.set_no_op(true);
    response.set_switch_id(before != nullptr ? before->switch_id() : 0);
    response.set_at_step(before != nullptr ? before->at_step() : 0);
    return response;
  }
  if (before != nullptr && before->at_step() == step) {
    return absl::AlreadyExistsError(absl::StrCat(
        "switch ", before->switch_id(), " to ", ModeName(before->to_mode()),
        " is already scheduled at step ", step, "; one switch per step: pick another step"));
  }
  Entry& e = by_step_[step];
  e.record.set_switch_id(next_id_++);
  e.record.set_at_step(step);
  e.record.set_to_mode(mode);
  e.record.set_unix_ms(unix_ms);
  response.set_switch_id(e.record.switch_id());
  response.set_at_step(step);
  return response;
}

int64_t SwitchSchedule::max_polled() const {
  int64_t most = floor_;
  for (const auto& [rank, step] : reached_) most = std::max(most, step);
  return most;
}

void SwitchSchedule::Rewind(int64_t step) {
  floor_ = std::min(floor_, step - 1);
  for (auto& [rank, reached] : reached_) reached = std::min(reached, step - 1);
}

int SwitchSchedule::DropFrom(int64_t end_step) {
  int dropped = 0;
  for (auto it = by_step_.lower_bound(end_step); it != by_step_.end();) {
    if (it->second.done) {  // reached: cannot be past the end (kept as it is)
      ++it;
      continue;
    }
    it = by_step_.erase(it);
    ++dropped;
  }
  return dropped;
}

SwitchSchedule::Entry* SwitchSchedule::FindById(int64_t switch_id) {
  for (auto& [step, e] : by_step_) {
    if (e.record.switch_id() == switch_id) return &e;
  }
  return nullptr;
}

absl::StatusOr<SwitchSchedule::AckResult> SwitchSchedule::Acknowledge(const ReportSwitchRequest& r,
                                                                      int64_t unix_ms) {
  Entry* e = FindById(r.switch_id());
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("switch ", r.switch_id(), " is unknown; ", next_id_ - 1,
                                            " switch(es) were scheduled"));
  }
  SwitchRecord& rec = e->record;
  if (r.at_step() != rec.at_step() || r.to_mode() != rec.to_mode()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r.rank(), " reports switch ", r.switch_id(), " to '",
                     ModeName(r.to_mode()), "' at step ", r.at_step(), ", but it is scheduled to ",
                     ModeName(rec.to_mode()), " at step ", rec.at_step()));
  }
  RETURN_IF_ERROR(CheckMode("from_mode", r.from_mode()));
  if (rec.from_mode() != TRAINING_MODE_UNSPECIFIED && r.from_mode() != rec.from_mode()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r.rank(), " reports switch ", r.switch_id(), " from ", ModeName(r.from_mode()),
        ", but an earlier report said from ", ModeName(rec.from_mode())));
  }
  if (!std::isfinite(r.handoff_seconds()) || r.handoff_seconds() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff_seconds ", r.handoff_seconds(), " must be finite and >= 0"));
  }
  AckResult result;
  result.done = e->done;
  auto* ranks = rec.mutable_acked_ranks();
  if (e->done || std::find(ranks->begin(), ranks->end(), r.rank()) != ranks->end()) {
    return result;  // a repeated report (a retry)
  }
  result.changed = true;
  rec.set_from_mode(r.from_mode());
  rec.set_handoff_seconds(std::max(rec.handoff_seconds(), r.handoff_seconds()));
  ranks->Add(r.rank());
  std::sort(ranks->begin(), ranks->end());
  if (ranks->size() >= options_.num_workers) {
    Complete(e, unix_ms);
    result.done = true;
  }
  return result;
}

void SwitchSchedule::Complete(Entry* e, int64_t unix_ms) {
  e->done = true;
  e->record.clear_acked_ranks();
  e->record.set_unix_ms(unix_ms);
  done_.push_back(e->record);
  for (auto it = by_step_.rbegin(); it != by_step_.rend(); ++it) {  // switches may complete
    if (it->second.done) {                                          // out of order
      mode_ = it->second.record.to_mode();
      break;
    }
  }
}

void SwitchSchedule::FillView(ClusterView* view) const {
  view->set_mode(mode_);
  view->set_initial_mode(options_.initial_mode);
  for (const SwitchRecord& r : done_) *view->add_switches() = r;
  for (const auto& [step, e] : by_step_) {
    if (!e.done) *view->add_pending_switches() = e.record;
  }
}

void SwitchSchedule::Save(CoordinatorState* state) const {
  for (const SwitchRecord& r : done_) *state->add_done_switches() = r;
  for (const auto& [step, e] : by_step_) {
    if (!e.done) *state->add_pending_switches() = e.record;
  }
  state->set_max_polled(max_polled());
  state->set_next_switch_id(next_id_);
}

absl::Status SwitchSchedule::Restore(const CoordinatorState& state) {
  std::map<int64_t, Entry> by_step;
  for (const auto* list : {&state.done_switches(), &state.pending_switches()}) {
    for (const SwitchRecord& r : *list) {
      RETURN_IF_ERROR(ValidateMode(r.to_mode(), options_.num_shards));
      if (r.at_step() < 0 ||
          !by_step.emplace(r.at_step(), Entry{r, list == &state.done_switches()}).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("saved switch ", r.switch_id(), " at step ", r.at_step(),
                         " is negative or shares its step with another"));
      }
    }
  }
  by_step_ = std::move(by_step);
  done_.assign(state.done_switches().begin(), state.done_switches().end());
  reached_.clear();
  floor_ = state.max_polled();
  next_id_ = std::max<int64_t>(state.next_switch_id(), 1);
  mode_ = options_.initial_mode;
  for (auto it = by_step_.rbegin(); it != by_step_.rend(); ++it) {
    if (it->second.done) {
      mode_ = it->second.record.to_mode();
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::coord
