// A small key-value store with waiting reads: the rendezvous point for collectives (a
// NCCL unique id, Gloo's store). Bounded: keys up to 256 bytes, values up to 1 MiB, at
// most 10,000 keys and 64 MiB of keys and values together; the keys of a generation that
// is over are dropped (DropPrefixedExcept). Thread-safe.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/parking.h"

namespace pscluster::coord {

class KvStore {
 public:
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;
  static constexpr size_t kMaxKeys = 10000;
  static constexpr size_t kMaxTotalBytes = size_t{64} << 20;

  // INVALID_ARGUMENT for an empty or oversized key, RESOURCE_EXHAUSTED for an oversized
  // value or a full store (naming the bound). Overwrites. A refused Put changes nothing.
  absl::Status Put(const std::string& key, std::string value);
  // Drops every key that starts with `prefix` but not with `keep` (the rendezvous of
  // generations that are over); returns how many.
  int DropPrefixedExcept(const std::string& prefix, const std::string& keep);
  size_t total_bytes() const;
  // With wait, until the key exists or the deadline (DEADLINE_EXCEEDED naming it): blocking,
  // or parked (common/parking.h: Parked(), and how.waiter woken by the Put of the key);
  // without, NOT_FOUND when absent.
  absl::StatusOr<std::string> Get(const std::string& key, bool wait, const Wait& how);
  absl::StatusOr<std::string> Get(const std::string& key, bool wait, absl::Time deadline) {
    Wait how;
    how.deadline = deadline;
    return Get(key, wait, how);
  }
  // Wakes every waiting Get, and fails later waits, with UNAVAILABLE (server shutdown).
  void Shutdown();

 private:
  mutable absl::Mutex mu_;
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // keys and values
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  Waiters<std::string> waiting_ ABSL_GUARDED_BY(mu_);  // parked Gets, by key
};

}  // namespace pscluster::coord
