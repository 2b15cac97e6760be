// One shard replica's three gRPC services (proto/ps.proto) over one channel: ShardData (the
// workers' calls), ShardAdmin (tables, snapshots, state) and ShardReplication (between
// replicas). The services' method names do not overlap, so a ShardStub forwards each by
// name (stub->Stats(...) is admin->Stats(...)); Get<S>() is the service stub S, for callers
// that hold a member pointer such as &ps::ShardAdmin::Stub::Stats.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "grpcpp/channel.h"
#include "proto/ps.grpc.pb.h"

namespace pscluster {

class ShardStub {
 public:
  explicit ShardStub(const std::shared_ptr<grpc::ChannelInterface>& channel)
      : data(ps::ShardData::NewStub(channel)),
        admin(ps::ShardAdmin::NewStub(channel)),
        replication(ps::ShardReplication::NewStub(channel)) {}
  static std::unique_ptr<ShardStub> New(const std::shared_ptr<grpc::ChannelInterface>& channel) {
    return std::make_unique<ShardStub>(channel);
  }

  template <typename S>
  S* Get() const {
    if constexpr (std::is_same_v<S, ps::ShardData::Stub>) {
      return data.get();
    } else if constexpr (std::is_same_v<S, ps::ShardAdmin::Stub>) {
      return admin.get();
    } else {
      static_assert(std::is_same_v<S, ps::ShardReplication::Stub>, "not a shard service's stub");
      return replication.get();
    }
  }

#define PSCLUSTER_SHARD_METHOD(service, Method)          \
  template <typename... Args>                            \
  auto Method(Args&&... args) {                          \
    return service->Method(std::forward<Args>(args)...); \
  }
  PSCLUSTER_SHARD_METHOD(data, RegisterWorker)
  PSCLUSTER_SHARD_METHOD(data, UnregisterWorker)
  PSCLUSTER_SHARD_METHOD(data, PullDense)
  PSCLUSTER_SHARD_METHOD(data, PushDense)
  PSCLUSTER_SHARD_METHOD(data, PullDenseStream)
  PSCLUSTER_SHARD_METHOD(data, PushDenseStream)
  PSCLUSTER_SHARD_METHOD(data, PullDenseBatch)
  PSCLUSTER_SHARD_METHOD(data, PushDenseBatch)
  PSCLUSTER_SHARD_METHOD(data, PushPullDenseBatch)
  PSCLUSTER_SHARD_METHOD(data, PullSparse)
  PSCLUSTER_SHARD_METHOD(data, PushSparse)
  PSCLUSTER_SHARD_METHOD(admin, CreateTable)
  PSCLUSTER_SHARD_METHOD(admin, DescribeTable)
  PSCLUSTER_SHARD_METHOD(admin, Stats)
  PSCLUSTER_SHARD_METHOD(admin, Snapshot)
  PSCLUSTER_SHARD_METHOD(admin, ListSnapshots)
  PSCLUSTER_SHARD_METHOD(admin, SnapshotStatus)
  PSCLUSTER_SHARD_METHOD(admin, Restore)
  PSCLUSTER_SHARD_METHOD(admin, ExportDense)
  PSCLUSTER_SHARD_METHOD(admin, ImportDense)
  PSCLUSTER_SHARD_METHOD(replication, Replicate)
  PSCLUSTER_SHARD_METHOD(replication, TransferState)
  PSCLUSTER_SHARD_METHOD(replication, JoinedChain)
#undef PSCLUSTER_SHARD_METHOD

  const std::unique_ptr<ps::ShardData::Stub> data;
  const std::unique_ptr<ps::ShardAdmin::Stub> admin;
  const std::unique_ptr<ps::ShardReplication::Stub> replication;
};

}  // namespace pscluster
