#include "server/coordinator/replica_prober.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"

namespace pscluster::coord {

ReplicaProber::ReplicaProber(ClusterState* cluster, Probe probe)
    : cluster_(cluster), probe_(std::move(probe)), thread_([this] { Loop(); }) {}

ReplicaProber::~ReplicaProber() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool ReplicaProber::Report(int32_t shard, const std::string& address) {
  std::optional<Member> m = cluster_->LiveReplicaAt(shard, address);
  if (!m) return false;
  absl::MutexLock lock(&mu_);
  auto it = last_.find(address);
  if (stop_ || (it != last_.end() && absl::Now() < it->second + kQuiet)) return false;
  last_[address] = absl::InfiniteFuture();
  queue_.push_back(*std::move(m));
  return true;
}

void ReplicaProber::Loop() {
  for (;;) {
    Member m;
    {
      absl::MutexLock lock(&mu_);
      // A bounded wait, so that a stop is seen even when no report comes.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_) return;
      if (queue_.empty()) continue;
      m = std::move(queue_.front());
      queue_.pop_front();
    }
    ProbeOne(m);
  }
}

void ReplicaProber::ProbeOne(const Member& m) {
  const absl::Status answer = probe_(m.address(), kProbeTimeout);
  const bool dead =
      !answer.ok() && cluster_->DeclareUnreachable(m.id(), m.replica(), m.incarnation());
  if (dead) {
    LogInfo(
        "shard %d replica %d (%s) reported unreachable and does not answer the "
        "coordinator either (%s): declared dead, out of its chain",
        m.id(), m.replica(), m.address().c_str(), answer.ToString().c_str());
  }
  absl::MutexLock lock(&mu_);
  last_[m.address()] = absl::Now();
  ++(dead ? confirmed_ : refuted_);
}

int64_t ReplicaProber::confirmed() const {
  absl::MutexLock lock(&mu_);
  return confirmed_;
}

int64_t ReplicaProber::refuted() const {
  absl::MutexLock lock(&mu_);
  return refuted_;
}

ReplicaProber::Probe ConnectProbe(const Security& security) {
  return [security](const std::string& address, absl::Duration timeout) {
    grpc::ChannelArguments args;
    // Its own connection: a shared one may still look ready after the process died.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel = security.Channel(address, args);
    const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
    // Not WaitForConnected: it waits out the timeout through a refused connection too.
    for (grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);;) {
      if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
        return absl::UnavailableError(
            absl::StrCat("connection to ", address, " refused or broken"));
      }
      if (!channel->WaitForStateChange(state, deadline)) {
        return absl::UnavailableError(
            absl::StrCat("no connection to ", address, " within ", absl::FormatDuration(timeout)));
      }
      state = channel->GetState(/*try_to_connect=*/true);
    }
  };
}

}  // namespace pscluster::coord
