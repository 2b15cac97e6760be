// The workers' recovery, as the coordinator keeps it: how the run was started, and the
// rollback of the newest generation (a healed cluster: common/cluster_view.h). The rules:
// - Rank 0 records the run's shared flags before it trains, then that the run started.
//   Until it started, a new record replaces the old (a rank 0 restarted before training);
//   once started, a record with other flags is refused and the same one changes nothing.
// - Every other worker, and a rank 0 that replaces a failed one, compares its flags with
//   the record (the worker does: the view carries it) and rejoins a started run.
// - In a rollback each worker of the generation reports that it stopped. A report of a
//   generation other than the one held starts that generation's rollback afresh (its
//   owner refuses generations that are no longer the cluster's).
// - Rank 0 decides the step once every rank has stopped, after restoring the shards; a
//   repeated decision with the same step changes nothing, another step is refused. The
//   run record counts the decisions (RunRecord.rollbacks).
// Independent of gRPC and of the cluster (its owner checks who calls and the generation).
// Not thread-safe: the owner (ClusterState) guards it with its own mutex.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// A flag record bounded so that it cannot crowd the view (registration.h's budget).
inline constexpr int kMaxRunFlags = 64;
inline constexpr size_t kMaxRunFlagBytes = 256;

class RecoverySchedule {
 public:
  // num_workers (>= 1): the ranks [0, num_workers) a rollback waits for.
  explicit RecoverySchedule(int num_workers) : num_workers_(num_workers) {}

  // INVALID_ARGUMENT for no flags, too many or too long ones; FAILED_PRECONDITION for a
  // rank other than 0, for started=false after the start, or for flags other than the
  // started run's. Answers whether the record changed.
  absl::StatusOr<bool> RecordRun(const RecordRunRequest& r);

  // Rank `rank` (in range: the caller checked) stopped in `generation` (not empty, else
  // INVALID_ARGUMENT). Answers whether the rollback changed.
  absl::StatusOr<bool> Stopped(const std::string& generation, int32_t rank);

  // FAILED_PRECONDITION for a rank other than 0, a generation with no rollback held, or
  // ranks not yet stopped (named); INVALID_ARGUMENT for a negative step; ALREADY_EXISTS
  // when decided with another step. Answers whether the rollback changed.
  absl::StatusOr<bool> Decide(const std::string& generation, int32_t rank, int64_t step);

  const Rollback& rollback() const { return rollback_; }
  // Sets view->run and view->rollback.
  void FillView(ClusterView* view) const;
  // Into and from a restarted coordinator's state; Restore drops a saved rollback with
  // ranks outside [0, num_workers) (the coordinator was restarted with fewer workers).
  void Save(CoordinatorState* state) const;
  void Restore(const CoordinatorState& state);

 private:
  // INVALID_ARGUMENT for no flags, too many or too long ones.
  static absl::Status CheckFlags(const google::protobuf::RepeatedPtrField<std::string>& flags);

  const int num_workers_;
  RunRecord run_;
  Rollback rollback_;
};

}  // namespace pscluster::coord
