#include "server/ps/service.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dense_wire.h"
#include "common/grpc_status.h"
#include "common/parse_errors.h"
#include "common/process_memory.h"
#include "common/status_macros.h"

namespace pscluster::ps {
namespace {

absl::Span<const float> AsFloats(const std::string& bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

absl::Status CheckFloatBytes(const std::string& bytes, absl::string_view field) {
  if (bytes.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " holds ", bytes.size(),
                                                   " bytes, not a whole number of float32 values"));
  }
  return absl::OkStatus();
}

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

// The gradient bytes a batch carries.
uint64_t PayloadBytes(const DenseBatch& batch) {
  uint64_t bytes = 0;
  for (const DenseChunk& c : batch.chunks()) bytes += c.data().size();
  return bytes;
}

absl::Status CheckStep(int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
  return absl::OkStatus();
}

// The process's resident memory and the bytes free in its heap.
struct Heap {
  uint64_t resident = 0, free = 0;
};
Heap HeapNow() {
  Heap h;
  h.resident = ResidentMemoryBytes();
  h.free = mallinfo2().fordblks;
  return h;
}

// A call's ps-client-id ("" without), at most kMaxClientIdBytes of it: an id only tells
// clients apart (Shard::Visit).
std::string ClientId(const grpc::ServerContext* ctx) {
  if (ctx == nullptr) return "";
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kClientIdKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), std::min(it->second.size(), kMaxClientIdBytes));
}

// A request that did not parse, named as ps_server's parse-error interceptor names those of
// the other methods (common/parse_errors.h).
grpc::Status Unparsable(const char* method) {
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat("/pscluster.ps.ParameterServer/", method, ": ", kUnparsableRequest));
}

// Sends `answer` (or its error) as a unary call's answer: as the last message, which gRPC
// sends with the call's status in one write, as it does a generated unary handler's answer
// (a plain Write went out on its own, and the status after it: 0.84x the pulls of 64 KiB
// over 2 shards, bench/history/RESULTS-to-2026-12-05.md 2026-12-05).
template <typename Stream>
grpc::Status Answer(absl::StatusOr<grpc::ByteBuffer> answer, Stream* stream) {
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  if (!stream->Write(*answer, grpc::WriteOptions().set_last_message())) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away before the answer");
  }
  return grpc::Status::OK;
}

}  // namespace

ParameterServerService::Scope::Scope(ParameterServerService* s, const grpc::ServerContext* ctx)
    : in_flight_(&s->in_flight_), serving_(&s->serving_mu_), visit_(s->shard_, ClientId(ctx)) {}

int MaxMessageBytes(const ServiceOptions& options) {
  return static_cast<int>(options.max_chunk_bytes + (64 << 10));
}

template <typename Stream, typename Req>
void ParameterServerService::ServeCoded(
    const char* method,
    grpc::Status (ParameterServerService::*handler)(grpc::ServerContext*, const Req&, Stream*)) {
  // A unary method is served as "streamed unary", a server stream as "split streaming", as
  // gRPC's generated WithStreamedUnaryMethod_ / WithSplitStreamingMethod_ do, with
  // grpc::ByteBuffer answers.
  const int index = google::protobuf::DescriptorPool::generated_pool()
                        ->FindServiceByName("pscluster.ps.ParameterServer")
                        ->FindMethodByName(method)
                        ->index();
  auto serve = [this, method, handler](grpc::ServerContext* ctx, Stream* stream) {
    Req req;
    if (!stream->Read(&req)) return Unparsable(method);
    return (this->*handler)(ctx, req, stream);
  };
  if constexpr (std::is_same_v<Stream, Unary<Req>>) {
    MarkMethodStreamed(index,
                       new grpc::internal::StreamedUnaryHandler<Req, grpc::ByteBuffer>(serve));
  } else {
    MarkMethodStreamed(
        index, new grpc::internal::SplitServerStreamingHandler<Req, grpc::ByteBuffer>(serve));
  }
}

