// Pulls parked until their table is readable at their step: how the callback handlers wait
// for BSP/SSP without holding a thread each. A Table keeps the list under its lock and wakes
// the waiters its clock now lets read after every change to the clock. Wake runs under the
// table's lock, so a waiter only hands its call on (to a pool) and never reads the table.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace pscluster::ps {

class PullWaiter {
 public:
  virtual ~PullWaiter() = default;
  // The table is readable at the step now (`why` OK), or it shut down or went away (`why`
  // says so, and is the pull's answer).
  virtual void Wake(const absl::Status& why) = 0;
};

// Not thread-safe: the owning Table guards it with its mutex.
class PullWaiters {
 public:
  // A waiter that is gone by the time it would be woken (its call ended) is skipped.
  void Park(int64_t step, std::weak_ptr<PullWaiter> waiter) {
    parked_.emplace_back(step, std::move(waiter));
  }
  // Wakes, and forgets, every waiter whose step ready(step) admits, and those that are gone.
  template <typename Ready>
  void WakeReady(Ready ready, const absl::Status& why = absl::OkStatus()) {
    if (parked_.empty()) return;
    size_t kept = 0;
    for (size_t i = 0; i < parked_.size(); ++i) {
      std::shared_ptr<PullWaiter> alive = parked_[i].second.lock();
      if (alive == nullptr) continue;
      if (ready(parked_[i].first)) {
        alive->Wake(why);
        continue;
      }
      if (kept != i) parked_[kept] = std::move(parked_[i]);
      ++kept;
    }
    parked_.resize(kept);
  }
  void WakeAll(const absl::Status& why) {
    WakeReady([](int64_t) { return true; }, why);
  }
  // The waiters whose calls have not ended.
  size_t size() const {
    size_t n = 0;
    for (const auto& [step, waiter] : parked_) n += waiter.expired() ? 0 : 1;
    return n;
  }

 private:
  std::vector<std::pair<int64_t, std::weak_ptr<PullWaiter>>> parked_;
};

}  // namespace pscluster::ps
