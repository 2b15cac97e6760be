// One parameter-server shard: its registered workers and tables. Independent of gRPC.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/ps.pb.h"
#include "server/ps/dense_table.h"
#include "server/ps/sparse_table.h"

namespace pscluster::ps {

// INVALID_ARGUMENT for a negative worker id (every request naming a worker checks it).
absl::Status CheckWorkerId(int32_t worker_id);

struct ShardOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  // Refuse tables whose slice on this shard (values + optimizer state) would exceed this.
  uint64_t max_table_bytes = uint64_t{16} << 30;
  // Refuse a new dense table when the tables' values and optimizer state would pass this,
  // shard-wide (sparse tables count the rows they hold, but a push adding rows is bounded
  // by max_table_bytes alone).
  uint64_t max_memory_bytes = UINT64_MAX;
  uint32_t max_sparse_dim = 1 << 16;
};

// INVALID_ARGUMENT naming the field for a spec no shard could hold.
absl::Status ValidateTableSpec(const TableSpec& spec);

class Shard {
 public:
  explicit Shard(ShardOptions options);
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const ShardOptions& options() const { return options_; }

  // The caller checks worker_id >= 0 (ParameterServerService).
  RegisterWorkerResponse RegisterWorker(int32_t worker_id);
  // The worker leaves for good (every table stops waiting for it).
  UnregisterWorkerResponse UnregisterWorker(int32_t worker_id);

  // Creates the table, or returns created=false when an identical one exists; a table with
  // the same id and another spec is ALREADY_EXISTS naming the differing fields.
  absl::StatusOr<CreateTableResponse> CreateTable(const TableSpec& spec);

  absl::StatusOr<Table*> GetTable(uint32_t table_id) const;
  // Also FAILED_PRECONDITION for an unregistered worker and for a table of the other kind.
  absl::StatusOr<DenseTable*> GetDense(uint32_t table_id, int32_t worker_id) const;
  absl::StatusOr<SparseTable*> GetSparse(uint32_t table_id, int32_t worker_id) const;

  StatsResponse Stats() const;

  // Every table, ascending id (for snapshots).
  std::vector<Table*> Tables() const;
  // CRC-32C over the registered workers and every table's Fingerprint (table.h).
  uint32_t Fingerprint() const;
  // The registered workers, ascending.
  std::vector<int32_t> Workers() const;
  // Restore: registers workers known from a snapshot, so they need not register again.
  void RestoreWorkers(const std::vector<int32_t>& workers);

  // Fails every waiting and later pull with UNAVAILABLE.
  void Shutdown();
  // Replaces every table and registered worker with `staged`'s (left empty): an in-place
  // restore. The caller must ensure no other thread uses this shard's tables
  // (ParameterServerService::Restore).
  void ReplaceWith(Shard* staged);

 private:
  absl::Status CheckWorker(int32_t worker_id) const;
  absl::StatusOr<Table*> GetForWorker(uint32_t table_id, int32_t worker_id,
                                      TableSpec::Kind kind) const;
  absl::Status CheckSize(const TableSpec& spec) const;
  // A dense table's values and optimizer state on this shard, in bytes (a valid spec; long
  // double so that no size overflows before it is compared with a limit).
  long double DenseBytes(const TableSpec& spec) const;

  const ShardOptions options_;
  // When each worker last pushed or pulled here (Stats' idle_ms).
  mutable absl::Mutex seen_mu_;
  mutable std::map<int32_t, absl::Time> last_seen_ ABSL_GUARDED_BY(seen_mu_);
  mutable absl::Mutex mu_;
  std::set<int32_t> workers_ ABSL_GUARDED_BY(mu_);
  // Tables are never removed, so pointers handed out stay valid for the shard's lifetime.
  std::map<uint32_t, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
