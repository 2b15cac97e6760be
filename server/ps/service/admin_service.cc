// ShardAdminService: tables, statistics, snapshots and restore.
#include "server/ps/service/admin_service.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/ps/service/export_stream.h"
#include "server/ps/service/import_stream.h"
#include "server/ps/service/raw_unary.h"

namespace pscluster::ps {

ShardAdminService::ShardAdminService(ShardCore* core) : core_(core) {}

// Quick reads answer on gRPC's thread; the rest may wait (a chain's round trip, a snapshot's
// step or write, a restore's load) and run on the admin pool.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* ShardAdminService::Answer(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req, grpc::ByteBuffer* resp,
    const char* method, bool may_wait,
    absl::Status (ShardAdminService::*work)(const grpc::ServerContextBase*, const Req&, Resp*)) {
  return AnswerUnary<Req, Resp>(
      ctx, req, resp, {"ShardAdmin", method}, may_wait ? &core_->admin_pool : nullptr,
      [this, ctx, work](const Req& r, Resp* out) { return (this->*work)(ctx, r, out); });
}

grpc::ServerUnaryReactor* ShardAdminService::CreateTable(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* req,
                                                         grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "CreateTable", core_->gate.replicator() != nullptr,
                &ShardAdminService::DoCreateTable);
}
grpc::ServerUnaryReactor* ShardAdminService::DescribeTable(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req,
                                                           grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "DescribeTable", false, &ShardAdminService::DoDescribeTable);
}
grpc::ServerUnaryReactor* ShardAdminService::Stats(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req,
                                                   grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "Stats", false, &ShardAdminService::DoStats);
}
grpc::ServerUnaryReactor* ShardAdminService::Snapshot(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "Snapshot", true, &ShardAdminService::DoSnapshot);
}
grpc::ServerUnaryReactor* ShardAdminService::ListSnapshots(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req,
                                                           grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "ListSnapshots", true, &ShardAdminService::DoListSnapshots);
}
grpc::ServerUnaryReactor* ShardAdminService::SnapshotStatus(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* req,
                                                            grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "SnapshotStatus", true, &ShardAdminService::DoSnapshotStatus);
}
grpc::ServerUnaryReactor* ShardAdminService::Restore(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req,
                                                     grpc::ByteBuffer* resp) {
  return Answer(ctx, req, resp, "Restore", true, &ShardAdminService::DoRestore);
}

absl::Status ShardAdminService::DoCreateTable(const grpc::ServerContextBase* ctx,
                                              const CreateTableRequest& req,
                                              CreateTableResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_create_table() = req; }, nullptr,
      [&]() -> absl::Status {
        ASSIGN_OR_RETURN(*resp, core_->shard->CreateTable(req.spec()));
        return absl::OkStatus();
      });
}

absl::Status ShardAdminService::DoDescribeTable(const grpc::ServerContextBase*,
                                                const DescribeTableRequest& req, TableInfo* resp) {
  ShardCore::Scope scope(core_);
  auto table = core_->shard->GetTable(req.table_id());
  if (!table.ok()) return table.status();
  *resp = (*table)->Info();
  return absl::OkStatus();
}

absl::Status ShardAdminService::DoStats(const grpc::ServerContextBase*, const StatsRequest& req,
                                        StatsResponse* resp) {
  ShardCore::Scope scope(core_);
  if (req.except_clients_size() > kMaxExceptClients) {  // a set of millions, from 4 MB
    return absl::InvalidArgumentError(absl::StrCat("except_clients lists ",
                                                   req.except_clients_size(),
                                                   " client ids; at most ", kMaxExceptClients));
  }
  *resp = core_->shard->Stats({req.except_clients().begin(), req.except_clients().end()});
  if (req.fingerprint()) resp->set_fingerprint(core_->shard->Fingerprint());
  return absl::OkStatus();
}

absl::Status ShardAdminService::CheckSnapshotter() const {
  if (core_->snapshotter == nullptr) {
    return absl::FailedPreconditionError(
        "this ps_server has no snapshot directory; restart it with --data_dir=DIR");
  }
  return absl::OkStatus();
}

absl::Status ShardAdminService::DoSnapshot(const grpc::ServerContextBase* ctx,
                                           const SnapshotRequest& req, SnapshotResponse* resp) {
  ShardCore::Scope scope(core_);
  if (absl::Status s = CheckSnapshotter(); !s.ok()) return s;
  if (absl::Status s = core_->gate.CheckServing(); !s.ok()) return s;  // the head writes
  auto r = core_->snapshotter->Snapshot(req, core_->gate.Deadline(ctx));
  if (!r.ok()) return r.status();
  *resp = *std::move(r);
  return absl::OkStatus();
}

absl::Status ShardAdminService::DoListSnapshots(const grpc::ServerContextBase*,
                                                const ListSnapshotsRequest&,
                                                ListSnapshotsResponse* resp) {
  ShardCore::Scope scope(core_);
  if (absl::Status s = CheckSnapshotter(); !s.ok()) return s;
  auto r = core_->snapshotter->List();
  if (!r.ok()) return r.status();
  *resp = *std::move(r);
  return absl::OkStatus();
}

absl::Status ShardAdminService::DoSnapshotStatus(const grpc::ServerContextBase* ctx,
                                                 const SnapshotStatusRequest& req,
                                                 SnapshotStatusResponse* resp) {
  ShardCore::Scope scope(core_);
  if (absl::Status s = CheckSnapshotter(); !s.ok()) return s;
  if (req.wait_until_idle() && !core_->snapshotter->AwaitIdle(core_->gate.Deadline(ctx))) {
    return absl::DeadlineExceededError("snapshot write still in progress");
  }
  *resp = core_->snapshotter->Status();
  return absl::OkStatus();
}

