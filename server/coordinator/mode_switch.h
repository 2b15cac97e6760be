// The schedule of live mode switches: which switches are pending, at which step, which
// workers have finished each, and the mode in effect. Workers poll before every step with
// the step they are about to run; the highest of the ranks' latest such steps (max_polled)
// bounds where a new switch may go, so no worker can have passed it (workers that rolled
// back to a checkpoint poll from it again, and the steps after it open up once they all
// have). A switch is done when every worker rank
// has reported it. Independent of gRPC and of cluster (its owner checks who calls).
// Not thread-safe: the owner (ClusterState) guards it with its own mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/training_mode.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// INVALID_ARGUMENT for UNSPECIFIED or a value outside the enum (listing the modes);
// FAILED_PRECONDITION for PS in a cluster without parameter-server shards.
absl::Status ValidateMode(TrainingMode mode, int num_shards);

struct SwitchScheduleOptions {
  TrainingMode initial_mode = PS;  // the mode before any switch; must pass ValidateMode
  int num_shards = 1;              // 0: switching to "ps" is refused
  int num_workers = 1;             // ranks [0, num_workers) must each report a switch
};

class SwitchSchedule {
 public:
  explicit SwitchSchedule(SwitchScheduleOptions options);

  // A worker is about to run `step` (INVALID_ARGUMENT if negative): records it in
  // max_polled and answers the earliest switch with at_step >= step, if any — done ones
  // included, for workers that rolled back to a checkpoint before it and replay it.
  // (Not the earliest pending overall: one still waiting for a slow worker's report lies
  // behind a worker that already took it, and must not hide a later one from it.)
  // `horizon` (>= 1) steps from `step` on count as reached: the worker polls again only
  // after them, so no switch may be scheduled among them any more.
  absl::StatusOr<PollSwitchResponse> Poll(int rank, int64_t step, int64_t horizon = 1);

  // Schedules a switch to `mode` at `at_step` (0: max_polled + 1, the next boundary no
  // worker has reached). INVALID_ARGUMENT for an unknown mode or a negative step;
  // FAILED_PRECONDITION for PS without shards or a step <= max_polled; ALREADY_EXISTS
  // for a step that has a switch to another mode. When `mode` is already the mode in
  // effect at that step, schedules nothing and answers no_op with the switch that puts it
  // in effect (0/0 for the starting mode). `unix_ms`: now, kept until the switch is done.
  absl::StatusOr<SwitchModeResponse> Schedule(TrainingMode mode, int64_t at_step, int64_t unix_ms);

  struct AckResult {
    bool changed = false;  // a new report was recorded (the view changed)
    bool done = false;     // the switch is done, by this report or before
  };
  // Worker r.rank() (in range: the caller checked) finished switch r.switch_id().
  // NOT_FOUND for an unknown switch; INVALID_ARGUMENT when at_step or to_mode differ from
  // the schedule, from_mode is unknown or differs from an earlier report, or
  // handoff_seconds is negative or not finite. Repeating a report is OK and changes
  // nothing. The last rank's report completes the switch (`unix_ms` is then its time).
  absl::StatusOr<AckResult> Acknowledge(const ReportSwitchRequest& r, int64_t unix_ms);

  // The mode of the done switch with the highest at_step, or the starting mode.
  TrainingMode mode() const { return mode_; }
  // The highest step counted as reached by any worker's latest poll (with its horizon);
  // -1 before the first poll.
  int64_t max_polled() const;
  // The cluster was rolled back to `step` (psctl restore): the workers resume there, so
  // the steps from it on can be scheduled again.
  void Rewind(int64_t step);
  // The run ends at `end_step` (the workers train the steps before it): the pending
  // switches at or after it, which no worker will reach, are dropped; returns how many.
  int DropFrom(int64_t end_step);
  // Sets view->mode, ->initial_mode, ->switches and ->pending_switches.
  void FillView(ClusterView* view) const;

  // What a restarted coordinator needs to continue the schedule: the switches (done and
  // pending), max_polled and the next id, into `state`; Restore takes them back
  // (INVALID_ARGUMENT for a record that does not pass the checks Schedule makes).
  void Save(CoordinatorState* state) const;
  absl::Status Restore(const CoordinatorState& state);

 private:
  struct Entry {
    SwitchRecord record;
    bool done = false;
  };
  Entry* FindById(int64_t switch_id);
  void Complete(Entry* e, int64_t unix_ms);

  const SwitchScheduleOptions options_;
  std::map<int64_t, Entry> by_step_;  // every switch scheduled, by at_step
  std::vector<SwitchRecord> done_;    // in the order they completed
  TrainingMode mode_;
  std::map<int, int64_t> reached_;  // each rank's latest poll: the last step it counts
  // A restored coordinator's saved max_polled, until every rank has polled again.
  int64_t floor_ = -1;
  int64_t next_id_ = 1;
};

}  // namespace pscluster::coord
