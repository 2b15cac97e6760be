// A member's link to the coordinator: registers, heartbeats on a background thread for
// as long as it lives, reads the cluster view, reports progress, takes part in live mode
// switches, and uses the rendezvous store. Every RPC has a deadline. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/coordinator/coordinator_operator.h"
#include "proto/coordinator.grpc.pb.h"

namespace pscluster {

struct CoordinatorClientOptions {
  std::string coordinator;  // host:port
  coord::Role role = coord::WORKER;
  int32_t id = 0;          // shard id or worker rank
  int32_t replica = 0;     // shards: which copy (ps_server --replica)
  int32_t group_size = 0;  // RegisterRequest.group_size: --num_shards / --world (0: not said)
  std::string address;     // where this member serves ("" for none)
  // Workers: what their model can run (the coordinator refuses switches it cannot take).
  std::optional<coord::ModeLimits> limits;
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration register_timeout = absl::Minutes(1);  // waits for the coordinator to start
  // A member's calls retry this long while the coordinator is unreachable (restarting).
  absl::Duration reconnect_timeout = absl::Minutes(2);
  // At most this; shortened to a quarter of the coordinator's heartbeat timeout.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  Security security;  // TLS and token of the calls (default: plaintext)
  // Called on the heartbeat thread after every heartbeat the coordinator answered, with the
  // view version it answered and when that heartbeat was sent (a shard's chain lease).
  std::function<void(int64_t view_version, absl::Time sent)> on_heartbeat;
  // Called on a watch thread with every newer view, as the coordinator makes it (a parked
  // GetView for the next version): a chain replica learns that it became the head at
  // once, not at its next heartbeat. Null: no watch thread.
  std::function<void(const coord::ClusterView&)> on_view;
};

// PollSwitch's answer: the earliest switch not yet done at or after the polled step.
struct PendingSwitch {
  bool pending = false;  // false: nothing scheduled from that step on
  int64_t switch_id = 0;
  int64_t at_step = 0;  // switch before running the polled step when it equals this
  coord::TrainingMode mode = coord::TRAINING_MODE_UNSPECIFIED;  // the mode to switch to
};

class CoordinatorClient {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Register(
      CoordinatorClientOptions options);
  ~CoordinatorClient();  // stops heartbeating and watching
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  int64_t incarnation() const { return incarnation_.load(); }
  // True while the heartbeat thread registers this member again: the coordinator may
  // already refuse calls as incarnation() (NOT_FOUND) before it has the new one.
  bool registering_again() const { return registering_again_.load(); }
  // The coordinator's liveness timeout (ps_coordinator --heartbeat_timeout_ms).
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }
  // The view the coordinator answered the first registration with (this member in it).
  const coord::ClusterView& registered_view() const { return registered_view_; }
  // A shard replica's chain key (RegisterResponse.chain_key), from its last registration.
  std::string chain_key() const;
  // Registers this live member again, as a new incarnation (a new generation of the
  // cluster: a worker whose step failed while every member stayed alive, so that every
  // worker rolls back). Returns the new incarnation.
  absl::StatusOr<int64_t> RegisterAgain();

  absl::StatusOr<coord::ClusterView> AwaitView(int64_t min_version, bool complete,
                                               absl::Duration timeout);
  // The step this worker's run ends at, sent with every ReportProgress (0: not said).
  void set_run_end_step(int64_t step) { run_end_step_.store(step); }
  // `metric` (optional): a validation metric measured at `step`; `step_time` (optional):
  // the mean step's split since the last report.
  absl::Status ReportProgress(int64_t view_version, int64_t step, double loss,
                              double samples_per_sec, std::optional<double> metric = std::nullopt,
                              const coord::StepTime* step_time = nullptr);
  // This worker's run ended well at `step` and it leaves: the view shows it finished, not
  // dead, once it falls silent.
  absl::Status ReportFinished(int64_t view_version, int64_t step);

  // Live mode switching (see proto/coordinator.proto). SwitchMode schedules a switch of
  // every worker to `mode` at `at_step` (0: the
  // next step boundary no worker has reached); errors: INVALID_ARGUMENT (unknown mode,
  // at_step < 0), FAILED_PRECONDITION (step already passed; PS without shards),
  // ALREADY_EXISTS (another switch at that step).
  absl::StatusOr<ScheduledSwitch> SwitchMode(coord::TrainingMode mode, int64_t at_step = 0);
  // A worker, before running `step` (as this client's registered rank and incarnation),
  // that polls again only at step + horizon: the answer covers every switch before it.
  absl::StatusOr<PendingSwitch> PollSwitch(int64_t step, int64_t horizon = 1);
  // A worker, once it finished the hand-over of `s` (from `from_mode`, in
  // `handoff_seconds`). Returns true when this was the last worker's report (the view's
  // mode is now s.mode). Repeating a report is harmless.
  absl::StatusOr<bool> ReportSwitch(const PendingSwitch& s, coord::TrainingMode from_mode,
                                    double handoff_seconds);

