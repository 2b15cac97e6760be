// How a callback handler waits without a thread (parking.h): ParkLoop runs the call's
// attempt, and when it parks, arranges to run it again once what it waits on wakes it, the
// deadline comes (a gRPC alarm) or the client cancels, on a pool, never under the waker's
// locks. Every wake-up that arrives while an attempt runs makes it run once more, so none
// is lost.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/graceful_shutdown.h"
#include "common/grpc_status.h"
#include "common/parking.h"
#include "common/work_queue.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {

// What the table's waiter list, the deadline alarm and the call share: it may outlive the
// call, and once the call has answered, waking it does nothing.
class Resumable final : public Waiter {
 public:
  Resumable(WorkQueue* pool, std::function<void()> run) : pool_(pool), run_(std::move(run)) {}
  void Wake(const absl::Status& why) override;
  bool Waiting() const override;
  // Runs `run` on the pool if parked; if it runs now, makes it run once more.
  void Poke();
  // At the end of an attempt that parked: true if it stays parked, false if a poke came
  // meanwhile (attempt again now).
  bool Park();
  // The call answered: later pokes do nothing.
  void Answered();
  // The first non-OK status a wake brought (what it waited on shut down or went away).
  absl::Status woken_with();

 private:
  enum class State { kRunning, kPoked, kParked, kAnswered };
  WorkQueue* const pool_;
  const std::function<void()> run_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kRunning;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
};

class ParkLoop {
 public:
  using Attempt = std::function<absl::Status(const Wait&)>;
  // run: what the owner does to attempt again (on the pool).
  ParkLoop(const grpc::CallbackServerContext* ctx, absl::Time deadline, WorkQueue* pool,
           InFlightCounter* in_flight, std::function<void()> run);
  // Runs attempt until it answers (returned, *parked false) or parks (*parked true: `run`
  // comes again when woken). Cancelled and woken-with-error calls answer without an attempt.
  absl::Status Step(const Attempt& attempt, bool* parked);
  // The client cancelled: a parked call answers CANCELLED.
  void Cancel() { resumable_->Poke(); }

 private:
  InFlightCounter::Scope in_flight_;  // a parked call is still in flight for shutdown
  const grpc::CallbackServerContext* const ctx_;
  const absl::Time deadline_;
  absl::Time parked_since_ = absl::InfinitePast();
  std::shared_ptr<Resumable> resumable_;
  // Made and set at the first park, for deadline_: a call that never parks (most) pays
  // nothing for it (each grpc::Alarm initialises gRPC's library).
  std::unique_ptr<grpc::Alarm> alarm_;
};

// A unary call that may park: `attempt` writes the call's answer itself, and the reactor
// finishes with its status once it answers.
class ParkedUnary final : public grpc::ServerUnaryReactor {
 public:
  ParkedUnary(grpc::CallbackServerContext* ctx, absl::Time deadline, WorkQueue* pool,
              InFlightCounter* in_flight, ParkLoop::Attempt attempt)
      : attempt_(std::move(attempt)), loop_(ctx, deadline, pool, in_flight, [this] { Run(); }) {}

  // An attempt; the first on the handler's thread, later ones on the pool.
  void Run() {
    bool parked = false;
    absl::Status s = loop_.Step(attempt_, &parked);
    if (!parked) Finish(ToGrpcStatus(s));
  }
  void OnCancel() override { loop_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  const ParkLoop::Attempt attempt_;
  ParkLoop loop_;
};

}  // namespace pscluster
