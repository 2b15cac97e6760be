// Replicator: a member taking the updates its predecessor hands
// on (the Replicate RPC).
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/replication/replicator.h"

namespace pscluster::ps {

grpc::Status Replicator::Receive(grpc::ServerContext* ctx,
                                 grpc::ServerReader<ReplicatedUpdate>* reader,
                                 const StreamHooks& hooks) {
  ReplicatedUpdate update;
  if (!reader->Read(&update)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Replicate carried no update");
  }
  if (absl::Status s = stopped(); !s.ok()) return ToGrpcStatus(s);
  const absl::Time deadline =
      std::min(absl::FromChrono(ctx->deadline()), absl::Now() + options_.forward_timeout);
  std::vector<std::string> chunks;
  if (grpc::Status s = ReadRest(ctx, reader, hooks, update, &chunks); !s.ok()) return s;
  // An update is applied only once its sender has sent all of it and ended the stream: one
  // that gives up before (or is idle too long: the service's watch) changes nothing here.
  if (hooks.read) hooks.read();
  if (ctx->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the Replicate call was cancelled before its sender ended it; "
                        "nothing was applied");
  }
  const uint64_t seq = update.seq();
  absl::StatusOr<Turn> turn = AwaitTurn(update, deadline);
  if (!turn.ok() || *turn == Turn::kHeld) return ToGrpcStatus(turn.status());
  if (*turn == Turn::kApply) {
    absl::ReaderMutexLock serving(serving_);
    absl::Status s = log_.AppendAt(
        seq, update.request_id(),
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CheckSenderLocked(update); },
        [&]() -> absl::Status {
          absl::Status s = apply_(update, &chunks);
          if (s.ok()) return s;
          // Refused here, it changed nothing here: not applied, not acknowledged. Sent by
          // a head that applied it, the head cannot hand it on and stops (Forward), and the
          // chain goes on without it; sent by anyone else, it is refused and this replica
          // goes on.
          return absl::Status(s.code(),
                              absl::StrCat(Name(), ": update ", seq, " refused: ", s.message()));
        });
    if (!s.ok()) return ToGrpcStatus(s);
  }
  absl::Status s = Forward(std::move(update), &chunks, /*from_head=*/false);
  if (s.ok()) log_.Done(seq);
  return ToGrpcStatus(s);
}

absl::Status Replicator::CheckSenderLocked(const ReplicatedUpdate& update) const {
  const Place p = PlaceLocked();
  if (update.epoch() < p.epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(), " is at chain epoch ", p.epoch, "; the update comes from epoch ",
                     update.epoch(), ": the sender's chain is out of date"));
  }
  if (update.epoch() > p.epoch) {
    return absl::UnavailableError(absl::StrCat(Name(), " is at chain epoch ", p.epoch,
                                               ", behind the update's ", update.epoch(),
                                               "; retry once it has caught up"));
  }
  if ((!p.in_chain && !p.learning) || p.head) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(), " takes no updates from another member in chain epoch ", p.epoch,
                     p.head ? " (it is the head)" : " (it is not in the chain, nor joining it)"));
  }
  return absl::OkStatus();
}

grpc::Status Replicator::ReadRest(grpc::ServerContext* ctx,
                                  grpc::ServerReader<ReplicatedUpdate>* reader,
                                  const StreamHooks& hooks, const ReplicatedUpdate& update,
                                  std::vector<std::string>* chunks) {
  if (!update.stream()) {
    if (ReplicatedUpdate more; reader->Read(&more)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Replicate update that is not a stream is one message; another "
                          "followed it");
    }
    return grpc::Status::OK;
  }
  // A sender this replica takes nothing from (an old head, an outsider) is refused before
  // its stream's chunks are read; the rest hold at most the push's total_length values.
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSenderLocked(update);
        s.code() == absl::StatusCode::kFailedPrecondition) {
      return ToGrpcStatus(s);
    }
  }
  if (!update.has_push_dense()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a Replicate stream must begin with a push_dense");
  }
  auto hold = [&](uint64_t bytes) {
    return hooks.hold ? ToGrpcStatus(hooks.hold(bytes)) : grpc::Status::OK;
  };
  const uint64_t declared = update.push_dense().total_length();
  uint64_t values = update.push_dense().data().size() / sizeof(float);
  uint64_t held = update.push_dense().data().capacity();
  const uint64_t declared_bytes = declared > UINT64_MAX / sizeof(float)
                                      ? UINT64_MAX  // (no budget holds it)
                                      : declared * sizeof(float);
  if (grpc::Status s = hold(std::max(declared_bytes, held)); !s.ok()) return s;
  for (ReplicatedUpdate c; reader->Read(&c);) {
    if (!c.has_chunk()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Replicate stream's later messages must hold only a chunk");
    }
    values += c.chunk().data().size() / sizeof(float);
    if (values > declared) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("a Replicate stream carries more than its push's "
                                       "total_length=",
                                       declared, " values"));
    }
    held += c.chunk().data().capacity();
    if (grpc::Status s = hold(held); !s.ok()) return s;
    chunks->push_back(std::move(*c.mutable_chunk()->mutable_data()));
  }
  if (values != declared && !ctx->IsCancelled()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the Replicate stream ended after ", values,
                     " of its push's total_length=", declared, " values; nothing was applied"));
  }
  return grpc::Status::OK;
}

absl::StatusOr<Replicator::Turn> Replicator::AwaitTurn(const ReplicatedUpdate& update,
                                                       absl::Time deadline) {
  absl::Status sender;
  {
    absl::MutexLock lock(&mu_);
    sender = CheckSenderLocked(update);
  }
  // This replica may be behind the sender's chain epoch: ask the coordinator (not under mu_:
  // refresh calls Update).
  if (sender.code() == absl::StatusCode::kUnavailable && options_.refresh) options_.refresh();
  const uint64_t seq = update.seq();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked(update));
  if (seq <= log_.applied()) {
    // Handed on again after a member failed: it is here already. Not acknowledged yet, its
    // first trip down the chain may still be under way, or may have failed (this replica's
    // place changed meanwhile, as when a joiner becomes the tail): hand it on again; the
    // members after this one skip it if they hold it.
    return log_.IsDone(seq) ? Turn::kHeld : Turn::kHandOn;
  }
  const int64_t epoch = update.epoch();
  auto turn = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return log_.applied() + 1 >= seq || config_.epoch != epoch;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
    return absl::UnavailableError(absl::StrCat(Name(), ": update ", seq, " waited for update ",
                                               log_.applied() + 1, ", which has not arrived"));
  }
  return Turn::kApply;
}

}  // namespace pscluster::ps
