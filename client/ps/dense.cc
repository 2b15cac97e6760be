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

constexpr uint64_t kUnaryPullBytes = 256 << 10;

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
    std::vector<size_t> order;
    for (size_t i = 0; i < tables.size(); ++i) {
      Range r = DenseShardRange(out[i].size(), shard, num_shards());
      if (r.size() == 0) continue;
      ps::PullDenseRequest* p = req.add_pulls();
      p->set_worker_id(options_.worker_id);
      p->set_step(step);
      p->set_table_id(tables[i]);
      p->set_offset(r.begin);
      p->set_length(r.size());
      total += r.size();
      order.push_back(i);
    }
    if (total * sizeof(float) > options_.chunk_bytes) {  // too big for one message
      for (size_t i : order) {
        Range r = DenseShardRange(out[i].size(), shard, num_shards());
        RETURN_IF_ERROR(
            PullDenseShard(shard, tables[i], step, r.begin, out[i].subspan(r.begin, r.size())));
      }
      return absl::OkStatus();
    }
    ps::DenseBatch resp;
    RETURN_IF_ERROR(calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
      return calls_.stub(shard)->PullDenseBatch(ctx, req, &resp);
    }));
    return CopyBatch(shard, resp, order, tables, out);
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
    ps::DenseBatch batch;
    std::vector<size_t> order;
    uint64_t total = 0;
    for (size_t i = 0; i < tables.size(); ++i) {
      total += DenseShardRange(grads[i].size(), shard, num_shards()).size();
    }
    if (total * sizeof(float) > options_.chunk_bytes) {  // too big for one message
      for (size_t i = 0; i < tables.size(); ++i) {
        Range r = DenseShardRange(grads[i].size(), shard, num_shards());
        if (r.size() == 0) continue;
        RETURN_IF_ERROR(
            PushDenseShard(shard, tables[i], step, r.begin, grads[i].subspan(r.begin, r.size())));
      }
      for (size_t i = 0; pull && i < tables.size(); ++i) {
        Range r = DenseShardRange(out[i].size(), shard, num_shards());
        if (r.size() == 0) continue;
        RETURN_IF_ERROR(
            PullDenseShard(shard, tables[i], step + 1, r.begin, out[i].subspan(r.begin, r.size())));
      }
      return absl::OkStatus();
    }
    for (size_t i = 0; i < tables.size(); ++i) {
      Range r = DenseShardRange(grads[i].size(), shard, num_shards());
      if (r.size() == 0) continue;
      ps::DenseChunk* c = batch.add_chunks();
      c->set_worker_id(options_.worker_id);
      c->set_step(step);
      c->set_table_id(tables[i]);
      c->set_offset(r.begin);
      c->set_begin(r.begin);
      c->set_total_length(r.size());
      c->set_data(grads[i].data() + r.begin, r.size() * sizeof(float));
      order.push_back(i);
    }
    if (!pull) {
      ps::PushDenseBatchResponse resp;
      return calls_.Unary(shard, &ps::ParameterServer::Stub::PushDenseBatch, batch, &resp);
    }
    // The push and the wait for step + 1 in one call; when the wait outlasts a slice the
    // push is in (the shard pushes before it waits), so the later attempts only pull. With
    // replicas every attempt pushes again, under the call's one request id: the slice may
    // have run out on a head cut off before the push reached it, and a head that has the
    // push answers the repeat from it.
    ps::PullDenseBatchRequest again;
    for (const ps::DenseChunk& c : batch.chunks()) {
      ps::PullDenseRequest* p = again.add_pulls();
      p->set_worker_id(c.worker_id());
      p->set_step(step + 1);
      p->set_table_id(c.table_id());
      p->set_offset(c.offset());
      p->set_length(c.total_length());
    }
    ps::DenseBatch resp;
    RETURN_IF_ERROR(calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int n) {
      return n == 0 || calls_.replicated()
                 ? calls_.stub(shard)->PushPullDenseBatch(ctx, batch, &resp)
                 : calls_.stub(shard)->PullDenseBatch(ctx, again, &resp);
    }));
    return CopyBatch(shard, resp, order, tables, out);
  });
}

