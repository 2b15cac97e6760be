#include "server/ps/service/serving_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/call_metadata.h"

namespace pscluster::ps {

ServingGate::ServingGate(uint32_t shard_id, absl::Duration max_wait)
    : shard_id_(shard_id),
      max_wait_(max_wait),
      alone_("shard " + std::to_string(shard_id), &log_mu_, kWriteIds, /*ordered=*/false) {}

absl::Status ServingGate::CheckServing() const {
  if (!joined_) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard_id_,
        " has just started and is registering with the coordinator; retry once it has"));
  }
  Replicator* chain = replicator_.load();
  return chain == nullptr ? absl::OkStatus() : chain->CheckHead();
}

absl::Time ServingGate::Deadline(const grpc::ServerContextBase* ctx) const {
  const absl::Time now = absl::Now(), client = absl::FromChrono(ctx->deadline());
  const absl::Time answer_by = client - std::min(absl::Milliseconds(200), (client - now) / 10);
  return std::min(answer_by, now + max_wait_);
}

absl::Status ServingGate::Write(const grpc::ServerContextBase* ctx,
                                const std::function<void(ReplicatedUpdate*)>& describe,
                                std::vector<std::string>* chunks,
                                const std::function<absl::Status()>& apply) {
  if (absl::Status s = CheckServing(); !s.ok()) return s;  // (with a chain: the head)
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return alone_.Append(RequestId(ctx), Deadline(ctx), apply).status();
  ReplicatedUpdate update;
  describe(&update);
  return chain->Write(RequestId(ctx), std::move(update), chunks, apply);
}

void ServingGate::ReplaceTables(const std::function<void()>& install) {
  absl::WriterMutexLock serving(&serving_mu_);
  install();
  tables_replaced_++;
  absl::MutexLock lock(&log_mu_);
  alone_.Reset(0);
}

}  // namespace pscluster::ps
