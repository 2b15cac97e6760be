// ShardAdmin: what the coordinator, psctl and operators call on a shard. Tables, statistics,
// snapshots and restore, and a dense table's whole state out and in (mode switches).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

class ShardAdminService final : public ShardAdmin::Service {
 public:
  explicit ShardAdminService(ShardCore* core);

  grpc::Status CreateTable(grpc::ServerContext* ctx, const CreateTableRequest* req,
                           CreateTableResponse* resp) override;
  grpc::Status DescribeTable(grpc::ServerContext* ctx, const DescribeTableRequest* req,
                             TableInfo* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const StatsRequest* req,
                     StatsResponse* resp) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const SnapshotRequest* req,
                        SnapshotResponse* resp) override;
  grpc::Status ListSnapshots(grpc::ServerContext* ctx, const ListSnapshotsRequest* req,
                             ListSnapshotsResponse* resp) override;
  grpc::Status SnapshotStatus(grpc::ServerContext* ctx, const SnapshotStatusRequest* req,
                              SnapshotStatusResponse* resp) override;
  grpc::Status Restore(grpc::ServerContext* ctx, const RestoreRequest* req,
                       RestoreResponse* resp) override;
  grpc::Status ExportDense(grpc::ServerContext* ctx, const ExportDenseRequest* req,
                           grpc::ServerWriter<TableStateChunk>* writer) override;
  grpc::Status ImportDense(grpc::ServerContext* ctx, grpc::ServerReader<TableStateChunk>* reader,
                           ImportDenseResponse* resp) override;

 private:
  absl::Status CheckSnapshotter() const;
  // Restore's parts: the snapshots after `step` deleted (their timeline is abandoned); the
  // loaded state installed, waiting pulls failed with the restore named.
  absl::Status DropLaterThan(int64_t step);
  void InstallRestored(Snapshotter::Loaded loaded);
  // Replicated, before the head replaces its whole state (Restore, ImportDense): the chain
  // becomes the head alone and no replica joins until *joins is released (Replicator).
  absl::Status ReplaceWholeState(absl::string_view what, std::unique_ptr<absl::MutexLock>* joins);
  // A dense table for ExportDense/ImportDense: NOT_FOUND, or FAILED_PRECONDITION for a
  // sparse one. (No worker id: moving state is not a worker's push or pull.)
  absl::StatusOr<DenseTable*> DenseForState(uint32_t table_id) const;
  // Reads a whole import stream into a state for `table`'s range; `first` is its first chunk.
  absl::StatusOr<DenseState> ReceiveState(DenseTable* table, const TableStateChunk& first,
                                          grpc::ServerReader<TableStateChunk>* reader,
                                          StreamWatchdog::Watch* watch) const;

  ShardCore* const core_;
};

}  // namespace pscluster::ps
