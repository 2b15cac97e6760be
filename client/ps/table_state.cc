// PsClient: a dense table's whole state (values, optimizer slots, update count) out of
// and into the shards.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/ps/ps_client.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {

namespace {

// INVALID_ARGUMENT unless every slot buffer holds `size` floats.
template <typename Span>
absl::Status CheckSlotSizes(uint32_t table_id, const std::vector<Span>& slots, size_t size) {
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k].size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("table ", table_id, " holds ", size,
                                                     " values; the buffer of optimizer slot ", k,
                                                     " has ", slots[k].size()));
    }
  }
  return absl::OkStatus();
}

template <typename T>
std::vector<T> Subspans(const std::vector<T>& spans, uint64_t begin, uint64_t n) {
  std::vector<T> out;
  for (const T& s : spans) out.push_back(s.subspan(begin, n));
  return out;
}

}  // namespace

absl::Status PsClient::ExportDense(uint32_t table_id, int64_t step, absl::Span<float> values,
                                   std::vector<absl::Span<float>> slots, int64_t* updates) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  RETURN_IF_ERROR(CheckDense(*spec, values.size()));
  RETURN_IF_ERROR(CheckSlotSizes(table_id, slots, values.size()));
  std::vector<int64_t> shard_updates(num_shards());
  absl::Status st = calls_.ForEach([&](int s) {
    Range r = DenseShardRange(values.size(), s, num_shards());
    return ExportDenseShard(s, table_id, step, r.begin, values.subspan(r.begin, r.size()),
                            Subspans(slots, r.begin, r.size()), &shard_updates[s]);
  });
  if (!st.ok()) return st;
  for (int s = 1; s < num_shards(); ++s) {
    if (shard_updates[s] != shard_updates[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", table_id, ": ", calls_.Name(0), " applied ", shard_updates[0],
          " optimizer updates but ", calls_.Name(s), " applied ", shard_updates[s],
          " (a non-finite push skipped on some shards only); the state has no single update "
          "count"));
    }
  }
  *updates = shard_updates[0];
  return absl::OkStatus();
}

absl::Status PsClient::ExportDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                        absl::Span<float> values,
                                        const std::vector<absl::Span<float>>& slots,
                                        int64_t* updates) {
  grpc::ClientContext ctx;
  calls_.SetDeadline(&ctx);
  ps::ExportDenseRequest req;
  req.set_table_id(table_id);
  req.set_step(step);
  auto reader = calls_.stub(shard)->ExportDense(&ctx, req);
  ps::TableStateChunk chunk;
  uint64_t got = 0, chunks = 0;
  // A reply this client cannot place: stop the stream and say what arrived.
  auto fail = [&](absl::Status error) {
    ctx.TryCancel();
    reader->Finish();
    return error;
  };
  while (reader->Read(&chunk)) {
    const uint64_t n = chunk.values_size();
    if (chunk.num_slots() != slots.size()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("table ", table_id, "'s optimizer keeps ", chunk.num_slots(),
                       " slots per value; ExportDense was given ", slots.size(), " slot buffers")));
    }
    if (chunk.table_id() != table_id || chunk.step() != step || chunk.begin() != begin + got ||
        n > values.size() - got || static_cast<uint64_t>(chunk.slots_size()) != slots.size() * n ||
        (chunks > 0 && chunk.updates() != *updates)) {
      return fail(absl::InternalError(absl::StrCat(
          calls_.Name(shard), " sent an export chunk at ", chunk.begin(), " with ", n, " values, ",
          chunk.slots_size(), " slot values and updates=", chunk.updates(), " after ", got, " of ",
          values.size(), " values")));
    }
    *updates = chunk.updates();
    std::memcpy(values.data() + got, chunk.values().data(), n * sizeof(float));
    for (size_t k = 0; k < slots.size(); ++k) {
      std::memcpy(slots[k].data() + got, chunk.slots().data() + k * n, n * sizeof(float));
    }
    got += n;
    ++chunks;
  }
  absl::Status st = calls_.Status(shard, reader->Finish());
  if (st.ok() && (got != values.size() || chunks == 0)) {
    return absl::DataLossError(absl::StrCat(calls_.Name(shard), " export stream ended after ", got,
                                            " of ", values.size(), " values"));
  }
  return st;
}

absl::Status PsClient::ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                                   absl::Span<const float> values,
                                   const std::vector<absl::Span<const float>>& slots) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  RETURN_IF_ERROR(CheckDense(*spec, values.size()));
  RETURN_IF_ERROR(CheckSlotSizes(table_id, slots, values.size()));
  return calls_.ForEach([&](int s) {
    Range r = DenseShardRange(values.size(), s, num_shards());
    return ImportDenseShard(s, table_id, step, updates, r.begin, values.subspan(r.begin, r.size()),
                            Subspans(slots, r.begin, r.size()));
  });
}

absl::Status PsClient::ImportDenseShard(int shard, uint32_t table_id, int64_t step, int64_t updates,
                                        uint64_t begin, absl::Span<const float> values,
                                        const std::vector<absl::Span<const float>>& slots) {
  grpc::ClientContext ctx;
  calls_.SetDeadline(&ctx);
  ps::ImportDenseResponse resp;
  auto writer = calls_.stub(shard)->ImportDense(&ctx, &resp);
  ps::TableStateChunk chunk;  // reused: its buffers are allocated once
  chunk.set_table_id(table_id);
  chunk.set_step(step);
  chunk.set_updates(updates);
  chunk.set_num_slots(slots.size());
  const uint64_t per_chunk =
      std::max<uint64_t>(1, options_.chunk_bytes / (sizeof(float) * (1 + slots.size())));
  for (uint64_t done = 0; done < values.size() || done == 0;) {  // an empty range: one chunk
    const uint64_t n = std::min<uint64_t>(per_chunk, values.size() - done);
    chunk.set_begin(begin + done);
    chunk.clear_values();
    chunk.mutable_values()->Add(values.begin() + done, values.begin() + done + n);
    chunk.clear_slots();
    for (const auto& slot : slots) {
      chunk.mutable_slots()->Add(slot.begin() + done, slot.begin() + done + n);
    }
    if (!writer->Write(chunk)) break;  // the server ended the stream; Finish says why
    done += n;
    if (values.empty()) break;
  }
  writer->WritesDone();
  return calls_.Status(shard, writer->Finish());
}

}  // namespace pscluster
