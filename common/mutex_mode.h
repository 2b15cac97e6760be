// Debian builds Abseil without NDEBUG, which leaves absl::Mutex's deadlock detection on:
// every lock and unlock updates a graph of lock order and records stack traces (1-2 % of
// all CPU in a PS training run, perf). The daemons turn it off first thing, as a release
// build of Abseil has it; the tests keep it.
#pragma once

#include "absl/synchronization/mutex.h"

namespace pscluster {

inline void NoMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace pscluster
