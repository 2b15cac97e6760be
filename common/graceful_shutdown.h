// Stopping a gRPC server without making operators wait. grpc::Server::Shutdown(deadline)
// waits for every client to close its connection, idle ones included, until the deadline;
// connected workers rarely do. So a server counts its handlers in progress, waits (bounded)
// for them to finish, then shuts down with an immediate deadline, which closes the idle
// connections at once. Thread-safe.
#pragma once

#include <signal.h>

#include <cstring>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"

namespace pscluster {

class InFlightCounter {
 public:
  // Held by a handler for its whole run.
  class Scope {
   public:
    explicit Scope(InFlightCounter* c) : c_(c) {
      absl::MutexLock lock(&c_->mu_);
      ++c_->count_;
    }
    ~Scope() {
      absl::MutexLock lock(&c_->mu_);
      --c_->count_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    InFlightCounter* c_;
  };

  // True when no handler was running before `deadline`.
  bool WaitIdle(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return count_ == 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  }

  int count() {
    absl::MutexLock lock(&mu_);
    return count_;
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Lets handlers in progress finish for up to `grace`, then stops the server at once.
// Returns false when some were still running at the deadline (they are cancelled).
inline bool ShutdownGracefully(grpc::Server* server, InFlightCounter* in_flight,
                               absl::Duration grace) {
  bool drained = in_flight->WaitIdle(absl::Now() + grace);
  server->Shutdown(std::chrono::system_clock::now());
  return drained;
}

// SIGTERM and SIGINT: the signals that stop a server.
inline sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// Call first in main(), before any thread starts: SIGTERM and SIGINT are then delivered
// only to ServeUntilSignal's waiting thread.
inline void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

// Waits up to `timeout` for SIGTERM or SIGINT (blocked by BlockTerminationSignals, so they
// stay pending until taken) and takes it: the signal's number, or 0 when none came.
inline int TakeTerminationSignal(absl::Duration timeout) {
  const sigset_t signals = TerminationSignals();
  const timespec ts = absl::ToTimespec(timeout);
  const int sig = sigtimedwait(&signals, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// Serves until SIGTERM or SIGINT; then sets the server's health service (if enabled) to
// NOT_SERVING, runs `before_shutdown` (e.g. fail waiting calls), drains handlers for up to
// 5 s and stops the server. A requested stop is no fault: its lines are information.
inline void ServeUntilSignal(grpc::Server* server, InFlightCounter* in_flight,
                             const std::function<void()>& before_shutdown) {
  std::thread stopper([&] {
    const sigset_t signals = TerminationSignals();
    int sig = 0;
    sigwait(&signals, &sig);
    LogInfo("signal %d (%s): shutting down", sig, strsignal(sig));
    // Health checks answer NOT_SERVING from now on (load balancers, probes stop sending).
    if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
      health->Shutdown();
    }
    if (before_shutdown) before_shutdown();
    if (!ShutdownGracefully(server, in_flight, absl::Seconds(5))) {
      LogWarning("RPCs still running after 5 s were cancelled");
    }
  });
  server->Wait();
  stopper.join();
  LogInfo("stopped");
}

}  // namespace pscluster
