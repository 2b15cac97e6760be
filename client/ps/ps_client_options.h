// PsClientOptions: what a PsClient connects to and how it calls (client/ps/ps_client.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"

namespace pscluster {

struct PsClientOptions {
  std::vector<std::string> shard_addresses;  // index = shard id, e.g. "127.0.0.1:5000"
  // Replicated shards (ps_coordinator --replicas > 1): each shard's replicas, head first (the
  // view's chains). A replica that does not take a call (dead, or no longer the head) sends
  // the client on to the next one, with the call's request id. Empty: shard_addresses.
  std::vector<std::vector<std::string>> shard_replicas;
  // With shard_replicas: where shard s's chain is now, asked after the replica at
  // `unreachable` did not take a call (the resolver may report it to the coordinator).
  // Answers the chain as the cluster's view has it (head first; it may wait a moment for
  // the view to change), or an error that ends the call: the shard's state is gone (every
  // replica died) or this client's cluster has moved on. An empty chain: no news, the
  // next replica is tried. Unset: the chains above are all there is.
  std::function<absl::StatusOr<std::vector<std::string>>(int shard, const std::string& unreachable)>
      resolve_chain;
  int32_t worker_id = 0;
  absl::Duration rpc_timeout = absl::Seconds(60);                 // deadline of every RPC
  uint64_t chunk_bytes = uint64_t{1} << 20;                       // dense stream chunk size
  uint64_t max_message_bytes = (uint64_t{4} << 20) + (64 << 10);  // gRPC limit, both ways
  // Pulls that wait in a shard (BSP, SSP) wait in slices of `wait_slice`; after each
  // slice, `wait_check` (if set) says whether to go on waiting (OK) or to give up (its
  // error, e.g. a member the coordinator declared dead), bounded by rpc_timeout overall.
  absl::Duration wait_slice = absl::Seconds(2);
  std::function<absl::Status()> wait_check;
  Security security;  // TLS and token of the calls (default: plaintext)
  // The ps-client-id metadata of every call (empty: NewClientId()): the shards tell clients
  // apart by it, e.g. for a restore that must not roll back under another client's run.
  std::string client_id;
};

}  // namespace pscluster
