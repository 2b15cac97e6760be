// Runs a few blocking calls at once (one per shard, one per tensor) and collects the
// first error. Threads are started per call: meant for a handful of RPCs, not a pool.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace pscluster {

// Runs fn(0..n-1) concurrently (fn(0) on the calling thread) and returns the first error,
// in index order.
inline absl::Status RunConcurrently(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back([&, i] { results[i] = fn(i); });
  if (n > 0) results[0] = fn(0);
  for (auto& t : threads) t.join();
  for (const auto& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pscluster
