// How the ranks of a group find each other before they talk: a key-value store that every
// rank can write and wait on. Gloo (communicator.h) and NCCL (nccl_communicator.h) both
// rendezvous through it. In a cluster it is the coordinator's key-value store
// (coordinator_rendezvous.h); ranks that share a process (tests, benchmarks) share a
// MemoryRendezvous.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster::collective {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Put(const std::string& key, const std::string& value) = 0;
  // The value put under `key`, waiting up to `timeout` for it; DEADLINE_EXCEEDED if none came.
  virtual absl::StatusOr<std::string> WaitGet(const std::string& key, absl::Duration timeout) = 0;
};

// In memory, for ranks in one process. Thread-safe.
class MemoryRendezvous final : public Rendezvous {
 public:
  absl::Status Put(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> WaitGet(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous: nothing was put under ", key,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::collective
