#include "server/ps/service/replication_service.h"

#include <utility>

#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/raw_unary.h"

namespace pscluster::ps {
namespace {
absl::Status NotReplicated() {
  return absl::FailedPreconditionError(
      "this shard is not replicated (ps_coordinator --replicas=1, or not registered yet)");
}
}  // namespace

grpc::Status ShardReplicationService::Replicate(grpc::ServerContext* ctx,
                                                grpc::ServerReader<ReplicatedUpdate>* reader,
                                                ReplicateResponse*) {
  // Not under serving_mu_ while the update waits for its turn (a joiner installs its state
  // meanwhile): the replicator takes it to apply.
  InFlightCounter::Scope in_flight(&core_->in_flight);
  Replicator* chain = core_->gate.replicator();
  if (chain == nullptr) return ToGrpcStatus(NotReplicated());
  // A streamed update is held whole until applied, as a client's push stream: charged to
  // the shard's budget. Any update is cancelled if its sender goes quiet before ending the
  // call (the replica applies it only then).
  StreamWatchdog::Watch watch(&core_->watchdog, ctx);
  RequestBudget::Charge charge(&core_->budget);
  Replicator::StreamHooks hooks;
  hooks.hold = [&](uint64_t bytes) {
    watch.Alive();
    return charge.GrowTo(bytes, "a Replicate stream from the previous replica");
  };
  hooks.read = [&] { watch.Disarm(); };
  return chain->Receive(ctx, reader, hooks);
}

grpc::Status ShardReplicationService::TransferState(
    grpc::ServerContext*, const TransferStateRequest* req,
    grpc::ServerWriter<StateTransferChunk>* writer) {
  Replicator* chain = core_->gate.replicator();
  if (chain == nullptr) return ToGrpcStatus(NotReplicated());
  auto joins = chain->HoldJoins();  // before Scope: the replicator's lock order
  ShardCore::Scope scope(core_);
  return chain->TransferState(req, writer);
}

grpc::ServerUnaryReactor* ShardReplicationService::JoinedChain(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* req,
                                                               grpc::ByteBuffer* resp) {
  // It asks the coordinator to append the joiner: on the pool, as a chain's round trip.
  return AnswerUnary<JoinedChainRequest, JoinedChainResponse>(
      ctx, req, resp, {"ShardReplication", "JoinedChain"}, &core_->pool,
      [this](const JoinedChainRequest& r, JoinedChainResponse* out) -> absl::Status {
        InFlightCounter::Scope in_flight(&core_->in_flight);
        Replicator* chain = core_->gate.replicator();
        if (chain == nullptr) return NotReplicated();
        auto joins = chain->HoldJoins();
        return FromGrpcStatus(chain->JoinedChain(&r, out));
      });
}

absl::StatusOr<Replicator::State> ShardReplicationService::CaptureState() const {
  Replicator::State state;
  for (Table* table : core_->shard->Tables()) {
    ASSIGN_OR_RETURN(std::unique_ptr<TableImage> image, table->CaptureNow());
    state.images.push_back(std::move(image));
  }
  state.workers = core_->shard->Workers();
  return state;
}

absl::Status ShardReplicationService::InstallState(std::unique_ptr<Shard> staged) {
  core_->shard->ReplaceWith(staged.get());  // the caller holds serving_mu_ exclusively
  core_->gate.TablesReplaced();
  return absl::OkStatus();
}

absl::Status ShardReplicationService::Apply(const ReplicatedUpdate& update,
                                            std::vector<std::string>* chunks) {
  return core_->commands.Apply(update, chunks);
}

}  // namespace pscluster::ps
