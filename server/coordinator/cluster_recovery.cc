// ClusterState: the workers' recovery calls (cluster_state.h), checked against the
// registered workers and the cluster's generation, then kept by the RecoverySchedule.
#include "absl/strings/str_cat.h"
#include "common/cluster_view.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {

absl::Status ClusterState::CheckGenerationLocked(const std::string& generation) const {
  const std::string now = Generation(ViewLocked());
  if (generation == now) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("generation '", generation, "' is over: the cluster is in generation '", now,
                   "' (a member failed or registered again); roll back in that one"));
}

absl::Status ClusterState::RecordRun(const RecordRunRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindWorkerLocked(r.rank(), r.incarnation()).status(); !s.ok()) return s;
  absl::StatusOr<bool> changed = recovery_.RecordRun(r);
  if (!changed.ok()) return changed.status();
  if (*changed) ChangedLocked();
  return absl::OkStatus();
}

absl::StatusOr<Rollback> ClusterState::ReportStopped(const ReportStoppedRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindWorkerLocked(r.rank(), r.incarnation()).status(); !s.ok()) return s;
  if (absl::Status s = CheckGenerationLocked(r.generation()); !s.ok()) return s;
  absl::StatusOr<bool> changed = recovery_.Stopped(r.generation(), r.rank());
  if (!changed.ok()) return changed.status();
  if (*changed) ChangedLocked();
  return recovery_.rollback();
}

absl::StatusOr<Rollback> ClusterState::DecideRollback(const DecideRollbackRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindWorkerLocked(r.rank(), r.incarnation()).status(); !s.ok()) return s;
  if (absl::Status s = CheckGenerationLocked(r.generation()); !s.ok()) return s;
  absl::StatusOr<bool> changed = recovery_.Decide(r.generation(), r.rank(), r.step());
  if (!changed.ok()) return changed.status();
  if (*changed) ChangedLocked();
  return recovery_.rollback();
}

}  // namespace pscluster::coord
