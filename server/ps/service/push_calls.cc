// The dense push path of ParameterServerService: unary, batched and streamed pushes, each
// checked whole before any of it is applied, then applied through Write (a chain's head
// hands it down the chain).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/service/request_checks.h"
#include "server/ps/service/service.h"

namespace pscluster::ps {
namespace {

// A unary push or one entry of a batch is a whole transfer in one chunk: its data, then
// total_length and begin, when set (non-zero), must say so.
absl::Status CheckWholeChunk(const DenseChunk& c) {
  RETURN_IF_ERROR(CheckFloatBytes(c.data(), "data"));
  const uint64_t values = c.data().size() / sizeof(float);
  if (c.total_length() != 0 && c.total_length() != values) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total_length=", c.total_length(), " but the chunk carries ", values,
        " values (a single-chunk push is the whole transfer; larger ones go by PushDenseStream)"));
  }
  if (c.begin() != 0 && c.begin() != c.offset()) {
    return absl::InvalidArgumentError(
        absl::StrCat("begin=", c.begin(), " differs from offset=", c.offset(),
                     " (a single-chunk push begins where its one chunk does)"));
  }
  return absl::OkStatus();
}

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

grpc::Status ParameterServerService::PushDenseBatch(grpc::ServerContext* ctx, const DenseBatch* req,
                                                    PushDenseBatchResponse* resp) {
  return ToGrpcStatus(WritePushBatch(ctx, *req, resp));
}

absl::Status ParameterServerService::WritePushBatch(const grpc::ServerContextBase* ctx,
                                                    const DenseBatch& req,
                                                    PushDenseBatchResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(PayloadBytes(req));
  return Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = req; }, nullptr,
      [&] { return PushBatch(req, resp); });
}

absl::Status ParameterServerService::PushBatch(const DenseBatch& batch,
                                               PushDenseBatchResponse* resp) {
  std::vector<DenseTable*> tables;
  std::vector<DenseTable::Scanned> scanned;
  RETURN_IF_ERROR(CheckBatch(batch, &tables, &scanned));  // all checked before any is applied
  // Checked against the tables' state and applied under all their locks at once: a batch
  // is applied whole or not at all.
  std::vector<DenseTable::PushArgs> pushes;
  std::unique_ptr<bool[]> skipped(new bool[batch.chunks_size()]);
  for (int i = 0; i < batch.chunks_size(); ++i) {
    const DenseChunk& c = batch.chunks(i);
    pushes.push_back({tables[i], c.worker_id(), c.step(), c.offset(), AsFloats(c.data()),
                      scanned[i], &skipped[i]});
  }
  size_t refused = 0;
  if (absl::Status s = DenseTable::PushAll(pushes, &refused); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("chunk ", refused, " of the batch (table ",
                                               batch.chunks(refused).table_id(), "): ", s.message(),
                                               "; nothing in the batch was applied"));
  }
  for (int i = 0; i < batch.chunks_size(); ++i) {
    PushDenseResponse* r = resp->add_results();
    r->set_values_received(batch.chunks(i).data().size() / sizeof(float));
    r->set_skipped_nonfinite(skipped[i]);
  }
  return absl::OkStatus();
}

absl::Status ParameterServerService::CheckBatch(const DenseBatch& batch,
                                                std::vector<DenseTable*>* tables,
                                                std::vector<DenseTable::Scanned>* scanned) const {
  if (const uint64_t bytes = PayloadBytes(batch); bytes > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the batch carries ", bytes, " bytes of gradients; the unary limit is ",
                     options_.max_chunk_bytes,
                     " (ps_server --max_chunk_bytes); nothing in the "
                     "batch was applied: push the large tables with PushDenseStream"));
  }
  for (int i = 0; i < batch.chunks_size(); ++i) {
    const DenseChunk& c = batch.chunks(i);
    auto fail = [&](const absl::Status& s) {
      return absl::Status(s.code(),
                          absl::StrCat("chunk ", i, " of the batch (table ", c.table_id(),
                                       "): ", s.message(), "; nothing in the batch was applied"));
    };
    if (absl::Status s = CheckWholeChunk(c); !s.ok()) return fail(s);
    auto table = shard_->GetDense(c.table_id(), c.worker_id());
    if (!table.ok()) return fail(table.status());
    if (absl::Status s = (*table)->CheckRange(c.offset(), c.data().size() / sizeof(float));
        !s.ok()) {
      return fail(s);
    }
    for (int j = 0; j < i; ++j) {
      if (batch.chunks(j).table_id() == c.table_id()) {
        return fail(absl::InvalidArgumentError("the table appears twice in the batch"));
      }
    }
    DenseTable::Scanned chunk_scan;
    if (absl::Status s = (*table)->ScanChunk(c.offset(), AsFloats(c.data()), &chunk_scan);
        !s.ok()) {
      return fail(s);
    }
    tables->push_back(*table);
    scanned->push_back(chunk_scan);
  }
  return absl::OkStatus();
}

