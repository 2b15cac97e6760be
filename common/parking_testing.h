// For tests of objects that park calls (common/parking.h), without gRPC: a waiter that
// records its wakes, and the Wait of a call that parks it.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/parking.h"

namespace pscluster::testing {

class CountingWaiter final : public Waiter {
 public:
  void Wake(const absl::Status& why) override {
    ++wakes;
    last = why;
  }
  bool Waiting() const override { return !answered; }
  int wakes = 0;
  bool answered = false;  // set by a test: the call has answered
  absl::Status last;      // the last wake's status
};

// A call that parks `waiter` until `deadline`.
inline Wait ParkedWait(std::shared_ptr<Waiter> waiter, absl::Time deadline) {
  Wait how;
  how.deadline = deadline;
  how.waiter = std::move(waiter);
  return how;
}

}  // namespace pscluster::testing
