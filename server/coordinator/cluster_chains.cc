// ClusterState's shard chains (proto Chain): who joins a chain, who leaves it, and the
// replicas' own calls that change it. Split from cluster_state.cc, whose lock they share.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {

bool ClusterState::ChainAliveLocked(int32_t shard, int32_t except) const {
  auto chain = chains_.find(shard);
  if (chain == chains_.end()) return false;
  for (int32_t r : chain->second.replicas()) {
    if (r == except) continue;
    auto it = members_.find({SHARD, shard, r});
    if (it != members_.end() && it->second.alive()) return true;
  }
  return false;
}

void ClusterState::JoinChainLocked(const Member& m) {
  Chain& chain = chains_[m.id()];
  chain.set_shard(m.id());
  // Live members of the chain besides m (which registered anew).
  const bool others_alive = ChainAliveLocked(m.id(), /*except=*/m.replica());
  if (formed_.count(m.id()) && others_alive) {
    LogInfo(
        "coordinator: shard %d replica %d waits outside its chain (the chain holds "
        "the state; it joins by a state transfer from the tail)",
        m.id(), m.replica());
    return;
  }
  if (formed_.count(m.id())) {
    // Every member is gone, and with them the state: a chain of a new generation, of m
    // alone (the others would join with no state; they wait outside it).
    chain.clear_replicas();
    chain.set_generation(chain.generation() + 1);
    if (options_.replicas > 1) shard_map_version_ = version_ + 1;
  }
  std::vector<int32_t> replicas(chain.replicas().begin(), chain.replicas().end());
  if (std::find(replicas.begin(), replicas.end(), m.replica()) == replicas.end()) {
    replicas.push_back(m.replica());
  }
  std::sort(replicas.begin(), replicas.end());
  chain.clear_replicas();
  for (int32_t r : replicas) chain.add_replicas(r);
  chain.set_epoch(chain.epoch() + 1);
  if (chain.replicas_size() == options_.replicas || chain.generation() > 0) formed_.insert(m.id());
}

void ClusterState::LeaveChainLocked(const Member& m, bool keep_last) {
  auto it = chains_.find(m.id());
  if (it == chains_.end()) return;
  Chain& chain = it->second;
  auto pos = std::find(chain.replicas().begin(), chain.replicas().end(), m.replica());
  if (pos == chain.replicas().end() || (keep_last && chain.replicas_size() == 1)) return;
  chain.mutable_replicas()->erase(pos);
  chain.set_epoch(chain.epoch() + 1);
  LogInfo("shard %d replica %d left its chain (epoch %lld, %d left)", m.id(), m.replica(),
          static_cast<long long>(chain.epoch()), chain.replicas_size());
}

absl::StatusOr<JoinChainResponse> ClusterState::JoinChain(const JoinChainRequest& r) {
  if (absl::Status s = CheckId(SHARD, r.shard(), r.replica()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Member* m = FindLocked(SHARD, r.shard(), r.replica());
  auto it = chains_.find(r.shard());
  if (m == nullptr || !m->alive() || it == chains_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", r.shard(), " replica ", r.replica(),
                                                      " is not a live registered replica"));
  }
  Chain& chain = it->second;
  RETURN_IF_ERROR(CheckCallerLocked("JoinChain", r.shard(), r.caller(), r.member_secret()));
  if (chain.epoch() != r.epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", r.shard(), "'s chain is at epoch ", chain.epoch(), ", not ", r.epoch(),
        ": it changed during the state transfer; start the transfer again"));
  }
  if (chain.replicas().empty() || chain.replicas(chain.replicas_size() - 1) != r.caller()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "JoinChain: shard ", r.shard(), " replica ", r.caller(),
        " is not the tail of its chain; only the tail, which sent the joiner its state, "
        "may add it"));
  }
  if (std::find(chain.replicas().begin(), chain.replicas().end(), r.replica()) !=
      chain.replicas().end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", r.shard(), " replica ", r.replica(), " is in the chain already"));
  }
  chain.add_replicas(r.replica());
  chain.set_epoch(chain.epoch() + 1);
  LogInfo(
      "coordinator: shard %d replica %d joined its chain as the tail (epoch %lld, %d "
      "replicas)",
      r.shard(), r.replica(), static_cast<long long>(chain.epoch()), chain.replicas_size());
  ChangedLocked();
  JoinChainResponse response;
  response.set_epoch(chain.epoch());
  return response;
}

absl::StatusOr<JoinChainResponse> ClusterState::ShrinkChain(const ShrinkChainRequest& r) {
  if (absl::Status s = CheckId(SHARD, r.shard(), r.replica()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckCallerLocked("ShrinkChain", r.shard(), r.replica(), r.member_secret()));
  auto it = chains_.find(r.shard());
  if (it == chains_.end() || it->second.epoch() != r.epoch() || it->second.replicas().empty() ||
      it->second.replicas(0) != r.replica()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", r.shard(), " replica ", r.replica(), " is not the head of chain epoch ",
        r.epoch(),
        it == chains_.end() ? ""
                            : absl::StrCat(" (the chain is at epoch ", it->second.epoch(), ")")));
  }
  Chain& chain = it->second;
  if (chain.replicas_size() > 1) {
    chain.clear_replicas();
    chain.add_replicas(r.replica());
    chain.set_epoch(chain.epoch() + 1);
    LogInfo(
        "coordinator: shard %d's chain is its head, replica %d, alone (epoch %lld): "
        "the head replaces its state; the others join again",
        r.shard(), r.replica(), static_cast<long long>(chain.epoch()));
    ChangedLocked();
  }
  JoinChainResponse response;
  response.set_epoch(chain.epoch());
  return response;
}

std::optional<Member> ClusterState::LiveReplicaAt(int32_t shard, const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, m] : members_) {
    if (m.role() == SHARD && m.id() == shard && m.alive() && m.address() == address) return m;
  }
  return std::nullopt;
}

bool ClusterState::DeclareUnreachable(int32_t shard, int32_t replica, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find({SHARD, shard, replica});
  if (it == members_.end() || !it->second.alive() || it->second.incarnation() != incarnation) {
    return false;
  }
  DeclareDeadLocked(&it->second);
  ChangedLocked();
  return true;
}

absl::Status ClusterState::CheckCallerLocked(const char* call, int32_t shard, int32_t replica,
                                             const std::string& secret) const {
  auto it = secrets_.find({SHARD, shard, replica});
  if (it == secrets_.end() && members_.count({SHARD, shard, replica})) return absl::OkStatus();
  if (it == secrets_.end() || it->second != secret) {
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": the caller did not prove it is shard ", shard, " replica ", replica,
        " (its member secret from registration does not match): only that replica may make "
        "this change to its chain"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::coord
