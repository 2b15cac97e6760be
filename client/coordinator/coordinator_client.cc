#include "client/coordinator/coordinator_client.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<coord::RegisterResponse> RegisterOnce(coord::Coordinator::Stub* stub,
                                                     const CoordinatorClientOptions& options) {
  // A restarted member may register before the coordinator has declared its previous
  // incarnation dead (ALREADY_EXISTS): retry until that happens, within register_timeout.
  const absl::Time deadline = absl::Now() + options.register_timeout;
  coord::RegisterRequest req;
  req.set_role(options.role);
  req.set_id(options.id);
  req.set_address(options.address);
  req.set_replica(options.replica);
  req.set_group_size(options.group_size);
  if (options.limits) *req.mutable_limits() = *options.limits;
  coord::RegisterResponse resp;
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(1));
  absl::Time said_unavailable = absl::InfinitePast();
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    absl::Status s = FromGrpcStatus(stub->Register(&ctx, req, &resp),
                                    absl::StrCat("coordinator ", options.coordinator));
    if (s.ok()) return resp;
    if (absl::Now() + backoff.ceiling() > deadline) return s;
    if (absl::IsAlreadyExists(s)) {
      LogWarning("%s; retrying until the coordinator declares it dead",
                 std::string(s.message()).c_str());
    } else if (absl::IsUnavailable(s)) {
      // Not up yet, or a connection that cannot be made (a TLS handshake refused, a wrong
      // address): said when it starts and every 10 s, with gRPC's reason.
      if (absl::Now() - said_unavailable >= absl::Seconds(10)) {
        LogWarning(
            "%s; retrying for up to %s (is it running there? with TLS, do --tls_ca "
            "and --tls_server_name match its certificate?)",
            std::string(s.message()).c_str(),
            absl::FormatDuration(absl::Trunc(deadline - absl::Now(), absl::Seconds(1))).c_str());
        said_unavailable = absl::Now();
      }
    } else {
      return s;
    }
    absl::SleepFor(backoff.Next());  // bounded by register_timeout
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Register(
    CoordinatorClientOptions options) {
  auto stub =
      coord::Coordinator::NewStub(CoordinatorChannel(options.coordinator, options.security));
  ASSIGN_OR_RETURN(coord::RegisterResponse resp, RegisterOnce(stub.get(), options));
  std::unique_ptr<CoordinatorClient> c(new CoordinatorClient(std::move(options), std::move(stub)));
  c->Registered(resp);
  c->registered_view_ = std::move(*resp.mutable_view());
  if (resp.heartbeat_timeout_ms() > 0) {  // beat several times per timeout
    c->heartbeat_timeout_ = absl::Milliseconds(resp.heartbeat_timeout_ms());
    c->options_.heartbeat_interval = std::min(c->options_.heartbeat_interval,
                                              absl::Milliseconds(resp.heartbeat_timeout_ms()) / 4);
  }
  c->heartbeats_ = std::thread(&CoordinatorClient::HeartbeatLoop, c.get());
  if (c->options_.on_view) c->watch_ = std::thread(&CoordinatorClient::WatchLoop, c.get());
  return c;
}

CoordinatorClient::CoordinatorClient(CoordinatorClientOptions options,
                                     std::unique_ptr<coord::Coordinator::Stub> stub)
    : options_(std::move(options)), stub_(std::move(stub)) {}

CoordinatorClient::~CoordinatorClient() {
  stop_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
  if (watch_.joinable()) watch_.join();
}

void CoordinatorClient::WatchLoop() {
  // Each wait is short, so that a stop is seen soon; an unreachable coordinator is the
  // heartbeats' to report, the watch only pauses.
  constexpr absl::Duration kSlice = absl::Milliseconds(500);
  int64_t seen = registered_view_.version();
  while (!stop_.HasBeenNotified()) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kSlice);
    coord::GetViewRequest req;
    req.set_min_version(seen + 1);
    coord::ClusterView view;
    const grpc::Status s = stub_->GetView(&ctx, req, &view);
    if (s.ok()) {
      seen = view.version();
      options_.on_view(view);
    } else if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      stop_.WaitForNotificationWithTimeout(kSlice);
    }
  }
}

