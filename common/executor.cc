#include "common/executor.h"

#include <atomic>

namespace pscluster {

struct Executor::Batch {
  Batch(int n, const std::function<absl::Status(int)>& fn) : n(n), fn(fn), results(n) {}

  // Takes and runs items until none is left.
  void Drain() {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      results[i] = fn(i);
      absl::MutexLock lock(&mu);
      ++done;
    }
  }

  const int n;
  const std::function<absl::Status(int)>& fn;  // lives in ParallelFor's caller
  std::vector<absl::Status> results;
  std::atomic<int> next{0};
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
    std::shared_ptr<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping
      batch = std::move(queue_.back());
      queue_.pop_back();
    }
    batch->Drain();
  }
}

absl::Status Executor::ParallelFor(int n, const std::function<absl::Status(int)>& fn) {
  if (n <= 0) return absl::OkStatus();
  auto batch = std::make_shared<Batch>(n, fn);
  if (n > 1 && !threads_.empty()) {
    absl::MutexLock lock(&mu_);
    const int helpers = std::min<int>(n - 1, threads_.size());
    for (int i = 0; i < helpers; ++i) queue_.push_back(batch);
  }
  batch->Drain();
  {
    absl::MutexLock lock(&batch->mu);
    batch->mu.Await(absl::Condition(
        +[](Batch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu) { return b->done == b->n; },
        batch.get()));
  }
  for (const absl::Status& s : batch->results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pscluster
