// The shard's write log: the one place that numbers its mutations and answers a repeated
// request once. Every write goes through Append, on a shard alone and on a chain's head;
// a chain's other replicas take the head's numbering (AppendAt).
//
// A request id (gRPC metadata ps-request-id) names one logical client call and all its
// attempts. The log remembers the ids of its last max_request_ids entries: a repeat of one
// is not applied again, and answers with the first attempt's entry. A write that fails
// changed nothing, takes no number and leaves its id free for a retry.
//
// Ordered (a chain): entries apply one at a time, in number order, so that every replica
// replays the same sequence. Unordered (a shard alone): writes apply concurrently, and a
// repeat that comes while its first attempt still applies waits for it; a write without a
// request id takes no number (Entry.seq 0).
//
// Thread-safe. The numbers are guarded by the owner's mutex `mu` (the owner waits on them
// under it); the order lock comes before it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/recent_ids.h"

namespace pscluster::ps {

class WriteLog {
 public:
  // name: whose log, for errors ("shard 0 replica 1").
  WriteLog(std::string name, absl::Mutex* mu, size_t max_request_ids, bool ordered)
      : name_(std::move(name)), mu_(mu), ordered_(ordered), ids_(max_request_ids) {}

  struct Entry {
    uint64_t seq = 0;
    bool repeat = false;  // an earlier attempt applied it: not applied again
  };
  // Applies `apply` as the next entry, unless `request_id` (if not empty) names an entry
  // already in the log. A repeat whose first attempt still applies waits for it until
  // `deadline` (UNAVAILABLE after: retry).
  absl::StatusOr<Entry> Append(const std::string& request_id, absl::Time deadline,
                               const std::function<absl::Status()>& apply);
  // Ordered: applies the head's entry `seq`, which must be the next (UNAVAILABLE if not);
  // `admit` runs under mu first, and its error refuses the entry.
  absl::Status AppendAt(uint64_t seq, const std::string& request_id,
                        const std::function<absl::Status()>& admit,
                        const std::function<absl::Status()>& apply);

  // The last entry applied (ordered: every one before it too).
  uint64_t applied() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return applied_; }
  // Done: the entry is acknowledged (a chain: every replica after this one holds it).
  void Done(uint64_t seq);
  bool IsDone(uint64_t seq) const ABSL_SHARED_LOCKS_REQUIRED(*mu_);
  // Waits (bounded) until seq is done; false if the deadline came first.
  bool AwaitDone(uint64_t seq, absl::Time deadline);
  // Starts the log again at `applied` (done too), remembering only the ids `add` adds.
  void Reset(uint64_t applied, const std::function<void(RecentIds<uint64_t>*)>& add = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // Every remembered id, oldest first, with its entry.
  void ForEachId(const std::function<void(const std::string&, uint64_t)>& f) const
      ABSL_SHARED_LOCKS_REQUIRED(*mu_);
  // Held, no entry applies: taken before mu, to capture or replace the state entries build.
  absl::Mutex* order() { return &order_mu_; }
  // Called under mu whenever applied() changes (set once, before any entry): a chain's
  // replica wakes the updates parked for their turn (Replicator::AwaitTurn).
  void SetOnApplied(std::function<void()> on_applied) { on_applied_ = std::move(on_applied); }

 private:
  // The value of an id whose first attempt applies now (unordered logs only).
  static constexpr uint64_t kApplying = UINT64_MAX;
  // An entry of `request_id` applied before: found (true, *seq set), or none (false; the
  // id is then reserved, for an unordered log). UNAVAILABLE if its first attempt still
  // applies at `deadline`.
  absl::StatusOr<bool> FindOrReserve(const std::string& request_id, absl::Time deadline,
                                     uint64_t* seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  void AppliedLocked(uint64_t seq, const std::string& request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

  const std::string name_;
  absl::Mutex* const mu_;
  const bool ordered_;
  absl::Mutex order_mu_;  // ordered: held while an entry applies
  uint64_t applied_ ABSL_GUARDED_BY(*mu_) = 0;
  uint64_t done_through_ ABSL_GUARDED_BY(*mu_) = 0;  // every seq up to it is done
  std::set<uint64_t> done_above_ ABSL_GUARDED_BY(*mu_);
  RecentIds<uint64_t> ids_ ABSL_GUARDED_BY(*mu_);
  std::function<void()> on_applied_;
};

}  // namespace pscluster::ps