ParameterServerService::ParameterServerService(Shard* shard, Snapshotter* snapshotter,
                                               ServiceOptions options)
    : shard_(shard),
      snapshotter_(snapshotter),
      options_(options),
      buffers_(std::min(options.buffer_pool_bytes, options.max_inflight_request_bytes / 4)),
      budget_(options.max_inflight_request_bytes) {
  // The pull methods answer with bytes they code themselves (see service.h).
  ServeCoded("PullDense", &ParameterServerService::PullDenseWire);
  ServeCoded("PullDenseBatch", &ParameterServerService::PullDenseBatchWire);
  ServeCoded("PushPullDenseBatch", &ParameterServerService::PushPullDenseBatchWire);
  ServeCoded("PullDenseStream", &ParameterServerService::PullDenseStreamWire);
  if (options_.release_idle_memory_after != absl::InfiniteDuration()) {
    releaser_ = std::thread([this] { ReleaseIdleMemory(); });
  }
}

ParameterServerService::~ParameterServerService() {
  {
    absl::MutexLock lock(&release_mu_);
    stopping_ = true;
  }
  if (releaser_.joinable()) releaser_.join();
}

// Requests leave memory behind when they end: recycled chunk buffers and message blocks
// (internal::ReleasePooledMessageMemory), and freed heap pages that glibc keeps for reuse
// (ps_server raises its mmap threshold so that buffers of a few MB come from the heap), as
// do connections that close. While requests keep coming that is what makes them fast; once
// nothing has held request memory for a while, give it back.
void ParameterServerService::ReleaseIdleMemory() {
  const absl::Duration idle = options_.release_idle_memory_after;
  const uint64_t min_bytes = options_.release_min_bytes;
  Heap released = HeapNow();  // the lowest since the last release
  absl::MutexLock lock(&release_mu_);
  auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(release_mu_) { return stopping_; };
  while (!release_mu_.AwaitWithTimeout(absl::Condition(&stopping), idle / 2)) {
    if (budget_.IdleFor() < idle) continue;
    const Heap now = HeapNow();
    if (now.resident < released.resident + min_bytes && now.free < released.free + min_bytes) {
      released.resident = std::min(released.resident, now.resident);
      released.free = std::min(released.free, now.free);
      continue;
    }
    release_mu_.Unlock();
    buffers_.Clear();
    internal::ReleasePooledMessageMemory();
    malloc_trim(0);
    released = HeapNow();
    release_mu_.Lock();
  }
}

std::function<bool()> ParameterServerService::Cancelled(const grpc::ServerContext* ctx) {
  return [ctx] { return ctx->IsCancelled(); };
}

absl::Time ParameterServerService::Deadline(const grpc::ServerContext* ctx) const {
  // Give up a little before the client does, so that it hears what the wait was for (the
  // workers a BSP pull waits for) rather than a bare DEADLINE_EXCEEDED of its own.
  const absl::Time now = absl::Now(), client = absl::FromChrono(ctx->deadline());
  const absl::Time answer_by = client - std::min(absl::Milliseconds(200), (client - now) / 10);
  return std::min(answer_by, now + options_.max_wait);
}

absl::Status ParameterServerService::CheckServing() const {
  if (!joined_) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard_->options().shard_id,
        " has just started and is registering with the coordinator; retry once it has"));
  }
  Replicator* chain = replicator_.load();
  return chain == nullptr ? absl::OkStatus() : chain->CheckHead();
}

absl::Status ParameterServerService::Write(const grpc::ServerContext* ctx,
                                           const std::function<void(ReplicatedUpdate*)>& describe,
                                           std::vector<std::string>* chunks,
                                           const std::function<absl::Status()>& apply) {
  RETURN_IF_ERROR(CheckServing());  // (with a chain: this replica is its head)
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return apply();
  ReplicatedUpdate update;
  describe(&update);
  return chain->Write(RequestId(ctx), std::move(update), chunks, apply);
}

namespace {
absl::Status NotReplicated() {
  return absl::FailedPreconditionError(
      "this shard is not replicated (ps_coordinator --replicas=1, or not registered yet)");
}
}  // namespace

