// gRPC front of a Shard: decodes requests, enforces transfer limits, streams chunks.
// The pulls run on gRPC's callback API (reactors.h): one that must wait for its step
// is parked in its table and holds no thread. The other methods are still synchronous.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/call_metadata.h"
#include "common/graceful_shutdown.h"
#include "common/parking.h"
#include "common/work_queue.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps/service/buffer_pool.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/table/shard.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/service/stream_watchdog.h"
#include "server/ps/replication/write_log.h"

namespace pscluster::ps {

struct ServiceOptions {
  // Largest DenseChunk.data / sparse payload accepted or sent, in bytes.
  uint64_t max_chunk_bytes = uint64_t{4} << 20;
  // Longest a pull waits for its consistency bound when the caller set no shorter deadline.
  absl::Duration max_wait = absl::Minutes(5);
  // Capacity of received-chunk buffers kept for reuse across push streams (at most a quarter
  // of max_inflight_request_bytes).
  uint64_t buffer_pool_bytes = uint64_t{256} << 20;
  // Most bytes the requests in flight may hold at once (RequestBudget): a push stream holds
  // its whole transfer until it is applied, an import or export the table's whole state; one
  // that would go over is refused with RESOURCE_EXHAUSTED. Unary requests and pulls count
  // what they hold but are never refused (gRPC has received them already).
  uint64_t max_inflight_request_bytes = uint64_t{1} << 30;
  // Once no request has held memory for this long and the process grew by at least
  // release_min_bytes since the last time, the pooled buffers are freed and the heap's free
  // pages go back to the kernel (malloc_trim). InfiniteDuration: never.
  absl::Duration release_idle_memory_after = absl::Seconds(2);
  uint64_t release_min_bytes = uint64_t{32} << 20;
  // A push or import stream that receives nothing for this long is cancelled, and nothing
  // of it applied (StreamWatchdog). InfiniteDuration: never.
  absl::Duration stream_idle_timeout = absl::Seconds(30);
};

// gRPC's own message limit for a server using `options`: a chunk plus its header.
int MaxMessageBytes(const ServiceOptions& options);

inline constexpr int kMaxExceptClients = 64;  // StatsRequest.except_clients

namespace callback {
class Reactors;
}

// The generated service with the pulls and the unary pushes on the raw callback API: their
// requests are parsed, and their answers coded, by reactors.cc (gRPC's own parser answers a
// callback method's unparsable request UNIMPLEMENTED, with no message).
using ParameterServerBase = ParameterServer::WithRawCallbackMethod_PullDense<
    ParameterServer::WithRawCallbackMethod_PullDenseBatch<
        ParameterServer::WithRawCallbackMethod_PushPullDenseBatch<
            ParameterServer::WithRawCallbackMethod_PullDenseStream<
                ParameterServer::WithRawCallbackMethod_PullSparse<
                    ParameterServer::WithRawCallbackMethod_PushDense<
                        ParameterServer::WithRawCallbackMethod_PushDenseBatch<
                            ParameterServer::WithRawCallbackMethod_PushSparse<
                                ParameterServer::Service>>>>>>>>;

class ParameterServerService final : public ParameterServerBase {
 public:
  // `snapshotter` may be null (no --data_dir): snapshot RPCs then fail clearly.
  ParameterServerService(Shard* shard, Snapshotter* snapshotter, ServiceOptions options);
  ~ParameterServerService() override;

