#include "common/cluster_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster::coord {

bool ShardHolds(const ClusterView& view, int32_t shard) {
  if (shard < 0 || shard >= view.chains_size()) return false;
  const Chain& chain = view.chains(shard);
  for (int32_t replica : chain.replicas()) {
    for (const Member& m : view.members()) {
      if (m.role() == SHARD && m.id() == shard && m.replica() == replica && m.alive()) {
        return true;
      }
    }
  }
  return false;
}

std::vector<std::string> ChainAddresses(const ClusterView& view, int32_t shard) {
  if (shard < 0 || shard >= view.chains_size()) return {};
  const Chain& chain = view.chains(shard);
  return {chain.addresses().begin(), chain.addresses().end()};
}

std::vector<int32_t> ShortChains(const ClusterView& view) {
  std::vector<int32_t> out;
  for (const Chain& chain : view.chains()) {
    for (const Member& m : view.members()) {
      if (m.role() == SHARD && m.id() == chain.shard() && m.alive() &&
          std::find(chain.replicas().begin(), chain.replicas().end(), m.replica()) ==
              chain.replicas().end()) {
        out.push_back(chain.shard());
        break;
      }
    }
  }
  return out;
}

std::vector<int32_t> RanksNotStopped(const Rollback& rollback, int32_t num_workers) {
  std::vector<int32_t> missing;
  for (int32_t r = 0; r < num_workers; ++r) {
    if (std::find(rollback.stopped_ranks().begin(), rollback.stopped_ranks().end(), r) ==
        rollback.stopped_ranks().end()) {
      missing.push_back(r);
    }
  }
  return missing;
}

std::string Generation(const ClusterView& view) {
  std::string gen;
  // A shard's state is lost only when its chain starts over (with one replica: whenever it
  // restarts); a replica that fails or joins beside a live chain changes nothing.
  for (const auto& chain : view.chains()) {
    absl::StrAppend(&gen, "s", chain.shard(), ".", chain.generation(), "-");
  }
  for (const auto& m : view.members()) {
    if (m.role() == WORKER) absl::StrAppend(&gen, "w", m.id(), ".", m.incarnation(), "-");
  }
  return gen;
}

absl::Status StillSameCluster(const ClusterView& was, const ClusterView& now, int32_t self) {
  for (const auto& m : now.members()) {
    if (!m.alive() && (m.role() == WORKER || !ShardHolds(now, m.id()))) {
      return absl::UnavailableError(
          absl::StrCat(m.role() == SHARD ? "shard " : "worker rank ", m.id(),
                       " is down (the coordinator saw its heartbeats stop)"));
    }
  }
  if (Generation(now) == Generation(was)) return absl::OkStatus();
  // Name the member that came back (declared dead, then registered again), if another.
  for (const auto& m : now.members()) {
    for (const auto& before : was.members()) {
      if (m.role() == before.role() && m.id() == before.id() &&
          m.incarnation() != before.incarnation() && !(m.role() == WORKER && m.id() == self)) {
        return absl::UnavailableError(absl::StrCat(
            m.role() == SHARD ? "shard " : "worker rank ", m.id(),
            " is down (the coordinator declared it dead; it registered again as incarnation ",
            m.incarnation(), "): rolling back with the others"));
      }
    }
  }
  return absl::UnavailableError(
      "the cluster changed generation (a member, perhaps this worker, registered again "
      "after being declared dead): rolling back with the others");
}

}  // namespace pscluster::coord
