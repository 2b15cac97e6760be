#include "client/ps/internal/raw_call.h"

#include <utility>

namespace pscluster::internal {
namespace {

// Takes the one event the operation just started puts on `cq`.
bool Next(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

// A queue must be shut down and empty before it is destroyed.
void Drain(grpc::CompletionQueue* cq) {
  cq->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
  }
}

// The calling thread's queue for its unary calls, made once, which the thread itself polls:
// no hand-over to another thread when the answer comes (as with the callback form), and no
// queue made and drained per call. A thread makes one call at a time, and each call puts
// exactly one event on it (Finish's).
grpc::CompletionQueue* ThreadQueue() {
  struct Queue {
    grpc::CompletionQueue cq;
    ~Queue() { Drain(&cq); }
  };
  thread_local Queue queue;
  return &queue.cq;
}

}  // namespace

grpc::Status RawUnaryCall(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  grpc::CompletionQueue* cq = ThreadQueue();
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub->PrepareUnaryCall(ctx, method, request, cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(response, &status, &status);
  void* tag = nullptr;
  bool ok = false;
  if (!cq->Next(&tag, &ok) || tag != &status || !ok) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the call ended without a status");
  }
  return status;
}

RawStream::RawStream(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx)
    : call_(stub->PrepareCall(ctx, method, &cq_)) {
  call_->StartCall(nullptr);
  started_ = Next(&cq_);
}

RawStream::~RawStream() { Drain(&cq_); }

bool RawStream::Await() { return Next(&cq_); }

bool RawStream::Write(const grpc::ByteBuffer& message) {
  if (!started_) return false;
  call_->Write(message, nullptr);
  return Await();
}

bool RawStream::WritesDone() {
  if (!started_) return false;
  call_->WritesDone(nullptr);
  return Await();
}

bool RawStream::Read(grpc::ByteBuffer* message) {
  if (!started_) return false;
  call_->Read(message, nullptr);
  return Await();
}

grpc::Status RawStream::Finish() {
  grpc::Status status;
  call_->Finish(&status, nullptr);
  Next(&cq_);
  return status;
}

}  // namespace pscluster::internal
