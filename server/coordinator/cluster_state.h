// The coordinator's state: who is in the cluster, who is alive, where the shards serve,
// how far the workers got and which mode they train in, as a versioned ClusterView. Independent of
// gRPC; the clock is injected so tests control time. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/parking.h"
#include "proto/coordinator.pb.h"
#include "server/coordinator/mode_switch.h"
#include "server/coordinator/recovery_schedule.h"
#include "server/coordinator/registration.h"

namespace pscluster::coord {

struct ClusterStateOptions {
  int num_shards = 1;   // expected shards: ids [0, num_shards)
  int num_workers = 1;  // expected workers: ranks [0, num_workers)
  int replicas = 1;     // copies of each shard, in a chain (proto Chain): replicas [0, replicas)
  absl::Duration heartbeat_timeout = absl::Seconds(5);  // silent this long: dead
  TrainingMode mode = PS;              // the starting mode; must pass ValidateMode (main checks)
  int64_t checkpoint_every_steps = 0;  // into the view (ClusterView's field says why)
  // A registration that could grow the view past this is refused (registration.h says why
  // the default; tests set less).
  size_t max_view_bytes = kMaxViewBytes;
  // Called (under the lock, so in order) with the state to persist after every change of
  // the view: members and their incarnations, the versions, the switch schedule.
  std::function<void(const CoordinatorState&)> on_change;
};

class ClusterState {
 public:
  explicit ClusterState(
      ClusterStateOptions options, std::function<absl::Time()> now = [] { return absl::Now(); });

  // INVALID_ARGUMENT for an id (or replica) outside the expected range, or what
  // CheckRegistration refuses (a shard's address that is not HOST:PORT, a worker's that is
  // no short printable label); RESOURCE_EXHAUSTED when the view could grow past
  // options.max_view_bytes (a refused registration changes nothing); ALREADY_EXISTS when a live
  // member holds the id at another address (a duplicate rank). Re-registering from the same address
  // (a restart) gets a new incarnation. A shard replica joins its chain while the chain forms
  // (until it first has
  // --replicas members) or when the chain has no live member left (a new generation);
  // otherwise it waits outside it (a replica that registers again lost its state, and
  // leaves the chain if it was in it).
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request);
  // NOT_FOUND for a member that never registered; FAILED_PRECONDITION for an old
  // incarnation (that process was replaced). Revives a member declared dead.
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  // INVALID_ARGUMENT for a negative step; FAILED_PRECONDITION when the worker's view
  // predates the current shard map. A refused report changes nothing.
  absl::Status ReportProgress(const ReportProgressRequest& request);

  // Live mode switches (see SwitchSchedule for the rules and error codes). SwitchMode is
  // an operator's call; PollSwitch and ReportSwitch a registered worker's (NOT_FOUND, as
  // ReportProgress, for a rank/incarnation that is not registered). Scheduling and each
  // new report bump the version; the last report sets the view's mode.
  absl::StatusOr<SwitchModeResponse> SwitchMode(const SwitchModeRequest& request);
  absl::StatusOr<PollSwitchResponse> PollSwitch(const PollSwitchRequest& request);
  absl::StatusOr<ReportSwitchResponse> ReportSwitch(const ReportSwitchRequest& request);

  // The workers' recovery (see RecoverySchedule for the rules and error codes), a
  // registered worker's calls (NOT_FOUND otherwise). ReportStopped and DecideRollback
  // answer ABORTED for a generation that is no longer the cluster's: the worker starts
  // over in the new one. Each change bumps the version; waiters read the view.
  absl::Status RecordRun(const RecordRunRequest& request);
  absl::StatusOr<Rollback> ReportStopped(const ReportStoppedRequest& request);
  absl::StatusOr<Rollback> DecideRollback(const DecideRollbackRequest& request);

  // A replica outside its shard's chain that now holds the chain's state (the tail's
  // state transfer) becomes its tail: FAILED_PRECONDITION when the chain is no longer at
  // request.epoch or the replica is not live and outside it. Returns the new epoch.
  absl::StatusOr<JoinChainResponse> JoinChain(const JoinChainRequest& request);
  // The chain becomes its head alone (ShrinkChainRequest); returns the new epoch.
  absl::StatusOr<JoinChainResponse> ShrinkChain(const ShrinkChainRequest& request);

  int num_shards() const { return options_.num_shards; }
  // The live replica of `shard` serving at `address`, if there is one (a copy).
  std::optional<Member> LiveReplicaAt(int32_t shard, const std::string& address) const;
  // Declares `replica` of `shard` dead at once (the coordinator's own probe found it
  // unreachable) and takes it out of its chain (but the last), as CheckLiveness would
  // later; nothing when that incarnation is no longer the live one. Whether it was.
  bool DeclareUnreachable(int32_t shard, int32_t replica, int64_t incarnation);

