#include "server/coordinator/service.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/call_metadata.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/park_loop.h"
#include "common/status_macros.h"

namespace pscluster::coord {
namespace {

// Runs `fn` (returning StatusOr<T>) and copies its value into *out.
template <typename T, typename Fn>
absl::Status Answer(Fn fn, T* out) {
  absl::StatusOr<T> r = fn();
  if (!r.ok()) return r.status();
  *out = *std::move(r);
  return absl::OkStatus();
}

}  // namespace

CoordinatorCalls::CoordinatorCalls(ClusterState* cluster, KvStore* kv, absl::Duration max_wait,
                                   Checkpointer* checkpointer, ProgressHistory* history,
                                   ReplicaProber* prober)
    : cluster_(cluster),
      kv_(kv),
      max_wait_(max_wait),
      checkpointer_(checkpointer),
      history_(history),
      prober_(prober) {}

absl::Time CoordinatorCalls::Deadline(absl::Time caller) const {
  return std::min(caller, absl::Now() + max_wait_);
}

absl::Status CoordinatorCalls::Register(const RegisterRequest& req, RegisterResponse* resp) {
  return Answer([&] { return cluster_->Register(req); }, resp);
}

absl::Status CoordinatorCalls::JoinChain(const JoinChainRequest& req, JoinChainResponse* resp) {
  return Answer([&] { return cluster_->JoinChain(req); }, resp);
}

absl::Status CoordinatorCalls::ShrinkChain(const ShrinkChainRequest& req, JoinChainResponse* resp) {
  return Answer([&] { return cluster_->ShrinkChain(req); }, resp);
}

absl::Status CoordinatorCalls::ReportUnreachable(const ReportUnreachableRequest& req,
                                                 ReportUnreachableResponse* resp) {
  if (req.shard() < 0 || req.shard() >= cluster_->num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReportUnreachable: shard ", req.shard(), " is outside [0, ", cluster_->num_shards(), ")"));
  }
  RETURN_IF_ERROR(CheckAdvertised(SHARD, req.shard(), 0, req.address(), ModeLimits()));
  resp->set_probing(prober_ != nullptr && prober_->Report(req.shard(), req.address()));
  return absl::OkStatus();
}

absl::Status CoordinatorCalls::Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp) {
  return Answer([&] { return cluster_->Heartbeat(req); }, resp);
}

bool CoordinatorCalls::Checkpoints(const ReportProgressRequest& req) const {
  return req.has_metric() && req.rank() == 0 && checkpointer_ != nullptr &&
         checkpointer_->automatic();
}

absl::Status CoordinatorCalls::ReportProgress(const ReportProgressRequest& req,
                                              ReportProgressResponse*) {
  absl::Status s = cluster_->ReportProgress(req);
  if (s.ok() && history_ != nullptr) history_->Record(req);
  // Rank 0's test metric is acted on while rank 0 waits here, before it pushes the step
  // after the one it measured: the tables are still at that step, so the checkpoint filed
  // under the metric holds what was measured (the background loop would come too late).
  if (s.ok() && Checkpoints(req)) {
    if (absl::Status c = checkpointer_->MaybeCheckpoint(); !c.ok()) {
      LogWarning("checkpoint on rank 0's metric: %s", c.ToString().c_str());
    }
  }
  return s;
}

absl::Status CoordinatorCalls::GetView(const GetViewRequest& req, const Wait& how,
                                       ClusterView* resp) {
  return Answer(
      [&] { return cluster_->AwaitView(req.min_version(), req.wait_until_complete(), how); }, resp);
}

absl::Status CoordinatorCalls::RecordRun(const RecordRunRequest& req, RecordRunResponse*) {
  return cluster_->RecordRun(req);
}

absl::Status CoordinatorCalls::ReportStopped(const ReportStoppedRequest& req, Rollback* resp) {
  return Answer([&] { return cluster_->ReportStopped(req); }, resp);
}

absl::Status CoordinatorCalls::DecideRollback(const DecideRollbackRequest& req, Rollback* resp) {
  return Answer([&] { return cluster_->DecideRollback(req); }, resp);
}

absl::Status CoordinatorCalls::KvPut(const KvPutRequest& req, KvPutResponse*) {
  return kv_->Put(req.key(), req.value());
}

absl::Status CoordinatorCalls::KvGet(const KvGetRequest& req, const Wait& how,
                                     KvGetResponse* resp) {
  absl::StatusOr<std::string> value = kv_->Get(req.key(), req.wait(), how);
  if (!value.ok()) return value.status();
  resp->set_value(*std::move(value));
  return absl::OkStatus();
}

absl::Status CoordinatorCalls::SwitchMode(const SwitchModeRequest& req, SwitchModeResponse* resp) {
  return Answer([&] { return cluster_->SwitchMode(req); }, resp);
}

absl::Status CoordinatorCalls::PollSwitch(const PollSwitchRequest& req, PollSwitchResponse* resp) {
  return Answer([&] { return cluster_->PollSwitch(req); }, resp);
}

absl::Status CoordinatorCalls::ReportSwitch(const ReportSwitchRequest& req,
                                            ReportSwitchResponse* resp) {
  return Answer([&] { return cluster_->ReportSwitch(req); }, resp);
}

absl::Status CoordinatorCalls::RestoreCheckpoint(const RestoreCheckpointRequest& req,
                                                 absl::Time deadline,
                                                 ::pscluster::coord::Checkpoint* resp) {
  if (checkpointer_ == nullptr) {
    return absl::FailedPreconditionError("this coordinator takes no checkpoints");
  }
  if (req.client_id().size() > kMaxClientIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("client_id has ", req.client_id().size(),
                                                   " bytes; a ", kClientIdKey, " has at most ",
                                                   kMaxClientIdBytes));
  }
  return Answer(
      [&] { return checkpointer_->Restore(req.step(), req.force(), req.client_id(), deadline); },
      resp);
}

absl::Status CoordinatorCalls::Checkpoint(const CheckpointRequest& req,
                                          ::pscluster::coord::Checkpoint* resp) {
  if (checkpointer_ == nullptr) {
    return absl::FailedPreconditionError("this coordinator takes no checkpoints");
  }
  if (req.has_metric() && !std::isfinite(req.metric())) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", req.metric(), " is not a finite number; nothing was checkpointed"));
  }
  return Answer(
      [&] {
        return checkpointer_->CheckpointNow(req.has_metric() ? std::optional(req.metric())
                                                             : std::nullopt);
      },
      resp);
}

}  // namespace pscluster::coord
