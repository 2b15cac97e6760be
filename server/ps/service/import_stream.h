// ImportDense on gRPC's callback API (read_whole.h): a dense table's whole state for this
// shard's range, received and checked chunk by chunk into a state allocated (and charged)
// at the first chunk, then installed at once: all or nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "proto/ps.pb.h"
#include "server/ps/service/read_whole.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/table/dense_state.h"
#include "server/ps/table/dense_table.h"

namespace pscluster::ps {

// A dense table for ExportDense/ImportDense: NOT_FOUND, or FAILED_PRECONDITION for a sparse
// one. (No worker id: moving state is not a worker's push or pull.)
absl::StatusOr<DenseTable*> DenseForState(const Shard& shard, uint32_t table_id);
// Bytes of a dense table's whole state on this shard: values and optimizer slots.
uint64_t StateBytes(const DenseTable& table);

class ImportStream final : public ReadWhole {
 public:
  // Before the state replaces the table's (replicated: the chain becomes the head alone,
  // and no replica joins while *joins is held).
  using ReplaceWholeState = std::function<absl::Status(std::unique_ptr<absl::MutexLock>* joins)>;
  ImportStream(ShardCore* core, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp,
               ReplaceWholeState replace);

 private:
  absl::Status Take(const grpc::ByteBuffer& message, uint64_t index) override;
  absl::Status Apply(uint64_t messages) override;
  void DropHeld() override { builder_.reset(); }
  // The first chunk's table, its state allocated and charged.
  absl::Status Open();
  // Chunk `index` checked and copied into the state.
  absl::Status Check(const TableStateChunk& c, uint64_t index);
  absl::Status Install(ImportDenseResponse* resp);

  grpc::ByteBuffer* const resp_;
  const ReplaceWholeState replace_;
  TableStateChunk first_;  // the header every chunk repeats
  uint64_t tables_ = 0;    // ServingGate::tables_replaced() when opened
  std::unique_ptr<DenseStateBuilder> builder_;
};

}  // namespace pscluster::ps
