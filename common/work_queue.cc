#include "common/work_queue.h"

#include <utility>

namespace pscluster {

WorkQueue::WorkQueue(int threads) : num_threads_(threads) {}

WorkQueue::~WorkQueue() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void WorkQueue::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
  if (!started_) {
    started_ = true;
    for (int i = 0; i < num_threads_; ++i) threads_.emplace_back([this] { Loop(); });
  }
}

void WorkQueue::Loop() {
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_, absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace pscluster
