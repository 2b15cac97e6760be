#include "server/ps/service/reactors.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
#include "common/park_loop.h"
#include "common/status_macros.h"
#include "server/ps/service/data_service.h"
#include "server/ps/service/raw_unary.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps::callback {
namespace {

// A pull stream: prepare waits for the step (parking as a unary pull does); then next codes
// one chunk at a time, each written once the one before has gone.
class StreamPull final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using Next = std::function<absl::Status(grpc::ByteBuffer*, bool* last)>;
  StreamPull(grpc::CallbackServerContext* ctx, absl::Time deadline, WorkQueue* pool,
             InFlightCounter* in_flight, ParkLoop::Attempt prepare, Next next)
      : pool_(pool),
        prepare_(std::move(prepare)),
        next_(std::move(next)),
        loop_(ctx, deadline, pool, in_flight, [this] { Run(); }) {}

  void Run() {
    bool parked = false;
    absl::Status s = loop_.Step(prepare_, &parked);
    if (parked) return;
    if (!s.ok()) return Finish(ToGrpcStatus(s));
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      return Finish(
          grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading the pull stream"));
    }
    if (last_) return Finish(grpc::Status::OK);
    pool_->Post([this] { WriteNext(); });  // reading the table may wait for its lock
  }
  void OnCancel() override { loop_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (absl::Status s = next_(&chunk_, &last_); !s.ok()) return Finish(ToGrpcStatus(s));
    StartWrite(&chunk_);
  }

  WorkQueue* const pool_;
  const ParkLoop::Attempt prepare_;
  const Next next_;
  grpc::ByteBuffer chunk_;  // the chunk being written
  bool last_ = false;
  ParkLoop loop_;
};

// While a call is parked, the workers its attempt touched stay in a call (Stats' calls and
// idle_ms: a coordinator refuses to roll the tables back under them).
using Held = std::shared_ptr<std::unique_ptr<Shard::Visit::Held>>;
template <typename Scope>
absl::Status KeepIfParked(Scope* scope, absl::Status s, const Held& held) {
  if (IsParked(s)) {
    *held = scope->visit()->Keep();
  } else {
    held->reset();
  }
  return s;
}

}  // namespace

grpc::ServerUnaryReactor* Reactors::StartPull(Service* s, grpc::CallbackServerContext* ctx,
                                              Attempt attempt, bool on_pool) {
  auto* reactor =
      new ParkedUnary(ctx, s->core_->gate.Deadline(ctx), &s->core_->pool, &s->core_->in_flight,
                      [s, ctx, held = Held(new Held::element_type),
                       attempt = std::move(attempt)](const Wait& wait) -> absl::Status {
                        ShardCore::Scope scope(s->core_, ctx);
                        RequestBudget::Charge charge(&s->core_->budget);
                        return KeepIfParked(&scope, attempt(wait, &charge), held);
                      });
  if (on_pool) {
    s->core_->pool.Post([reactor] { reactor->Run(); });
  } else {
    reactor->Run();
  }
  return reactor;
}

