// ShardData: what workers call on a shard. Registration, dense push and pull (unary, batched
// and streamed) and sparse rows. The pulls and the unary pushes run on gRPC's callback API
// (reactors.h): a pull that must wait for its step is parked in its table and holds no
// thread. Bulk tensors travel zero-copy through the raw methods (common/dense_wire.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/parking.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps/service/shard_core.h"

namespace pscluster::ps {

namespace callback {
class Reactors;
}

// The generated service with every unary method and the pull stream on the raw callback
// API: their requests are parsed, and their answers coded, by reactors.cc (gRPC's own
// parser answers a callback method's unparsable request UNIMPLEMENTED, with no message).
template <typename Base>
using WithRawUnaryData = ShardData::WithRawCallbackMethod_RegisterWorker<
    ShardData::WithRawCallbackMethod_UnregisterWorker<ShardData::WithRawCallbackMethod_PushDense<
        ShardData::WithRawCallbackMethod_PushDenseBatch<ShardData::WithRawCallbackMethod_PushSparse<
            ShardData::WithRawCallbackMethod_PullSparse<Base>>>>>>;
using ShardDataBase = WithRawUnaryData<
    ShardData::WithRawCallbackMethod_PullDense<ShardData::WithRawCallbackMethod_PullDenseBatch<
        ShardData::WithRawCallbackMethod_PushPullDenseBatch<
            ShardData::WithRawCallbackMethod_PullDenseStream<
                ShardData::WithRawCallbackMethod_PushDenseStream<ShardData::Service>>>>>>;

class ShardDataService final : public ShardDataBase {
 public:
  explicit ShardDataService(ShardCore* core);

  // (push_stream.h)
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushDenseStream(grpc::CallbackServerContext* ctx,
                                                             grpc::ByteBuffer* resp) override;
  // The pulls (reactors.cc).
  grpc::ServerUnaryReactor* PullDense(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PullDenseBatch(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushPullDenseBatch(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* req,
                                               grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullDenseStream(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* req) override;
  // The unary writes: answered on gRPC's thread, or, with a chain, whose round trip
  // blocks, on the pool (reactors.cc).
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* UnregisterWorker(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req,
                                             grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushDense(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushDenseBatch(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushSparse(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PullSparse(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;

 private:
  friend class callback::Reactors;

  // A dense pull's answer before its values are read: the chunk's every field but data, and
  // the table its `length` values come from, from header.offset() on.
  struct PullChunk {
    const DenseTable* table;
    DenseChunk header;
    uint64_t length;
  };
  // The chunk of `length` values of `table` from req.offset() on.
  static PullChunk PlanChunk(const DenseTable* table, const PullDenseRequest& req, uint64_t offset,
                             uint64_t length);
  // The answer coded as gRPC sends it (a DenseBatch, or one DenseChunk).
  static absl::StatusOr<grpc::ByteBuffer> EncodeChunks(const std::vector<PullChunk>& chunks,
                                                       bool batch);
  // The pull RPCs' work up to reading the values.
  absl::StatusOr<PullChunk> PullOne(const Wait& wait, const PullDenseRequest& req,
                                    RequestBudget::Charge* charge);
  // PushPullDenseBatch in two parts: the push, made once (a repeated attempt, same request
  // id, only pulls), and the pull of step + 1 of the same ranges, made again after a park.
  absl::Status PushOnce(const grpc::ServerContextBase* ctx, const DenseBatch& req,
                        RequestBudget::Charge* charge);
  absl::Status PullAfterPush(const Wait& wait, const DenseBatch& req, std::vector<PullChunk>* out,
                             RequestBudget::Charge* charge);
  // A pull stream's chunks: `per_chunk` values each, the last one shorter (one empty chunk
  // when `length` is 0).
  struct StreamPlan {
    uint64_t length, per_chunk;
    bool Done(uint64_t done, uint64_t sent) const { return sent > 0 && done >= length; }
    PullChunk Chunk(const DenseTable* table, const PullDenseRequest& req, uint64_t done) const;
  };
  StreamPlan PlanStream(const PullDenseRequest& req, uint64_t length) const;

  // The unary writes' work, once the request parsed.
  absl::Status WriteRegister(const grpc::ServerContextBase* ctx, const RegisterWorkerRequest& req,
                             RegisterWorkerResponse* resp);
  absl::Status WriteUnregister(const grpc::ServerContextBase* ctx,
                               const UnregisterWorkerRequest& req, UnregisterWorkerResponse* resp);
  absl::Status WritePush(const grpc::ServerContextBase* ctx, const DenseChunk& req,
                         PushDenseResponse* resp);
  absl::Status WritePushBatch(const grpc::ServerContextBase* ctx, const DenseBatch& req,
                              PushDenseBatchResponse* resp);
  absl::Status WritePushSparse(const grpc::ServerContextBase* ctx, const SparseRequest& req,
                               PushSparseResponse* resp);
  // The answer's bytes are added to `charge` as its chunks are planned.
  absl::Status PullBatch(const Wait& wait,
                         const google::protobuf::RepeatedPtrField<PullDenseRequest>& pulls,
                         std::vector<PullChunk>* out, RequestBudget::Charge* charge);
  // Validates a pull and waits for its consistency bound (or parks: Parked()); returns the
  // table and the resolved length (0 in the request = to the end of this shard's range).
  absl::StatusOr<DenseTable*> PreparePull(const Wait& wait, const PullDenseRequest& req,
                                          uint64_t* length);
  // OK once `table` is readable at `step`; until then Parked(), and the Wait's waiter is
  // woken when it is.
  static absl::Status WaitForStep(Table* table, int64_t step, const Wait& wait);
  // A sparse pull's rows into resp->values (the pull waits as `wait` says).
  absl::Status PullRows(const Wait& wait, const SparseRequest& req, PullSparseResponse* resp,
                        RequestBudget::Charge* charge);

  ShardCore* const core_;
};

}  // namespace pscluster::ps
