// CoordinatorService: the coordinator's RPCs on gRPC's callback API (service.h).
#include <utility>

#include "common/grpc_status.h"
#include "common/park_loop.h"
#include "server/coordinator/service.h"

namespace pscluster::coord {

CoordinatorService::CoordinatorService(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                                       Checkpointer* checkpointer, ProgressHistory* history,
                                       ReplicaProber* prober)
    : calls_(cluster, kv, max_wait, checkpointer, history, prober) {}

grpc::ServerUnaryReactor* CoordinatorService::Now(grpc::CallbackServerContext* ctx,
                                                  const std::function<absl::Status()>& fn) {
  InFlightCounter::Scope in_flight(&in_flight_);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(fn()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::OnPool(grpc::CallbackServerContext* ctx,
                                                     std::function<absl::Status()> fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto in_flight = std::make_shared<InFlightCounter::Scope>(&in_flight_);
  pool_.Post([reactor, in_flight, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Parking(
    grpc::CallbackServerContext* ctx, std::function<absl::Status(const Wait&)> attempt) {
  auto* reactor = new ParkedUnary(ctx, calls_.Deadline(absl::FromChrono(ctx->deadline())), &pool_,
                                  &in_flight_, std::move(attempt));
  reactor->Run();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* ctx,
                                                       const RegisterRequest* req,
                                                       RegisterResponse* resp) {
  return Now(ctx, [&] { return calls_.Register(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const HeartbeatRequest* req,
                                                        HeartbeatResponse* resp) {
  return Now(ctx, [&] { return calls_.Heartbeat(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                             const ReportProgressRequest* req,
                                                             ReportProgressResponse* resp) {
  auto report = [this, req, resp] { return calls_.ReportProgress(*req, resp); };
  return calls_.Checkpoints(*req) ? OnPool(ctx, report) : Now(ctx, report);
}

grpc::ServerUnaryReactor* CoordinatorService::GetView(grpc::CallbackServerContext* ctx,
                                                      const GetViewRequest* req,
                                                      ClusterView* resp) {
  return Parking(ctx,
                 [this, req, resp](const Wait& how) { return calls_.GetView(*req, how, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::RecordRun(grpc::CallbackServerContext* ctx,
                                                        const RecordRunRequest* req,
                                                        RecordRunResponse* resp) {
  return Now(ctx, [&] { return calls_.RecordRun(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportStopped(grpc::CallbackServerContext* ctx,
                                                            const ReportStoppedRequest* req,
                                                            Rollback* resp) {
  return Now(ctx, [&] { return calls_.ReportStopped(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::DecideRollback(grpc::CallbackServerContext* ctx,
                                                             const DecideRollbackRequest* req,
                                                             Rollback* resp) {
  return Now(ctx, [&] { return calls_.DecideRollback(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::KvPut(grpc::CallbackServerContext* ctx,
                                                    const KvPutRequest* req, KvPutResponse* resp) {
  return Now(ctx, [&] { return calls_.KvPut(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(grpc::CallbackServerContext* ctx,
                                                    const KvGetRequest* req, KvGetResponse* resp) {
  return Parking(ctx, [this, req, resp](const Wait& how) { return calls_.KvGet(*req, how, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::SwitchMode(grpc::CallbackServerContext* ctx,
                                                         const SwitchModeRequest* req,
                                                         SwitchModeResponse* resp) {
  return Now(ctx, [&] { return calls_.SwitchMode(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::PollSwitch(grpc::CallbackServerContext* ctx,
                                                         const PollSwitchRequest* req,
                                                         PollSwitchResponse* resp) {
  return Now(ctx, [&] { return calls_.PollSwitch(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportSwitch(grpc::CallbackServerContext* ctx,
                                                           const ReportSwitchRequest* req,
                                                           ReportSwitchResponse* resp) {
  return Now(ctx, [&] { return calls_.ReportSwitch(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                         const CheckpointRequest* req,
                                                         ::pscluster::coord::Checkpoint* resp) {
  return OnPool(ctx, [this, req, resp] { return calls_.Checkpoint(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::RestoreCheckpoint(
    grpc::CallbackServerContext* ctx, const RestoreCheckpointRequest* req,
    ::pscluster::coord::Checkpoint* resp) {
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  return OnPool(
      ctx, [this, req, resp, deadline] { return calls_.RestoreCheckpoint(*req, deadline, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::JoinChain(grpc::CallbackServerContext* ctx,
                                                        const JoinChainRequest* req,
                                                        JoinChainResponse* resp) {
  return Now(ctx, [&] { return calls_.JoinChain(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::ShrinkChain(grpc::CallbackServerContext* ctx,
                                                          const ShrinkChainRequest* req,
                                                          JoinChainResponse* resp) {
  return Now(ctx, [&] { return calls_.ShrinkChain(*req, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportUnreachable(grpc::CallbackServerContext* ctx,
                                                                const ReportUnreachableRequest* req,
                                                                ReportUnreachableResponse* resp) {
  return Now(ctx, [&] { return calls_.ReportUnreachable(*req, resp); });
}

}  // namespace pscluster::coord
