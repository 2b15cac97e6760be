#include "server/coordinator/kv_store.h"

#include "absl/strings/str_cat.h"

namespace pscluster::coord {

absl::Status KvStore::Put(const std::string& key, std::string value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value of key '", key, "' has ", value.size(),
                                                     " bytes; the limit is ", kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  if (values_.size() >= kMaxKeys && !values_.count(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds ", kMaxKeys, " keys already"));
  }
  values_[key] = std::move(value);
  waiting_.WakeReady([&](const std::string& k) { return k == key; });
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key, bool wait, const Wait& how) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return shutdown_ || present(); };
  if (present()) return values_.at(key);
  if (!wait) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
  if (AwaitOrPark(&mu_, absl::Condition(&done), how, key, &waiting_)) return Parked();
  if (present()) return values_.at(key);
  if (shutdown_) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator is shutting down while waiting for key '", key, "'; retry"));
  }
  return absl::DeadlineExceededError(absl::StrCat("waited for key '", key, "' to be set"));
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  waiting_.WakeAll(absl::OkStatus());  // each asks again, and hears of the shutdown
}

}  // namespace pscluster::coord
