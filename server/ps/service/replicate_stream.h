// ShardReplication.Replicate on gRPC's callback API (read_whole.h): one update from the
// replica before this one, a unary update in one message or a streamed push in chunks,
// received whole and charged to the shard's budget as it comes. Once its sender has ended
// the call, the replicator applies it in its turn and hands it on (Replicator::Receive):
// an update that came before the one it follows parks, holding no thread, until the log
// applies that one. Applying and handing on run on the replication pool (--threads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/park_loop.h"
#include "proto/ps.pb.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/read_whole.h"
#include "server/ps/service/request_budget.h"

namespace pscluster::ps {

// What a shard outside any chain answers the replicas' calls.
inline absl::Status NotReplicated() {
  return absl::FailedPreconditionError(
      "this shard is not replicated (ps_coordinator --replicas=1, or not registered yet)");
}

class ReplicateStream final : public ReadWhole {
 public:
  // `chain`: this replica's (null: the shard is not replicated, and refuses the call).
  // `resp`: where the call's answer goes (gRPC's).
  ReplicateStream(ShardCore* core, Replicator* chain, grpc::CallbackServerContext* ctx,
                  grpc::ByteBuffer* resp);

  void OnCancel() override { turn_.Cancel(); }

 private:
  absl::Status Take(const grpc::ByteBuffer& message, uint64_t index) override;
  absl::Status Apply(uint64_t messages) override;
  void DropHeld() override { std::vector<std::string>().swap(chunks_); }
  // The first message: the update, or a stream's push_dense with its first chunk.
  absl::Status TakeFirst(const grpc::ByteBuffer& message);
  // A stream's later message: one more chunk of the push.
  absl::Status TakeChunk(const grpc::ByteBuffer& message);
  // Receive, again each time the parked update is woken (on the replication pool).
  void Run();

  Replicator* const chain_;
  grpc::ByteBuffer* const resp_;
  ReplicatedUpdate update_;
  std::vector<std::string> chunks_;  // a stream's later chunks' data
  uint64_t declared_ = 0;            // a stream: its push's total_length
  uint64_t values_ = 0, held_ = 0;   // a stream: values received, bytes held
  ParkLoop turn_;
};

}  // namespace pscluster::ps
