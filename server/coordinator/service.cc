#include "server/coordinator/service.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/call_metadata.h"
#include "common/grpc_status.h"

namespace pscluster::coord {

CoordinatorService::CoordinatorService(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                                       Checkpointer* checkpointer, ProgressHistory* history)
    : cluster_(cluster),
      kv_(kv),
      max_wait_(max_wait),
      checkpointer_(checkpointer),
      history_(history) {}

absl::Time CoordinatorService::Deadline(const grpc::ServerContext* ctx) const {
  return std::min(absl::FromChrono(ctx->deadline()), absl::Now() + max_wait_);
}

// Runs `fn` (returning StatusOr<T>) and copies its value into *out.
template <typename T, typename Fn>
grpc::Status Answer(Fn fn, T* out) {
  absl::StatusOr<T> r = fn();
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Register(grpc::ServerContext*, const RegisterRequest* req,
                                          RegisterResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->Register(*req); }, resp);
}

grpc::Status CoordinatorService::JoinChain(grpc::ServerContext*, const JoinChainRequest* req,
                                           JoinChainResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->JoinChain(*req); }, resp);
}

grpc::Status CoordinatorService::ShrinkChain(grpc::ServerContext*, const ShrinkChainRequest* req,
                                             JoinChainResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->ShrinkChain(*req); }, resp);
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const HeartbeatRequest* req,
                                           HeartbeatResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->Heartbeat(*req); }, resp);
}

grpc::Status CoordinatorService::ReportProgress(grpc::ServerContext*,
                                                const ReportProgressRequest* req,
                                                ReportProgressResponse*) {
  InFlightCounter::Scope scope(&in_flight_);
  absl::Status s = cluster_->ReportProgress(*req);
  if (s.ok() && history_ != nullptr) history_->Record(*req);
  // Rank 0's test metric is acted on while rank 0 waits here, before it pushes the step
  // after the one it measured: the tables are still at that step, so the checkpoint filed
  // under the metric holds what was measured (the background loop would come too late).
  if (s.ok() && req->has_metric() && req->rank() == 0 && checkpointer_ != nullptr &&
      checkpointer_->automatic()) {
    if (absl::Status c = checkpointer_->MaybeCheckpoint(); !c.ok()) {
      std::fprintf(stderr, "ps_coordinator: checkpoint on rank 0's metric: %s\n",
                   c.ToString().c_str());
    }
  }
  return ToGrpcStatus(s);
}

grpc::Status CoordinatorService::GetView(grpc::ServerContext* ctx, const GetViewRequest* req,
                                         ClusterView* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer(
      [&] {
        return cluster_->AwaitView(req->min_version(), req->wait_until_complete(), Deadline(ctx));
      },
      resp);
}

grpc::Status CoordinatorService::KvPut(grpc::ServerContext*, const KvPutRequest* req,
                                       KvPutResponse*) {
  InFlightCounter::Scope scope(&in_flight_);
  return ToGrpcStatus(kv_->Put(req->key(), req->value()));
}

grpc::Status CoordinatorService::KvGet(grpc::ServerContext* ctx, const KvGetRequest* req,
                                       KvGetResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  auto value = kv_->Get(req->key(), req->wait(), Deadline(ctx));
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SwitchMode(grpc::ServerContext*, const SwitchModeRequest* req,
                                            SwitchModeResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->SwitchMode(*req); }, resp);
}

grpc::Status CoordinatorService::PollSwitch(grpc::ServerContext*, const PollSwitchRequest* req,
                                            PollSwitchResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->PollSwitch(*req); }, resp);
}

grpc::Status CoordinatorService::ReportSwitch(grpc::ServerContext*, const ReportSwitchRequest* req,
                                              ReportSwitchResponse* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  return Answer([&] { return cluster_->ReportSwitch(*req); }, resp);
}

grpc::Status CoordinatorService::RestoreCheckpoint(grpc::ServerContext* ctx,
                                                   const RestoreCheckpointRequest* req,
                                                   ::pscluster::coord::Checkpoint* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  if (checkpointer_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this coordinator takes no checkpoints"));
  }
  if (req->client_id().size() > kMaxClientIdBytes) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("client_id has ", req->client_id().size(), " bytes; a ", kClientIdKey,
                     " has at most ", kMaxClientIdBytes)));
  }
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  return Answer(
      [&] { return checkpointer_->Restore(req->step(), req->force(), req->client_id(), deadline); },
      resp);
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext*, const CheckpointRequest* req,
                                            ::pscluster::coord::Checkpoint* resp) {
  InFlightCounter::Scope scope(&in_flight_);
  if (checkpointer_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this coordinator takes no checkpoints"));
  }
  if (req->has_metric() && !std::isfinite(req->metric())) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "metric ", req->metric(), " is not a finite number; nothing was checkpointed")));
  }
  return Answer(
      [&] {
        return checkpointer_->CheckpointNow(req->has_metric() ? std::optional(req->metric())
                                                              : std::nullopt);
      },
      resp);
}

}  // namespace pscluster::coord
