// ShardReplication.TransferState on gRPC's callback API: the tail's whole state, streamed
// to a joining replica. The replicator produces the stream a message at a time, and waits
// for each to be sent before the next (the joiner's pace), so it runs on the replication
// pool, never on gRPC's threads; this reactor sends what it is handed.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/graceful_shutdown.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

class TransferStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  TransferStream(ShardCore* core, Replicator* chain, grpc::CallbackServerContext* ctx,
                 TransferStateRequest req);
  // Posts the transfer to the replication pool.
  void Start();

  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // The transfer, on the pool; answers the call.
  void Run();
  // Sends one message and waits until it is sent; false if the joiner stopped reading (or
  // the transfer ran out of time: the call is cancelled then).
  bool Write(const StateTransferChunk& chunk);

  InFlightCounter::Scope in_flight_;  // until the call is done, for a graceful shutdown
  ShardCore* const core_;
  Replicator* const chain_;
  grpc::CallbackServerContext* const ctx_;
  const TransferStateRequest req_;
  const absl::Time deadline_;  // the whole transfer's
  grpc::ByteBuffer message_;   // the one being written
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;  // the last write's outcome
};

}  // namespace pscluster::ps
