// The shard's state machine: each mutation a client can make, applied to the tables. A
// handler checks a request, then hands one of these to ServingGate::Write; a chain's other
// replicas apply the same update through Apply. Each is all or nothing: an error leaves the
// tables as they were.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/ps.pb.h"
#include "server/ps/table/dense_table.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

class Commands {
 public:
  Commands(Shard* shard, uint64_t max_chunk_bytes)
      : shard_(shard), max_chunk_bytes_(max_chunk_bytes) {}

  // An update that came down the chain (chunks: a push stream's bytes after the first
  // message's, handed back for the next replica).
  absl::Status Apply(const ReplicatedUpdate& update, std::vector<std::string>* chunks);

  // The typed commands. The handlers of a shard alone call these directly: building the
  // update message would copy every request's bytes once more.
  absl::Status PushDense(const DenseChunk& chunk, PushDenseResponse* resp);
  // Every chunk checked, then applied under all the tables' locks at once.
  absl::Status PushBatch(const DenseBatch& batch, PushDenseBatchResponse* resp);
  // A push stream's transfer: `first`'s header, the chunks' values in order; `scanned`, as
  // the receiving handler scanned them (empty: scanned here).
  absl::Status PushStreamed(const DenseChunk& first, const std::vector<std::string>& buffers,
                            DenseTable::Scanned scanned, PushDenseResponse* resp);
  absl::Status PushSparse(const SparseRequest& req, PushSparseResponse* resp);

 private:
  absl::Status ApplyStreamed(const ReplicatedUpdate& u, std::vector<std::string>* chunks);
  // A batch's every chunk checked, its table found and its values scanned, in order.
  absl::Status CheckBatch(const DenseBatch& batch, std::vector<DenseTable*>* tables,
                          std::vector<DenseTable::Scanned>* scanned) const;

  Shard* const shard_;
  const uint64_t max_chunk_bytes_;
};

}  // namespace pscluster::ps
