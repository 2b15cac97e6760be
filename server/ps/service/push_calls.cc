// The dense push path of ShardDataService: unary, batched and streamed (push_stream.h)
// pushes, each checked whole before any of it is applied, then applied through the gate's
// Write (a chain's head hands it down the chain).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/data_service.h"
#include "server/ps/service/push_stream.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {
absl::Status ShardDataService::WritePushBatch(const grpc::ServerContextBase* ctx,
                                              const DenseBatch& req, PushDenseBatchResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RequestBudget::Charge charge(&core_->budget);
  charge.ForceGrowTo(PayloadBytes(req));
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = req; }, nullptr,
      [&] { return core_->commands.PushBatch(req, resp); });
}

absl::Status ShardDataService::WritePush(const grpc::ServerContextBase* ctx, const DenseChunk& req,
                                         PushDenseResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RequestBudget::Charge charge(&core_->budget);
  charge.ForceGrowTo(req.data().size());  // already received: counted, never refused
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense() = req; }, nullptr,
      [&] { return core_->commands.PushDense(req, resp); });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ShardDataService::PushDenseStream(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  auto* stream = new PushStream(core_, ctx, resp);
  stream->Begin();
  return stream;
}

}  // namespace pscluster::ps
