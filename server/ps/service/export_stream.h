// ExportDense on gRPC's callback API: the table's state is copied on the admin pool (the
// copy may wait for its step), then sent a chunk at a time, each coded once the one before
// has gone. It holds the copy, charged to the shard's budget, until the last chunk is sent.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/graceful_shutdown.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/service/shard_core.h"
#include "server/ps/table/dense_state.h"

namespace pscluster::ps {

class ExportStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // The state to send, for the request, charged to `charge`.
  using Prepare = std::function<absl::Status(const ExportDenseRequest& req,
                                             RequestBudget::Charge* charge, DenseState* state)>;
  ExportStream(ShardCore* core, ExportDenseRequest req);
  // Prepares the state (on the caller's thread), then sends it.
  void Start(const Prepare& prepare);

  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  void WriteNext();
  // The answer, once the state is freed and given back to the shard's budget: a client that
  // has the answer finds the bytes free for its next request.
  void End(const grpc::Status& status);

  InFlightCounter::Scope in_flight_;  // until the call is done, for a graceful shutdown
  RequestBudget::Charge charge_;
  const ExportDenseRequest req_;
  const uint64_t max_chunk_bytes_;
  DenseState state_;
  uint64_t done_ = 0;  // values sent
  bool last_ = false;  // the chunk being written is the last
  grpc::ByteBuffer chunk_;
};

}  // namespace pscluster::ps
