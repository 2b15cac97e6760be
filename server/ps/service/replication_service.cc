#include "server/ps/service/replication_service.h"

#include <utility>

#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/raw_unary.h"
#include "server/ps/service/replicate_stream.h"
#include "server/ps/service/request_checks.h"
#include "server/ps/service/transfer_stream.h"

namespace pscluster::ps {

grpc::ServerReadReactor<grpc::ByteBuffer>* ShardReplicationService::Replicate(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  // Not under the serving lock while the update waits for its turn (a joiner installs its
  // state meanwhile): the replicator takes it to apply.
  auto* stream = new ReplicateStream(core_, core_->gate.replicator(), ctx, resp);
  stream->Begin();
  return stream;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardReplicationService::TransferState(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  TransferStateRequest request;
  if (!ParseRaw(*req, &request)) {
    return new RefusedWrite(Unparsable(RawMethod{"ShardReplication", "TransferState"}));
  }
  Replicator* chain = core_->gate.replicator();
  if (chain == nullptr) return new RefusedWrite(ToGrpcStatus(NotReplicated()));
  if (absl::Status peer = chain->CheckPeer(*ctx, "TransferState"); !peer.ok()) {
    return new RefusedWrite(ToGrpcStatus(peer));
  }
  auto* stream = new TransferStream(core_, chain, ctx, std::move(request));
  stream->Start();
  return stream;
}

grpc::ServerUnaryReactor* ShardReplicationService::JoinedChain(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* req,
                                                               grpc::ByteBuffer* resp) {
  // It asks the coordinator to append the joiner: on the pool, as a chain's round trip.
  return AnswerUnary<JoinedChainRequest, JoinedChainResponse>(
      ctx, req, resp, {"ShardReplication", "JoinedChain"}, &core_->pool,
      [this, ctx](const JoinedChainRequest& r, JoinedChainResponse* out) -> absl::Status {
        InFlightCounter::Scope in_flight(&core_->in_flight);
        Replicator* chain = core_->gate.replicator();
        if (chain == nullptr) return NotReplicated();
        RETURN_IF_ERROR(chain->CheckPeer(*ctx, "JoinedChain"));
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
