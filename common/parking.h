// Calls that wait for a condition without holding a thread: the callback handlers' way to
// wait (a BSP/SSP pull for its step, a worker for the cluster view or a rendezvous key).
// The object waited on keeps a Waiters list under its own lock and, after every change that
// may satisfy a waiter, wakes the ones it now satisfies. Wake runs under that lock, so a
// waiter only hands its call on (ParkLoop posts it to a pool) and never calls back in.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pscluster {

class Waiter {
 public:
  virtual ~Waiter() = default;
  // What the call waited for holds now (`why` OK), or never will: the object shut down or
  // went away (`why` says so, and is the call's answer).
  virtual void Wake(const absl::Status& why) = 0;
  // False once the call has answered: its entry may linger until the next wake-up, but
  // counts (pulls_parked) must not show a call whose client already has its answer.
  virtual bool Waiting() const { return true; }
};

// How a call waits: blocking the calling thread until `deadline`; or, with a `waiter`,
// parked: the call answers Parked() at once and the waiter is woken later. parked_since:
// when it first parked (InfinitePast: it has not).
struct Wait {
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<Waiter> waiter;
  absl::Time parked_since = absl::InfinitePast();
};

// The answer of a call that parked (never sent to a client).
absl::Status Parked();
bool IsParked(const absl::Status& s);

// Not thread-safe: the owner guards it with its own lock. Key: what a waiter waits for.
template <typename Key>
class Waiters {
 public:
  // A waiter that is gone by the time it would be woken (its call ended) is skipped.
  void Park(Key key, std::weak_ptr<Waiter> waiter) {
    parked_.emplace_back(std::move(key), std::move(waiter));
  }
  // Wakes, and forgets, every waiter whose key ready(key) admits, and those that are gone.
  template <typename Ready>
  void WakeReady(Ready ready, const absl::Status& why = absl::OkStatus()) {
    if (parked_.empty()) return;
    size_t kept = 0;
    for (size_t i = 0; i < parked_.size(); ++i) {
      std::shared_ptr<Waiter> alive = parked_[i].second.lock();
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
    WakeReady([](const Key&) { return true; }, why);
  }
  // The waiters whose calls have not answered.
  size_t size() const {
    size_t n = 0;
    for (const auto& entry : parked_) {
      std::shared_ptr<Waiter> alive = entry.second.lock();
      n += alive != nullptr && alive->Waiting() ? 1 : 0;
    }
    return n;
  }

 private:
  std::vector<std::pair<Key, std::weak_ptr<Waiter>>> parked_;
};

// A call's wait for `done`, under `mu` (which the caller holds), as `how` says. Blocking:
// until done or the deadline (the caller then looks at what holds). Parking: when not done
// and before the deadline, parks how.waiter in `waiters` under `key` and returns true (the
// call answers Parked()); else returns false at once.
template <typename Key>
bool AwaitOrPark(absl::Mutex* mu, const absl::Condition& done, const Wait& how, Key key,
                 Waiters<Key>* waiters) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (how.waiter == nullptr) {
    mu->AwaitWithDeadline(done, how.deadline);
    return false;
  }
  if (done.Eval() || absl::Now() >= how.deadline) return false;
  waiters->Park(std::move(key), how.waiter);
  return true;
}

}  // namespace pscluster