  // Declares dead every member silent for longer than the timeout, and takes dead shard
  // replicas out of their chains (but the last: the chain then waits for a new
  // generation); true if any was.
  bool CheckLiveness();

  ClusterView View() const;
  // Continues from a saved state (a restarted coordinator): the members as they were,
  // alive with a fresh heartbeat (a member that did not survive misses its next beats and
  // is declared dead), the view's version above the saved one, the switch schedule.
  // Members outside the expected ranges (restarted with other counts) are dropped;
  // INVALID_ARGUMENT for a saved switch Schedule would refuse.
  absl::Status Restore(const CoordinatorState& state);
  // Removes checkpoints no longer kept (retention); bumps the version if any.
  void SetCheckpoints(const std::vector<Checkpoint>& checkpoints);
  // After a restore of `step` (the later checkpoints gone): the checkpoints kept, and
  // switches may be scheduled from `step` on again (SwitchSchedule::Rewind).
  void RolledBackTo(int64_t step, const std::vector<Checkpoint>& checkpoints);
  // Waits until the view's version >= min_version (and it is complete, if asked), or
  // DEADLINE_EXCEEDED naming who is missing.
  absl::StatusOr<ClusterView> AwaitView(int64_t min_version, bool complete, absl::Time deadline) {
    Wait how;
    how.deadline = deadline;
    return AwaitView(min_version, complete, how);
  }
  // The same, blocking or parked (common/parking.h: Parked(), and how.waiter woken by the
  // change that makes the view what it waits for).
  absl::StatusOr<ClusterView> AwaitView(int64_t min_version, bool complete, const Wait& how);
  // Wakes every AwaitView, and fails later waits, with UNAVAILABLE (server shutdown).
  void Shutdown();

 private:
  using Key = std::tuple<int, int32_t, int32_t>;  // (role, id, replica)
  absl::Status CheckId(Role role, int32_t id, int32_t replica = 0) const;
  // RESOURCE_EXHAUSTED when registering `r` (in place of `replaced`, its earlier entry, or
  // nullptr) could grow the view past options_.max_view_bytes.
  absl::Status CheckViewRoomLocked(const RegisterRequest& r, const Member* replaced) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Member* FindLocked(Role role, int32_t id, int32_t replica = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Chain changes (see Register and CheckLiveness); each bumps the chain's epoch.
  void JoinChainLocked(const Member& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveChainLocked(const Member& m, bool keep_last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member found dead (silent past the timeout, or unreachable on a probe): not alive,
  // and a shard replica out of its chain (but the last). The caller bumps the version.
  void DeclareDeadLocked(Member* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the shard's chain holds a live member (other than replica `except`).
  bool ChainAliveLocked(int32_t shard, int32_t except = -1) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The worker, or NOT_FOUND when `rank` is not registered with `incarnation`.
  absl::StatusOr<Member*> FindWorkerLocked(int32_t rank, int64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompleteLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // PERMISSION_DENIED unless `secret` is the one replica `replica` of `shard` got when it
  // registered last (a member restored from a state saved without secrets: accepted).
  absl::Status CheckCallerLocked(const char* call, int32_t shard, int32_t replica,
                                 const std::string& secret) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A recovery call's caller: INVALID_ARGUMENT or NOT_FOUND unless a registered worker;
  // with `generation`, ABORTED unless it is the cluster's now.
  absl::Status CheckRecoveryCallLocked(int32_t rank, int64_t incarnation,
                                       const std::string* generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A recovery change's outcome: its error, or OK with the view's version bumped when it
  // changed something.
  absl::Status AppliedLocked(const absl::StatusOr<bool>& changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  ClusterView ViewLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterStateOptions options_;
  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  std::map<Key, Member> members_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::string> secrets_ ABSL_GUARDED_BY(mu_);         // by member: its incarnation's
  std::map<int32_t, std::string> chain_keys_ ABSL_GUARDED_BY(mu_);  // by shard, made once
  int64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Parked AwaitViews: (min_version, complete).
  Waiters<std::pair<int64_t, bool>> view_waiters_ ABSL_GUARDED_BY(mu_);
  int64_t shard_map_version_ ABSL_GUARDED_BY(mu_) = 1;  // version of the last address change
  std::vector<Checkpoint> checkpoints_ ABSL_GUARDED_BY(mu_);
  // By shard id: the chain (its addresses are filled in by ViewLocked), and whether it has
  // had --replicas members once (formed: later registrations wait outside it).
  std::map<int32_t, Chain> chains_ ABSL_GUARDED_BY(mu_);
  std::set<int32_t> formed_ ABSL_GUARDED_BY(mu_);
  SwitchSchedule switches_ ABSL_GUARDED_BY(mu_);
  RecoverySchedule recovery_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::coord
