#include "common/cluster_view.h"

#include <algorithm>

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

}  // namespace pscluster::coord
