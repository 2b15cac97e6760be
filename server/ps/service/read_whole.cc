#include "server/ps/service/read_whole.h"

#include "common/grpc_status.h"

namespace pscluster::ps {

ReadWhole::ReadWhole(ShardCore* core, grpc::CallbackServerContext* ctx, WorkQueue* pool,
                     const char* cancelled)
    : core_(core),
      ctx_(ctx),
      in_flight_(&core->in_flight),
      watch_(&core->watchdog, ctx),
      pool_(pool),
      cancelled_(cancelled) {}

void ReadWhole::OnReadDone(bool ok) {
  if (!ok) {  // the client ended the stream, or it was cancelled
    watch_.Disarm();
    if (ctx_->IsCancelled()) {  // the watchdog's (idle), or the client's: nothing applied
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, cancelled_));
    }
    pool_->Post([this] { Finish(ToGrpcStatus(Apply(received_))); });
    return;
  }
  watch_.Alive();
  absl::Status taken = Take(message_, received_++);
  message_.Clear();
  if (!taken.ok()) {
    watch_.Disarm();
    return Finish(ToGrpcStatus(taken));
  }
  // The client may wait for this (ClientWriter::WaitForInitialMetadata) to know that the
  // shard has its stream and took its first message.
  if (received_ == 1) StartSendInitialMetadata();
  StartRead(&message_);
}

}  // namespace pscluster::ps
