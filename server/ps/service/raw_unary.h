// A unary call on gRPC's callback API whose request the shard parses itself: gRPC's own
// parser answers a callback method's unparsable request UNIMPLEMENTED, with no message,
// where a client needs INVALID_ARGUMENT naming the method.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "common/work_queue.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/request_checks.h"

namespace pscluster::ps {

// gRPC's deserializer empties the buffer it reads: it reads a copy (the slices are shared).
template <typename Msg>
bool ParseRaw(const grpc::ByteBuffer& bytes, Msg* msg) {
  grpc::ByteBuffer copy(bytes);
  return grpc::SerializationTraits<Msg>::Deserialize(&copy, msg).ok();
}

// A unary call answered at once with `why` (a request that did not parse).
inline grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const grpc::Status& why) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(why);
  return reactor;
}

// A server stream answered with `why` before it sends anything.
class RefusedWrite final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedWrite(const grpc::Status& why) { Finish(why); }
  void OnDone() override { delete this; }
};

// Answers with work(request, &answer), run on gRPC's thread when `pool` is null (work that
// never waits long), else on `pool` (a chain's round trip, a snapshot's wait, a restore).
// `method` names the call in the error for a request that does not parse.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* AnswerUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp, const RawMethod& method,
                                      WorkQueue* pool,
                                      std::function<absl::Status(const Req&, Resp*)> work) {
  auto request = std::make_shared<Req>();
  if (!ParseRaw(*req, request.get())) return Refuse(ctx, Unparsable(method));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto answer = [reactor, resp, request, work = std::move(work)] {
    Resp out;
    absl::Status st = work(*request, &out);
    bool own = false;
    if (st.ok()) st = FromGrpcStatus(grpc::SerializationTraits<Resp>::Serialize(out, resp, &own));
    reactor->Finish(ToGrpcStatus(st));
  };
  if (pool == nullptr) {
    answer();
  } else {
    pool->Post(std::move(answer));
  }
  return reactor;
}

}  // namespace pscluster::ps
