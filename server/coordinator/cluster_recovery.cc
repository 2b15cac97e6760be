// ClusterState: the workers' recovery calls (cluster_state.h), checked against the
// registered workers and the cluster's generation, then kept by the RecoverySchedule.
#include "absl/strings/str_cat.h"
#include "common/cluster_view.h"
#include "common/status_macros.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {

absl::Status ClusterState::CheckRecoveryCallLocked(int32_t rank, int64_t incarnation,
                                                   const std::string* generation) {
  RETURN_IF_ERROR(CheckId(WORKER, rank));
  RETURN_IF_ERROR(FindWorkerLocked(rank, incarnation).status());
  if (generation == nullptr) return absl::OkStatus();
  const std::string now = Generation(ViewLocked());
  if (*generation == now) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("generation '", *generation, "' is over: the cluster is in generation '", now,
                   "' (a member failed or registered again); roll back in that one"));
}

absl::Status ClusterState::AppliedLocked(const absl::StatusOr<bool>& changed) {
  if (!changed.ok()) return changed.status();
  if (*changed) ChangedLocked();
  return absl::OkStatus();
}

absl::Status ClusterState::RecordRun(const RecordRunRequest& r) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRecoveryCallLocked(r.rank(), r.incarnation(), nullptr));
  return AppliedLocked(recovery_.RecordRun(r));
}

absl::StatusOr<Rollback> ClusterState::ReportStopped(const ReportStoppedRequest& r) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRecoveryCallLocked(r.rank(), r.incarnation(), &r.generation()));
  RETURN_IF_ERROR(AppliedLocked(recovery_.Stopped(r.generation(), r.rank())));
  return recovery_.rollback();
}

absl::StatusOr<Rollback> ClusterState::DecideRollback(const DecideRollbackRequest& r) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRecoveryCallLocked(r.rank(), r.incarnation(), &r.generation()));
  RETURN_IF_ERROR(AppliedLocked(recovery_.Decide(r.generation(), r.rank(), r.step())));
  return recovery_.rollback();
}

}  // namespace pscluster::coord
