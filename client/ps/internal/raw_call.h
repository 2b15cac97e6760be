// Calls whose messages the client codes itself (common/dense_wire.h), made through gRPC's
// generic stub: its public API sends and receives grpc::ByteBuffer, so a pull's values go
// from the answer's bytes straight to their place and a push's from the gradient. Each call
// blocks on its own completion queue, as a synchronous stub's does, bounded by the
// context's deadline.
#pragma once

#include <memory>
#include <type_traits>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace pscluster::internal {

// A message as bytes on the wire.
template <typename Msg>
grpc::Status ToBytes(const Msg& msg, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<Msg>::Serialize(msg, out, &own);
}

template <typename Msg>
grpc::Status FromBytes(grpc::ByteBuffer* bytes, Msg* out) {
  if constexpr (std::is_same_v<Msg, grpc::ByteBuffer>) {
    *out = std::move(*bytes);
    return grpc::Status::OK;
  } else {
    return grpc::SerializationTraits<Msg>::Deserialize(bytes, out);
  }
}

// One unary call of `method` ("/package.Service/Method").
grpc::Status RawUnaryCall(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response);

template <typename Req, typename Resp>
grpc::Status RawUnary(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx,
                      const Req& req, Resp* resp) {
  grpc::ByteBuffer response;
  grpc::Status s;
  if constexpr (std::is_same_v<Req, grpc::ByteBuffer>) {
    s = RawUnaryCall(stub, method, ctx, req, &response);
  } else {
    grpc::ByteBuffer request;
    if (s = ToBytes(req, &request); !s.ok()) return s;
    s = RawUnaryCall(stub, method, ctx, request, &response);
  }
  if (!s.ok()) return s;
  return FromBytes(&response, resp);
}

// A streaming call of `method` (client, server or both ways: the wire is the same), one
// blocking step at a time. Finish must be called before it is destroyed.
class RawStream {
 public:
  RawStream(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx);
  ~RawStream();
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;

  // False once the call has ended (Finish says why).
  bool Write(const grpc::ByteBuffer& message);
  bool WritesDone();
  bool Read(grpc::ByteBuffer* message);
  grpc::Status Finish();

 private:
  // Waits for the operation just started; false if it failed (or the call did not start).
  bool Await();

  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool started_ = false;
};

}  // namespace pscluster::internal
