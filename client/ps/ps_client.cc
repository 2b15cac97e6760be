#include "client/ps/ps_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/concurrent.h"
#include "common/grpc_status.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {
namespace {

constexpr uint64_t kUnaryPullBytes = 256 << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options) {
  if (options.shard_addresses.empty()) {
    return absl::InvalidArgumentError("PsClientOptions.shard_addresses is empty");
  }
  if (options.chunk_bytes < sizeof(float) ||
      options.chunk_bytes + 1024 > options.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PsClientOptions.chunk_bytes=", options.chunk_bytes,
                     " must be in [4, max_message_bytes - 1024]"));
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(options)));
}

PsClient::PsClient(PsClientOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  for (const std::string& address : options_.shard_addresses) {
    stubs_.push_back(ps::ParameterServer::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
}

void PsClient::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
}

std::string PsClient::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", options_.shard_addresses[shard], ")");
}

absl::Status PsClient::RegisterWorker() {
  return RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::RegisterWorkerRequest req;
    req.set_worker_id(options_.worker_id);
    ps::RegisterWorkerResponse resp;
    absl::Status st = FromGrpcStatus(stubs_[s]->RegisterWorker(&ctx, req, &resp), ShardName(s));
    if (st.ok() && (resp.shard_id() != static_cast<uint32_t>(s) ||
                    resp.num_shards() != static_cast<uint32_t>(num_shards()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          ShardName(s), " says it is shard ", resp.shard_id(), " of ", resp.num_shards(),
          "; the client lists it as shard ", s, " of ", num_shards(), ": fix the address order"));
    }
    return st;
  });
}

absl::Status PsClient::AwaitWorkers(int world, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    std::vector<int> counts(num_shards());
    absl::Status st = RunConcurrently(num_shards(), [&](int s) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      ps::RegisterWorkerRequest req;
      req.set_worker_id(options_.worker_id);
      ps::RegisterWorkerResponse resp;
      absl::Status rs = FromGrpcStatus(stubs_[s]->RegisterWorker(&ctx, req, &resp), ShardName(s));
      counts[s] = resp.registered_workers_size();
      return rs;
    });
    if (!st.ok()) return st;
    const int fewest = *std::min_element(counts.begin(), counts.end());
    if (fewest >= world) return absl::OkStatus();
    if (absl::Now() + backoff > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "waited ", absl::FormatDuration(timeout), " for ", world,
          " workers to register; the emptiest shard has ", fewest, ": start the other workers"));
    }
    absl::SleepFor(backoff);  // rendezvous poll, bounded by the deadline
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::Status PsClient::CreateTable(const ps::TableSpec& spec) {
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::CreateTableRequest req;
    req.set_worker_id(options_.worker_id);
    *req.mutable_spec() = spec;
    ps::CreateTableResponse resp;
    return FromGrpcStatus(stubs_[s]->CreateTable(&ctx, req, &resp), ShardName(s));
  });
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    specs_[spec.table_id()] = spec;
  }
  return st;
}

absl::StatusOr<std::vector<ps::TableInfo>> PsClient::DescribeTable(uint32_t table_id) {
  std::vector<ps::TableInfo> infos(num_shards());
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::DescribeTableRequest req;
    req.set_worker_id(options_.worker_id);
    req.set_table_id(table_id);
    return FromGrpcStatus(stubs_[s]->DescribeTable(&ctx, req, &infos[s]), ShardName(s));
  });
  if (!st.ok()) return st;
  return infos;
}

absl::StatusOr<ps::TableSpec> PsClient::Spec(uint32_t table_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = specs_.find(table_id);
    if (it != specs_.end()) return it->second;
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ps::DescribeTableRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_table_id(table_id);
  ps::TableInfo info;
  absl::Status st = FromGrpcStatus(stubs_[0]->DescribeTable(&ctx, req, &info), ShardName(0));
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  specs_[table_id] = info.spec();
  return info.spec();
}

absl::Status PsClient::CheckDense(const ps::TableSpec& spec, size_t length) {
  if (spec.kind() != ps::TableSpec::DENSE) {
    return absl::FailedPreconditionError(absl::StrCat("table ", spec.table_id(), " is not DENSE"));
  }
  if (length != spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_id(), " holds ", spec.size(), " values; the buffer has ", length));
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushDense(uint32_t table_id, int64_t step, absl::Span<const float> grad) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckDense(*spec, grad.size()); !s.ok()) return s;
  return RunConcurrently(num_shards(), [&](int s) {
    Range r = DenseShardRange(grad.size(), s, num_shards());
    return PushDenseShard(s, table_id, step, r.begin, grad.subspan(r.begin, r.size()));
  });
}