grpc::Status ParameterServerService::Replicate(grpc::ServerContext* ctx,
                                               grpc::ServerReader<ReplicatedUpdate>* reader,
                                               ReplicateResponse*) {
  // Not under serving_mu_ while the update waits for its turn (a joiner installs its state
  // meanwhile): the replicator takes it to apply.
  InFlightCounter::Scope in_flight(&in_flight_);
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return ToGrpcStatus(NotReplicated());
  // A streamed update is held whole until applied, as a client's push stream: charged to
  // the shard's budget. Any update is cancelled if its sender goes quiet before ending the
  // call (the replica applies it only then).
  StreamWatchdog::Watch watch(&watchdog_, ctx);
  RequestBudget::Charge charge(&budget_);
  Replicator::StreamHooks hooks;
  hooks.hold = [&](uint64_t bytes) {
    watch.Alive();
    return charge.GrowTo(bytes, "a Replicate stream from the previous replica");
  };
  hooks.read = [&] { watch.Disarm(); };
  return chain->Receive(ctx, reader, hooks);
}

grpc::Status ParameterServerService::TransferState(grpc::ServerContext*,
                                                   const TransferStateRequest* req,
                                                   grpc::ServerWriter<StateTransferChunk>* writer) {
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return ToGrpcStatus(NotReplicated());
  auto joins = chain->HoldJoins();  // before Scope: the replicator's lock order
  Scope scope(this);
  return chain->TransferState(req, writer);
}

grpc::Status ParameterServerService::JoinedChain(grpc::ServerContext*,
                                                 const JoinedChainRequest* req,
                                                 JoinedChainResponse* resp) {
  InFlightCounter::Scope in_flight(&in_flight_);
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return ToGrpcStatus(NotReplicated());
  auto joins = chain->HoldJoins();
  return chain->JoinedChain(req, resp);
}

absl::StatusOr<Replicator::State> ParameterServerService::CaptureState() const {
  Replicator::State state;
  for (Table* table : shard_->Tables()) {
    ASSIGN_OR_RETURN(std::unique_ptr<TableImage> image, table->CaptureNow());
    state.images.push_back(std::move(image));
  }
  state.workers = shard_->Workers();
  return state;
}

absl::Status ParameterServerService::InstallState(std::unique_ptr<Shard> staged) {
  shard_->ReplaceWith(staged.get());  // the caller holds serving_mu_ exclusively
  return absl::OkStatus();
}

absl::Status ParameterServerService::ApplyReplicated(const ReplicatedUpdate& u,
                                                     std::vector<std::string>* chunks) {
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
      PushDenseResponse resp;
      if (!u.stream()) return PushDenseChunk(u.push_dense(), &resp);
      std::vector<std::string> buffers;
      if (!u.push_dense().data().empty()) buffers.push_back(u.push_dense().data());
      for (std::string& c : *chunks) buffers.push_back(std::move(c));
      absl::Status s = PushStreamed(u.push_dense(), buffers, {}, &resp);
      // Handed on down the chain next: give the bytes back.
      chunks->clear();
      for (size_t i = u.push_dense().data().empty() ? 0 : 1; i < buffers.size(); ++i) {
        chunks->push_back(std::move(buffers[i]));
      }
      return s;
    }
    case ReplicatedUpdate::kPushDenseBatch: {
      PushDenseBatchResponse resp;
      return PushBatch(u.push_dense_batch(), &resp);
    }
    case ReplicatedUpdate::kPushSparse: {
      PushSparseResponse resp;
      return PushSparseRows(u.push_sparse(), &resp);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "Replicate: update kind ", static_cast<int>(u.update_case()), " is unknown"));
  }
}

grpc::Status ParameterServerService::RegisterWorker(grpc::ServerContext* ctx,
                                                    const RegisterWorkerRequest* req,
                                                    RegisterWorkerResponse* resp) {
  Scope scope(this, ctx);
  if (absl::Status s = CheckWorkerId(req->worker_id()); !s.ok()) return ToGrpcStatus(s);
  absl::Status written = Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_register_worker() = *req; }, nullptr,
      [&] {
        *resp = shard_->RegisterWorker(req->worker_id());
        return absl::OkStatus();
      });
  if (written.ok() && resp->num_shards() == 0) {  // a retry the chain had applied already
    resp->set_shard_id(shard_->options().shard_id);
    resp->set_num_shards(shard_->options().num_shards);
  }
  return ToGrpcStatus(written);
}

