// Questions about a coordinator's cluster view that workers and the coordinator both ask.
#pragma once

#include <cstdint>
#include <vector>

#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// Whether shard `shard`'s chain still has a live replica (its state is not lost).
bool ShardHolds(const ClusterView& view, int32_t shard);

// The shards whose chain lacks a live replica of theirs (one copying the head's state back,
// as after an import or a restore): until it joins, the head's death loses the shard.
std::vector<int32_t> ShortChains(const ClusterView& view);

}  // namespace pscluster::coord
