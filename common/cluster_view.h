// Questions about a coordinator's cluster view that workers and the coordinator both ask.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// Whether shard `shard`'s chain still has a live replica (its state is not lost).
bool ShardHolds(const ClusterView& view, int32_t shard);

// The shards whose chain lacks a live replica of theirs (one copying the head's state back,
// as after an import or a restore): until it joins, the head's death loses the shard.
std::vector<int32_t> ShortChains(const ClusterView& view);

// The worker ranks of [0, num_workers) that `rollback` does not list as stopped, ascending.
std::vector<int32_t> RanksNotStopped(const Rollback& rollback, int32_t num_workers);

// The generation of a cluster view: every worker's incarnation and every shard chain's
// generation, so the workers of one (re)formed cluster agree on names for their rendezvous.
std::string Generation(const ClusterView& view);

// The rendezvous keys of a generation start with RendezvousPrefix(generation), all under
// kRendezvousRoot: the coordinator drops those of generations that are over.
inline constexpr char kRendezvousRoot[] = "gen/";
inline std::string RendezvousPrefix(const std::string& generation) {
  return kRendezvousRoot + generation + "/";
}

// Whether a wait that began in view `was` (a BSP step waiting for a worker's push, a
// collective, a checkpoint's capture) may go on in view `now`: UNAVAILABLE naming the
// worker, or the shard whose chain lost its state, that is down, or the member that came
// back as a new incarnation (not worker `self`: the asker itself), when the generation
// changed; OK otherwise.
// Shard `shard`'s chain in `view`: its replicas' addresses, head first (empty: no chain).
std::vector<std::string> ChainAddresses(const ClusterView& view, int32_t shard);

absl::Status StillSameCluster(const ClusterView& was, const ClusterView& now, int32_t self = -1);

}  // namespace pscluster::coord
