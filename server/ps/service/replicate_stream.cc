#include "server/ps/service/replicate_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/parse_errors.h"
#include "common/status_macros.h"
#include "server/ps/service/raw_unary.h"

namespace pscluster::ps {
namespace {

// The update's wait for its turn and its trip down the chain: the replicator's bound, or
// the sender's deadline if sooner.
absl::Time TurnDeadline(Replicator* chain, const grpc::CallbackServerContext* ctx) {
  const absl::Time sender = absl::FromChrono(ctx->deadline());
  return chain == nullptr ? sender : std::min(sender, chain->OperationDeadline());
}

}  // namespace

ReplicateStream::ReplicateStream(ShardCore* core, Replicator* chain,
                                 grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp)
    : ReadWhole(core, ctx, &core->replication_pool,
                "the Replicate call was cancelled before its sender ended it; nothing was "
                "applied"),
      chain_(chain),
      resp_(resp),
      turn_(ctx, TurnDeadline(chain, ctx), &core->replication_pool, &core->in_flight,
            [this] { Run(); }) {}

absl::Status ReplicateStream::Take(const grpc::ByteBuffer& message, uint64_t index) {
  if (index == 0) return TakeFirst(message);
  if (!update_.stream()) {
    return absl::InvalidArgumentError(
        "a Replicate update that is not a stream is one message; another followed it");
  }
  return TakeChunk(message);
}

absl::Status ReplicateStream::TakeFirst(const grpc::ByteBuffer& message) {
  if (chain_ == nullptr) return NotReplicated();
  RETURN_IF_ERROR(chain_->CheckPeer(*ctx_, "Replicate"));
  if (!ParseRaw(message, &update_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("/pscluster.ps.ShardReplication/Replicate: ", kUnparsableRequest));
  }
  RETURN_IF_ERROR(chain_->CheckFirst(update_));
  if (!update_.stream()) return absl::OkStatus();
  // A streamed update is held whole until applied, as a client's push stream: charged to
  // the shard's budget, its declared size before any chunk is read.
  declared_ = update_.push_dense().total_length();
  values_ = update_.push_dense().data().size() / sizeof(float);
  held_ = update_.push_dense().data().capacity();
  const uint64_t declared_bytes = declared_ > UINT64_MAX / sizeof(float)
                                      ? UINT64_MAX  // (no budget holds it)
                                      : declared_ * sizeof(float);
  return charge_.GrowTo(std::max(declared_bytes, held_),
                        "a Replicate stream from the previous replica");
}

absl::Status ReplicateStream::TakeChunk(const grpc::ByteBuffer& message) {
  ReplicatedUpdate c;
  if (!ParseRaw(message, &c) || !c.has_chunk()) {
    return absl::InvalidArgumentError("a Replicate stream's later messages must hold only a chunk");
  }
  values_ += c.chunk().data().size() / sizeof(float);
  if (values_ > declared_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Replicate stream carries more than its push's total_length=", declared_, " values"));
  }
  held_ += c.chunk().data().capacity();
  RETURN_IF_ERROR(charge_.GrowTo(held_, "a Replicate stream from the previous replica"));
  chunks_.push_back(std::move(*c.mutable_chunk()->mutable_data()));
  return absl::OkStatus();
}

absl::Status ReplicateStream::Apply(uint64_t messages) {
  if (messages == 0) return absl::InvalidArgumentError("Replicate carried no update");
  if (update_.stream() && values_ != declared_) {
    return absl::InvalidArgumentError(absl::StrCat("the Replicate stream ended after ", values_,
                                                   " of its push's total_length=", declared_,
                                                   " values; nothing was applied"));
  }
  Run();
  return Parked();  // Run answers
}

void ReplicateStream::Run() {
  bool parked = false;
  absl::Status s = turn_.Step(
      [this](const Wait& wait) { return chain_->Receive(&update_, &chunks_, wait); }, &parked);
  if (parked) return;
  bool own = false;
  if (s.ok()) {
    s = FromGrpcStatus(
        grpc::SerializationTraits<ReplicateResponse>::Serialize(ReplicateResponse(), resp_, &own));
  }
  Answer(s);
}

}  // namespace pscluster::ps