absl::Status ShardAdminService::DoRestore(const grpc::ServerContextBase*, const RestoreRequest& req,
                                          RestoreResponse* resp) {
  InFlightCounter::Scope in_flight(&core_->in_flight);
  if (absl::Status s = CheckSnapshotter(); !s.ok()) return s;
  if (absl::Status s = core_->gate.CheckServing(); !s.ok()) return s;
  std::unique_ptr<absl::MutexLock> joins;
  if (absl::Status s = ReplaceWholeState("Restore", &joins); !s.ok()) return s;
  if (req.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", req.step()));
  }
  // Health checks answer NOT_SERVING until the restore is done or failed: balancers and
  // probes hold traffic back while the state is replaced.
  grpc::HealthCheckServiceInterface* health = core_->gate.health();
  if (health != nullptr) health->SetServingStatus(false);
  absl::Cleanup serving_again = [health] {
    if (health != nullptr) health->SetServingStatus(true);
  };
  // Read and verify the whole snapshot first, while serving: on any error the shard is
  // exactly as before.
  auto loaded = core_->snapshotter->Load(absl::StrCat(req.step()));
  if (!loaded.ok()) {
    return absl::Status(
        loaded.status().code(),
        absl::StrCat(loaded.status().message(), " (nothing was restored; the shard is unchanged)"));
  }
  const int64_t step = loaded->step;
  // The later snapshots go first, while serving (it may wait for a write to end): kept, a
  // restart with --restore=latest, or a checkpoint of one of their steps, would bring back
  // the timeline this restore abandons. If they cannot all go, the restore fails and the
  // tables stay as they are.
  if (req.drop_later()) {
    if (absl::Status s = DropLaterThan(step); !s.ok()) return s;
  }
  InstallRestored(*std::move(loaded));
  LogInfo("rolled back in place to snapshot of step %lld", static_cast<long long>(step));
  resp->set_step(step);
  return absl::OkStatus();
}

absl::Status ShardAdminService::DropLaterThan(int64_t step) {
  absl::StatusOr<std::vector<int64_t>> dropped = core_->snapshotter->DropAfter(step);
  if (!dropped.ok()) {
    return absl::Status(
        dropped.status().code(),
        absl::StrCat("restoring step ", step,
                     " needs the later snapshots deleted, and they "
                     "could not all be: ",
                     dropped.status().message(),
                     " (nothing was "
                     "restored; the tables are unchanged; make the snapshot directory "
                     "writable, or delete the later .psnap files, and restore again)"));
  }
  if (!dropped->empty()) {
    LogInfo("deleted the snapshots of steps %s (after the one restored)",
            absl::StrJoin(*dropped, ", ").c_str());
  }
  return absl::OkStatus();
}

void ShardAdminService::InstallRestored(Snapshotter::Loaded loaded) {
  const int64_t step = loaded.step;
  // Waiting pulls fail now, naming the restore (not UNAVAILABLE: a replica would be tried,
  // and no retry finds the tables they waited on) ...
  core_->shard->Shutdown(absl::AbortedError(absl::StrCat(
      "shard ", core_->shard->options().shard_id, " was rolled back to its snapshot of step ", step,
      " (a restore) while this call waited: the tables it waited on are gone; a worker of the "
      "run rolled back resumes from that checkpoint")));
  // ... and every other handler leaves before the tables are replaced.
  core_->gate.ReplaceTables([&] { core_->snapshotter->Install(std::move(loaded)); });
}

absl::Status ShardAdminService::ReplaceWholeState(absl::string_view what,
                                                  std::unique_ptr<absl::MutexLock>* joins) {
  Replicator* chain = core_->gate.replicator();
  if (chain == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(chain->StandAlone(what));
  *joins = chain->HoldJoins();
  if (!chain->AloneNow()) {
    joins->reset();
    return absl::UnavailableError(absl::StrCat(
        what, ": a replica joined the chain again meanwhile; nothing was changed; retry"));
  }
  return absl::OkStatus();
}

absl::Status ShardAdminService::PrepareExport(const grpc::ServerContextBase* ctx,
                                              const ExportDenseRequest& req,
                                              RequestBudget::Charge* charge, DenseState* state) {
  ShardCore::Scope scope(core_);
  RETURN_IF_ERROR(core_->gate.CheckServing());
  ASSIGN_OR_RETURN(DenseTable * table, DenseForState(*core_->shard, req.table_id()));
  // The export holds a copy of the table's whole state (values and slots) until it is sent.
  RETURN_IF_ERROR(
      charge->GrowTo(StateBytes(*table), absl::StrCat("the export of table ", req.table_id())));
  // Copied under the table's lock, once the table is readable at the step (it may wait).
  ASSIGN_OR_RETURN(*state, table->ExportState(req.step(), core_->gate.Deadline(ctx)));
  return absl::OkStatus();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardAdminService::ExportDense(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  ExportDenseRequest request;
  if (!ParseRaw(*req, &request)) {
    return new RefusedWrite(Unparsable(RawMethod{"ShardAdmin", "ExportDense"}));
  }
  auto* stream = new ExportStream(core_, request);
  core_->admin_pool.Post([this, ctx, stream] {
    stream->Start([this, ctx](const ExportDenseRequest& r, RequestBudget::Charge* charge,
                              DenseState* state) { return PrepareExport(ctx, r, charge, state); });
  });
  return stream;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ShardAdminService::ImportDense(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  auto* stream =
      new ImportStream(core_, ctx, resp, [this](std::unique_ptr<absl::MutexLock>* joins) {
        return ReplaceWholeState("ImportDense", joins);
      });
  stream->Begin();
  return stream;
}

}  // namespace pscluster::ps
