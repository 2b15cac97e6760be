#include "server/ps/service/shard_services.h"

#include <string>
#include <utility>
#include <vector>

namespace pscluster::ps {

std::unique_ptr<Replicator> ShardServices::NewReplicator(ReplicatorOptions options) {
  options.serving = core_.gate.serving_mu();
  ShardReplicationService* r = &replication_;
  return std::make_unique<Replicator>(
      std::move(options),
      [r](const ReplicatedUpdate& u, std::vector<std::string>* chunks) {
        return r->Apply(u, chunks);
      },
      [r] { return r->CaptureState(); },
      [r](std::unique_ptr<Shard> staged) { return r->InstallState(std::move(staged)); });
}

}  // namespace pscluster::ps
