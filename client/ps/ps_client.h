// PsClient: one worker's view of a sharded parameter server. It splits dense tensors by
// range and sparse keys by hash (common/sharding.h), talks to every shard in parallel with
// a deadline on each RPC, and reassembles the answers. Large dense slices travel as
// streams of bounded chunks. The implementation is in one file per protocol: ps_client.cc
// (registration, tables, sparse rows), dense.cc (dense tensors), table_state.cc (whole
// table state for mode switches), snapshots.cc (statistics, snapshots, restore); what
// every call shares is internal/shard_calls.h.
//
// Thread-safe: concurrent calls from several threads are fine.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/ps/internal/shard_calls.h"
#include "client/ps/parameter_store.h"
#include "client/ps/ps_client_options.h"
#include "proto/ps.grpc.pb.h"

namespace pscluster {

// A random client id (32 hex digits).
std::string NewClientId();

class PsClient final : public ParameterStore {
 public:
  // Connects lazily (channels are created, nothing is sent).
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(PsClientOptions options);
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  int num_shards() const { return calls_.size(); }
  int32_t worker_id() const { return options_.worker_id; }

  // Registers this worker with every shard (needed before any push or pull).
  absl::Status RegisterWorker();
  // This worker leaves for good: no shard's BSP steps wait for it any more.
  absl::Status UnregisterWorker();
  // Until the coordinator does rendezvous: waits (bounded) until every shard has at least
  // `world` registered workers, so BSP steps wait for all of them from step 0 on.
  absl::Status AwaitWorkers(int world, absl::Duration timeout);
  // Creates the table on every shard (idempotent for an identical spec).
  absl::Status CreateTable(const ps::TableSpec& spec);
  // Every shard's view of the table, by shard id.
  absl::StatusOr<std::vector<ps::TableInfo>> DescribeTable(uint32_t table_id);

  // Whole dense tensor of the table (spec.size values).
  absl::Status PushDense(uint32_t table_id, int64_t step, absl::Span<const float> grad);
  absl::Status PullDense(uint32_t table_id, int64_t step, absl::Span<float> out);

