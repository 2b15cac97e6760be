// A fixed pool of threads that runs posted work in order of posting: where the callback
// handlers hand work that may block (a chain's round trip, a woken pull's copy) so that
// gRPC's own threads never wait. Unlike Executor, the poster does not wait for the work.
//
// The threads start at the first Post: a queue nothing is posted to costs none.
// Thread-safe. The destructor runs what is still queued, then joins the threads.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Runs fn on a pool thread soon. Never blocks: safe under the poster's locks.
  void Post(std::function<void()> fn);

 private:
  void Loop();

  const int num_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster
