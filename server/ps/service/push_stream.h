// PushDenseStream on gRPC's callback API (read_whole.h): a dense push too large for one
// message, received whole, each chunk checked, charged and scanned as it comes and its
// bytes kept as received (no copy), then applied at once through the shard's write path,
// all or nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/ps.pb.h"
#include "server/ps/service/read_whole.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/table/dense_table.h"

namespace pscluster::ps {

class PushStream final : public ReadWhole {
 public:
  // `resp`: where the call's answer goes (gRPC's).
  PushStream(ShardCore* core, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp);
  ~PushStream() override;  // the chunks' buffers go back to the shard's pool

 private:
  absl::Status Take(const grpc::ByteBuffer& message, uint64_t index) override;
  absl::Status Apply(uint64_t messages) override;
  void DropHeld() override { ReturnBuffers(); }
  // The stream's table, checked against the first chunk.
  absl::Status Open();
  // Chunk `index`, whose values start `received_` values into the transfer.
  absl::Status CheckChunk(const DenseChunk& c, uint64_t index) const;
  // The tables this stream read from are still the shard's (a restore replaces them).
  absl::Status CheckSameTables() const;
  // The chunks' buffers, back to the shard's pool.
  void ReturnBuffers();

  grpc::ByteBuffer* const resp_;
  DenseChunk first_;  // the transfer's header (its bytes are buffers_[0])
  DenseTable* table_ = nullptr;
  uint64_t tables_ = 0;  // ServingGate::tables_replaced() when opened
  std::string what_;     // the stream, named in a refusal of the budget
  std::vector<std::string> buffers_;
  DenseTable::Scanned scanned_;
  uint64_t chunk_bytes_ = 1;  // the first chunk's size: later chunks' pooled buffers
  uint64_t received_ = 0, held_ = 0;
};

}  // namespace pscluster::ps