grpc::Status ParameterServerService::UnregisterWorker(grpc::ServerContext* ctx,
                                                      const UnregisterWorkerRequest* req,
                                                      UnregisterWorkerResponse* resp) {
  Scope scope(this, ctx);
  if (absl::Status s = CheckWorkerId(req->worker_id()); !s.ok()) return ToGrpcStatus(s);
  absl::Status written = Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_unregister_worker() = *req; }, nullptr,
      [&] {
        *resp = shard_->UnregisterWorker(req->worker_id());
        return absl::OkStatus();
      });
  if (!written.ok()) return ToGrpcStatus(written);
  std::printf("ps_server: worker %d unregistered (%s)\n", req->worker_id(),
              resp->was_registered() ? "it was registered" : "it was not registered");
  std::fflush(stdout);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::CreateTable(grpc::ServerContext* ctx,
                                                 const CreateTableRequest* req,
                                                 CreateTableResponse* resp) {
  Scope scope(this, ctx);
  return ToGrpcStatus(Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_create_table() = *req; }, nullptr,
      [&]() -> absl::Status {
        ASSIGN_OR_RETURN(*resp, shard_->CreateTable(req->spec()));
        return absl::OkStatus();
      }));
}

grpc::Status ParameterServerService::DescribeTable(grpc::ServerContext*,
                                                   const DescribeTableRequest* req,
                                                   TableInfo* resp) {
  Scope scope(this);
  auto table = shard_->GetTable(req->table_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  *resp = (*table)->Info();
  return grpc::Status::OK;
}

absl::StatusOr<DenseTable*> ParameterServerService::PreparePull(const grpc::ServerContext* ctx,
                                                                const PullDenseRequest& req,
                                                                uint64_t* length) {
  RETURN_IF_ERROR(CheckServing());
  RETURN_IF_ERROR(CheckStep(req.step()));
  auto table = shard_->GetDense(req.table_id(), req.worker_id());
  if (!table.ok()) return table.status();
  Range range = (*table)->range();
  *length = req.length();
  if (*length == 0 && req.offset() >= range.begin && req.offset() <= range.end) {
    *length = range.end - req.offset();
  }
  RETURN_IF_ERROR((*table)->CheckRange(req.offset(), *length));
  RETURN_IF_ERROR((*table)->AwaitPullable(req.step(), Deadline(ctx), Cancelled(ctx)));
  return table;
}

absl::StatusOr<ParameterServerService::PullChunk> ParameterServerService::PullOne(
    const grpc::ServerContext* ctx, const PullDenseRequest& req, RequestBudget::Charge* charge) {
  uint64_t length = 0;
  ASSIGN_OR_RETURN(DenseTable * table, PreparePull(ctx, req, &length));
  if (length * sizeof(float) > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("length ", length, " values exceeds the unary limit of ",
                     options_.max_chunk_bytes, " bytes; use PullDenseStream"));
  }
  charge->ForceGrowTo(length * sizeof(float));  // at most max_chunk_bytes: counted, not refused
  return PlanChunk(table, req, req.offset(), length);
}

grpc::Status ParameterServerService::PullDense(grpc::ServerContext* ctx,
                                               const PullDenseRequest* req, DenseChunk* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  absl::StatusOr<PullChunk> chunk = PullOne(ctx, *req, &charge);
  if (!chunk.ok()) return ToGrpcStatus(chunk.status());
  return ToGrpcStatus(ReadChunk(*chunk, resp));
}

ParameterServerService::PullChunk ParameterServerService::PlanChunk(const DenseTable* table,
                                                                    const PullDenseRequest& req,
                                                                    uint64_t offset,
                                                                    uint64_t length) {
  PullChunk c{table, {}, length};
  c.header.set_table_id(req.table_id());
  c.header.set_step(req.step());
  c.header.set_offset(offset);
  c.header.set_begin(offset);
  c.header.set_total_length(length);
  return c;
}