  // Handlers in progress, for ShutdownGracefully.
  InFlightCounter* in_flight() { return &in_flight_; }
  // The server's grpc.health.v1 service (null: none), NOT_SERVING while Restore runs.
  void SetHealth(grpc::HealthCheckServiceInterface* health) { health_ = health; }
  // The shard's chain (ps_coordinator --replicas > 1; null: not replicated). From then on
  // only the chain's head serves clients, and every update goes down the chain.
  void SetReplicator(Replicator* replicator) { replicator_ = replicator; }
  // False while a shard started with --coordinator has not registered yet: its data calls
  // get UNAVAILABLE. A restarted shard served its workers' pushes before the coordinator's
  // view showed its new incarnation, and they took the refusal of a step the restored
  // tables had not reached for their own error instead of rolling back.
  void SetJoined(bool joined) { joined_ = joined; }
  // An update that came down the chain, applied as the head's handler applied it.
  absl::Status ApplyReplicated(const ReplicatedUpdate& update, std::vector<std::string>* chunks);
  // For a joining replica: the shard's state now (the tail), and installing it (the joiner).
  absl::StatusOr<Replicator::State> CaptureState() const;
  absl::Status InstallState(std::unique_ptr<Shard> staged);
  // Held shared by every handler that uses the tables (Replicator's `serving`).
  absl::Mutex* serving_mu() { return &serving_mu_; }

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const RegisterWorkerRequest* req,
                              RegisterWorkerResponse* resp) override;
  grpc::Status UnregisterWorker(grpc::ServerContext* ctx, const UnregisterWorkerRequest* req,
                                UnregisterWorkerResponse* resp) override;
  grpc::Status CreateTable(grpc::ServerContext* ctx, const CreateTableRequest* req,
                           CreateTableResponse* resp) override;
  grpc::Status DescribeTable(grpc::ServerContext* ctx, const DescribeTableRequest* req,
                             TableInfo* resp) override;
  grpc::Status PullDense(grpc::ServerContext* ctx, const PullDenseRequest* req,
                         DenseChunk* resp) override;
  grpc::Status PushDense(grpc::ServerContext* ctx, const DenseChunk* req,
                         PushDenseResponse* resp) override;
  grpc::Status PullDenseStream(grpc::ServerContext* ctx, const PullDenseRequest* req,
                               grpc::ServerWriter<DenseChunk>* writer) override;
  grpc::Status PushDenseStream(grpc::ServerContext* ctx, grpc::ServerReader<DenseChunk>* reader,
                               PushDenseResponse* resp) override;
  grpc::Status PullDenseBatch(grpc::ServerContext* ctx, const PullDenseBatchRequest* req,
                              DenseBatch* resp) override;
  grpc::Status PushDenseBatch(grpc::ServerContext* ctx, const DenseBatch* req,
                              PushDenseBatchResponse* resp) override;
  grpc::Status PushPullDenseBatch(grpc::ServerContext* ctx, const DenseBatch* req,
                                  DenseBatch* resp) override;
  // The same pulls on the wire (reactors.cc); the synchronous ones above stay for
  // callers in this process (the fuzzers).
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
  // The unary pushes on the wire: answered on gRPC's thread, or, with a chain, whose round
  // trip blocks, on the pool (push_calls.cc).
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
  grpc::Status PullSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                          PullSparseResponse* resp) override;
  grpc::Status PushSparse(grpc::ServerContext* ctx, const SparseRequest* req,
                          PushSparseResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const StatsRequest* req,
                     StatsResponse* resp) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const SnapshotRequest* req,
                        SnapshotResponse* resp) override;
  grpc::Status ListSnapshots(grpc::ServerContext* ctx, const ListSnapshotsRequest* req,
                             ListSnapshotsResponse* resp) override;
  grpc::Status SnapshotStatus(grpc::ServerContext* ctx, const SnapshotStatusRequest* req,
                              SnapshotStatusResponse* resp) override;
  grpc::Status Restore(grpc::ServerContext* ctx, const RestoreRequest* req,
                       RestoreResponse* resp) override;
  grpc::Status ExportDense(grpc::ServerContext* ctx, const ExportDenseRequest* req,
                           grpc::ServerWriter<TableStateChunk>* writer) override;
  grpc::Status ImportDense(grpc::ServerContext* ctx, grpc::ServerReader<TableStateChunk>* reader,
                           ImportDenseResponse* resp) override;
  grpc::Status Replicate(grpc::ServerContext* ctx, grpc::ServerReader<ReplicatedUpdate>* reader,
                         ReplicateResponse* resp) override;
  grpc::Status TransferState(grpc::ServerContext* ctx, const TransferStateRequest* req,
                             grpc::ServerWriter<StateTransferChunk>* writer) override;
  grpc::Status JoinedChain(grpc::ServerContext* ctx, const JoinedChainRequest* req,
                           JoinedChainResponse* resp) override;

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
  // The answer as a message, or coded as gRPC sends it (a DenseBatch, or one DenseChunk).
  static absl::Status ReadChunk(const PullChunk& chunk, DenseChunk* out);
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
  // The synchronous handlers' wait: until the call's deadline, or until it is cancelled.
  Wait Blocking(const grpc::ServerContextBase* ctx) const;

  absl::Time Deadline(const grpc::ServerContextBase* ctx) const;
  // OK when this shard serves clients: not replicated, or the head of its chain.
  absl::Status CheckServing() const;
  // A client's update: apply() directly, or, replicated, on the head in the chain's order
  // and then down the chain (describe fills in the update it sends).
  absl::Status Write(const grpc::ServerContextBase* ctx,
                     const std::function<void(ReplicatedUpdate*)>& describe,
                     std::vector<std::string>* chunks, const std::function<absl::Status()>& apply);
  // The unary pushes' work, for both the synchronous and the callback handlers.
  absl::Status WritePush(const grpc::ServerContextBase* ctx, const DenseChunk& req,
                         PushDenseResponse* resp);
  absl::Status WritePushBatch(const grpc::ServerContextBase* ctx, const DenseBatch& req,
                              PushDenseBatchResponse* resp);
  absl::Status WritePushSparse(const grpc::ServerContextBase* ctx, const SparseRequest& req,
                               PushSparseResponse* resp);
  // The handlers' updates, once their requests are checked (the chain applies them again).
  absl::Status PushDenseChunk(const DenseChunk& chunk, PushDenseResponse* resp);
  absl::Status PushSparseRows(const SparseRequest& req, PushSparseResponse* resp);
  // A push stream's chunks after `first`, each checked (CheckStreamChunk), charged and
  // scanned as it comes, its bytes kept in *buffers; `first`'s own bytes become buffers[0].
  absl::Status ReceivePush(DenseTable* table, DenseChunk* first,
                           grpc::ServerReader<DenseChunk>* reader, StreamWatchdog::Watch* watch,
                           RequestBudget::Charge* charge, std::vector<std::string>* buffers,
                           DenseTable::Scanned* scanned);
  // Chunk `index` of a push stream that received `received` values before it.
  absl::Status CheckStreamChunk(const DenseChunk& first, const DenseChunk& c, uint64_t index,
                                uint64_t received) const;
  // A push stream's transfer: `first`'s header, the chunks' values in order.
  absl::Status PushStreamed(const DenseChunk& first, const std::vector<std::string>& buffers,
                            DenseTable::Scanned scanned, PushDenseResponse* resp);
  // Whether the client cancelled the call (or gave up on it): waits end early on it.
  static std::function<bool()> Cancelled(const grpc::ServerContextBase* ctx);
  // The batch RPCs' work: every chunk checked before any is pushed; pulls read in order.
  absl::Status PushBatch(const DenseBatch& batch, PushDenseBatchResponse* resp);
  // A batch's every chunk checked, its table found and its values scanned, in order.
  absl::Status CheckBatch(const DenseBatch& batch, std::vector<DenseTable*>* tables,
                          std::vector<DenseTable::Scanned>* scanned) const;
  // The answer's bytes are added to `charge` as its chunks are planned.
  absl::Status PullBatch(const Wait& wait,
                         const google::protobuf::RepeatedPtrField<PullDenseRequest>& pulls,
                         std::vector<PullChunk>* out, RequestBudget::Charge* charge);
  // Validates a pull and waits for its consistency bound (or parks: Parked()); returns the
  // table and the resolved length (0 in the request = to the end of this shard's range).
  absl::StatusOr<DenseTable*> PreparePull(const Wait& wait, const PullDenseRequest& req,
                                          uint64_t* length);
  // Until `table` is readable at `step`: blocking, or Parked() (Wait).
  static absl::Status WaitForStep(Table* table, int64_t step, const Wait& wait);
  // A sparse pull's rows into resp->values (the pull waits as `wait` says).
  absl::Status PullRows(const Wait& wait, const SparseRequest& req, PullSparseResponse* resp,
                        RequestBudget::Charge* charge);

  // The thread that gives idle memory back (release_idle_memory_after).
  void ReleaseIdleMemory();

  absl::Status CheckSnapshotter() const;
  // Restore's parts: the snapshots after `step` deleted (their timeline is abandoned); the
  // loaded state installed, waiting pulls failed with the restore named.
  absl::Status DropLaterThan(int64_t step);
  void InstallRestored(Snapshotter::Loaded loaded);
  // Replicated, before the head replaces its whole state (Restore, ImportDense): the chain
  // becomes the head alone and no replica joins until *joins is released (Replicator).
  absl::Status ReplaceWholeState(absl::string_view what, std::unique_ptr<absl::MutexLock>* joins);
  // A dense table for ExportDense/ImportDense: NOT_FOUND, or FAILED_PRECONDITION for a
  // sparse one. (No worker id: moving state is not a worker's push or pull.)
  absl::StatusOr<DenseTable*> DenseForState(uint32_t table_id) const;
  // Reads a whole import stream into a state for `table`'s range; `first` is its first chunk.
  absl::StatusOr<DenseState> ReceiveState(DenseTable* table, const TableStateChunk& first,
                                          grpc::ServerReader<TableStateChunk>* reader,
                                          StreamWatchdog::Watch* watch) const;

  // Held by every handler but Restore, which takes serving_mu_ exclusively to swap tables.
  // With `ctx` (the push and pull handlers), the workers the call touches count as in a
  // call of the client its ps-client-id metadata names until it ends (Shard::Visit).
  class Scope {
   public:
    explicit Scope(ParameterServerService* s, const grpc::ServerContextBase* ctx = nullptr);
    Shard::Visit* visit() { return &visit_; }

   private:
    InFlightCounter::Scope in_flight_;
    absl::ReaderMutexLock serving_;
    Shard::Visit visit_;
  };

  Shard* const shard_;
  Snapshotter* const snapshotter_;
  std::atomic<grpc::HealthCheckServiceInterface*> health_{nullptr};
  std::atomic<Replicator*> replicator_{nullptr};
  std::atomic<bool> joined_{true};  // SetJoined
  const ServiceOptions options_;
  StreamWatchdog watchdog_{options_.stream_idle_timeout};
  BufferPool buffers_;
  RequestBudget budget_;
  InFlightCounter in_flight_;
  absl::Mutex serving_mu_;
  // Without a chain, every write goes through this log (with one, through the chain's):
  // a repeated attempt of a write (its slice ran out before the answer came) is not
  // applied again. Started again when Restore replaces the tables: repeats of writes into
  // the old tables apply again.
  static constexpr size_t kWriteIds = 4096;
  absl::Mutex log_mu_ ABSL_ACQUIRED_AFTER(serving_mu_);
  WriteLog alone_{"shard " + std::to_string(shard_->options().shard_id), &log_mu_, kWriteIds,
                  /*ordered=*/false};
  // Counts the times Restore or a joining replica replaced the tables: a pull stream, which
  // reads its table across callbacks, ends when it changes under it.
  std::atomic<uint64_t> tables_replaced_{0};
  // Where the callback handlers run what may block: a woken pull, a chain's round trip.
  WorkQueue pool_{kPoolThreads};
  static constexpr int kPoolThreads = 4;
  absl::Mutex release_mu_;
  bool stopping_ ABSL_GUARDED_BY(release_mu_) = false;
  std::thread releaser_;  // last: started once everything it uses exists
};

}  // namespace pscluster::ps
