#include "common/executor.h"

#include <algorithm>

namespace pscluster {

struct Executor::Batch {
  Batch(int n, const std::function<absl::Status(int)>& fn) : fn(fn), results(n) {}

  void Run(int i) {
    results[i] = fn(i);
    absl::MutexLock lock(&mu);
    ++done;
  }

  const std::function<absl::Status(int)>& fn;  // lives in ParallelFor's caller
  std::vector<absl::Status> results;
  absl::Mutex mu;
  int done ABSL_GUARDED_BY(mu) = 0;
};

Executor::Executor(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void Executor::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    item.batch->Run(item.index);
  }
}

absl::Status Executor::ParallelFor(int n, const std::function<absl::Status(int)>& fn) {
  if (n <= 0) return absl::OkStatus();
  auto batch = std::make_shared<Batch>(n, fn);
  if (n > 1 && !threads_.empty()) {
    absl::MutexLock lock(&mu_);
    for (int i = 1; i < n; ++i) queue_.push_back({batch, i});
  }
  batch->Run(0);
  // Items no pool thread has taken yet run here: a pool busy with outer items (a nested
  // ParallelFor) only runs this one with fewer helpers, never deadlocks it.
  std::vector<int> mine;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->batch == batch) {
        mine.push_back(it->index);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (threads_.empty()) {
    for (int i = 1; i < n; ++i) mine.push_back(i);
  }
  for (int i : mine) batch->Run(i);
  {
    absl::MutexLock lock(&batch->mu);
    batch->mu.Await(absl::Condition(
        +[](Batch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu) {
          return b->done == static_cast<int>(b->results.size());
        },
        batch.get()));
  }
  for (const absl::Status& s : batch->results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pscluster
