// The dense pull path of ShardDataService: checking a pull, parking it until its step is
// readable (the callback handlers in reactors.cc run it again then), planning its chunks
// and coding them from the table straight into the bytes gRPC sends.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dense_wire.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/data_service.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {

absl::StatusOr<DenseTable*> ShardDataService::PreparePull(const Wait& wait,
                                                          const PullDenseRequest& req,
                                                          uint64_t* length) {
  RETURN_IF_ERROR(core_->gate.CheckServing());
  RETURN_IF_ERROR(CheckStep(req.step()));
  auto table = core_->shard->GetDense(req.table_id(), req.worker_id());
  if (!table.ok()) return table.status();
  Range range = (*table)->range();
  *length = req.length();
  if (*length == 0 && req.offset() >= range.begin && req.offset() <= range.end) {
    *length = range.end - req.offset();
  }
  RETURN_IF_ERROR((*table)->CheckRange(req.offset(), *length));
  RETURN_IF_ERROR(WaitForStep(*table, req.step(), wait));
  return table;
}

absl::Status ShardDataService::WaitForStep(Table* table, int64_t step, const Wait& wait) {
  ASSIGN_OR_RETURN(bool ready,
                   table->PullableOrPark(step, wait.deadline, wait.waiter, wait.parked_since));
  return ready ? absl::OkStatus() : Parked();
}

absl::StatusOr<ShardDataService::PullChunk> ShardDataService::PullOne(
    const Wait& wait, const PullDenseRequest& req, RequestBudget::Charge* charge) {
  uint64_t length = 0;
  ASSIGN_OR_RETURN(DenseTable * table, PreparePull(wait, req, &length));
  if (length * sizeof(float) > core_->options.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("length ", length, " values exceeds the unary limit of ",
                     core_->options.max_chunk_bytes, " bytes; use PullDenseStream"));
  }
  charge->ForceGrowTo(length * sizeof(float));  // at most max_chunk_bytes: counted, not refused
  return PlanChunk(table, req, req.offset(), length);
}

ShardDataService::PullChunk ShardDataService::PlanChunk(const DenseTable* table,
                                                        const PullDenseRequest& req,
                                                        uint64_t offset, uint64_t length) {
  PullChunk c{table, {}, length};
  c.header.set_table_id(req.table_id());
  c.header.set_step(req.step());
  c.header.set_offset(offset);
  c.header.set_begin(offset);
  c.header.set_total_length(length);
  return c;
}

absl::StatusOr<grpc::ByteBuffer> ShardDataService::EncodeChunks(
    const std::vector<PullChunk>& chunks, bool batch) {
  std::vector<DenseChunk> headers;
  std::vector<size_t> bytes;
  for (const PullChunk& c : chunks) {
    headers.push_back(c.header);
    bytes.push_back(c.length * sizeof(float));
  }
  return internal::EncodeDense(headers, bytes, batch, [&](size_t i, char* dst) {
    return chunks[i].table->ReadBytes(chunks[i].header.offset(), chunks[i].length, dst);
  });
}

absl::Status ShardDataService::PullBatch(
    const Wait& wait, const google::protobuf::RepeatedPtrField<PullDenseRequest>& pulls,
    std::vector<PullChunk>* out, RequestBudget::Charge* charge) {
  const uint64_t charged = charge->bytes();
  // The answer's bytes: each pull's values and its chunk's header. Headers count because
  // they are built (PlanChunk, EncodeChunks) before anything is sent: a batch of a million
  // empty pulls is a large answer, refused before it is built.
  constexpr uint64_t kHeaderBytes = 64;
  uint64_t total = 0;
  for (int i = 0; i < pulls.size(); ++i) {
    const PullDenseRequest& pull = pulls[i];
    uint64_t length = 0;
    auto table = PreparePull(wait, pull, &length);
    if (IsParked(table.status())) return table.status();
    if (!table.ok()) {
      return absl::Status(table.status().code(),
                          absl::StrCat("pull ", i, " of the batch (table ", pull.table_id(),
                                       "): ", table.status().message()));
    }
    total += length * sizeof(float) + kHeaderBytes;
    if (total > core_->options.max_chunk_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the batch's answer exceeds the unary limit of ", core_->options.max_chunk_bytes,
          " bytes at pull ", i, " of ", pulls.size(), " (the values, and ", kHeaderBytes,
          " bytes a pull); pull the large tables one by one, or fewer at once"));
    }
    charge->ForceGrowTo(charged + total);  // at most max_chunk_bytes
    out->push_back(PlanChunk(*table, pull, pull.offset(), length));
  }
  return absl::OkStatus();
}

absl::Status ShardDataService::PushOnce(const grpc::ServerContextBase* ctx, const DenseBatch& req,
                                        RequestBudget::Charge* charge) {
  charge->ForceGrowTo(PayloadBytes(req));  // then the pulled chunks (PullBatch)
  PushDenseBatchResponse pushed;
  // A repeated attempt (its slice ran out waiting for the pull) does not push again.
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = req; }, nullptr,
      [&] { return core_->commands.PushBatch(req, &pushed); });
}

absl::Status ShardDataService::PullAfterPush(const Wait& wait, const DenseBatch& req,
                                             std::vector<PullChunk>* out,
                                             RequestBudget::Charge* charge) {
  google::protobuf::RepeatedPtrField<PullDenseRequest> pulls;
  for (const DenseChunk& c : req.chunks()) {
    PullDenseRequest* p = pulls.Add();
    p->set_worker_id(c.worker_id());
    p->set_step(c.step() + 1);
    p->set_table_id(c.table_id());
    p->set_offset(c.offset());
    p->set_length(c.data().size() / sizeof(float));
  }
  return PullBatch(wait, pulls, out, charge);
}

ShardDataService::StreamPlan ShardDataService::PlanStream(const PullDenseRequest& req,
                                                          uint64_t length) const {
  const uint64_t chunk_bytes = req.chunk_bytes() == 0
                                   ? core_->options.max_chunk_bytes
                                   : std::min(req.chunk_bytes(), core_->options.max_chunk_bytes);
  return StreamPlan{length, std::max<uint64_t>(1, chunk_bytes / sizeof(float))};
}

ShardDataService::PullChunk ShardDataService::StreamPlan::Chunk(const DenseTable* table,
                                                                const PullDenseRequest& req,
                                                                uint64_t done) const {
  PullChunk c = PlanChunk(table, req, req.offset() + done, std::min(per_chunk, length - done));
  c.header.set_begin(req.offset());  // the whole transfer's
  c.header.set_total_length(length);
  return c;
}

}  // namespace pscluster::ps
