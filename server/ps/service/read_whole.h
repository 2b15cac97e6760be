// A client stream on gRPC's callback API that is received whole before anything of it is
// applied (a push stream, an import). Each message is handed to Take as it comes, on
// gRPC's thread: it checks the message and keeps what it needs, and never waits long. Once
// the client has ended the stream, Apply runs on a pool (it may wait: a chain's round trip,
// the tables' locks) and answers the call. The initial metadata goes once the first
// message is taken. An error from Take ends the call at once; a
// stream its client cancels, or that the watchdog cancels for going quiet, applies nothing.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/graceful_shutdown.h"
#include "common/work_queue.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/shard_core.h"
#include "server/ps/service/stream_watchdog.h"

namespace pscluster::ps {

class ReadWhole : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // Starts reading: call once the derived reactor is whole.
  void Begin() { StartRead(&message_); }

  void OnReadDone(bool ok) final;
  void OnDone() final { delete this; }

 protected:
  // `cancelled`: what a cancelled stream answers (it names the stream).
  ReadWhole(ShardCore* core, grpc::CallbackServerContext* ctx, WorkQueue* pool,
            const char* cancelled);
  ~ReadWhole() override = default;

  // Message `index` of the stream.
  virtual absl::Status Take(const grpc::ByteBuffer& message, uint64_t index) = 0;
  // After the last of `messages` messages, on the pool; fills in the call's answer.
  virtual absl::Status Apply(uint64_t messages) = 0;

  ShardCore* const core_;
  grpc::CallbackServerContext* const ctx_;

 private:
  InFlightCounter::Scope in_flight_;  // until the call is done, for a graceful shutdown
  StreamWatchdog::Watch watch_;
  WorkQueue* const pool_;
  const char* const cancelled_;
  grpc::ByteBuffer message_;
  uint64_t received_ = 0;
};

}  // namespace pscluster::ps
