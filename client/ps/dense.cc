// PsClient: dense tensors in and out of the shards (unary, streams, batches).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/ps/ps_client.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {
namespace {

using internal::DenseMethods;

constexpr uint64_t kUnaryPullBytes = 256 << 10;

// A chunk's header: every field but data.
ps::DenseChunk Header(int32_t worker, int64_t step, uint32_t table, uint64_t offset, uint64_t begin,
                      uint64_t total_length) {
  ps::DenseChunk c;
  c.set_worker_id(worker);
  c.set_step(step);
  c.set_table_id(table);
  c.set_offset(offset);
  c.set_begin(begin);
  c.set_total_length(total_length);
  return c;
}

}  // namespace

absl::Status PsClient::PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                     absl::Span<const absl::Span<float>> out) {
  if (tables.size() != out.size()) {
    return absl::InvalidArgumentError("PullDenseMany: one output per table");
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    auto spec = Spec(tables[i]);
    if (!spec.ok()) return spec.status();
    RETURN_IF_ERROR(CheckDense(*spec, out[i].size()));
  }
  return calls_.ForEach([&](int shard) -> absl::Status {
    ps::PullDenseBatchRequest req;
    uint64_t total = 0;
    for (size_t i = 0; i < tables.size(); ++i) {
      Range r = DenseShardRange(out[i].size(), shard, num_shards());
      ps::PullDenseRequest* p = req.add_pulls();
      p->set_worker_id(options_.worker_id);
      p->set_step(step);
      p->set_table_id(tables[i]);
      p->set_offset(r.begin);
      p->set_length(r.size());
      total += r.size();
    }
    if (total * sizeof(float) > options_.chunk_bytes) {  // too big for one message
      for (size_t i = 0; i < tables.size(); ++i) {
        Range r = DenseShardRange(out[i].size(), shard, num_shards());
        RETURN_IF_ERROR(
            PullDenseShard(shard, tables[i], step, r.begin, out[i].subspan(r.begin, r.size())));
      }
      return absl::OkStatus();
    }
    grpc::ByteBuffer resp;
    RETURN_IF_ERROR(calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
      return calls_.DenseCall(shard, &DenseMethods::pull_dense_batch, ctx, req, &resp);
    }));
    return CopyBatch(shard, resp, tables, out);
  });
}

absl::Status PsClient::PushDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                     absl::Span<const absl::Span<const float>> grads) {
  return PushMany(step, tables, grads, {});
}

absl::Status PsClient::PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                         absl::Span<const absl::Span<const float>> grads,
                                         absl::Span<const absl::Span<float>> out) {
  if (out.size() != tables.size()) {
    return absl::InvalidArgumentError("PushPullDenseMany: one output per table");
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (out[i].size() != grads[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("PushPullDenseMany: table ", tables[i],
                                                     "'s output and gradient sizes differ"));
    }
  }
  return PushMany(step, tables, grads, out);
}

absl::Status PsClient::PushMany(int64_t step, absl::Span<const uint32_t> tables,
                                absl::Span<const absl::Span<const float>> grads,
                                absl::Span<const absl::Span<float>> out) {
  if (tables.size() != grads.size()) {
    return absl::InvalidArgumentError("PushDenseMany: one gradient per table");
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    auto spec = Spec(tables[i]);
    if (!spec.ok()) return spec.status();
    RETURN_IF_ERROR(CheckDense(*spec, grads[i].size()));
    RETURN_IF_ERROR(CheckFinite(*spec, grads[i]));
  }
  const bool pull = !out.empty();
  return calls_.ForEach([&](int shard) -> absl::Status {
    uint64_t total = 0;
    for (size_t i = 0; i < tables.size(); ++i) {
      total += DenseShardRange(grads[i].size(), shard, num_shards()).size();
    }
    if (total * sizeof(float) > options_.chunk_bytes) {  // too big for one message
      for (size_t i = 0; i < tables.size(); ++i) {
        Range r = DenseShardRange(grads[i].size(), shard, num_shards());
        RETURN_IF_ERROR(
            PushDenseShard(shard, tables[i], step, r.begin, grads[i].subspan(r.begin, r.size())));
      }
      for (size_t i = 0; pull && i < tables.size(); ++i) {
        Range r = DenseShardRange(out[i].size(), shard, num_shards());
        RETURN_IF_ERROR(
            PullDenseShard(shard, tables[i], step + 1, r.begin, out[i].subspan(r.begin, r.size())));
      }
      return absl::OkStatus();
    }
    std::vector<ps::DenseChunk> headers;
    std::vector<absl::Span<const float>> data;
    for (size_t i = 0; i < tables.size(); ++i) {
      Range r = DenseShardRange(grads[i].size(), shard, num_shards());
      headers.push_back(Header(options_.worker_id, step, tables[i], r.begin, r.begin, r.size()));
      data.push_back(grads[i].subspan(r.begin, r.size()));
    }
    const grpc::ByteBuffer batch = internal::EncodeDenseBatch(headers, data);
    if (!pull) {
      ps::PushDenseBatchResponse resp;
      return calls_.DenseUnary(shard, &DenseMethods::push_dense_batch, batch, &resp);
    }
    // The push and the wait for step + 1 in one call. Every attempt pushes again, under the
    // call's one request id: an attempt whose slice ran out may have been dropped before
    // the shard read it (a shard stopped for a few seconds), or taken; a shard that took
    // the push answers a repeat of its id with the pull alone (so does the next head of a
    // chain whose head failed after handing the push down).
    grpc::ByteBuffer resp;
    RETURN_IF_ERROR(calls_.Waiting(
        shard,
        [&](grpc::ClientContext* ctx, int) {
          return calls_.DenseCall(shard, &DenseMethods::push_pull_dense_batch, ctx, batch, &resp);
        },
        /*identified=*/true));
    return CopyBatch(shard, resp, tables, out);
  });
}

