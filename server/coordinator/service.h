// gRPC front of the coordinator's ClusterState, KvStore and Checkpointer. CoordinatorCalls
// does each RPC's work as a plain call (the fuzzer drives it); CoordinatorService serves
// them on gRPC's callback API: quick calls on gRPC's thread, the calls that reach the
// shards (checkpoints, restores) on a pool, and the waiting reads (GetView, KvGet with
// wait) parked, holding no thread until the view or the key they wait for arrives.
#pragma once

#include "absl/time/time.h"
#include "common/graceful_shutdown.h"
#include "common/parking.h"
#include "common/work_queue.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/coordinator/checkpointer.h"
#include "server/coordinator/cluster_state.h"
#include "server/coordinator/kv_store.h"
#include "server/coordinator/progress_history.h"
#include "server/coordinator/replica_prober.h"

namespace pscluster::coord {

class CoordinatorCalls {
 public:
  // Longest a waiting read waits when the caller set no shorter deadline. `checkpointer`
  // null: Checkpoint answers FAILED_PRECONDITION. `history` (may be null) records every
  // accepted progress report, for the status page. `prober` null: ReportUnreachable
  // probes nothing (answers probing=false).
  CoordinatorCalls(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                   Checkpointer* checkpointer = nullptr, ProgressHistory* history = nullptr,
                   ReplicaProber* prober = nullptr);

  absl::Status Register(const RegisterRequest& req, RegisterResponse* resp);
  absl::Status Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp);
  absl::Status ReportProgress(const ReportProgressRequest& req, ReportProgressResponse* resp);
  absl::Status GetView(const GetViewRequest& req, const Wait& how, ClusterView* resp);
  absl::Status RecordRun(const RecordRunRequest& req, RecordRunResponse* resp);
  absl::Status ReportStopped(const ReportStoppedRequest& req, Rollback* resp);
  absl::Status DecideRollback(const DecideRollbackRequest& req, Rollback* resp);
  absl::Status KvPut(const KvPutRequest& req, KvPutResponse* resp);
  absl::Status KvGet(const KvGetRequest& req, const Wait& how, KvGetResponse* resp);
  absl::Status SwitchMode(const SwitchModeRequest& req, SwitchModeResponse* resp);
  absl::Status PollSwitch(const PollSwitchRequest& req, PollSwitchResponse* resp);
  absl::Status ReportSwitch(const ReportSwitchRequest& req, ReportSwitchResponse* resp);
  absl::Status Checkpoint(const CheckpointRequest& req, ::pscluster::coord::Checkpoint* resp);
  absl::Status RestoreCheckpoint(const RestoreCheckpointRequest& req, absl::Time deadline,
                                 ::pscluster::coord::Checkpoint* resp);
  absl::Status JoinChain(const JoinChainRequest& req, JoinChainResponse* resp);
  absl::Status ShrinkChain(const ShrinkChainRequest& req, JoinChainResponse* resp);
  absl::Status ReportUnreachable(const ReportUnreachableRequest& req,
                                 ReportUnreachableResponse* resp);

  // Whether ReportProgress will take a checkpoint (rank 0's metric): it then calls the shards.
  bool Checkpoints(const ReportProgressRequest& req) const;
  // How long a waiting read may wait: until the caller's deadline, at most max_wait.
  absl::Time Deadline(absl::Time caller) const;

 private:
  ClusterState* const cluster_;
  KvStore* const kv_;
  const absl::Duration max_wait_;
  Checkpointer* const checkpointer_;
  ProgressHistory* const history_;
  ReplicaProber* const prober_;
};

class CoordinatorService final : public Coordinator::CallbackService {
 public:
  // As CoordinatorCalls.
  CoordinatorService(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                     Checkpointer* checkpointer = nullptr, ProgressHistory* history = nullptr,
                     ReplicaProber* prober = nullptr);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const RegisterRequest* req,
                                     RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const HeartbeatRequest* req,
                                      HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* ctx,
                                           const ReportProgressRequest* req,
                                           ReportProgressResponse* resp) override;
  grpc::ServerUnaryReactor* GetView(grpc::CallbackServerContext* ctx, const GetViewRequest* req,
                                    ClusterView* resp) override;
  grpc::ServerUnaryReactor* RecordRun(grpc::CallbackServerContext* ctx, const RecordRunRequest* req,
                                      RecordRunResponse* resp) override;
  grpc::ServerUnaryReactor* ReportStopped(grpc::CallbackServerContext* ctx,
                                          const ReportStoppedRequest* req, Rollback* resp) override;
  grpc::ServerUnaryReactor* DecideRollback(grpc::CallbackServerContext* ctx,
                                           const DecideRollbackRequest* req,
                                           Rollback* resp) override;
  grpc::ServerUnaryReactor* KvPut(grpc::CallbackServerContext* ctx, const KvPutRequest* req,
                                  KvPutResponse* resp) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const KvGetRequest* req,
                                  KvGetResponse* resp) override;
  grpc::ServerUnaryReactor* SwitchMode(grpc::CallbackServerContext* ctx,
                                       const SwitchModeRequest* req,
                                       SwitchModeResponse* resp) override;
  grpc::ServerUnaryReactor* PollSwitch(grpc::CallbackServerContext* ctx,
                                       const PollSwitchRequest* req,
                                       PollSwitchResponse* resp) override;
  grpc::ServerUnaryReactor* ReportSwitch(grpc::CallbackServerContext* ctx,
                                         const ReportSwitchRequest* req,
                                         ReportSwitchResponse* resp) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const CheckpointRequest* req,
                                       ::pscluster::coord::Checkpoint* resp) override;
  grpc::ServerUnaryReactor* RestoreCheckpoint(grpc::CallbackServerContext* ctx,
                                              const RestoreCheckpointRequest* req,
                                              ::pscluster::coord::Checkpoint* resp) override;
  grpc::ServerUnaryReactor* JoinChain(grpc::CallbackServerContext* ctx, const JoinChainRequest* req,
                                      JoinChainResponse* resp) override;
  grpc::ServerUnaryReactor* ShrinkChain(grpc::CallbackServerContext* ctx,
                                        const ShrinkChainRequest* req,
                                        JoinChainResponse* resp) override;
  grpc::ServerUnaryReactor* ReportUnreachable(grpc::CallbackServerContext* ctx,
                                              const ReportUnreachableRequest* req,
                                              ReportUnreachableResponse* resp) override;

  // Calls in progress (parked ones included), for ShutdownGracefully.
  InFlightCounter* in_flight() { return &in_flight_; }

 private:
  // Answers with fn()'s status: on this (gRPC's) thread, or on the pool.
  grpc::ServerUnaryReactor* Now(grpc::CallbackServerContext* ctx,
                                const std::function<absl::Status()>& fn);
  grpc::ServerUnaryReactor* OnPool(grpc::CallbackServerContext* ctx,
                                   std::function<absl::Status()> fn);
  // A read that may park until what it waits for arrives (common/park_loop.h).
  grpc::ServerUnaryReactor* Parking(grpc::CallbackServerContext* ctx,
                                    std::function<absl::Status(const Wait&)> attempt);

  CoordinatorCalls calls_;
  InFlightCounter in_flight_;
  // Checkpoints and restores: a few at a time at most (psctl, rank 0's metric).
  static constexpr int kPoolThreads = 4;
  WorkQueue pool_{kPoolThreads};
};

}  // namespace pscluster::coord
