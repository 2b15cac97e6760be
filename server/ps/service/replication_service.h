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

using ShardReplicationBase = ShardReplication::WithRawCallbackMethod_Replicate<
    ShardReplication::WithRawCallbackMethod_TransferState<
        ShardReplication::WithRawCallbackMethod_JoinedChain<ShardReplication::Service>>>;

// Every method on the raw callback API: an update waiting for its turn holds no thread;
// applying it, handing it on and a state transfer run on the replication pool.
class ShardReplicationService final : public ShardReplicationBase {
 public:
  explicit ShardReplicationService(ShardCore* core) : core_(core) {}

  // (replicate_stream.h)
  grpc::ServerReadReactor<grpc::ByteBuffer>* Replicate(grpc::CallbackServerContext* ctx,
                                                       grpc::ByteBuffer* resp) override;
  // (transfer_stream.h)
  grpc::ServerWriteReactor<grpc::ByteBuffer>* TransferState(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* req) override;
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
