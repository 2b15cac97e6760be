#include "server/ps/service/service.h"

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
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {
namespace {

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
std::string ClientId(const grpc::ServerContextBase* ctx) {
  if (ctx == nullptr) return "";
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kClientIdKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), std::min(it->second.size(), kMaxClientIdBytes));
}

}  // namespace

ParameterServerService::Scope::Scope(ParameterServerService* s, const grpc::ServerContextBase* ctx)
    : in_flight_(&s->in_flight_), serving_(&s->serving_mu_), visit_(s->shard_, ClientId(ctx)) {}

int MaxMessageBytes(const ServiceOptions& options) {
  return static_cast<int>(options.max_chunk_bytes + (64 << 10));
}

ParameterServerService::ParameterServerService(Shard* shard, Snapshotter* snapshotter,
                                               ServiceOptions options)
    : shard_(shard),
      snapshotter_(snapshotter),
      options_(options),
      buffers_(std::min(options.buffer_pool_bytes, options.max_inflight_request_bytes / 4)),
      budget_(options.max_inflight_request_bytes) {
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

std::function<bool()> ParameterServerService::Cancelled(const grpc::ServerContextBase* ctx) {
  return [ctx] { return ctx->IsCancelled(); };
}

absl::Time ParameterServerService::Deadline(const grpc::ServerContextBase* ctx) const {
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

absl::Status ParameterServerService::Write(const grpc::ServerContextBase* ctx,
                                           const std::function<void(ReplicatedUpdate*)>& describe,
                                           std::vector<std::string>* chunks,
                                           const std::function<absl::Status()>& apply) {
  RETURN_IF_ERROR(CheckServing());  // (with a chain: this replica is its head)
  Replicator* chain = replicator_.load();
  if (chain == nullptr) return alone_.Append(RequestId(ctx), Deadline(ctx), apply).status();
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
  tables_replaced_++;
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

grpc::Status ParameterServerService::PullSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                                                PullSparseResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  return ToGrpcStatus(PullRows(Blocking(ctx), *req, resp, &charge));
}

absl::Status ParameterServerService::PullRows(const Wait& wait, const SparseRequest& req,
                                              PullSparseResponse* resp,
                                              RequestBudget::Charge* charge) {
  RETURN_IF_ERROR(CheckServing());
  RETURN_IF_ERROR(CheckStep(req.step()));
  ASSIGN_OR_RETURN(SparseTable * table, shard_->GetSparse(req.table_id(), req.worker_id()));
  const uint64_t values = static_cast<uint64_t>(req.keys_size()) * table->spec().dim();
  if (values * sizeof(float) > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pulling ", req.keys_size(), " rows would return ", values * sizeof(float),
                     " bytes; the limit is ", options_.max_chunk_bytes, "; split the keys"));
  }
  absl::Span<const uint64_t> keys(req.keys().data(), req.keys_size());
  RETURN_IF_ERROR(table->CheckKeys(keys));
  RETURN_IF_ERROR(WaitForStep(table, req.step(), wait));
  charge->ForceGrowTo(values * sizeof(float));  // at most max_chunk_bytes: counted, not refused
  std::string* out = resp->mutable_values();
  out->resize(values * sizeof(float));
  return table->Read(keys, absl::MakeSpan(reinterpret_cast<float*>(out->data()), values));
}

grpc::Status ParameterServerService::PushSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                                                PushSparseResponse* resp) {
  return ToGrpcStatus(WritePushSparse(ctx, *req, resp));
}

absl::Status ParameterServerService::WritePushSparse(const grpc::ServerContextBase* ctx,
                                                     const SparseRequest& req,
                                                     PushSparseResponse* resp) {
  Scope scope(this, ctx);
  RequestBudget::Charge charge(&budget_);
  charge.ForceGrowTo(req.grads().size() + uint64_t{8} * req.keys_size());
  return Write(
      ctx, [&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = req; }, nullptr,
      [&] { return PushSparseRows(req, resp); });
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
