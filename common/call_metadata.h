// The metadata keys a client call carries, written by the C++ client (and, spelled the same,
// the Python client) and read by the shards.
#pragma once

#include <cstddef>

namespace pscluster {

// The client that makes a call: a random id each PsClient and Python Cluster sends with every
// call, so that a shard can tell one client's pushes and pulls from the others' (a
// coordinator's restore asks the shards about every client but its caller).
inline constexpr char kClientIdKey[] = "ps-client-id";
// The bytes of an id that count; an id only tells clients apart, and a longer one is
// refused where a request carries it (RestoreCheckpointRequest.client_id).
inline constexpr size_t kMaxClientIdBytes = 64;

// One logical write and every attempt of it (a retry, a failover to another replica): a
// shard that applied it answers a repeat from its record instead of applying it again
// (common/recent_ids.h).
inline constexpr char kRequestIdKey[] = "ps-request-id";

// Between the replicas of a shard (ShardReplication's calls): the shard's chain key, which
// the coordinator gives only to that shard's replicas when they register. A caller without
// it is no replica of the shard: its Replicate, TransferState and JoinedChain are refused.
inline constexpr char kChainKeyKey[] = "ps-chain-key";

}  // namespace pscluster