absl::Status PsClient::PullDense(uint32_t table_id, int64_t step, absl::Span<float> out) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckDense(*spec, out.size()); !s.ok()) return s;
  return RunConcurrently(num_shards(), [&](int s) {
    Range r = DenseShardRange(out.size(), s, num_shards());
    return PullDenseShard(s, table_id, step, r.begin, out.subspan(r.begin, r.size()));
  });
}

absl::Status PsClient::PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                     absl::Span<const absl::Span<float>> out) {
  if (tables.size() != out.size()) {
    return absl::InvalidArgumentError("PullDenseMany: one output per table");
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    auto spec = Spec(tables[i]);
    if (!spec.ok()) return spec.status();
    if (absl::Status s = CheckDense(*spec, out[i].size()); !s.ok()) return s;
  }
  return RunConcurrently(num_shards(), [&](int shard) -> absl::Status {
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
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::DenseBatch resp;
    RETURN_IF_ERROR(
        FromGrpcStatus(stubs_[shard]->PullDenseBatch(&ctx, req, &resp), ShardName(shard)));
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
    if (absl::Status s = CheckDense(*spec, grads[i].size()); !s.ok()) return s;
  }
  const bool pull = !out.empty();
  return RunConcurrently(num_shards(), [&](int shard) -> absl::Status {
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
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    if (!pull) {
      ps::PushDenseBatchResponse resp;
      return FromGrpcStatus(stubs_[shard]->PushDenseBatch(&ctx, batch, &resp), ShardName(shard));
    }
    ps::DenseBatch resp;
    RETURN_IF_ERROR(
        FromGrpcStatus(stubs_[shard]->PushPullDenseBatch(&ctx, batch, &resp), ShardName(shard)));
    return CopyBatch(shard, resp, order, tables, out);
  });
}

absl::Status PsClient::CopyBatch(int shard, const ps::DenseBatch& resp,
                                 const std::vector<size_t>& order,
                                 absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<float>> out) {
  if (resp.chunks_size() != static_cast<int>(order.size())) {
    return absl::InternalError(absl::StrCat(ShardName(shard), " answered ", resp.chunks_size(),
                                            " chunks for ", order.size(), " tables"));
  }
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    Range r = DenseShardRange(out[i].size(), shard, num_shards());
    const std::string& data = resp.chunks(k).data();
    if (data.size() != r.size() * sizeof(float)) {
      return absl::InternalError(absl::StrCat(ShardName(shard), " answered ", data.size(),
                                              " bytes for table ", tables[i], ", expected ",
                                              r.size() * sizeof(float)));
    }
    std::memcpy(out[i].data() + r.begin, data.data(), data.size());
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                      absl::Span<const float> grad) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
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
    return FromGrpcStatus(stubs_[shard]->PushDense(&ctx, chunk, &resp), ShardName(shard));
  }
  auto writer = stubs_[shard]->PushDenseStream(&ctx, &resp);
  for (uint64_t done = 0; done < grad.size(); done += per_chunk) {
    uint64_t n = std::min<uint64_t>(per_chunk, grad.size() - done);
    chunk.set_offset(begin + done);
    chunk.set_data(grad.data() + done, n * sizeof(float));
    if (!writer->Write(chunk)) break;  // the server ended the stream; Finish says why
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish(), ShardName(shard));
}

