#include "server/ps/service/push_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ps/service/raw_unary.h"
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

PushStream::PushStream(ShardCore* core, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp)
    : ReadWhole(core, ctx, &core->pool, "push stream cancelled; nothing was applied"),
      resp_(resp) {}

PushStream::~PushStream() { ReturnBuffers(); }

void PushStream::ReturnBuffers() {
  for (std::string& b : buffers_) core_->buffers.Put(std::move(b));
  buffers_.clear();
}

absl::Status PushStream::Open() {
  RETURN_IF_ERROR(core_->gate.CheckServing());  // before receiving more
  ASSIGN_OR_RETURN(table_, core_->shard->GetDense(first_.table_id(), first_.worker_id()));
  RETURN_IF_ERROR(table_->CheckRange(first_.begin(), first_.total_length()));
  tables_ = core_->gate.tables_replaced();
  chunk_bytes_ = std::max<uint64_t>(first_.data().size(), 1);
  // The whole transfer is held until it is applied: charge it to the shard's budget before
  // receiving more than the first chunk, and the buffers as they come (their capacity).
  what_ = absl::StrCat("the push stream of table ", first_.table_id(),
                       " (total_length=", first_.total_length(), " values)");
  return charge_.GrowTo(
      std::max<uint64_t>(first_.total_length() * sizeof(float), first_.data().capacity()), what_);
}

absl::Status PushStream::CheckSameTables() const {
  if (core_->gate.tables_replaced() == tables_) return absl::OkStatus();
  return absl::AbortedError(
      "the shard's tables were replaced (a restore, or a replica installing state) while this "
      "push stream was received; nothing was applied; push again");
}

absl::Status PushStream::Take(const grpc::ByteBuffer& message, uint64_t index) {
  ShardCore::Scope scope(core_, ctx_);
  DenseChunk chunk;
  // Parsed into a recycled buffer sized like the first chunk (a pooled buffer much larger
  // would be held in vain); every buffer goes back to the pool when the stream ends.
  // (chunk_bytes_, not first_'s size: first_'s bytes have moved to buffers_[0] by now.)
  if (index > 0) *chunk.mutable_data() = core_->buffers.Get(chunk_bytes_);
  DenseChunk& c = index == 0 ? first_ : chunk;
  if (!ParseRaw(message, &c)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " did not parse as a DenseChunk; nothing was applied"));
  }
  if (index == 0) {
    RETURN_IF_ERROR(Open());
  } else {
    RETURN_IF_ERROR(CheckSameTables());
  }
  RETURN_IF_ERROR(CheckChunk(c, index));
  held_ += c.data().capacity();
  RETURN_IF_ERROR(charge_.GrowTo(held_, what_));
  // Scan now, while the chunk is in cache; a bad value ends the stream at once.
  RETURN_IF_ERROR(table_->ScanChunk(c.offset(), AsFloats(c.data()), &scanned_));
  received_ += c.data().size() / sizeof(float);
  buffers_.push_back(std::move(*c.mutable_data()));
  return absl::OkStatus();
}

absl::Status PushStream::CheckChunk(const DenseChunk& c, uint64_t index) const {
  RETURN_IF_ERROR(CheckSameTransfer(first_, c, index));
  RETURN_IF_ERROR(CheckFloatBytes(c.data(), "data"));
  const uint64_t max_chunk_bytes = core_->options.max_chunk_bytes;
  if (c.data().size() > max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("chunk ", index, " holds ", c.data().size(),
                                                     " bytes; the limit is ", max_chunk_bytes));
  }
  if (c.offset() != first_.begin() + received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " has offset ", c.offset(),
                                                   ", expected ", first_.begin() + received_,
                                                   " (chunks must be contiguous and in order)"));
  }
  if (c.data().size() / sizeof(float) > first_.total_length() - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push stream carries more than total_length=", first_.total_length(), " values"));
  }
  return absl::OkStatus();
}

absl::Status PushStream::Apply(uint64_t messages) {
  if (messages == 0) return absl::InvalidArgumentError("push stream carried no chunks");
  if (received_ != first_.total_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push stream truncated: got ", received_, " of total_length=", first_.total_length(),
        " values (the client ended the stream early); nothing was applied"));
  }
  ShardCore::Scope scope(core_, ctx_);
  RETURN_IF_ERROR(CheckSameTables());
  first_.clear_data();  // its bytes are buffers_[0]
  PushDenseResponse resp;
  RETURN_IF_ERROR(core_->gate.Write(
      ctx_,
      [&](ReplicatedUpdate* u) {
        *u->mutable_push_dense() = first_;
        u->set_stream(true);
      },
      &buffers_, [&] { return core_->commands.PushStreamed(first_, buffers_, scanned_, &resp); }));
  // Pooled again before the answer: the client's next push finds them (fresh megabytes
  // page-fault on first touch; that alone made this path 0.65x the synchronous one).
  ReturnBuffers();
  bool own = false;
  return FromGrpcStatus(grpc::SerializationTraits<PushDenseResponse>::Serialize(resp, resp_, &own));
}

}  // namespace pscluster::ps
