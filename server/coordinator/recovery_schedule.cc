#include "server/coordinator/recovery_schedule.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_view.h"

namespace pscluster::coord {

absl::Status RecoverySchedule::CheckFlags(
    const google::protobuf::RepeatedPtrField<std::string>& flags) {
  if (flags.empty() || flags.size() > kMaxRunFlags) {
    return absl::InvalidArgumentError(
        absl::StrCat("a run record has 1 to ", kMaxRunFlags, " flags, not ", flags.size()));
  }
  for (const std::string& f : flags) {
    if (f.empty() || f.size() > kMaxRunFlagBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a run flag has 1 to ", kMaxRunFlagBytes, " bytes, not ", f.size()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RecoverySchedule::RecordRun(const RecordRunRequest& r) {
  if (r.rank() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", r.rank(), " cannot record the run: only rank 0 does"));
  }
  if (absl::Status s = CheckFlags(r.flags()); !s.ok()) return s;
  const bool same =
      std::equal(r.flags().begin(), r.flags().end(), run_.flags().begin(), run_.flags().end());
  if (run_.started()) {
    if (!same) {
      return absl::FailedPreconditionError(
          absl::StrCat("the run started with ", absl::StrJoin(run_.flags(), " "),
                       "; a run's flags do not change once it started"));
    }
    if (!r.started()) {
      return absl::FailedPreconditionError("the run has started; a start is not undone");
    }
    return false;
  }
  if (same && r.started() == run_.started()) return false;
  *run_.mutable_flags() = r.flags();
  run_.set_started(r.started());
  return true;
}

absl::StatusOr<bool> RecoverySchedule::Stopped(const std::string& generation, int32_t rank) {
  if (generation.empty()) return absl::InvalidArgumentError("a rollback names its generation");
  if (rollback_.generation() != generation) {
    rollback_ = Rollback();
    rollback_.set_generation(generation);
  }
  auto* ranks = rollback_.mutable_stopped_ranks();
  auto at = std::lower_bound(ranks->begin(), ranks->end(), rank);
  if (at != ranks->end() && *at == rank) return false;
  ranks->Add(rank);
  std::sort(ranks->begin(), ranks->end());
  return true;
}

absl::StatusOr<bool> RecoverySchedule::Decide(const std::string& generation, int32_t rank,
                                              int64_t step) {
  if (rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", rank, " cannot decide a rollback: only rank 0 does"));
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("rollback step ", step, " < 0"));
  if (generation.empty() || rollback_.generation() != generation) {
    return absl::FailedPreconditionError(absl::StrCat("no worker reported stopping in generation '",
                                                      generation, "': report it first"));
  }
  if (rollback_.decided()) {
    if (rollback_.step() == step) return false;
    return absl::AlreadyExistsError(absl::StrCat("the rollback of this generation was decided at ",
                                                 rollback_.step(), ", not ", step));
  }
  if (const std::vector<int32_t> missing = RanksNotStopped(rollback_, num_workers_);
      !missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("worker ranks ", absl::StrJoin(missing, ", "),
                                                      " have not stopped: wait for them"));
  }
  rollback_.set_decided(true);
  rollback_.set_step(step);
  run_.set_rollbacks(run_.rollbacks() + 1);
  return true;
}

void RecoverySchedule::FillView(ClusterView* view) const {
  *view->mutable_run() = run_;
  *view->mutable_rollback() = rollback_;
}

void RecoverySchedule::Save(CoordinatorState* state) const {
  *state->mutable_run() = run_;
  *state->mutable_rollback() = rollback_;
}

void RecoverySchedule::Restore(const CoordinatorState& state) {
  run_ = state.run();
  if (!run_.flags().empty() && !CheckFlags(run_.flags()).ok()) run_ = RunRecord();
  rollback_ = state.rollback();
  for (int32_t r : rollback_.stopped_ranks()) {
    if (r < 0 || r >= num_workers_) {
      rollback_ = Rollback();
      break;
    }
  }
}

}  // namespace pscluster::coord