void CoordinatorClient::HeartbeatLoop() {
  bool failing = false;
  while (!stop_.WaitForNotificationWithTimeout(options_.heartbeat_interval)) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.rpc_timeout);
    coord::HeartbeatRequest req;
    req.set_role(options_.role);
    req.set_id(options_.id);
    req.set_replica(options_.replica);
    coord::HeartbeatResponse resp;
    const absl::Time sent = absl::Now();
    grpc::Status s;
    {
      absl::MutexLock lock(&register_mu_);
      req.set_incarnation(incarnation_);
      s = stub_->Heartbeat(&ctx, req, &resp);
    }
    if (s.ok() && options_.on_heartbeat) options_.on_heartbeat(resp.view_version(), sent);
    if (!s.ok() && !failing) {  // say so once per outage, not every second
      LogWarning("coordinator heartbeat failing: %s", s.error_message().c_str());
    } else if (s.ok() && failing) {
      LogWarning("coordinator heartbeat ok again");
    }
    failing = !s.ok();
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) return;  // replaced: stop
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) Reregister();
  }
}

void CoordinatorClient::Reregister() {
  // A coordinator restarted without its saved state does not know this member.
  LogWarning("coordinator %s does not know %s %d; registering again", options_.coordinator.c_str(),
             options_.role == coord::SHARD ? "shard" : "worker", options_.id);
  registering_again_ = true;
  absl::StatusOr<coord::RegisterResponse> r;
  {
    absl::MutexLock lock(&register_mu_);
    r = RegisterOnce(stub_.get(), options_);
    if (r.ok()) Registered(*r);
  }
  registering_again_ = false;
  if (!r.ok()) {
    LogWarning("registering again failed: %s", r.status().ToString().c_str());
    return;
  }
  LogWarning("registered again as incarnation %lld", static_cast<long long>(r->incarnation()));
}

absl::StatusOr<int64_t> CoordinatorClient::RegisterAgain() {
  absl::MutexLock lock(&register_mu_);
  ASSIGN_OR_RETURN(coord::RegisterResponse r, RegisterOnce(stub_.get(), options_));
  Registered(r);
  return r.incarnation();
}

void CoordinatorClient::Registered(const coord::RegisterResponse& r) {
  absl::MutexLock lock(&secret_mu_);
  incarnation_ = r.incarnation();
  member_secret_ = r.member_secret();
  chain_key_ = r.chain_key();
}

std::string CoordinatorClient::chain_key() const {
  absl::MutexLock lock(&secret_mu_);
  return chain_key_;
}

std::string CoordinatorClient::member_secret() const {
  absl::MutexLock lock(&secret_mu_);
  return member_secret_;
}

template <typename Call>
absl::Status CoordinatorClient::Reconnecting(const char* what, absl::Duration timeout, Call call) {
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(1));
  for (bool said = false;; said = true) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    absl::Status s = FromGrpcStatus(call(&ctx), "coordinator");
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() + backoff.ceiling() > give_up) {
      return s;
    }
    if (!said) {
      LogWarning("%s: coordinator %s unreachable (%s); retrying for up to %s", what,
                 options_.coordinator.c_str(), std::string(s.message()).c_str(),
                 absl::FormatDuration(options_.reconnect_timeout).c_str());
    }
    if (stop_.WaitForNotificationWithTimeout(backoff.Next())) return s;  // shutting down
  }
}

