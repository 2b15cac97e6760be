// An operator's link to the coordinator (psctl, scripts, the Python client later): read
// the cluster view, schedule a mode switch, ask for a checkpoint. No registration and no
// heartbeat: the caller is not a member. Every RPC has a deadline; errors are
// absl::Status with the coordinator's code and message. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/coordinator.grpc.pb.h"

namespace pscluster {

// A switch scheduled by SwitchMode.
struct ScheduledSwitch {
  int64_t switch_id = 0;
  int64_t at_step = 0;
  // The mode was already in effect at that step: nothing was scheduled, and
  // switch_id/at_step name the switch that puts it in effect (0/0: the starting mode).
  bool no_op = false;
};

class CoordinatorOperator {
 public:
  // Connects lazily to `address` (host:port); `rpc_timeout` bounds View and SwitchMode.
  CoordinatorOperator(const std::string& address, absl::Duration rpc_timeout,
                      const Security& security = Security());
  // Over an existing stub (not owned; a member's client shares its channel).
  CoordinatorOperator(coord::Coordinator::Stub* stub, absl::Duration rpc_timeout);

  absl::StatusOr<coord::ClusterView> View();
  // Every worker switches to `mode` before step `at_step` (0: the next boundary).
  absl::StatusOr<ScheduledSwitch> SwitchMode(coord::TrainingMode mode, int64_t at_step = 0);
  // A cluster checkpoint now (the coordinator chooses the step); returns once it is
  // durable on every shard, or the error naming the shard that failed.
  absl::StatusOr<coord::Checkpoint> Checkpoint(std::optional<double> metric,
                                               absl::Duration timeout);
  // Every shard back to checkpoint `step`, made the newest (RestoreCheckpointRequest).
  absl::StatusOr<coord::Checkpoint> Restore(int64_t step, bool force, absl::Duration timeout);

 private:
  std::unique_ptr<coord::Coordinator::Stub> owned_;
  coord::Coordinator::Stub* const stub_;
  const absl::Duration rpc_timeout_;
};

// The channel every coordinator client uses: reconnects within a second of a restarted
// coordinator (gRPC's default backoff grows to two minutes).
std::shared_ptr<grpc::Channel> CoordinatorChannel(const std::string& target,
                                                  const Security& security);

}  // namespace pscluster
