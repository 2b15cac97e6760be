// ShardAdmin: what the coordinator, psctl and operators call on a shard. Tables, statistics,
// snapshots and restore, and a dense table's whole state out and in (mode switches).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

// Every method on the raw callback API (raw_unary.h, export_stream.h, import_stream.h).
using ShardAdminBase = ShardAdmin::WithRawCallbackMethod_CreateTable<
    ShardAdmin::WithRawCallbackMethod_DescribeTable<ShardAdmin::WithRawCallbackMethod_Stats<
        ShardAdmin::WithRawCallbackMethod_Snapshot<ShardAdmin::WithRawCallbackMethod_ListSnapshots<
            ShardAdmin::WithRawCallbackMethod_SnapshotStatus<
                ShardAdmin::WithRawCallbackMethod_Restore<
                    ShardAdmin::WithRawCallbackMethod_ExportDense<
                        ShardAdmin::WithRawCallbackMethod_ImportDense<ShardAdmin::Service>>>>>>>>>;

class ShardAdminService final : public ShardAdminBase {
 public:
  explicit ShardAdminService(ShardCore* core);

  using Reactor = grpc::ServerUnaryReactor;
  using Ctx = grpc::CallbackServerContext;
  Reactor* CreateTable(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* DescribeTable(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* Stats(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* Snapshot(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* ListSnapshots(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* SnapshotStatus(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  Reactor* Restore(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportDense(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* req) override;
  // (import_stream.h)
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportDense(grpc::CallbackServerContext* ctx,
                                                         grpc::ByteBuffer* resp) override;

 private:
  // A unary call answered by work (on the admin pool when it may wait).
  template <typename Req, typename Resp>
  Reactor* Answer(Ctx* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp, const char* method,
                  bool may_wait,
                  absl::Status (ShardAdminService::*work)(const grpc::ServerContextBase*,
                                                          const Req&, Resp*));
  // The unary methods' work, once the request parsed.
  using CtxBase = grpc::ServerContextBase;
  absl::Status DoCreateTable(const CtxBase* ctx, const CreateTableRequest& req,
                             CreateTableResponse* resp);
  absl::Status DoDescribeTable(const CtxBase* ctx, const DescribeTableRequest& req,
                               TableInfo* resp);
  absl::Status DoStats(const CtxBase* ctx, const StatsRequest& req, StatsResponse* resp);
  absl::Status DoSnapshot(const CtxBase* ctx, const SnapshotRequest& req, SnapshotResponse* resp);
  absl::Status DoListSnapshots(const CtxBase* ctx, const ListSnapshotsRequest& req,
                               ListSnapshotsResponse* resp);
  absl::Status DoSnapshotStatus(const CtxBase* ctx, const SnapshotStatusRequest& req,
                                SnapshotStatusResponse* resp);
  absl::Status DoRestore(const CtxBase* ctx, const RestoreRequest& req, RestoreResponse* resp);

  // ExportDense's work before it sends: the state copied (it may wait for its step).
  absl::Status PrepareExport(const CtxBase* ctx, const ExportDenseRequest& req,
                             RequestBudget::Charge* charge, DenseState* state);

  absl::Status CheckSnapshotter() const;
  // Restore's parts: the snapshots after `step` deleted (their timeline is abandoned); the
  // loaded state installed, waiting pulls failed with the restore named.
  absl::Status DropLaterThan(int64_t step);
  void InstallRestored(Snapshotter::Loaded loaded);
  // Replicated, before the head replaces its whole state (Restore, ImportDense): the chain
  // becomes the head alone and no replica joins until *joins is released (Replicator).
  absl::Status ReplaceWholeState(absl::string_view what, std::unique_ptr<absl::MutexLock>* joins);

  ShardCore* const core_;
};

}  // namespace pscluster::ps
