// The dense push path of ShardDataService: unary, batched and streamed pushes, each
// checked whole before any of it is applied, then applied through Write (a chain's head
// hands it down the chain).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/data_service.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {
namespace {

// The header fields every chunk of one push stream must repeat unchanged.
absl::Status CheckSameTransfer(const DenseChunk& first, const DenseChunk& c, uint64_t index) {
  auto differs = [&](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " changes ", field, " within one push stream"));
  };
  if (c.table_id() != first.table_id()) return differs("table_id");
  if (c.worker_id() != first.worker_id()) return differs("worker_id");
  if (c.step() != first.step()) return differs("step");
  if (c.begin() != first.begin()) return differs("begin");
  if (c.total_length() != first.total_length()) return differs("total_length");
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardDataService::WritePushBatch(const grpc::ServerContextBase* ctx,
                                              const DenseBatch& req, PushDenseBatchResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RequestBudget::Charge charge(&core_->budget);
  charge.ForceGrowTo(PayloadBytes(req));
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = req; }, nullptr,
      [&] { return core_->commands.PushBatch(req, resp); });
}

absl::Status ShardDataService::WritePush(const grpc::ServerContextBase* ctx, const DenseChunk& req,
                                         PushDenseResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  RequestBudget::Charge charge(&core_->budget);
  charge.ForceGrowTo(req.data().size());  // already received: counted, never refused
  return core_->gate.Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense() = req; }, nullptr,
      [&] { return core_->commands.PushDense(req, resp); });
}

grpc::Status ShardDataService::PushDenseStream(grpc::ServerContext* ctx,
                                               grpc::ServerReader<DenseChunk>* reader,
                                               PushDenseResponse* resp) {
  ShardCore::Scope scope(core_, ctx);
  if (absl::Status s = core_->gate.CheckServing(); !s.ok())
    return ToGrpcStatus(s);  // before receiving
  StreamWatchdog::Watch watch(&core_->watchdog, ctx);
  DenseChunk first;
  if (!reader->Read(&first)) {
    return ToGrpcStatus(absl::InvalidArgumentError("push stream carried no chunks"));
  }
  auto table = core_->shard->GetDense(first.table_id(), first.worker_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  if (absl::Status s = (*table)->CheckRange(first.begin(), first.total_length()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  // Keep each chunk's bytes as received (no copy); apply all at the end, all or nothing.
  // Chunks are parsed into recycled buffers sized like the first chunk (a pooled buffer much
  // larger would be held in vain), which all go back to the pool on return.
  std::vector<std::string> buffers;
  struct Recycle {
    BufferPool* pool;
    std::vector<std::string>* buffers;
    ~Recycle() {
      for (std::string& b : *buffers) pool->Put(std::move(b));
    }
  } recycle{&core_->buffers, &buffers};
  RequestBudget::Charge charge(&core_->budget);
  DenseTable::Scanned scanned;
  if (absl::Status s = ReceivePush(*table, &first, reader, &watch, &charge, &buffers, &scanned);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  watch.Disarm();
  if (ctx->IsCancelled()) {  // the watchdog's (idle), or the client's: nothing applied
    return ToGrpcStatus(absl::CancelledError("push stream cancelled; nothing was applied"));
  }
  first.clear_data();  // its bytes are buffers[0]
  return ToGrpcStatus(core_->gate.Write(
      ctx,
      [&](ReplicatedUpdate* u) {
        *u->mutable_push_dense() = first;
        u->set_stream(true);
      },
      &buffers, [&] { return core_->commands.PushStreamed(first, buffers, scanned, resp); }));
}

absl::Status ShardDataService::ReceivePush(DenseTable* table, DenseChunk* first,
                                           grpc::ServerReader<DenseChunk>* reader,
                                           StreamWatchdog::Watch* watch,
                                           RequestBudget::Charge* charge,
                                           std::vector<std::string>* buffers,
                                           DenseTable::Scanned* scanned) {
  // The whole transfer is held until it is applied: charge it to the shard's budget before
  // receiving more than the first chunk, and the buffers as they come (their capacity).
  const std::string what = absl::StrCat("the push stream of table ", first->table_id(),
                                        " (total_length=", first->total_length(), " values)");
  RETURN_IF_ERROR(charge->GrowTo(
      std::max<uint64_t>(first->total_length() * sizeof(float), first->data().capacity()), what));
  const uint64_t chunk_bytes = std::max<uint64_t>(first->data().size(), 1);
  uint64_t received = 0, held = 0;
  DenseChunk chunk;
  for (bool have = true; have;
       *chunk.mutable_data() = core_->buffers.Get(chunk_bytes), have = reader->Read(&chunk)) {
    DenseChunk& c = buffers->empty() ? *first : chunk;
    RETURN_IF_ERROR(CheckStreamChunk(*first, c, buffers->size(), received));
    held += c.data().capacity();
    RETURN_IF_ERROR(charge->GrowTo(held, what));
    // Scan now, while the chunk is in cache; a bad value ends the stream at once.
    RETURN_IF_ERROR(table->ScanChunk(c.offset(), AsFloats(c.data()), scanned));
    received += c.data().size() / sizeof(float);
    buffers->push_back(std::move(*c.mutable_data()));
    watch->Alive();
  }
  if (received != first->total_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push stream truncated: got ", received, " of total_length=", first->total_length(),
        " values (the client ended the stream early, or a chunk did not parse as a "
        "DenseChunk); nothing was applied"));
  }
  return absl::OkStatus();
}

absl::Status ShardDataService::CheckStreamChunk(const DenseChunk& first, const DenseChunk& c,
                                                uint64_t index, uint64_t received) const {
  RETURN_IF_ERROR(CheckSameTransfer(first, c, index));
  RETURN_IF_ERROR(CheckFloatBytes(c.data(), "data"));
  if (c.data().size() > core_->options.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("chunk ", index, " holds ", c.data().size(),
                                                     " bytes; the limit is ",
                                                     core_->options.max_chunk_bytes));
  }
  if (c.offset() != first.begin() + received) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " has offset ", c.offset(),
                                                   ", expected ", first.begin() + received,
                                                   " (chunks must be contiguous and in order)"));
  }
  if (c.data().size() / sizeof(float) > first.total_length() - received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push stream carries more than total_length=", first.total_length(), " values"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::ps
