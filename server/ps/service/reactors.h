// The pulls and the unary pushes on gRPC's callback API. A pull whose step is not readable yet
// parks in its table (common/parking.h) and holds no thread; it runs again on the service's pool
// when the table wakes it, its deadline comes, or the client cancels. The answers are coded
// straight from the tables into the bytes gRPC sends (common/dense_wire.h).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "common/parking.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/request_budget.h"

namespace pscluster::ps {
class ShardDataService;

namespace callback {

// ShardDataService's raw callback methods (the pulls and the unary pushes), and the
// only code besides it that reaches its private pull path (a friend).
class Reactors {
 public:
  using Service = ShardDataService;
  static grpc::ServerUnaryReactor* PullDense(Service* s, grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req, grpc::ByteBuffer* resp);
  static grpc::ServerUnaryReactor* PullDenseBatch(Service* s, grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req,
                                                  grpc::ByteBuffer* resp);
  static grpc::ServerUnaryReactor* PushPullDenseBatch(Service* s, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp);
  static grpc::ServerUnaryReactor* PullSparse(Service* s, grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req, grpc::ByteBuffer* resp);
  // A unary push: its request parsed here, work(ctx, request, &answer) run on gRPC's thread,
  // or, with a chain, whose round trip blocks, on the service's pool.
  template <typename Req, typename Resp>
  static grpc::ServerUnaryReactor* Write(
      Service* s, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
      grpc::ByteBuffer* resp, const char* method,
      absl::Status (Service::*work)(const grpc::ServerContextBase*, const Req&, Resp*));
  static grpc::ServerWriteReactor<grpc::ByteBuffer>* PullDenseStream(
      Service* s, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req);

 private:
  // A unary pull's work once its request is parsed, into the response it captured; may
  // answer Parked() (common/parking.h).
  using Attempt = std::function<absl::Status(const Wait&, RequestBudget::Charge*)>;
  // Runs each attempt under the service's Scope and a charge to its budget; while the call
  // is parked, the workers its attempt touched stay in a call (Shard::Visit::Keep). The
  // first attempt runs here, or with `on_pool` on the service's pool.
  static grpc::ServerUnaryReactor* StartPull(Service* s, grpc::CallbackServerContext* ctx,
                                             Attempt attempt, bool on_pool = false);
};

}  // namespace callback
}  // namespace pscluster::ps