template <typename Req>
absl::StatusOr<int64_t> CoordinatorClient::ChainCall(
    const char* what,
    grpc::Status (coord::Coordinator::Stub::*method)(grpc::ClientContext*, const Req&,
                                                     coord::JoinChainResponse*),
    int32_t replica, int64_t epoch) {
  Req req;
  req.set_shard(options_.id);
  req.set_replica(replica);
  req.set_epoch(epoch);
  req.set_member_secret(member_secret());
  if constexpr (std::is_same_v<Req, coord::JoinChainRequest>) req.set_caller(options_.replica);
  coord::JoinChainResponse resp;
  RETURN_IF_ERROR(Reconnecting(what, options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
    return (stub_.get()->*method)(ctx, req, &resp);
  }));
  return resp.epoch();
}

absl::StatusOr<int64_t> CoordinatorClient::JoinChain(int32_t replica, int64_t epoch) {
  return ChainCall("JoinChain", &coord::Coordinator::Stub::JoinChain, replica, epoch);
}

absl::StatusOr<int64_t> CoordinatorClient::ShrinkChain(int32_t replica, int64_t epoch) {
  return ChainCall("ShrinkChain", &coord::Coordinator::Stub::ShrinkChain, replica, epoch);
}

absl::StatusOr<bool> CoordinatorClient::ReportUnreachable(int32_t shard, const std::string& address,
                                                          absl::Duration timeout) {
  coord::ReportUnreachableRequest req;
  req.set_shard(shard);
  req.set_address(address);
  coord::ReportUnreachableResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->ReportUnreachable(&ctx, req, &resp), "coordinator"));
  return resp.probing();
}

absl::StatusOr<coord::ClusterView> CoordinatorClient::AwaitView(int64_t min_version, bool complete,
                                                                absl::Duration timeout) {
  coord::GetViewRequest req;
  req.set_min_version(min_version);
  req.set_wait_until_complete(complete);
  coord::ClusterView view;
  absl::Status s = Reconnecting("GetView", timeout, [&](grpc::ClientContext* ctx) {
    return stub_->GetView(ctx, req, &view);
  });
  if (!s.ok()) return s;
  return view;
}

absl::Status CoordinatorClient::ReportFinished(int64_t view_version, int64_t step) {
  coord::ReportProgressRequest req;
  req.set_view_version(view_version);
  req.set_step(step);
  req.set_finished(true);
  return SendProgress(std::move(req), "ReportFinished");
}

absl::Status CoordinatorClient::ReportProgress(int64_t view_version, int64_t step, double loss,
                                               double samples_per_sec, std::optional<double> metric,
                                               const coord::StepTime* step_time) {
  coord::ReportProgressRequest req;
  req.set_view_version(view_version);
  req.set_step(step);
  req.set_loss(loss);
  req.set_samples_per_sec(samples_per_sec);
  if (metric) {
    req.set_has_metric(true);
    req.set_metric(*metric);
  }
  if (step_time != nullptr) *req.mutable_step_time() = *step_time;
  return SendProgress(std::move(req), "ReportProgress");
}

absl::Status CoordinatorClient::SendProgress(coord::ReportProgressRequest req, const char* what) {
  req.set_rank(options_.id);
  req.set_incarnation(incarnation_);
  req.set_run_end_step(run_end_step_.load());
  coord::ReportProgressResponse resp;
  return Reconnecting(what, options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->ReportProgress(ctx, req, &resp);
  });
}

absl::StatusOr<ScheduledSwitch> CoordinatorClient::SwitchMode(coord::TrainingMode mode,
                                                              int64_t at_step) {
  return CoordinatorOperator(stub_.get(), options_.rpc_timeout).SwitchMode(mode, at_step);
}

absl::StatusOr<PendingSwitch> CoordinatorClient::PollSwitch(int64_t step, int64_t horizon) {
  coord::PollSwitchRequest req;
  req.set_rank(options_.id);
  req.set_incarnation(incarnation_);
  req.set_step(step);
  req.set_horizon(horizon);
  coord::PollSwitchResponse resp;
  absl::Status s = Reconnecting("PollSwitch", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->PollSwitch(ctx, req, &resp);
  });
  if (!s.ok()) return s;
  return PendingSwitch{resp.pending(), resp.switch_id(), resp.at_step(), resp.mode()};
}