absl::Status PsClient::CopyBatch(int shard, const grpc::ByteBuffer& resp,
                                 absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<float>> out) {
  absl::StatusOr<int> chunks = internal::DecodeDenseBatch(
      resp, [&](int k, const ps::DenseChunk&, size_t bytes) -> absl::StatusOr<char*> {
        if (k >= static_cast<int>(tables.size())) {
          return absl::InternalError(absl::StrCat("more than ", tables.size(), " chunks"));
        }
        const size_t i = k;
        Range r = DenseShardRange(out[i].size(), shard, num_shards());
        if (bytes != r.size() * sizeof(float)) {
          return absl::InternalError(absl::StrCat(bytes, " bytes for table ", tables[i],
                                                  ", expected ", r.size() * sizeof(float)));
        }
        return reinterpret_cast<char*>(out[i].data() + r.begin);
      });
  if (chunks.ok() && *chunks != static_cast<int>(tables.size())) {
    chunks = absl::InternalError(absl::StrCat(*chunks, " chunks for ", tables.size(), " tables"));
  }
  if (!chunks.ok()) {
    return absl::InternalError(
        absl::StrCat(calls_.Name(shard), " answered a bad batch: ", chunks.status().message()));
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                      absl::Span<const float> grad) {
  ps::PushDenseResponse resp;
  auto chunk = [&](uint64_t done, uint64_t n) {
    return internal::EncodeDenseChunk(
        Header(options_.worker_id, step, table_id, begin + done, begin, grad.size()),
        grad.subspan(done, n));
  };
  const uint64_t per_chunk = options_.chunk_bytes / sizeof(float);
  if (grad.size() <= per_chunk) {  // one message: unary
    const grpc::ByteBuffer whole = chunk(0, grad.size());
    return calls_.DenseUnary(shard, &DenseMethods::push_dense, whole, &resp);
  }
  return calls_.Status(shard, calls_.Retrying(shard, [&](grpc::ClientContext* ctx) {
    internal::RawStream stream(calls_.generic(shard), internal::kDenseMethods.push_dense_stream,
                               ctx);
    for (uint64_t done = 0; done < grad.size(); done += per_chunk) {
      // the server ended the stream when a write fails; Finish says why
      if (!stream.Write(chunk(done, std::min<uint64_t>(per_chunk, grad.size() - done)))) break;
    }
    stream.WritesDone();
    grpc::ByteBuffer answer;
    const bool answered = stream.Read(&answer);
    grpc::Status s = stream.Finish();
    if (s.ok() && answered) s = internal::FromBytes(&answer, &resp);
    return s;
  }));
}

absl::Status PsClient::PullDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                      absl::Span<float> out) {
  ps::PullDenseRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_step(step);
  req.set_table_id(table_id);
  req.set_offset(begin);
  req.set_length(out.size());
  // Each chunk's values go straight to their place in `out`, checked first.
  uint64_t got = 0;
  auto place = [&](int, const ps::DenseChunk& c, size_t bytes) -> absl::StatusOr<char*> {
    const uint64_t n = bytes / sizeof(float);
    if (c.offset() != begin + got || bytes % sizeof(float) != 0 || n > out.size() - got) {
      return absl::InternalError(absl::StrCat(calls_.Name(shard), " sent chunk at offset ",
                                              c.offset(), " with ", bytes, " bytes after ", got,
                                              " of ", out.size(), " values"));
    }
    char* at = reinterpret_cast<char*>(out.data() + got);
    got += n;
    return at;
  };
  grpc::ByteBuffer chunk;
  // Small slices: unary. Larger ones stream even when they fit one message.
  if (out.size() * sizeof(float) <= std::min<uint64_t>(options_.chunk_bytes, kUnaryPullBytes)) {
    RETURN_IF_ERROR(calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
      return calls_.DenseCall(shard, &DenseMethods::pull_dense, ctx, req, &chunk);
    }));
    RETURN_IF_ERROR(internal::DecodeDenseChunk(chunk, place));
  } else {
    absl::Status bad;  // a chunk out of place, or one that does not parse
    absl::Status st = calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
      got = 0;
      internal::RawStream stream(calls_.generic(shard), internal::kDenseMethods.pull_dense_stream,
                                 ctx);
      grpc::ByteBuffer request;
      if (grpc::Status s = internal::ToBytes(req, &request); !s.ok()) return s;
      if (stream.Write(request)) stream.WritesDone();
      while (stream.Read(&chunk)) {
        if (bad = internal::DecodeDenseChunk(chunk, place); !bad.ok()) {
          ctx->TryCancel();
          stream.Finish();
          return grpc::Status::OK;
        }
      }
      return stream.Finish();
    });
    RETURN_IF_ERROR(bad);
    RETURN_IF_ERROR(st);
  }
  if (got != out.size()) {
    return absl::DataLossError(
        absl::StrCat(calls_.Name(shard), " pull ended after ", got, " of ", out.size(), " values"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