absl::Status ParameterServerService::ReadChunk(const PullChunk& chunk, DenseChunk* out) {
  *out = chunk.header;
  std::string* data = out->mutable_data();
  data->resize(chunk.length * sizeof(float));
  return chunk.table->ReadBytes(chunk.header.offset(), chunk.length, data->data());
}

absl::StatusOr<grpc::ByteBuffer> ParameterServerService::EncodeChunks(
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

grpc::Status ParameterServerService::PullDenseBatch(grpc::ServerContext* ctx,
                                                    const PullDenseBatchRequest* req,
                                                    DenseBatch* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  std::vector<PullChunk> chunks;
  if (absl::Status s = PullBatch(ctx, req->pulls(), &chunks, &charge); !s.ok()) {
    return ToGrpcStatus(s);
  }
  for (const PullChunk& c : chunks) {
    if (absl::Status s = ReadChunk(c, resp->add_chunks()); !s.ok()) return ToGrpcStatus(s);
  }
  return grpc::Status::OK;
}

absl::Status ParameterServerService::PullBatch(
    const grpc::ServerContext* ctx,
    const google::protobuf::RepeatedPtrField<PullDenseRequest>& pulls, std::vector<PullChunk>* out,
    RequestBudget::Charge* charge) {
  const uint64_t charged = charge->bytes();
  uint64_t total = 0;
  for (int i = 0; i < pulls.size(); ++i) {
    const PullDenseRequest& pull = pulls[i];
    uint64_t length = 0;
    auto table = PreparePull(ctx, pull, &length);
    if (!table.ok()) {
      return absl::Status(table.status().code(),
                          absl::StrCat("pull ", i, " of the batch (table ", pull.table_id(),
                                       "): ", table.status().message()));
    }
    total += length;
    if (total * sizeof(float) > options_.max_chunk_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the batch's pulls exceed the unary limit of ", options_.max_chunk_bytes,
                       " bytes at pull ", i, "; pull the large tables one by one"));
    }
    charge->ForceGrowTo(charged + total * sizeof(float));  // at most max_chunk_bytes
    out->push_back(PlanChunk(*table, pull, pull.offset(), length));
  }
  return absl::OkStatus();
}

grpc::Status ParameterServerService::PushDenseBatch(grpc::ServerContext* ctx, const DenseBatch* req,
                                                    PushDenseBatchResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(PayloadBytes(*req));
  return ToGrpcStatus(Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = *req; }, nullptr,
      [&] { return PushBatch(*req, resp); }));
}

// A step's push and the next step's pull in one round trip: push the batch, then wait (as a
// pull would) until step + 1 is readable and answer the same ranges.
grpc::Status ParameterServerService::PushPullDenseBatch(grpc::ServerContext* ctx,
                                                        const DenseBatch* req, DenseBatch* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  std::vector<PullChunk> chunks;
  if (absl::Status s = PushPull(ctx, *req, &chunks, &charge); !s.ok()) return ToGrpcStatus(s);
  for (const PullChunk& c : chunks) {
    if (absl::Status s = ReadChunk(c, resp->add_chunks()); !s.ok()) return ToGrpcStatus(s);
  }
  return grpc::Status::OK;
}

absl::Status ParameterServerService::PushPull(const grpc::ServerContext* ctx, const DenseBatch& req,
                                              std::vector<PullChunk>* out,
                                              RequestBudget::Charge* charge) {
  charge->ForceGrowTo(PayloadBytes(req));  // then the pulled chunks (PullBatch)
  PushDenseBatchResponse pushed;
  const std::string id = RequestId(ctx);
  if (replicator_.load() == nullptr && !id.empty()) {
    RETURN_IF_ERROR(CheckServing());
    absl::MutexLock lock(&pushed_mu_);
    if (pushed_.Find(id) == nullptr) {
      RETURN_IF_ERROR(PushBatch(req, &pushed));
      pushed_.Add(id, true);
    }
  } else {  // a chain answers repeats itself (Replicator::Write)
    RETURN_IF_ERROR(Write(
        ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = req; }, nullptr,
        [&] { return PushBatch(req, &pushed); }));
  }
  google::protobuf::RepeatedPtrField<PullDenseRequest> pulls;
  for (const DenseChunk& c : req.chunks()) {
    PullDenseRequest* p = pulls.Add();
    p->set_worker_id(c.worker_id());
    p->set_step(c.step() + 1);
    p->set_table_id(c.table_id());
    p->set_offset(c.offset());
    p->set_length(c.data().size() / sizeof(float));
  }
  return PullBatch(ctx, pulls, out, charge);
}