absl::StatusOr<bool> CoordinatorClient::ReportSwitch(const PendingSwitch& sw,
                                                     coord::TrainingMode from_mode,
                                                     double handoff_seconds) {
  coord::ReportSwitchRequest req;
  req.set_rank(options_.id);
  req.set_incarnation(incarnation_);
  req.set_switch_id(sw.switch_id);
  req.set_at_step(sw.at_step);
  req.set_from_mode(from_mode);
  req.set_to_mode(sw.mode);
  req.set_handoff_seconds(handoff_seconds);
  coord::ReportSwitchResponse resp;
  absl::Status s =
      Reconnecting("ReportSwitch", options_.rpc_timeout,
                   [&](grpc::ClientContext* ctx) { return stub_->ReportSwitch(ctx, req, &resp); });
  if (!s.ok()) return s;
  return resp.done();
}

absl::StatusOr<coord::Checkpoint> CoordinatorClient::Checkpoint(std::optional<double> metric,
                                                                absl::Duration timeout) {
  return CoordinatorOperator(stub_.get(), options_.rpc_timeout).Checkpoint(metric, timeout);
}

// The recovery calls name this worker's incarnation as of each attempt: one registered
// again while a call retried (the coordinator restarted) asks as the new one.
absl::Status CoordinatorClient::RecordRun(const std::vector<std::string>& flags, bool started) {
  coord::RecordRunRequest req;
  req.set_rank(options_.id);
  for (const std::string& f : flags) req.add_flags(f);
  req.set_started(started);
  coord::RecordRunResponse resp;
  return Reconnecting("RecordRun", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
    req.set_incarnation(incarnation_);
    return stub_->RecordRun(ctx, req, &resp);
  });
}

absl::StatusOr<coord::Rollback> CoordinatorClient::ReportStopped(const std::string& generation) {
  coord::ReportStoppedRequest req;
  req.set_rank(options_.id);
  req.set_generation(generation);
  coord::Rollback resp;
  RETURN_IF_ERROR(
      Reconnecting("ReportStopped", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
        req.set_incarnation(incarnation_);
        return stub_->ReportStopped(ctx, req, &resp);
      }));
  return resp;
}

absl::StatusOr<coord::Rollback> CoordinatorClient::DecideRollback(const std::string& generation,
                                                                  int64_t step) {
  coord::DecideRollbackRequest req;
  req.set_rank(options_.id);
  req.set_generation(generation);
  req.set_step(step);
  coord::Rollback resp;
  RETURN_IF_ERROR(
      Reconnecting("DecideRollback", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
        req.set_incarnation(incarnation_);
        return stub_->DecideRollback(ctx, req, &resp);
      }));
  return resp;
}

absl::Status CoordinatorClient::KvPut(const std::string& key, const std::string& value) {
  coord::KvPutRequest req;
  req.set_key(key);
  req.set_value(value);
  coord::KvPutResponse resp;
  return Reconnecting("KvPut", options_.rpc_timeout,
                      [&](grpc::ClientContext* ctx) { return stub_->KvPut(ctx, req, &resp); });
}

absl::StatusOr<std::string> CoordinatorClient::KvGet(const std::string& key, bool wait,
                                                     absl::Duration timeout) {
  coord::KvGetRequest req;
  req.set_key(key);
  req.set_wait(wait);
  coord::KvGetResponse resp;
  absl::Status s = Reconnecting(
      "KvGet", timeout, [&](grpc::ClientContext* ctx) { return stub_->KvGet(ctx, req, &resp); });
  if (!s.ok()) return s;
  return resp.value();
}

}  // namespace pscluster
