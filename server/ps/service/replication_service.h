// ShardReplication: what the replicas of one shard call on each other (ps_coordinator
// --replicas > 1). Updates down the chain, and a joiner's state transfer. The replicator
// does the work (server/ps/replication); this is its gRPC front and its hooks into the shard.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proto/ps.grpc.pb.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

// JoinedChain on the raw callback API; Replicate and TransferState still synchronous (a
// replica's turn waits for the updates before it, which needs turns that park first).
class ShardReplicationService final
    : public ShardReplication::WithRawCallbackMethod_JoinedChain<ShardReplication::Service> {
 public:
  explicit ShardReplicationService(ShardCore* core) : core_(core) {}

  grpc::Status Replicate(grpc::ServerContext* ctx, grpc::ServerReader<ReplicatedUpdate>* reader,
                         ReplicateResponse* resp) override;
  grpc::Status TransferState(grpc::ServerContext* ctx, const TransferStateRequest* req,
                             grpc::ServerWriter<StateTransferChunk>* writer) override;
  grpc::ServerUnaryReactor* JoinedChain(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;

  // The replicator's hooks into the shard: an update that came down the chain applied as
  // the head applied it; the shard's state now (the tail's, for a joiner); a joiner's state
  // installed (the caller holds the serving lock exclusively).
  absl::Status Apply(const ReplicatedUpdate& update, std::vector<std::string>* chunks);
  absl::StatusOr<Replicator::State> CaptureState() const;
  absl::Status InstallState(std::unique_ptr<Shard> staged);

 private:
  ShardCore* const core_;
};

}  // namespace pscluster::ps