absl::Status ParameterServerService::PushBatch(const DenseBatch& batch,
                                               PushDenseBatchResponse* resp) {
  const DenseBatch* req = &batch;
  std::vector<DenseTable*> tables;
  std::vector<DenseTable::Scanned> scanned;
  uint64_t total_bytes = 0;
  for (const DenseChunk& c : req->chunks()) total_bytes += c.data().size();
  if (total_bytes > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the batch carries ", total_bytes, " bytes of gradients; the unary limit is ",
                     options_.max_chunk_bytes,
                     " (ps_server --max_chunk_bytes); nothing in the "
                     "batch was applied: push the large tables with PushDenseStream"));
  }
  for (int i = 0; i < req->chunks_size(); ++i) {  // all checked before any is applied
    const DenseChunk& c = req->chunks(i);
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
      if (req->chunks(j).table_id() == c.table_id()) {
        return fail(absl::InvalidArgumentError("the table appears twice in the batch"));
      }
    }
    DenseTable::Scanned chunk_scan;
    if (absl::Status s = (*table)->ScanChunk(c.offset(), AsFloats(c.data()), &chunk_scan);
        !s.ok()) {
      return fail(s);
    }
    tables.push_back(*table);
    scanned.push_back(chunk_scan);
  }
  // Checked against the tables' state and applied under all their locks at once: a batch
  // is applied whole or not at all.
  std::vector<DenseTable::PushArgs> pushes;
  std::unique_ptr<bool[]> skipped(new bool[req->chunks_size()]);
  for (int i = 0; i < req->chunks_size(); ++i) {
    const DenseChunk& c = req->chunks(i);
    pushes.push_back({tables[i], c.worker_id(), c.step(), c.offset(), AsFloats(c.data()),
                      scanned[i], &skipped[i]});
  }
  size_t refused = 0;
  if (absl::Status s = DenseTable::PushAll(pushes, &refused); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("chunk ", refused, " of the batch (table ",
                                               req->chunks(refused).table_id(), "): ", s.message(),
                                               "; nothing in the batch was applied"));
  }
  for (int i = 0; i < req->chunks_size(); ++i) {
    PushDenseResponse* r = resp->add_results();
    r->set_values_received(req->chunks(i).data().size() / sizeof(float));
    r->set_skipped_nonfinite(skipped[i]);
  }
  return absl::OkStatus();
}

grpc::Status ParameterServerService::PullDenseStream(grpc::ServerContext* ctx,
                                                     const PullDenseRequest* req,
                                                     grpc::ServerWriter<DenseChunk>* writer) {
  Scope scope(this, ctx);
  DenseChunk message;  // reused: its buffer is allocated once
  return ToGrpcStatus(PullStream(ctx, *req, [&](const PullChunk& c) {
    RETURN_IF_ERROR(ReadChunk(c, &message));
    if (!writer->Write(message)) {
      return absl::CancelledError("client stopped reading the pull stream");
    }
    return absl::OkStatus();
  }));
}

