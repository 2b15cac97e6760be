#include "server/ps/service/read_whole.h"

#include <utility>

#include "common/grpc_status.h"
#include "common/parking.h"

namespace pscluster::ps {

ReadWhole::ReadWhole(ShardCore* core, grpc::CallbackServerContext* ctx, WorkQueue* pool,
                     const char* cancelled)
    : core_(core),
      ctx_(ctx),
      charge_(&core->budget),
      in_flight_(&core->in_flight),
      watch_(&core->watchdog, ctx),
      pool_(pool),
      cancelled_(cancelled) {}

void ReadWhole::Begin() {
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
  }
  StartRead(&message_);
}

bool ReadWhole::ReadNextLocked() {
  if (reading_ || ended_ || finished_ || queue_.size() >= kAhead) return false;
  reading_ = true;
  return true;
}

void ReadWhole::OnReadDone(bool ok) {
  if (ok) watch_.Alive();
  bool read = false, drain = false;
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (ok) {
      queue_.push_back(std::move(message_));
      message_ = grpc::ByteBuffer();
    } else {
      ended_ = true;  // the client ended the stream, or it was cancelled
    }
    read = ReadNextLocked();
    drain = !draining_ && !finished_;
    draining_ = draining_ || drain;
  }
  if (read) StartRead(&message_);
  if (drain) pool_->Post([this] { Drain(); });
}

void ReadWhole::Drain() {
  for (;;) {
    grpc::ByteBuffer message;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        draining_ = false;
        if (!ended_ || reading_ || finished_) return;  // more to come, or answered
        finished_ = true;
        break;
      }
      message = std::move(queue_.front());
      queue_.pop_front();
    }
    const uint64_t index = taken_++;
    if (absl::Status s = Take(message, index); !s.ok()) return End(ToGrpcStatus(s));
    // The client may wait for this (ClientWriter::WaitForInitialMetadata) to know that
    // the shard has its stream and took its first message.
    if (index == 0) StartSendInitialMetadata();
    bool read = false;
    {
      absl::MutexLock lock(&mu_);
      read = ReadNextLocked();
    }
    if (read) StartRead(&message_);
  }
  watch_.Disarm();
  if (ctx_->IsCancelled()) {  // the watchdog's (idle), or the client's: nothing applied
    return Send(grpc::Status(grpc::StatusCode::CANCELLED, cancelled_));
  }
  if (absl::Status s = Apply(taken_); !IsParked(s)) Answer(s);
}

void ReadWhole::Answer(const absl::Status& s) { Send(ToGrpcStatus(s)); }

void ReadWhole::Send(const grpc::Status& status) {
  DropHeld();
  charge_.Release();
  Finish(status);
}

void ReadWhole::End(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    draining_ = false;
    finished_ = true;
  }
  watch_.Disarm();
  Send(status);
}

}  // namespace pscluster::ps