  // Asks the coordinator for a cluster checkpoint now (the Checkpoint RPC), waiting up to
  // `timeout` for it to be durable on every shard; `metric` files it for keep-the-best.
  absl::StatusOr<coord::Checkpoint> Checkpoint(std::optional<double> metric,
                                               absl::Duration timeout);

  // A chain's tail: replica `replica` of this shard holds the chain's state at `epoch` and
  // every update since; it becomes the tail (JoinChain RPC). Returns the new epoch.
  absl::StatusOr<int64_t> JoinChain(int32_t replica, int64_t epoch);
  // A chain's head: the chain becomes `replica` (this head) alone (ShrinkChain RPC).
  absl::StatusOr<int64_t> ShrinkChain(int32_t replica, int64_t epoch);
  // This process could not reach the replica of `shard` at `address`: the coordinator
  // probes it and takes it out of its chain if it does not answer either (the
  // ReportUnreachable RPC). One attempt, bounded by `timeout`; true when a probe started.
  absl::StatusOr<bool> ReportUnreachable(int32_t shard, const std::string& address,
                                         absl::Duration timeout);

  // The workers' recovery (proto RecordRun, ReportStopped, DecideRollback; the rules in
  // server/coordinator/recovery_schedule.h), as this worker.
  absl::Status RecordRun(const std::vector<std::string>& flags, bool started);
  absl::StatusOr<coord::Rollback> ReportStopped(const std::string& generation);
  absl::StatusOr<coord::Rollback> DecideRollback(const std::string& generation, int64_t step);

  // The collectives' rendezvous (worker/collective/coordinator_rendezvous.h).
  absl::Status KvPut(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KvGet(const std::string& key, bool wait, absl::Duration timeout);

 private:
  CoordinatorClient(CoordinatorClientOptions options,
                    std::unique_ptr<coord::Coordinator::Stub> stub);
  void HeartbeatLoop();
  // Keeps a registration's incarnation and member secret.
  void Registered(const coord::RegisterResponse& r);
  std::string member_secret() const;
  void WatchLoop();  // options_.on_view's thread
  // Registers again (a heartbeat answered NOT_FOUND: the coordinator lost this member).
  void Reregister();
  // `req` as this worker's (rank, incarnation, run end), reconnecting as every call does.
  absl::Status SendProgress(coord::ReportProgressRequest req, const char* what);
  // One RPC through `call(ctx)` with `timeout`, made again with backoff while the
  // coordinator is unreachable (UNAVAILABLE), up to reconnect_timeout; says once what it
  // waits for. Member calls are idempotent, so a retry after a lost answer is harmless.
  template <typename Call>
  absl::Status Reconnecting(const char* what, absl::Duration timeout, Call call);
  // JoinChain and ShrinkChain: (this shard, replica, epoch) -> the chain's new epoch.
  template <typename Req>
  absl::StatusOr<int64_t> ChainCall(
      const char* what,
      grpc::Status (coord::Coordinator::Stub::*method)(grpc::ClientContext*, const Req&,
                                                       coord::JoinChainResponse*),
      int32_t replica, int64_t epoch);

  CoordinatorClientOptions options_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  std::atomic<int64_t> incarnation_{0};  // the heartbeat thread may register again
  std::atomic<int64_t> run_end_step_{0};
  std::atomic<bool> registering_again_{false};
  // Held across a heartbeat and across RegisterAgain: no heartbeat of the old incarnation
  // is in flight once the new one is registered (it would be NOT_FOUND, and register again).
  absl::Mutex register_mu_;
  absl::Duration heartbeat_timeout_ = absl::Seconds(5);
  coord::ClusterView registered_view_;
  mutable absl::Mutex secret_mu_;
  std::string member_secret_ ABSL_GUARDED_BY(secret_mu_);
  std::string chain_key_ ABSL_GUARDED_BY(secret_mu_);  // proves this member (JoinChain...)
  absl::Notification stop_;
  std::thread heartbeats_;
  std::thread watch_;
};

}  // namespace pscluster
