// Gloo's rendezvous store on the coordinator's key-value store: how the ranks of a
// cluster find each other for collectives. Keys are namespaced by `prefix` (e.g. the mode
// switch's generation). Thread-compatible, like Gloo's other stores.
#pragma once

#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "worker/client/coordinator_client.h"

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

}  // namespace pscluster::collective
