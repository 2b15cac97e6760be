// The cluster's rendezvous (rendezvous.h): the coordinator's key-value store, whose KvGet
// can wait for a key. The only one the workers use, for Gloo and NCCL alike.
#pragma once

#include <string>

#include "client/coordinator/coordinator_client.h"
#include "worker/collective/rendezvous.h"

namespace pscluster::collective {

class CoordinatorRendezvous final : public Rendezvous {
 public:
  // `client` must outlive the rendezvous.
  explicit CoordinatorRendezvous(CoordinatorClient* client) : client_(client) {}
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
