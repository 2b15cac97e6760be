#include "client/ps/internal/raw_call.h"

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

}  // namespace

grpc::Status RawUnaryCall(grpc::GenericStub* stub, const char* method, grpc::ClientContext* ctx,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub->PrepareUnaryCall(ctx, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(response, &status, nullptr);
  if (!Next(&cq) && status.ok()) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, "the call ended without a status");
  }
  Drain(&cq);
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
