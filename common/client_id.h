// The metadata naming the client that makes a call: a random id each PsClient and Python
// Cluster sends with every call, so that a shard can tell one client's pushes and pulls from
// the others' (a coordinator's restore asks the shards about every client but its caller).
#pragma once

#include <cstddef>

namespace pscluster {

inline constexpr char kClientIdKey[] = "ps-client-id";
// The bytes of an id that count; an id only tells clients apart, and a longer one is
// refused where a request carries it (RestoreCheckpointRequest.client_id).
inline constexpr size_t kMaxClientIdBytes = 64;

}  // namespace pscluster
