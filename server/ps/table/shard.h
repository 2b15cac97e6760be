// One parameter-server shard: its registered workers and tables. Independent of gRPC.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/ps.pb.h"
#include "server/ps/table/dense_table.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {

// INVALID_ARGUMENT for a negative worker id (every request naming a worker checks it).
absl::Status CheckWorkerId(int32_t worker_id);

struct ShardOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  // Refuse tables whose slice on this shard (values + optimizer state) would exceed this.
  uint64_t max_table_bytes = uint64_t{16} << 30;
  // Refuse a new dense table, or a sparse one's admission sketch, when it would take the
  // tables' values, optimizer state and sketches past this, shard-wide (sparse tables
  // count the rows they hold, but a push adding rows is bounded by max_table_bytes alone).
  uint64_t max_memory_bytes = UINT64_MAX;
  uint32_t max_sparse_dim = 1 << 16;
  // Sparse rows keep the change count of their last update (8 bytes each), so that
  // snapshots may hold only what changed (ps_server --snapshot_full_every > 1).
  bool track_row_versions = false;
  // Sparse tables keep the rows their RAM budget has no room for here (null: all in RAM).
  // Owned by the caller; outlives the shard.
  DiskTier* disk_tier = nullptr;
};

// INVALID_ARGUMENT naming the field for a spec no shard could hold.
absl::Status ValidateTableSpec(const TableSpec& spec);

class Shard {
 public:
  explicit Shard(ShardOptions options);
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const ShardOptions& options() const { return options_; }

  // The caller checks worker_id >= 0 (the services, server/ps/service).
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

  // When a worker's calls of one client last began or ended, and how many are in progress.
  struct Seen {
    absl::Time last;
    int calls = 0;
  };
  // The calls of one handler of one client (ShardCore::Scope), on this thread
  // while it lives: every worker whose tables it gets (GetDense, GetSparse) counts as in a
  // call of `client` (a ps-client-id; "" unknown) until the Visit ends. Stats tells them.
  class Visit {
   public:
    Visit(const Shard* shard, std::string client);
    ~Visit();
    Visit(const Visit&) = delete;
    Visit& operator=(const Visit&) = delete;

    // The workers this visit counts in a call, still counted after it ends, until the
    // Held is destroyed: a pull parked until its step is readable is still a call.
    class Held {
     public:
      ~Held();

     private:
      friend class Visit;
      Held(const Shard* shard, std::vector<std::pair<int32_t, Seen*>> workers)
          : shard_(shard), workers_(std::move(workers)) {}
      const Shard* const shard_;
      const std::vector<std::pair<int32_t, Seen*>> workers_;
    };
    std::unique_ptr<Held> Keep();

   private:
    friend class Shard;
    // Ends the calls of `workers`, now.
    static void End(const Shard* shard, const std::vector<std::pair<int32_t, Seen*>>& workers);
    const Shard* const shard_;
    const std::string client_;
    Visit* const outer_;  // the visit this thread was in before (none: nullptr)
    std::vector<std::pair<int32_t, Seen*>> workers_;  // and the record each call counts in
  };

  // except_clients: leave their calls out of the workers' idle_ms and calls.
  StatsResponse Stats(const std::set<std::string>& except_clients = {}) const;

  // Every table, ascending id (for snapshots).
  std::vector<Table*> Tables() const;
  // CRC-32C over the registered workers and every table's Fingerprint (table.h).
  uint32_t Fingerprint() const;
  // The same from its parts: the workers (ascending) and each table's (id, fingerprint),
  // ascending id.
  static uint32_t CombineFingerprints(const std::vector<int32_t>& workers,
                                      const std::vector<std::pair<uint32_t, uint32_t>>& tables);
  // The registered workers, ascending.
  std::vector<int32_t> Workers() const;
  // Restore: registers workers known from a snapshot, so they need not register again.
  void RestoreWorkers(const std::vector<int32_t>& workers);

  // Fails every waiting and later pull with `why` (by default UNAVAILABLE: shutting down).
  void Shutdown(const absl::Status& why = Table::ShuttingDown());
  // Replaces every table and registered worker with `staged`'s (left empty): an in-place
  // restore. The caller must ensure no other thread uses this shard's tables
  // (ShardAdminService::Restore).
  void ReplaceWith(Shard* staged);

 private:
  absl::Status CheckWorker(int32_t worker_id) const;
  absl::StatusOr<Table*> GetForWorker(uint32_t table_id, int32_t worker_id,
                                      TableSpec::Kind kind) const;
  absl::Status CheckSize(const TableSpec& spec) const;
  // A dense table's values and optimizer state on this shard, in bytes (a valid spec; long
  // double so that no size overflows before it is compared with a limit).
  long double DenseBytes(const TableSpec& spec) const;
  // RESOURCE_EXHAUSTED naming --max_memory_bytes when what a new table takes at once would
  // pass it beside the tables held.
  absl::Status CheckRoomLocked(const TableSpec& spec) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ShardOptions options_;
  // Each worker's calls by client (Stats' idle_ms and calls), at most kMaxSeen pairs. When
  // full, the pairs idle for kForgetAfter go (at most once a kForgetAfter / 600); with none
  // to forget, a new pair's calls count in the worker's overflow record, which no client
  // can leave out: a flood of client ids cannot hide another client's calls.
  static constexpr size_t kMaxSeen = 4096;
  static constexpr absl::Duration kForgetAfter = absl::Minutes(10);
  void Saw(int32_t worker_id) const;
  Seen& SeenLocked(int32_t worker_id, const std::string& client) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seen_mu_);
  mutable absl::Mutex seen_mu_;
  mutable std::map<std::pair<int32_t, std::string>, Seen> seen_ ABSL_GUARDED_BY(seen_mu_);
  mutable std::map<int32_t, Seen> overflow_ ABSL_GUARDED_BY(seen_mu_);
  mutable absl::Time next_forget_ ABSL_GUARDED_BY(seen_mu_) = absl::InfinitePast();
  mutable absl::Mutex mu_;
  std::set<int32_t> workers_ ABSL_GUARDED_BY(mu_);
  // Tables are never removed, so pointers handed out stay valid for the shard's lifetime.
  std::map<uint32_t, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
