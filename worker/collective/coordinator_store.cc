#include "worker/collective/coordinator_store.h"

#include <stdexcept>

namespace pscluster::collective {

void CoordinatorStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = client_->KvPut(prefix_ + key, std::string(data.begin(), data.end()));
  if (!s.ok()) throw std::runtime_error("rendezvous set " + prefix_ + key + ": " + s.ToString());
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  auto value = client_->KvGet(prefix_ + key, /*wait=*/true, timeout_);
  if (!value.ok())
    throw std::runtime_error("rendezvous get " + prefix_ + key + ": " + value.status().ToString());
  return std::vector<char>(value->begin(), value->end());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  for (const std::string& key : keys) {
    auto value = client_->KvGet(prefix_ + key, /*wait=*/true, absl::FromChrono(timeout));
    if (!value.ok()) {
      throw std::runtime_error("rendezvous wait " + prefix_ + key + ": " +
                               value.status().ToString());
    }
  }
}

}  // namespace pscluster::collective