grpc::ServerUnaryReactor* Reactors::PullDense(Service* s, grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  auto pull = std::make_shared<PullDenseRequest>();
  if (!ParseRaw(*req, pull.get())) return Refuse(ctx, Unparsable("PullDense"));
  return StartPull(s, ctx, [s, pull, resp](const Wait& wait, RequestBudget::Charge* charge) {
    ASSIGN_OR_RETURN(Service::PullChunk chunk, s->PullOne(wait, *pull, charge));
    ASSIGN_OR_RETURN(*resp, Service::EncodeChunks({chunk}, /*batch=*/false));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* Reactors::PullDenseBatch(Service* s, grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req,
                                                   grpc::ByteBuffer* resp) {
  auto batch = std::make_shared<PullDenseBatchRequest>();
  if (!ParseRaw(*req, batch.get())) return Refuse(ctx, Unparsable("PullDenseBatch"));
  return StartPull(s, ctx, [s, batch, resp](const Wait& wait, RequestBudget::Charge* charge) {
    std::vector<Service::PullChunk> chunks;
    RETURN_IF_ERROR(s->PullBatch(wait, batch->pulls(), &chunks, charge));
    ASSIGN_OR_RETURN(*resp, Service::EncodeChunks(chunks, /*batch=*/true));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* Reactors::PushPullDenseBatch(Service* s, grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req,
                                                       grpc::ByteBuffer* resp) {
  struct Call {
    DenseBatch batch;
    bool pushed = false;  // a run after a park only pulls
  };
  auto call = std::make_shared<Call>();
  if (!ParseRaw(*req, &call->batch)) return Refuse(ctx, Unparsable("PushPullDenseBatch"));
  // A chain's push waits for its round trip down the chain: not on a gRPC thread.
  const bool on_pool = s->core_->gate.replicator() != nullptr;
  return StartPull(
      s, ctx,
      [s, ctx, call, resp](const Wait& wait, RequestBudget::Charge* charge) {
        if (!call->pushed) {
          RETURN_IF_ERROR(s->PushOnce(ctx, call->batch, charge));
          call->pushed = true;
        }
        std::vector<Service::PullChunk> chunks;
        RETURN_IF_ERROR(s->PullAfterPush(wait, call->batch, &chunks, charge));
        ASSIGN_OR_RETURN(*resp, Service::EncodeChunks(chunks, /*batch=*/true));
        return absl::OkStatus();
      },
      on_pool);
}

grpc::ServerUnaryReactor* Reactors::PullSparse(Service* s, grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* req,
                                               grpc::ByteBuffer* resp) {
  auto pull = std::make_shared<SparseRequest>();
  if (!ParseRaw(*req, pull.get())) return Refuse(ctx, Unparsable("PullSparse"));
  return StartPull(s, ctx, [s, pull, resp](const Wait& wait, RequestBudget::Charge* charge) {
    PullSparseResponse rows;
    RETURN_IF_ERROR(s->PullRows(wait, *pull, &rows, charge));
    bool own = false;
    return FromGrpcStatus(
        grpc::SerializationTraits<PullSparseResponse>::Serialize(rows, resp, &own));
  });
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* Reactors::Write(
    Service* s, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
    grpc::ByteBuffer* resp, const char* method,
    absl::Status (Service::*work)(const grpc::ServerContextBase*, const Req&, Resp*)) {
  WorkQueue* pool = s->core_->gate.replicator() == nullptr ? nullptr : &s->core_->pool;
  return AnswerUnary<Req, Resp>(
      ctx, req, resp, {"ShardData", method}, pool,
      [s, ctx, work](const Req& r, Resp* out) { return (s->*work)(ctx, r, out); });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* Reactors::PullDenseStream(
    Service* s, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  struct Call {
    PullDenseRequest pull;
    const DenseTable* table = nullptr;
    Service::StreamPlan plan{0, 1};
    uint64_t done = 0, sent = 0;
    uint64_t tables = 0;  // ServingGate::tables_replaced() when prepared
    std::unique_ptr<RequestBudget::Charge> charge;
  };
  auto call = std::make_shared<Call>();
  if (!ParseRaw(*req, &call->pull)) return new RefusedWrite(Unparsable("PullDenseStream"));
  call->charge = std::make_unique<RequestBudget::Charge>(&s->core_->budget);
  auto prepare = [s, ctx, call,
                  held = Held(new Held::element_type)](const Wait& wait) -> absl::Status {
    ShardCore::Scope scope(s->core_, ctx);
    uint64_t length = 0;
    absl::StatusOr<DenseTable*> table = s->PreparePull(wait, call->pull, &length);
    RETURN_IF_ERROR(KeepIfParked(&scope, table.status(), held));
    call->table = *table;
    call->plan = s->PlanStream(call->pull, length);
    call->tables = s->core_->gate.tables_replaced();
    // one chunk at a time
    call->charge->ForceGrowTo(std::min(length, call->plan.per_chunk) * sizeof(float));
    return absl::OkStatus();
  };
  auto next = [s, ctx, call](grpc::ByteBuffer* out, bool* last) -> absl::Status {
    ShardCore::Scope scope(s->core_, ctx);
    if (s->core_->gate.tables_replaced() != call->tables) {
      return absl::AbortedError(
          "the shard's tables were replaced (a restore, or a replica installing state) while "
          "this pull stream was being sent; pull again");
    }
    const Service::PullChunk c = call->plan.Chunk(call->table, call->pull, call->done);
    ASSIGN_OR_RETURN(*out, Service::EncodeChunks({c}, /*batch=*/false));
    call->done += c.length;
    *last = call->plan.Done(call->done, ++call->sent);
    if (*last) call->charge->Release();  // free for the client's next request at its answer
    return absl::OkStatus();
  };
  auto* reactor = new StreamPull(ctx, s->core_->gate.Deadline(ctx), &s->core_->pool,
                                 &s->core_->in_flight, std::move(prepare), std::move(next));
  reactor->Run();
  return reactor;
}

}  // namespace pscluster::ps::callback

namespace pscluster::ps {

grpc::ServerUnaryReactor* ShardDataService::PullDense(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp) {
  return callback::Reactors::PullDense(this, ctx, req, resp);
}

grpc::ServerUnaryReactor* ShardDataService::PullDenseBatch(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req,
                                                           grpc::ByteBuffer* resp) {
  return callback::Reactors::PullDenseBatch(this, ctx, req, resp);
}

grpc::ServerUnaryReactor* ShardDataService::PushPullDenseBatch(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* req,
                                                               grpc::ByteBuffer* resp) {
  return callback::Reactors::PushPullDenseBatch(this, ctx, req, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardDataService::PullDenseStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return callback::Reactors::PullDenseStream(this, ctx, req);
}

grpc::ServerUnaryReactor* ShardDataService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req,
                                                           grpc::ByteBuffer* resp) {
  return callback::Reactors::Write(this, ctx, req, resp, "RegisterWorker",
                                   &ShardDataService::WriteRegister);
}

grpc::ServerUnaryReactor* ShardDataService::UnregisterWorker(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* req,
                                                             grpc::ByteBuffer* resp) {
  return callback::Reactors::Write(this, ctx, req, resp, "UnregisterWorker",
                                   &ShardDataService::WriteUnregister);
}

grpc::ServerUnaryReactor* ShardDataService::PushDense(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp) {
  return callback::Reactors::Write(this, ctx, req, resp, "PushDense", &ShardDataService::WritePush);
}

grpc::ServerUnaryReactor* ShardDataService::PushDenseBatch(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req,
                                                           grpc::ByteBuffer* resp) {
  return callback::Reactors::Write(this, ctx, req, resp, "PushDenseBatch",
                                   &ShardDataService::WritePushBatch);
}

grpc::ServerUnaryReactor* ShardDataService::PushSparse(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req,
                                                       grpc::ByteBuffer* resp) {
  return callback::Reactors::Write(this, ctx, req, resp, "PushSparse",
                                   &ShardDataService::WritePushSparse);
}

grpc::ServerUnaryReactor* ShardDataService::PullSparse(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req,
                                                       grpc::ByteBuffer* resp) {
  return callback::Reactors::PullSparse(this, ctx, req, resp);
}

}  // namespace pscluster::ps
