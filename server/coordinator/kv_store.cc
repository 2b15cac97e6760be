#include "server/coordinator/kv_store.h"

#include "absl/strings/match.h"
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
  auto it = values_.find(key);
  if (it == values_.end() && values_.size() >= kMaxKeys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds ", kMaxKeys, " keys already"));
  }
  const size_t replaced = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t total = total_bytes_ - replaced + key.size() + value.size();
  if (total > kMaxTotalBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store would hold ", total, " bytes of keys and values with key '", key,
                     "'; the limit is ", kMaxTotalBytes, " (a rendezvous needs a few KiB)"));
  }
  total_bytes_ = total;
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

int KvStore::DropPrefixedExcept(const std::string& prefix, const std::string& keep) {
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix);) {
    if (absl::StartsWith(it->first, keep)) {
      ++it;
      continue;
    }
    total_bytes_ -= it->first.size() + it->second.size();
    it = values_.erase(it);
    ++dropped;
  }
  return dropped;
}

size_t KvStore::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  waiting_.WakeAll(absl::OkStatus());  // each asks again, and hears of the shutdown
}

}  // namespace pscluster::coord