absl::Status ParameterServerService::PullStream(
    const grpc::ServerContext* ctx, const PullDenseRequest& req,
    const std::function<absl::Status(const PullChunk&)>& write) {
  uint64_t length = 0;
  ASSIGN_OR_RETURN(DenseTable * table, PreparePull(ctx, req, &length));
  const uint64_t chunk_bytes = req.chunk_bytes() == 0
                                   ? options_.max_chunk_bytes
                                   : std::min(req.chunk_bytes(), options_.max_chunk_bytes);
  const uint64_t per_chunk = std::max<uint64_t>(1, chunk_bytes / sizeof(float));
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(std::min(length, per_chunk) * sizeof(float));  // one chunk at a time
  for (uint64_t done = 0; done < length || (length == 0 && done == 0);) {
    uint64_t n = std::min(per_chunk, length - done);
    PullChunk c = PlanChunk(table, req, req.offset() + done, n);
    c.header.set_begin(req.offset());  // the whole transfer's
    c.header.set_total_length(length);
    RETURN_IF_ERROR(write(c));
    done += n;
    if (length == 0) break;
  }
  return absl::OkStatus();
}

grpc::Status ParameterServerService::PullDenseWire(grpc::ServerContext* ctx,
                                                   const PullDenseRequest& req,
                                                   Unary<PullDenseRequest>* stream) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  absl::StatusOr<PullChunk> chunk = PullOne(ctx, req, &charge);
  if (!chunk.ok()) return ToGrpcStatus(chunk.status());
  return Answer(EncodeChunks({*chunk}, /*batch=*/false), stream);
}

grpc::Status ParameterServerService::PullDenseBatchWire(grpc::ServerContext* ctx,
                                                        const PullDenseBatchRequest& req,
                                                        Unary<PullDenseBatchRequest>* stream) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  std::vector<PullChunk> chunks;
  if (absl::Status s = PullBatch(ctx, req.pulls(), &chunks, &charge); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Answer(EncodeChunks(chunks, /*batch=*/true), stream);
}

grpc::Status ParameterServerService::PushPullDenseBatchWire(grpc::ServerContext* ctx,
                                                            const DenseBatch& req,
                                                            Unary<DenseBatch>* stream) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  std::vector<PullChunk> chunks;
  if (absl::Status s = PushPull(ctx, req, &chunks, &charge); !s.ok()) return ToGrpcStatus(s);
  return Answer(EncodeChunks(chunks, /*batch=*/true), stream);
}

grpc::Status ParameterServerService::PullDenseStreamWire(grpc::ServerContext* ctx,
                                                         const PullDenseRequest& req,
                                                         Split<PullDenseRequest>* stream) {
  Scope scope(this, ctx);
  return ToGrpcStatus(PullStream(ctx, req, [&](const PullChunk& c) {
    ASSIGN_OR_RETURN(grpc::ByteBuffer bytes, EncodeChunks({c}, /*batch=*/false));
    if (!stream->Write(bytes)) {
      return absl::CancelledError("client stopped reading the pull stream");
    }
    return absl::OkStatus();
  }));
}

