// A shard's three gRPC services on one port, over the one ShardCore they share: ShardData
// (workers), ShardAdmin (tables, snapshots, state), ShardReplication (between replicas).
#pragma once

#include <memory>

#include "grpcpp/server_builder.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/admin_service.h"
#include "server/ps/service/data_service.h"
#include "server/ps/service/replication_service.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

class ShardServices {
 public:
  // `snapshotter` may be null (no --data_dir): snapshot RPCs then fail clearly.
  ShardServices(Shard* shard, Snapshotter* snapshotter, ServiceOptions options)
      : core_(shard, snapshotter, options), data_(&core_), admin_(&core_), replication_(&core_) {}

  void RegisterWith(grpc::ServerBuilder* builder) {
    builder->RegisterService(&data_);
    builder->RegisterService(&admin_);
    builder->RegisterService(&replication_);
  }
  // A replicator for this shard's chain, hooked into it (not in use until the gate is
  // given it: core()->gate.SetReplicator).
  std::unique_ptr<Replicator> NewReplicator(ReplicatorOptions options);

  ShardCore* core() { return &core_; }
  ShardDataService* data() { return &data_; }
  ShardAdminService* admin() { return &admin_; }
  ShardReplicationService* replication() { return &replication_; }

 private:
  ShardCore core_;
  ShardDataService data_;
  ShardAdminService admin_;
  ShardReplicationService replication_;
};

}  // namespace pscluster::ps