absl::Status PsClient::PullDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                      absl::Span<float> out) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ps::PullDenseRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_step(step);
  req.set_table_id(table_id);
  req.set_offset(begin);
  req.set_length(out.size());
  auto misplaced = [&](const ps::DenseChunk& c, uint64_t got) {
    return absl::InternalError(absl::StrCat(ShardName(shard), " sent chunk at offset ", c.offset(),
                                            " with ", c.data().size(), " bytes after ", got, " of ",
                                            out.size(), " values"));
  };
  ps::DenseChunk chunk;
  // Small slices: unary. Larger ones stream even when they fit one message: the stream
  // reuses its chunk buffer, a unary response allocates (and page-faults) a new one.
  if (out.size() * sizeof(float) <= std::min<uint64_t>(options_.chunk_bytes, kUnaryPullBytes)) {
    absl::Status st = FromGrpcStatus(stubs_[shard]->PullDense(&ctx, req, &chunk), ShardName(shard));
    if (!st.ok()) return st;
    if (chunk.data().size() != out.size() * sizeof(float)) return misplaced(chunk, 0);
    std::memcpy(out.data(), chunk.data().data(), chunk.data().size());
    return absl::OkStatus();
  }
  auto reader = stubs_[shard]->PullDenseStream(&ctx, req);
  uint64_t got = 0;
  while (reader->Read(&chunk)) {
    uint64_t n = chunk.data().size() / sizeof(float);
    if (chunk.offset() != begin + got || n > out.size() - got) {
      ctx.TryCancel();
      reader->Finish();
      return misplaced(chunk, got);
    }
    std::memcpy(out.data() + got, chunk.data().data(), n * sizeof(float));
    got += n;
  }
  absl::Status st = FromGrpcStatus(reader->Finish(), ShardName(shard));
  if (st.ok() && got != out.size()) {
    return absl::DataLossError(absl::StrCat(ShardName(shard), " pull stream ended after ", got,
                                            " of ", out.size(), " values"));
  }
  return st;
}

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
  if (absl::Status s = CheckDense(*spec, values.size()); !s.ok()) return s;
  if (absl::Status s = CheckSlotSizes(table_id, slots, values.size()); !s.ok()) return s;
  std::vector<int64_t> shard_updates(num_shards());
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    Range r = DenseShardRange(values.size(), s, num_shards());
    return ExportDenseShard(s, table_id, step, r.begin, values.subspan(r.begin, r.size()),
                            Subspans(slots, r.begin, r.size()), &shard_updates[s]);
  });
  if (!st.ok()) return st;
  for (int s = 1; s < num_shards(); ++s) {
    if (shard_updates[s] != shard_updates[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", table_id, ": ", ShardName(0), " applied ", shard_updates[0],
          " optimizer updates but ", ShardName(s), " applied ", shard_updates[s],
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
  SetDeadline(&ctx);
  ps::ExportDenseRequest req;
  req.set_table_id(table_id);
  req.set_step(step);
  auto reader = stubs_[shard]->ExportDense(&ctx, req);
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
          ShardName(shard), " sent an export chunk at ", chunk.begin(), " with ", n, " values, ",
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
  absl::Status st = FromGrpcStatus(reader->Finish(), ShardName(shard));
  if (st.ok() && (got != values.size() || chunks == 0)) {
    return absl::DataLossError(absl::StrCat(ShardName(shard), " export stream ended after ", got,
                                            " of ", values.size(), " values"));
  }
  return st;
}

absl::Status PsClient::ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                                   absl::Span<const float> values,
                                   const std::vector<absl::Span<const float>>& slots) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckDense(*spec, values.size()); !s.ok()) return s;
  if (absl::Status s = CheckSlotSizes(table_id, slots, values.size()); !s.ok()) return s;
  return RunConcurrently(num_shards(), [&](int s) {
    Range r = DenseShardRange(values.size(), s, num_shards());
    return ImportDenseShard(s, table_id, step, updates, r.begin, values.subspan(r.begin, r.size()),
                            Subspans(slots, r.begin, r.size()));
  });
}

absl::Status PsClient::ImportDenseShard(int shard, uint32_t table_id, int64_t step, int64_t updates,
                                        uint64_t begin, absl::Span<const float> values,
                                        const std::vector<absl::Span<const float>>& slots) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ps::ImportDenseResponse resp;
  auto writer = stubs_[shard]->ImportDense(&ctx, &resp);
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
  return FromGrpcStatus(writer->Finish(), ShardName(shard));
}

absl::StatusOr<size_t> PsClient::SparseDim(uint32_t table_id, size_t keys, size_t values) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  if (spec->kind() != ps::TableSpec::SPARSE || values != keys * spec->dim()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", table_id, " needs SPARSE keys x dim (",
                                                   keys, " x ", spec->dim(), ") values; got ",
                                                   values));
  }
  return spec->dim();
}

std::vector<ps::SparseRequest> PsClient::SparseRequests(uint32_t table_id, int64_t step) const {
  std::vector<ps::SparseRequest> reqs(num_shards());
  for (ps::SparseRequest& r : reqs) {
    r.set_worker_id(options_.worker_id);
    r.set_step(step);
    r.set_table_id(table_id);
  }
  return reqs;
}

absl::Status PsClient::PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<const float> grads) {
  auto dim_or = SparseDim(table_id, keys.size(), grads.size());
  if (!dim_or.ok()) return dim_or.status();
  const size_t dim = *dim_or;
  std::vector<ps::SparseRequest> reqs = SparseRequests(table_id, step);
  for (size_t i = 0; i < keys.size(); ++i) {
    ps::SparseRequest& r = reqs[SparseShardOf(keys[i], num_shards())];
    r.add_keys(keys[i]);
    r.mutable_grads()->append(reinterpret_cast<const char*>(grads.data() + i * dim),
                              dim * sizeof(float));
  }
  return RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::PushSparseResponse resp;
    return FromGrpcStatus(stubs_[s]->PushSparse(&ctx, reqs[s], &resp), ShardName(s));
  });
}

