#include "server/ps/service/export_stream.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/grpc_status.h"

namespace pscluster::ps {

ExportStream::ExportStream(ShardCore* core, ExportDenseRequest req)
    : in_flight_(&core->in_flight),
      charge_(&core->budget),
      req_(std::move(req)),
      max_chunk_bytes_(core->options.max_chunk_bytes) {}

void ExportStream::Start(const Prepare& prepare) {
  if (absl::Status s = prepare(req_, &charge_, &state_); !s.ok()) return End(ToGrpcStatus(s));
  WriteNext();
}

void ExportStream::OnWriteDone(bool ok) {
  if (!ok) {
    return End(
        grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading the export stream"));
  }
  if (last_) return End(grpc::Status::OK);
  WriteNext();
}

void ExportStream::End(const grpc::Status& status) {
  state_ = DenseState();
  charge_.Release();
  Finish(status);
}

void ExportStream::WriteNext() {
  const size_t num_slots = state_.slots.size();
  const uint64_t per_chunk =
      std::max<uint64_t>(1, max_chunk_bytes_ / (sizeof(float) * (1 + num_slots)));
  const uint64_t size = state_.values.size();
  const uint64_t n = std::min(per_chunk, size - done_);  // an empty range sends one chunk
  TableStateChunk chunk;
  chunk.set_table_id(req_.table_id());
  chunk.set_step(req_.step());
  chunk.set_updates(state_.updates);
  chunk.set_num_slots(num_slots);
  chunk.set_begin(state_.range.begin + done_);
  chunk.mutable_values()->Add(state_.values.begin() + done_, state_.values.begin() + done_ + n);
  for (const std::vector<float>& slot : state_.slots) {
    chunk.mutable_slots()->Add(slot.begin() + done_, slot.begin() + done_ + n);
  }
  done_ += n;
  last_ = done_ >= size;
  bool own = false;
  chunk_.Clear();  // the one before has gone; the serializer wants an empty buffer
  grpc::Status coded = grpc::SerializationTraits<TableStateChunk>::Serialize(chunk, &chunk_, &own);
  if (!coded.ok()) return End(coded);
  StartWrite(&chunk_);
}

}  // namespace pscluster::ps
