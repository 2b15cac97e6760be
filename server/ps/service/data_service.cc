#include "server/ps/service/data_service.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {

ShardDataService::ShardDataService(ShardCore* core) : core_(core) {}

absl::Status ShardDataService::WriteRegister(const grpc::ServerContextBase* ctx,
                                             const RegisterWorkerRequest& req,
                                             RegisterWorkerResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RETURN_IF_ERROR(CheckWorkerId(req.worker_id()));
  absl::Status written = core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_register_worker() = req; }, nullptr,
      [&] {
        *resp = core_->shard->RegisterWorker(req.worker_id());
        return absl::OkStatus();
      });
  if (written.ok() && resp->num_shards() == 0) {  // a retry the chain had applied already
    resp->set_shard_id(core_->shard->options().shard_id);
    resp->set_num_shards(core_->shard->options().num_shards);
  }
  return written;
}

absl::Status ShardDataService::WriteUnregister(const grpc::ServerContextBase* ctx,
                                               const UnregisterWorkerRequest& req,
                                               UnregisterWorkerResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RETURN_IF_ERROR(CheckWorkerId(req.worker_id()));
  absl::Status written = core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_unregister_worker() = req; }, nullptr,
      [&] {
        *resp = core_->shard->UnregisterWorker(req.worker_id());
        return absl::OkStatus();
      });
  if (!written.ok()) return written;
  LogInfo("worker %d unregistered (%s)", req.worker_id(),
          resp->was_registered() ? "it was registered" : "it was not registered");
  return absl::OkStatus();
}

absl::Status ShardDataService::PullRows(const Wait& wait, const SparseRequest& req,
                                        PullSparseResponse* resp, RequestBudget::Charge* charge) {
  RETURN_IF_ERROR(core_->gate.CheckServing());
  RETURN_IF_ERROR(CheckStep(req.step()));
  ASSIGN_OR_RETURN(SparseTable * table, core_->shard->GetSparse(req.table_id(), req.worker_id()));
  const uint64_t values = static_cast<uint64_t>(req.keys_size()) * table->spec().dim();
  if (values * sizeof(float) > core_->options.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pulling ", req.keys_size(), " rows would return ", values * sizeof(float),
                     " bytes; the limit is ", core_->options.max_chunk_bytes, "; split the keys"));
  }
  absl::Span<const uint64_t> keys(req.keys().data(), req.keys_size());
  RETURN_IF_ERROR(table->CheckKeys(keys));
  RETURN_IF_ERROR(WaitForStep(table, req.step(), wait));
  charge->ForceGrowTo(values * sizeof(float));  // at most max_chunk_bytes: counted, not refused
  std::string* out = resp->mutable_values();
  out->resize(values * sizeof(float));
  return table->Read(keys, absl::MakeSpan(reinterpret_cast<float*>(out->data()), values));
}

absl::Status ShardDataService::WritePushSparse(const grpc::ServerContextBase* ctx,
                                               const SparseRequest& req, PushSparseResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RequestBudget::Charge charge(&core_->budget);
  charge.ForceGrowTo(req.grads().size() + uint64_t{8} * req.keys_size());
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = req; }, nullptr,
      [&] { return core_->commands.PushSparse(req, resp); });
}

}  // namespace pscluster::ps