grpc::Status ParameterServerService::PushDense(grpc::ServerContext* ctx, const DenseChunk* req,
                                               PushDenseResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(req->data().size());  // already received: counted, never refused
  return ToGrpcStatus(Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_dense() = *req; }, nullptr,
      [&] { return PushDenseChunk(*req, resp); }));
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
  DenseChunk first, chunk;
  if (!reader->Read(&first)) {
    return ToGrpcStatus(absl::InvalidArgumentError("push stream carried no chunks"));
  }
  auto table = shard_->GetDense(first.table_id(), first.worker_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  if (absl::Status s = (*table)->CheckRange(first.begin(), first.total_length()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  // The whole transfer is held until it is applied: charge it to the shard's budget before
  // receiving more than the first chunk, and the buffers as they come (their capacity).
  RequestBudget::Charge charge(&budget_);
  const std::string what = absl::StrCat("the push stream of table ", first.table_id(),
                                        " (total_length=", first.total_length(), " values)");
  if (absl::Status s = charge.GrowTo(
          std::max<uint64_t>(first.total_length() * sizeof(float), first.data().capacity()), what);
      !s.ok()) {
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
  const uint64_t chunk_bytes = std::max<uint64_t>(first.data().size(), 1);
  uint64_t received = 0, held = 0;
  DenseTable::Scanned scanned;
  for (bool have = true; have;
       *chunk.mutable_data() = buffers_.Get(chunk_bytes), have = reader->Read(&chunk)) {
    DenseChunk& c = buffers.empty() ? first : chunk;
    if (absl::Status s = CheckSameTransfer(first, c, buffers.size()); !s.ok())
      return ToGrpcStatus(s);
    if (absl::Status s = CheckFloatBytes(c.data(), "data"); !s.ok()) return ToGrpcStatus(s);
    if (c.data().size() > options_.max_chunk_bytes) {
      return ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("chunk ", buffers.size(), " holds ", c.data().size(),
                       " bytes; the limit is ", options_.max_chunk_bytes)));
    }
    if (c.offset() != first.begin() + received) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("chunk ", buffers.size(), " has offset ", c.offset(), ", expected ",
                       first.begin() + received, " (chunks must be contiguous and in order)")));
    }
    if (c.data().size() / sizeof(float) > first.total_length() - received) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "push stream carries more than total_length=", first.total_length(), " values")));
    }
    held += c.data().capacity();
    if (absl::Status s = charge.GrowTo(held, what); !s.ok()) return ToGrpcStatus(s);
    // Scan now, while the chunk is in cache; a bad value ends the stream at once.
    if (absl::Status s = (*table)->ScanChunk(c.offset(), AsFloats(c.data()), &scanned); !s.ok()) {
      return ToGrpcStatus(s);
    }
    received += c.data().size() / sizeof(float);
    buffers.push_back(std::move(*c.mutable_data()));
    watch.Alive();
  }
  if (received != first.total_length()) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "push stream truncated: got ", received, " of total_length=", first.total_length(),
        " values (the client ended the stream early, or a chunk did not parse as a "
        "DenseChunk); nothing was applied")));
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

grpc::Status ParameterServerService::PullSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                                                PullSparseResponse* resp) {
  Scope scope(this, ctx);
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = CheckStep(req->step()); !s.ok()) return ToGrpcStatus(s);
  auto table = shard_->GetSparse(req->table_id(), req->worker_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  uint64_t values = static_cast<uint64_t>(req->keys_size()) * (*table)->spec().dim();
  if (values * sizeof(float) > options_.max_chunk_bytes) {
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("pulling ", req->keys_size(), " rows would return ", values * sizeof(float),
                     " bytes; the limit is ", options_.max_chunk_bytes, "; split the keys")));
  }
  absl::Span<const uint64_t> keys(req->keys().data(), req->keys_size());
  if (absl::Status s = (*table)->CheckKeys(keys); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = (*table)->AwaitPullable(req->step(), Deadline(ctx), Cancelled(ctx));
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(values * sizeof(float));  // at most max_chunk_bytes: counted, not refused
  std::string* out = resp->mutable_values();
  out->resize(values * sizeof(float));
  return ToGrpcStatus(
      (*table)->Read(keys, absl::MakeSpan(reinterpret_cast<float*>(out->data()), values)));
}

grpc::Status ParameterServerService::PushSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                                                PushSparseResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(req->grads().size() + uint64_t{8} * req->keys_size());
  return ToGrpcStatus(Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = *req; }, nullptr,
      [&] { return PushSparseRows(*req, resp); }));
}

absl::Status ParameterServerService::PushSparseRows(const SparseRequest& request,
                                                    PushSparseResponse* resp) {
  const SparseRequest* req = &request;
  RETURN_IF_ERROR(CheckFloatBytes(req->grads(), "grads"));
  if (uint64_t bytes = req->grads().size() + uint64_t{8} * req->keys_size();
      bytes > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the push carries ", bytes, " bytes of keys and gradients; the limit is ",
                     options_.max_chunk_bytes, " (ps_server --max_chunk_bytes); split the keys"));
  }
  ASSIGN_OR_RETURN(SparseTable * table, shard_->GetSparse(req->table_id(), req->worker_id()));
  bool skipped = false;
  absl::Status s = table->Push(req->worker_id(), req->step(),
                               absl::MakeConstSpan(req->keys().data(), req->keys_size()),
                               AsFloats(req->grads()), &skipped, req->part(), req->parts());
  resp->set_rows_received(req->keys_size());
  resp->set_skipped_nonfinite(skipped);
  return s;
}

}  // namespace pscluster::ps
