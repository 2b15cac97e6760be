// A fixed pool of threads for fan-out (one blocking call per shard, one per tensor)
// without starting threads per call. ParallelFor is safe to nest: the calling thread
// runs the items no pool thread has taken, so a pool busy with outer items never
// deadlocks an inner fan-out; it only runs it with fewer helpers.
//
// Thread-safe. The destructor waits for the pool threads (every ParallelFor must have
// returned).
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs fn(0..n-1), concurrently on the pool and the calling thread, and returns the
  // first error in index order once every call has returned.
  absl::Status ParallelFor(int n, const std::function<absl::Status(int)>& fn);

 private:
  struct Batch;
  void Loop();

  absl::Mutex mu_;
  std::vector<std::shared_ptr<Batch>> queue_ ABSL_GUARDED_BY(mu_);  // helper tickets
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pscluster
