// Replicator: a member taking the updates its predecessor hands on (the Replicate RPC),
// each in its turn: an update that comes before the ones it follows parks (no thread
// waits) until the log applies the one before it.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/call_metadata.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/replication/replicator.h"

namespace pscluster::ps {

absl::Status Replicator::CheckPeer(const grpc::ServerContextBase& ctx, const char* call) const {
  const std::string key = options_.chain_key ? options_.chain_key() : "";
  if (key.empty()) return absl::OkStatus();
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kChainKeyKey);
  if (it == metadata.end() || absl::string_view(it->second.data(), it->second.size()) != key) {
    return absl::PermissionDeniedError(absl::StrCat(
        Name(), ": ", call, " from a caller without shard ", options_.shard_id,
        "'s chain key: only the shard's own replicas (registered with the coordinator) "
        "replicate to each other"));
  }
  return absl::OkStatus();
}

void Replicator::SignCall(grpc::ClientContext* ctx) const {
  if (!options_.chain_key) return;
  const std::string key = options_.chain_key();
  if (!key.empty()) ctx->AddMetadata(kChainKeyKey, key);
}

absl::Status Replicator::CheckFirst(const ReplicatedUpdate& first) {
  RETURN_IF_ERROR(stopped());
  if (!first.stream()) return absl::OkStatus();
  // A sender this replica takes nothing from (an old head, an outsider) is refused before
  // its stream's chunks are read; the rest hold at most the push's total_length values.
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSenderLocked(first);
        s.code() == absl::StatusCode::kFailedPrecondition) {
      return s;
    }
  }
  if (!first.has_push_dense()) {
    return absl::InvalidArgumentError("a Replicate stream must begin with a push_dense");
  }
  return absl::OkStatus();
}

absl::Status Replicator::Receive(ReplicatedUpdate* update, std::vector<std::string>* chunks,
                                 const Wait& wait) {
  RETURN_IF_ERROR(stopped());
  const uint64_t seq = update->seq();
  // Parked() passes through: the call runs Receive again once woken.
  ASSIGN_OR_RETURN(Turn turn, AwaitTurn(*update, wait));
  if (turn == Turn::kHeld) return absl::OkStatus();
  if (turn == Turn::kApply) RETURN_IF_ERROR(ApplyInTurn(*update, chunks));
  absl::Status s = Forward(std::move(*update), chunks, /*from_head=*/false);
  if (s.ok()) log_.Done(seq);
  return s;
}

absl::Status Replicator::ApplyInTurn(const ReplicatedUpdate& update,
                                     std::vector<std::string>* chunks) {
  const uint64_t seq = update.seq();
  absl::ReaderMutexLock serving(serving_);
  return log_.AppendAt(
      seq, update.request_id(),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CheckSenderLocked(update); },
      [&]() -> absl::Status {
        absl::Status s = apply_(update, chunks);
        if (s.ok()) return s;
        // Refused here, it changed nothing here: not applied, not acknowledged. Sent by
        // a head that applied it, the head cannot hand it on and stops (Forward), and the
        // chain goes on without it; sent by anyone else, it is refused and this replica
        // goes on.
        return absl::Status(s.code(),
                            absl::StrCat(Name(), ": update ", seq, " refused: ", s.message()));
      });
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

absl::StatusOr<Replicator::Turn> Replicator::AwaitTurn(const ReplicatedUpdate& update,
                                                       const Wait& wait) {
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
  if (AwaitOrPark(&mu_, absl::Condition(&turn), wait, TurnKey{seq, epoch}, &turns_)) {
    return Parked();
  }
  if (!turn()) {
    return absl::UnavailableError(absl::StrCat(Name(), ": update ", seq, " waited for update ",
                                               log_.applied() + 1, ", which has not arrived"));
  }
  return Turn::kApply;
}

void Replicator::WakeTurnsLocked() {
  turns_.WakeReady([&](const TurnKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return log_.applied() + 1 >= k.seq || config_.epoch != k.epoch;
  });
}

}  // namespace pscluster::ps
