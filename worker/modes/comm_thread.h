// The placements' communication thread (ALLREDUCE, PS).
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pscluster::modes::internal {

// One thread that runs posted work in order, while the poster goes on: ALLREDUCE's
// all-reduces of a step's buckets as the backward pass fills them (PyTorch's c10d Work, in
// its simplest form), PS mode's push/pull of a step while the next step computes. Wait()
// returns once everything posted so far has run, with the first error; later work posted
// before that Wait is skipped. Wait is bounded when the work is (each all-reduce by the
// communicator's timeout, each PS call by the client's deadline). The destructor runs what
// is still posted, then joins.
class CommThread {
 public:
  CommThread() : thread_([this] { Loop(); }) {}
  ~CommThread() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  void Post(std::function<absl::Status()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](CommThread* t)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->queue_.empty() && !t->running_; },
        this));
    absl::Status first = std::move(first_error_);
    first_error_ = absl::OkStatus();
    return first;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(
          +[](CommThread* t)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stopping_ || !t->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<absl::Status()> fn = std::move(queue_.front());
      queue_.pop_front();
      if (!first_error_.ok()) continue;  // the step failed: its later buckets are moot
      running_ = true;
      mu_.Unlock();
      absl::Status s = fn();
      mu_.Lock();
      running_ = false;
      if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pscluster::modes::internal