absl::Status PsClient::CopyBatch(int shard, const ps::DenseBatch& resp,
                                 const std::vector<size_t>& order,
                                 absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<float>> out) {
  if (resp.chunks_size() != static_cast<int>(order.size())) {
    return absl::InternalError(absl::StrCat(calls_.Name(shard), " answered ", resp.chunks_size(),
                                            " chunks for ", order.size(), " tables"));
  }
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    Range r = DenseShardRange(out[i].size(), shard, num_shards());
    const std::string& data = resp.chunks(k).data();
    if (data.size() != r.size() * sizeof(float)) {
      return absl::InternalError(absl::StrCat(calls_.Name(shard), " answered ", data.size(),
                                              " bytes for table ", tables[i], ", expected ",
                                              r.size() * sizeof(float)));
    }
    std::memcpy(out[i].data() + r.begin, data.data(), data.size());
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                      absl::Span<const float> grad) {
  ps::DenseChunk chunk;
  chunk.set_worker_id(options_.worker_id);
  chunk.set_step(step);
  chunk.set_table_id(table_id);
  chunk.set_begin(begin);
  chunk.set_total_length(grad.size());
  ps::PushDenseResponse resp;
  const uint64_t per_chunk = options_.chunk_bytes / sizeof(float);
  if (grad.size() <= per_chunk) {  // one message: unary
    chunk.set_offset(begin);
    chunk.set_data(grad.data(), grad.size() * sizeof(float));
    return calls_.Unary(shard, &ps::ParameterServer::Stub::PushDense, chunk, &resp);
  }
  return calls_.Status(shard, calls_.Retrying(shard, [&](grpc::ClientContext* ctx) {
    auto writer = calls_.stub(shard)->PushDenseStream(ctx, &resp);
    for (uint64_t done = 0; done < grad.size(); done += per_chunk) {
      uint64_t n = std::min<uint64_t>(per_chunk, grad.size() - done);
      chunk.set_offset(begin + done);
      chunk.set_data(grad.data() + done, n * sizeof(float));
      if (!writer->Write(chunk)) break;  // the server ended the stream; Finish says why
    }
    writer->WritesDone();
    return writer->Finish();
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
  auto misplaced = [&](const ps::DenseChunk& c, uint64_t got) {
    return absl::InternalError(absl::StrCat(calls_.Name(shard), " sent chunk at offset ",
                                            c.offset(), " with ", c.data().size(), " bytes after ",
                                            got, " of ", out.size(), " values"));
  };
  ps::DenseChunk chunk;
  // Small slices: unary. Larger ones stream even when they fit one message: the stream
  // reuses its chunk buffer, a unary response allocates (and page-faults) a new one.
  if (out.size() * sizeof(float) <= std::min<uint64_t>(options_.chunk_bytes, kUnaryPullBytes)) {
    absl::Status st = calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
      return calls_.stub(shard)->PullDense(ctx, req, &chunk);
    });
    if (!st.ok()) return st;
    if (chunk.data().size() != out.size() * sizeof(float)) return misplaced(chunk, 0);
    std::memcpy(out.data(), chunk.data().data(), chunk.data().size());
    return absl::OkStatus();
  }
  uint64_t got = 0;
  absl::Status bad;  // a chunk out of place
  absl::Status st = calls_.Waiting(shard, [&](grpc::ClientContext* ctx, int) {
    got = 0;
    auto reader = calls_.stub(shard)->PullDenseStream(ctx, req);
    while (reader->Read(&chunk)) {
      uint64_t n = chunk.data().size() / sizeof(float);
      if (chunk.offset() != begin + got || n > out.size() - got) {
        ctx->TryCancel();
        reader->Finish();
        bad = misplaced(chunk, got);
        return grpc::Status::OK;
      }
      std::memcpy(out.data() + got, chunk.data().data(), n * sizeof(float));
      got += n;
    }
    return reader->Finish();
  });
  if (!bad.ok()) return bad;
  if (st.ok() && got != out.size()) {
    return absl::DataLossError(absl::StrCat(calls_.Name(shard), " pull stream ended after ", got,
                                            " of ", out.size(), " values"));
  }
  return st;
}

}  // namespace pscluster
