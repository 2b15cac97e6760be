// gRPC front of the coordinator's ClusterState, KvStore and Checkpointer (synchronous API:
// blocking reads and checkpoints wait on the handler thread, bounded by the RPC deadline).
#pragma once

#include "absl/time/time.h"
#include "common/graceful_shutdown.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/coordinator/checkpointer.h"
#include "server/coordinator/cluster_state.h"
#include "server/coordinator/kv_store.h"
#include "server/coordinator/progress_history.h"

namespace pscluster::coord {

class CoordinatorService final : public Coordinator::Service {
 public:
  // Longest a blocking read waits when the caller set no shorter deadline. `checkpointer`
  // null: the Checkpoint RPC answers FAILED_PRECONDITION. `history` (may be null) records
  // every accepted progress report, for the status page.
  CoordinatorService(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                     Checkpointer* checkpointer = nullptr, ProgressHistory* history = nullptr);

  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest*,
                         HeartbeatResponse*) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const ReportProgressRequest*,
                              ReportProgressResponse*) override;
  grpc::Status GetView(grpc::ServerContext*, const GetViewRequest*, ClusterView*) override;
  grpc::Status KvPut(grpc::ServerContext*, const KvPutRequest*, KvPutResponse*) override;
  grpc::Status KvGet(grpc::ServerContext*, const KvGetRequest*, KvGetResponse*) override;
  grpc::Status SwitchMode(grpc::ServerContext*, const SwitchModeRequest*,
                          SwitchModeResponse*) override;
  grpc::Status PollSwitch(grpc::ServerContext*, const PollSwitchRequest*,
                          PollSwitchResponse*) override;
  grpc::Status ReportSwitch(grpc::ServerContext*, const ReportSwitchRequest*,
                            ReportSwitchResponse*) override;
  grpc::Status Checkpoint(grpc::ServerContext*, const CheckpointRequest*,
                          ::pscluster::coord::Checkpoint*) override;
  grpc::Status RestoreCheckpoint(grpc::ServerContext*, const RestoreCheckpointRequest*,
                                 ::pscluster::coord::Checkpoint*) override;
  grpc::Status JoinChain(grpc::ServerContext*, const JoinChainRequest*,
                         JoinChainResponse*) override;
  grpc::Status ShrinkChain(grpc::ServerContext*, const ShrinkChainRequest*,
                           JoinChainResponse*) override;

  InFlightCounter* in_flight() { return &in_flight_; }

 private:
  absl::Time Deadline(const grpc::ServerContext* ctx) const;

  ClusterState* const cluster_;
  KvStore* const kv_;
  const absl::Duration max_wait_;
  Checkpointer* const checkpointer_;
  ProgressHistory* const history_;
  InFlightCounter in_flight_;
};

}  // namespace pscluster::coord