absl::Status PsClient::PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<float> out) {
  auto dim_or = SparseDim(table_id, keys.size(), out.size());
  if (!dim_or.ok()) return dim_or.status();
  const size_t dim = *dim_or;
  std::vector<ps::SparseRequest> reqs = SparseRequests(table_id, step);
  std::vector<std::vector<size_t>> positions(num_shards());
  for (size_t i = 0; i < keys.size(); ++i) {
    int s = SparseShardOf(keys[i], num_shards());
    reqs[s].add_keys(keys[i]);
    positions[s].push_back(i);
  }
  return RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::PullSparseResponse resp;
    absl::Status st = FromGrpcStatus(stubs_[s]->PullSparse(&ctx, reqs[s], &resp), ShardName(s));
    if (!st.ok()) return st;
    if (resp.values().size() != positions[s].size() * dim * sizeof(float)) {
      return absl::InternalError(absl::StrCat(ShardName(s), " returned ", resp.values().size(),
                                              " bytes for ", positions[s].size(), " rows"));
    }
    const float* v = reinterpret_cast<const float*>(resp.values().data());
    for (size_t j = 0; j < positions[s].size(); ++j) {
      std::memcpy(out.data() + positions[s][j] * dim, v + j * dim, dim * sizeof(float));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<ps::StatsResponse>> PsClient::Stats() {
  std::vector<ps::StatsResponse> stats(num_shards());
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return FromGrpcStatus(stubs_[s]->Stats(&ctx, ps::StatsRequest(), &stats[s]), ShardName(s));
  });
  if (!st.ok()) return st;
  return stats;
}

absl::Status PsClient::Snapshot(int64_t step, const ps::SnapshotRequest& extra) {
  return RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::SnapshotRequest req = extra;
    req.set_step(step);
    ps::SnapshotResponse resp;
    return FromGrpcStatus(stubs_[s]->Snapshot(&ctx, req, &resp), ShardName(s));
  });
}

absl::StatusOr<std::vector<ps::SnapshotStatusResponse>> PsClient::SnapshotStatus(
    bool wait_until_idle) {
  std::vector<ps::SnapshotStatusResponse> out(num_shards());
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::SnapshotStatusRequest req;
    req.set_wait_until_idle(wait_until_idle);
    return FromGrpcStatus(stubs_[s]->SnapshotStatus(&ctx, req, &out[s]), ShardName(s));
  });
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<ps::ListSnapshotsResponse>> PsClient::ListSnapshots() {
  std::vector<ps::ListSnapshotsResponse> out(num_shards());
  absl::Status st = RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return FromGrpcStatus(stubs_[s]->ListSnapshots(&ctx, ps::ListSnapshotsRequest(), &out[s]),
                          ShardName(s));
  });
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<ps::SnapshotInfo>> PsClient::CompleteSnapshots() {
  auto lists = ListSnapshots();
  if (!lists.ok()) return lists.status();
  std::map<int64_t, std::pair<int, ps::SnapshotInfo>> by_step;  // shards holding it, summary
  for (const auto& list : *lists) {
    for (const auto& s : list.snapshots()) {
      if (!s.complete()) continue;
      auto& [count, info] = by_step[s.step()];
      if (count++ == 0) {
        info = s;
      } else {
        info.set_bytes(info.bytes() + s.bytes());
      }
    }
  }
  std::vector<ps::SnapshotInfo> out;
  for (const auto& [step, entry] : by_step) {
    if (entry.first == num_shards()) out.push_back(entry.second);
  }
  return out;
}

absl::StatusOr<int64_t> PsClient::LatestCompleteSnapshot() {
  auto complete = CompleteSnapshots();
  if (!complete.ok()) return complete.status();
  if (complete->empty()) return absl::NotFoundError("no snapshot is complete on every shard");
  return complete->back().step();
}

absl::StatusOr<int64_t> PsClient::FurthestAppliedStep() {
  auto stats = Stats();
  if (!stats.ok()) return stats.status();
  int64_t step = 0;
  for (const auto& shard : *stats) {
    for (const auto& t : shard.tables()) step = std::max(step, t.info().applied_steps());
  }
  return step;
}

absl::Status PsClient::Restore(int64_t step) {
  return RunConcurrently(num_shards(), [&](int s) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ps::RestoreRequest req;
    req.set_step(step);
    ps::RestoreResponse resp;
    return FromGrpcStatus(stubs_[s]->Restore(&ctx, req, &resp), ShardName(s));
  });
}

}  // namespace pscluster
