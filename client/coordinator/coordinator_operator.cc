#include "client/coordinator/coordinator_operator.h"

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

std::shared_ptr<grpc::Channel> CoordinatorChannel(const std::string& target,
                                                  const Security& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return security.Channel(target, args);
}

CoordinatorOperator::CoordinatorOperator(const std::string& address, absl::Duration rpc_timeout,
                                         const Security& security)
    : owned_(coord::Coordinator::NewStub(CoordinatorChannel(address, security))),
      stub_(owned_.get()),
      rpc_timeout_(rpc_timeout) {}

CoordinatorOperator::CoordinatorOperator(coord::Coordinator::Stub* stub, absl::Duration rpc_timeout)
    : stub_(stub), rpc_timeout_(rpc_timeout) {}

absl::StatusOr<coord::ClusterView> CoordinatorOperator::View() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  coord::ClusterView view;
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->GetView(&ctx, coord::GetViewRequest(), &view), "coordinator"));
  return view;
}

absl::StatusOr<ScheduledSwitch> CoordinatorOperator::SwitchMode(coord::TrainingMode mode,
                                                                int64_t at_step) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  coord::SwitchModeRequest req;
  req.set_mode(mode);
  req.set_at_step(at_step);
  coord::SwitchModeResponse resp;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->SwitchMode(&ctx, req, &resp), "coordinator"));
  return ScheduledSwitch{resp.switch_id(), resp.at_step(), resp.no_op()};
}

absl::StatusOr<coord::Checkpoint> CoordinatorOperator::Checkpoint(std::optional<double> metric,
                                                                  absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  coord::CheckpointRequest req;
  if (metric) {
    req.set_has_metric(true);
    req.set_metric(*metric);
  }
  coord::Checkpoint resp;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Checkpoint(&ctx, req, &resp), "coordinator"));
  return resp;
}

absl::StatusOr<coord::Checkpoint> CoordinatorOperator::Restore(int64_t step, bool force,
                                                               absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  coord::RestoreCheckpointRequest req;
  req.set_step(step);
  req.set_force(force);
  coord::Checkpoint resp;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->RestoreCheckpoint(&ctx, req, &resp), "coordinator"));
  return resp;
}

}  // namespace pscluster
