#include "server/ps/service/transfer_stream.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace pscluster::ps {

TransferStream::TransferStream(ShardCore* core, Replicator* chain, grpc::CallbackServerContext* ctx,
                               TransferStateRequest req)
    : in_flight_(&core->in_flight),
      core_(core),
      chain_(chain),
      ctx_(ctx),
      req_(std::move(req)),
      deadline_(
          std::min(absl::FromChrono(ctx->deadline()), absl::Now() + chain->transfer_timeout())) {}

void TransferStream::Start() {
  core_->replication_pool.Post([this] { Run(); });
}

void TransferStream::Run() {
  absl::Status s;
  {
    auto joins = chain_->HoldJoins();  // before Scope: the replicator's lock order
    ShardCore::Scope scope(core_);
    s = chain_->TransferState(req_, [this](const StateTransferChunk& c) { return Write(c); });
  }
  Finish(ToGrpcStatus(s));
}

bool TransferStream::Write(const StateTransferChunk& chunk) {
  message_.Clear();  // the one before has gone; the serializer wants an empty buffer
  bool own = false;
  if (!grpc::SerializationTraits<StateTransferChunk>::Serialize(chunk, &message_, &own).ok()) {
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    writing_ = true;
  }
  StartWrite(&message_);
  auto written = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; };
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&written), deadline_)) return sent_;
  }
  // Out of time (a joiner that stopped reading, or reads too slowly): cancelled, and the
  // write ends at once, since gRPC calls OnWriteDone for a cancelled call; the transfer
  // ends with it.
  ctx_->TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&written));
  return false;
}

void TransferStream::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  sent_ = ok;
}

}  // namespace pscluster::ps
