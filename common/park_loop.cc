#include "common/park_loop.h"

#include <utility>

namespace pscluster {

void Resumable::Wake(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (!why.ok() && why_.ok()) why_ = why;
  }
  Poke();
}

bool Resumable::Waiting() const {
  absl::MutexLock lock(&mu_);
  return state_ != State::kAnswered;
}

void Resumable::Poke() {
  absl::MutexLock lock(&mu_);
  switch (state_) {
    case State::kParked:
      state_ = State::kRunning;
      pool_->Post(run_);
      return;
    case State::kRunning:
      state_ = State::kPoked;
      return;
    case State::kPoked:
    case State::kAnswered:
      return;
  }
}

bool Resumable::Park() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kPoked) {
    state_ = State::kRunning;
    return false;
  }
  state_ = State::kParked;
  return true;
}

void Resumable::Answered() {
  absl::MutexLock lock(&mu_);
  state_ = State::kAnswered;
}

absl::Status Resumable::woken_with() {
  absl::MutexLock lock(&mu_);
  return why_;
}

ParkLoop::ParkLoop(const grpc::CallbackServerContext* ctx, absl::Time deadline, WorkQueue* pool,
                   InFlightCounter* in_flight, std::function<void()> run)
    : in_flight_(in_flight),
      ctx_(ctx),
      deadline_(deadline),
      resumable_(std::make_shared<Resumable>(pool, std::move(run))) {}

absl::Status ParkLoop::Step(const Attempt& attempt, bool* parked) {
  for (;;) {
    absl::Status s = resumable_->woken_with();
    if (s.ok() && ctx_->IsCancelled()) {
      s = absl::CancelledError("the client cancelled the call while it waited");
    }
    if (s.ok()) {
      Wait wait;
      wait.deadline = deadline_;
      wait.waiter = resumable_;
      wait.parked_since = parked_since_;
      s = attempt(wait);
    }
    if (!IsParked(s)) {
      resumable_->Answered();
      *parked = false;
      return s;
    }
    if (parked_since_ == absl::InfinitePast()) {
      parked_since_ = absl::Now();
      // The alarm's callback may come after the call is gone: it holds the shared part only.
      alarm_ = std::make_unique<grpc::Alarm>();
      alarm_->Set(absl::ToChronoTime(deadline_), [r = resumable_](bool fired) {
        if (fired) r->Poke();
      });
    }
    if (resumable_->Park()) {
      *parked = true;
      return s;
    }
  }
}

}  // namespace pscluster