  // Many dense tables at once, for a model's tensors each step: one RPC per shard (each
  // holding every table's range on it) instead of one per table and shard. tables[i] is
  // read into / pushed from data[i] (the whole tensor). Falls back to the per-table calls
  // for a shard whose share exceeds chunk_bytes.
  absl::Status PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                             absl::Span<const absl::Span<float>> out) override;
  absl::Status PushDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                             absl::Span<const absl::Span<const float>> grads);
  // PushDenseMany of step `step`, then PullDenseMany of step + 1 into `out`, in one round
  // trip per shard (out may alias grads: the gradients are sent before anything arrives).
  absl::Status PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<const float>> grads,
                                 absl::Span<const absl::Span<float>> out) override;

  // A dense table's full state at `step`, for leaving PS mode. Waits (bounded by
  // rpc_timeout) until every shard can be read at `step`, as a pull at `step` would (BSP:
  // steps < step applied; FAILED_PRECONDITION when step itself already is), then gathers
  // from every shard concurrently the values, each optimizer slot and the update count
  // (Adam's bias-correction step). `values` and each of `slots` hold spec.size floats;
  // `slots` has one buffer per optimizer slot (SGD 0, MOMENTUM/ADAGRAD 1, ADAM(W)/FTRL 2),
  // else INVALID_ARGUMENT. FAILED_PRECONDITION when shards disagree on the update count
  // (a skip_nonfinite push dropped on some shards only).
  absl::Status ExportDense(uint32_t table_id, int64_t step, absl::Span<float> values,
                           std::vector<absl::Span<float>> slots, int64_t* updates) override;
  // Installs a dense table's full state, for entering PS mode at `step` (e.g. what
  // ExportDense returned). Sends each shard its range concurrently; each shard checks it
  // (slot count, finite values, step and updates >= 0) and then, all or nothing, replaces
  // values, slots and update count, drops gradients pushed but not applied and restarts
  // consistency at `step`: every registered worker has pushed the steps before it, so pulls
  // at `step` return at once and pushes for `step` are accepted. When one shard rejects the
  // state the others may already hold it; repeating the import is safe.
  absl::Status ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                           absl::Span<const float> values,
                           const std::vector<absl::Span<const float>>& slots) override;

  // Rows of `keys` (out / grads hold keys.size() * dim values, row-major, in key order).
  absl::Status PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<const float> grads) override;
  absl::Status PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<float> out) override;

  // except_clients: the workers' idle_ms and calls leave out these clients' calls.
  absl::StatusOr<std::vector<ps::StatsResponse>> Stats(
      const std::vector<std::string>& except_clients = {});

  // Asks every shard to snapshot `step` (each captures, acknowledges, writes in the
  // background); `metric` feeds keep-the-best retention.
  absl::Status Snapshot(int64_t step, const ps::SnapshotRequest& extra = {});
  // Every shard's snapshot status; with wait_until_idle, after its write finished.
  absl::StatusOr<std::vector<ps::SnapshotStatusResponse>> SnapshotStatus(bool wait_until_idle);
  absl::StatusOr<std::vector<ps::ListSnapshotsResponse>> ListSnapshots();
  // Snapshots complete on every shard, ascending step, bytes summed over shards.
  absl::StatusOr<std::vector<ps::SnapshotInfo>> CompleteSnapshots();
  // The newest snapshot step complete on every shard, or NOT_FOUND.
  absl::StatusOr<int64_t> LatestCompleteSnapshot();
  // The step to snapshot the tables at: the most steps any BSP table on any shard has
  // applied (the step a BSP table holds for the capture); with no BSP table, the furthest
  // SSP/ASP watermark (their slowest worker's clock; captured at once). A BSP table is
  // never asked for a step an SSP/ASP table's clocks reached but it did not.
  absl::StatusOr<int64_t> CheckpointStep();
  // Rolls every shard back to snapshot `step` in place; `drop_later`: and deletes their
  // snapshots of later steps (RestoreRequest.drop_later).
  // rolled_back (optional): the shards that did, also when others failed.
  absl::Status Restore(int64_t step, bool drop_later = false,
                       std::vector<int>* rolled_back = nullptr);

  // The stub of one shard, for callers that need an RPC this class does not wrap.
  ShardStub* stub(int shard) { return calls_.stub(shard); }

 private:
  explicit PsClient(PsClientOptions options);
  // The table's spec, from the cache or asked of shard 0.
  absl::StatusOr<ps::TableSpec> Spec(uint32_t table_id);
  absl::Status CheckDense(const ps::TableSpec& spec, size_t length);
  // A gradient with NaN/Inf is refused here, before anything is sent: each shard checks
  // only its own part, so a push one shard refused would be applied by the others. Tables
  // with skip_nonfinite are left to the shards.
  static absl::Status CheckFinite(const ps::TableSpec& spec, absl::Span<const float> grad);
  // The table's dim, checking it is SPARSE and `values` == keys x dim.
  absl::StatusOr<size_t> SparseDim(uint32_t table_id, size_t keys, size_t values);
  // One empty request per shard, addressed to table_id at step.
  std::vector<ps::SparseRequest> SparseRequests(uint32_t table_id, int64_t step) const;
  // PushDenseMany and PushPullDenseMany (out non-empty: pull step + 1 into it).
  absl::Status PushMany(int64_t step, absl::Span<const uint32_t> tables,
                        absl::Span<const absl::Span<const float>> grads,
                        absl::Span<const absl::Span<float>> out);
  // The chunks of a batch answer, one per table (every shard gets every table's chunk, an
  // empty range's too), into out.
  absl::Status CopyBatch(int shard, const grpc::ByteBuffer& resp, absl::Span<const uint32_t> tables,
                         absl::Span<const absl::Span<float>> out);
  absl::Status PushDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                              absl::Span<const float> grad);
  absl::Status PullDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                              absl::Span<float> out);
  // One shard's part of ExportDense/ImportDense: its range starts at global index `begin`;
  // values and slots are already cut to it.
  absl::Status ExportDenseShard(int shard, uint32_t table_id, int64_t step, uint64_t begin,
                                absl::Span<float> values,
                                const std::vector<absl::Span<float>>& slots, int64_t* updates);
  absl::Status ImportDenseShard(int shard, uint32_t table_id, int64_t step, int64_t updates,
                                uint64_t begin, absl::Span<const float> values,
                                const std::vector<absl::Span<const float>>& slots);
  using Stub = ShardStub;

  const PsClientOptions options_;
  internal::ShardCalls calls_;
  absl::Mutex mu_;
  std::map<uint32_t, ps::TableSpec> specs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster
