// A fixed pool of threads for fan-out (one blocking call per shard, one per tensor)
// without starting threads per call. The caller runs the first item while the pool takes
// the others; items still queued when it is done it runs itself. So ParallelFor is safe
// to nest: a pool busy with outer items never deadlocks an inner fan-out, it only runs it
// with fewer helpers.
//
// Thread-safe. The destructor waits for the pool threads (every ParallelFor must have
// returned).
#pragma once

#include <deque>
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
  struct Item {
    std::shared_ptr<Batch> batch;
    int index = 0;
  };
  void Loop();

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);  // items no thread has taken yet
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pscluster
