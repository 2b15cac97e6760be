#include "server/ps/service/commands.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ps/service/request_checks.h"

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

}  // namespace

absl::Status Commands::PushBatch(const DenseBatch& batch, PushDenseBatchResponse* resp) {
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

absl::Status Commands::CheckBatch(const DenseBatch& batch, std::vector<DenseTable*>* tables,
                                  std::vector<DenseTable::Scanned>* scanned) const {
  if (const uint64_t bytes = PayloadBytes(batch); bytes > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the batch carries ", bytes, " bytes of gradients; the unary limit is ", max_chunk_bytes_,
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

absl::Status Commands::PushDense(const DenseChunk& req, PushDenseResponse* resp) {
  RETURN_IF_ERROR(CheckWholeChunk(req));
  if (req.data().size() > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the push carries ", req.data().size(), " bytes; the unary limit is ",
                     max_chunk_bytes_, " (ps_server --max_chunk_bytes); use PushDenseStream"));
  }
  ASSIGN_OR_RETURN(DenseTable * table, shard_->GetDense(req.table_id(), req.worker_id()));
  bool skipped = false;
  absl::Status s =
      table->Push(req.worker_id(), req.step(), req.offset(), {AsFloats(req.data())}, &skipped);
  resp->set_values_received(req.data().size() / sizeof(float));
  resp->set_skipped_nonfinite(skipped);
  return s;
}

absl::Status Commands::PushStreamed(const DenseChunk& first,
                                    const std::vector<std::string>& buffers,
                                    DenseTable::Scanned scanned, PushDenseResponse* resp) {
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

absl::Status Commands::PushSparse(const SparseRequest& req, PushSparseResponse* resp) {
  RETURN_IF_ERROR(CheckFloatBytes(req.grads(), "grads"));
  if (uint64_t bytes = req.grads().size() + uint64_t{8} * req.keys_size();
      bytes > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the push carries ", bytes, " bytes of keys and gradients; the limit is ",
                     max_chunk_bytes_, " (ps_server --max_chunk_bytes); split the keys"));
  }
  ASSIGN_OR_RETURN(SparseTable * table, shard_->GetSparse(req.table_id(), req.worker_id()));
  bool skipped = false;
  absl::Status s = table->Push(req.worker_id(), req.step(),
                               absl::MakeConstSpan(req.keys().data(), req.keys_size()),
                               AsFloats(req.grads()), &skipped, req.part(), req.parts());
  resp->set_rows_received(req.keys_size());
  resp->set_skipped_nonfinite(skipped);
  return s;
}

absl::Status Commands::Apply(const ReplicatedUpdate& u, std::vector<std::string>* chunks) {
  switch (u.update_case()) {
    case ReplicatedUpdate::kRegisterWorker:
      shard_->RegisterWorker(u.register_worker().worker_id());
      return absl::OkStatus();
    case ReplicatedUpdate::kUnregisterWorker:
      shard_->UnregisterWorker(u.unregister_worker().worker_id());
      return absl::OkStatus();
    case ReplicatedUpdate::kCreateTable:
      return shard_->CreateTable(u.create_table().spec()).status();
    case ReplicatedUpdate::kPushDense: {
      if (u.stream()) return ApplyStreamed(u, chunks);
      PushDenseResponse resp;
      return PushDense(u.push_dense(), &resp);
    }
    case ReplicatedUpdate::kPushDenseBatch: {
      PushDenseBatchResponse resp;
      return PushBatch(u.push_dense_batch(), &resp);
    }
    case ReplicatedUpdate::kPushSparse: {
      PushSparseResponse resp;
      return PushSparse(u.push_sparse(), &resp);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "Replicate: update kind ", static_cast<int>(u.update_case()), " is unknown"));
  }
}

absl::Status Commands::ApplyStreamed(const ReplicatedUpdate& u, std::vector<std::string>* chunks) {
  std::vector<std::string> buffers;
  if (!u.push_dense().data().empty()) buffers.push_back(u.push_dense().data());
  for (std::string& c : *chunks) buffers.push_back(std::move(c));
  PushDenseResponse resp;
  absl::Status s = PushStreamed(u.push_dense(), buffers, {}, &resp);
  // Handed on down the chain next: give the bytes back.
  chunks->clear();
  for (size_t i = u.push_dense().data().empty() ? 0 : 1; i < buffers.size(); ++i) {
    chunks->push_back(std::move(buffers[i]));
  }
  return s;
}

}  // namespace pscluster::ps
