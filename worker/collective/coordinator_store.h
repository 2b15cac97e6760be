// Gloo's rendezvous store (and NCCL's, below) on the coordinator's key-value store: how the ranks
// of a cluster find each other for collectives. Keys are namespaced by `prefix` (e.g. the mode
// switch's generation). Thread-compatible, like Gloo's other stores.
#pragma once

#include <string>
#include <vector>

#include "client/coordinator/coordinator_client.h"
#include "gloo/rendezvous/store.h"
#include "worker/collective/nccl_communicator.h"

namespace pscluster::collective {

class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  // `client` must outlive the store.
  CoordinatorStore(CoordinatorClient* client, std::string prefix, absl::Duration timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  // Gloo's Store interface reports failures by exception; Gloo turns them into its own.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  CoordinatorClient* const client_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

// NCCL's rendezvous (rank 0 publishes the unique id) on the coordinator's key-value store.
class CoordinatorKeyValue final : public KeyValue {
 public:
  explicit CoordinatorKeyValue(CoordinatorClient* client) : client_(client) {}
  absl::Status Put(const std::string& key, const std::string& value) override {
    return client_->KvPut(key, value);
  }
  absl::StatusOr<std::string> WaitGet(const std::string& key, absl::Duration timeout) override {
    return client_->KvGet(key, /*wait=*/true, timeout);
  }

 private:
  CoordinatorClient* const client_;
};

}  // namespace pscluster::collective
