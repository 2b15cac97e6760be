// A client stream on gRPC's callback API that is received whole before anything of it is
// applied (a push stream, an import, a replicated update). Each message is handed to Take
// in order, on a pool: it checks the message and keeps what it needs. Once the client has
// ended the stream, Apply runs (on the pool too: it may wait for a chain's round trip or the
// tables' locks) and answers the call. An error from Take ends the call at once; a stream its
// client cancels, or that the watchdog cancels for going quiet, applies nothing. The initial
// metadata goes once the first message is taken. What the stream held is given back to the
// shard's budget before its answer goes: a client that has the answer finds the bytes free.
//
// gRPC receives the next message while Take works on one (at most kAhead wait). A 64 MiB
// push received this way runs as fast as on the synchronous API, once its chunks land in
// pooled buffers (bench/history/2026-12-06-push-stream-callback.md).
#pragma once

#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/graceful_shutdown.h"
#include "common/work_queue.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/service/shard_core.h"
#include "server/ps/service/stream_watchdog.h"

namespace pscluster::ps {

class ReadWhole : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // Starts reading: call once the derived reactor is whole.
  void Begin();

  void OnReadDone(bool ok) final;
  void OnDone() final { delete this; }

 protected:
  // `cancelled`: what a cancelled stream answers (it names the stream).
  ReadWhole(ShardCore* core, grpc::CallbackServerContext* ctx, WorkQueue* pool,
            const char* cancelled);
  ~ReadWhole() override = default;

  // Message `index` of the stream.
  virtual absl::Status Take(const grpc::ByteBuffer& message, uint64_t index) = 0;
  // After the last of `messages` messages; fills in the call's answer. Parked(): the
  // reactor answers later itself (Answer).
  virtual absl::Status Apply(uint64_t messages) = 0;
  void Answer(const absl::Status& s);
  // Lets go of the memory the stream holds (its buffers); runs once, just before the answer.
  virtual void DropHeld() {}

  ShardCore* const core_;
  grpc::CallbackServerContext* const ctx_;
  RequestBudget::Charge charge_;  // what the stream holds, in the shard's budget

 private:
  static constexpr size_t kAhead = 2;  // messages received and not taken yet, at most
  // Takes the queued messages in order (one Drain at a time), then answers once the
  // stream has ended.
  void Drain();
  // Starts the next read if one may start now; under mu_, acted on after (StartRead).
  bool ReadNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(const grpc::Status& status);
  // The answer, once what the stream held is given back.
  void Send(const grpc::Status& status);

  InFlightCounter::Scope in_flight_;  // until the call is done, for a graceful shutdown
  StreamWatchdog::Watch watch_;
  WorkQueue* const pool_;
  const char* const cancelled_;
  grpc::ByteBuffer message_;  // the read in progress
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // the client ended (or lost) the stream
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // a Drain is posted or running
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t taken_ = 0;  // Drain's
};

}  // namespace pscluster::ps
