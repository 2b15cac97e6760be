// Where each shard's calls go: the shard's chain of replicas, head first, as far as this
// client knows, and the replica its calls go to now. A chain changes when a call fails
// over to the next replica (Rotate) or the coordinator's view names other replicas
// (Install: a replica that rejoined on a new port, a dead one taken out).
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/ps/shard_stub.h"
#include "common/security.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace pscluster::internal {

class ShardChains {
 public:
  // chains[s]: shard s's replicas, head first (one each when not replicated).
  ShardChains(const std::vector<std::vector<std::string>>& chains, const Security& security,
              int max_message_bytes);

  int size() const { return static_cast<int>(shards_.size()); }

  // The replica calls to `shard` go to now: its stubs and address.
  ShardStub* stub(int shard) const;
  grpc::GenericStub* generic(int shard) const;
  std::string address(int shard) const;

  // How many times the shard's target changed: a failing call reads it before its attempt,
  // so that of several calls failing at once only the first moves the target on.
  uint64_t moves(int shard) const;
  // Calls go to the next replica of the chain, unless the target moved since `seen`.
  // Returns the address calls go to now.
  std::string Rotate(int shard, uint64_t seen);
  // The shard's chain is `chain` (head first, not empty): when it differs from the one
  // held, calls go to its head from now on. Whether it differed.
  bool Install(int shard, const std::vector<std::string>& chain);

 private:
  struct Replica {
    std::unique_ptr<ShardStub> stub;
    std::unique_ptr<grpc::GenericStub> generic;
  };
  struct Shard {
    std::vector<std::string> chain;
    size_t current = 0;  // index into chain
    uint64_t moves = 0;
  };
  const Replica& CurrentLocked(int shard) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ConnectLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Security security_;
  grpc::ChannelArguments args_;
  mutable absl::Mutex mu_;
  std::vector<Shard> shards_ ABSL_GUARDED_BY(mu_);
  // Every address ever named, for the client's life: calls in flight hold raw pointers to
  // these stubs, and a cluster has few addresses (one a replica start).
  std::map<std::string, Replica> replicas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::internal