grpc::Status ParameterServerService::PushDense(grpc::ServerContext* ctx, const DenseChunk* req,
                                               PushDenseResponse* resp) {
  return ToGrpcStatus(WritePush(ctx, *req, resp));
}

absl::Status ParameterServerService::WritePush(const grpc::ServerContextBase* ctx,
                                               const DenseChunk& req, PushDenseResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(req.data().size());  // already received: counted, never refused
  return Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense() = req; }, nullptr,
      [&] { return PushDenseChunk(req, resp); });
}

absl::Status ParameterServerService::PushDenseChunk(const DenseChunk& chunk,
                                                    PushDenseResponse* resp) {
  const DenseChunk* req = &chunk;
  RETURN_IF_ERROR(CheckWholeChunk(*req));
  if (req->data().size() > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the push carries ", req->data().size(), " bytes; the unary limit is ",
        options_.max_chunk_bytes, " (ps_server --max_chunk_bytes); use PushDenseStream"));
  }
  ASSIGN_OR_RETURN(DenseTable * table, shard_->GetDense(req->table_id(), req->worker_id()));
  bool skipped = false;
  absl::Status s =
      table->Push(req->worker_id(), req->step(), req->offset(), {AsFloats(req->data())}, &skipped);
  resp->set_values_received(req->data().size() / sizeof(float));
  resp->set_skipped_nonfinite(skipped);
  return s;
}

grpc::Status ParameterServerService::PushDenseStream(grpc::ServerContext* ctx,
                                                     grpc::ServerReader<DenseChunk>* reader,
                                                     PushDenseResponse* resp) {
  Scope scope(this, ctx);
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);  // before receiving
  StreamWatchdog::Watch watch(&watchdog_, ctx);
  DenseChunk first;
  if (!reader->Read(&first)) {
    return ToGrpcStatus(absl::InvalidArgumentError("push stream carried no chunks"));
  }
  auto table = shard_->GetDense(first.table_id(), first.worker_id());
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
  } recycle{&buffers_, &buffers};
  RequestBudget::Charge charge(&budget_);
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
  return ToGrpcStatus(Write(
      ctx,
      [&](ReplicatedUpdate* u) {
        *u->mutable_push_dense() = first;
        u->set_stream(true);
      },
      &buffers, [&] { return PushStreamed(first, buffers, scanned, resp); }));
}

absl::Status ParameterServerService::ReceivePush(DenseTable* table, DenseChunk* first,
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
       *chunk.mutable_data() = buffers_.Get(chunk_bytes), have = reader->Read(&chunk)) {
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

absl::Status ParameterServerService::CheckStreamChunk(const DenseChunk& first, const DenseChunk& c,
                                                      uint64_t index, uint64_t received) const {
  RETURN_IF_ERROR(CheckSameTransfer(first, c, index));
  RETURN_IF_ERROR(CheckFloatBytes(c.data(), "data"));
  if (c.data().size() > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("chunk ", index, " holds ", c.data().size(),
                                                     " bytes; the limit is ",
                                                     options_.max_chunk_bytes));
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

absl::Status ParameterServerService::PushStreamed(const DenseChunk& first,
                                                  const std::vector<std::string>& buffers,
                                                  DenseTable::Scanned scanned,
                                                  PushDenseResponse* resp) {
  ASSIGN_OR_RETURN(DenseTable * table, shard_->GetDense(first.table_id(), first.worker_id()));
  std::vector<absl::Span<const float>> spans;
  uint64_t received = 0;
  for (const std::string& b : buffers) {
    RETURN_IF_ERROR(CheckFloatBytes(b, "data"));
    spans.push_back(AsFloats(b));
    received += spans.back().size();
  }
  if (received != first.total_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push stream holds ", received, " values, not total_length=", first.total_length()));
  }
  bool skipped = false;
  absl::Status s =
      table->Push(first.worker_id(), first.step(), first.begin(), spans, &skipped, scanned);
  resp->set_values_received(received);
  resp->set_skipped_nonfinite(skipped);
  return s;
}

}  // namespace pscluster::ps
