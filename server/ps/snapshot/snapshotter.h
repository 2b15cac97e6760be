// Snapshots of one shard: capture at a step (a short pause per table), acknowledge, write
// to the shard's SnapshotStore on a background thread, keep the last K plus the best; and
// restore at start-up, also from a checkpoint taken with another number of shards.
//
// Layout: --data_dir is the cluster's checkpoint root, shared by every shard (one machine
// or a shared file system); shard i keeps its RocksDB database in <root>/shard-<i>.
// Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps.pb.h"
#include "server/ps/snapshot/shard_loader.h"
#include "server/ps/snapshot/snapshot_chain.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

struct SnapshotterOptions {
  std::string root;  // checkpoint root (ps_server --data_dir)
  // More roots whose shard directories Load reads (never writes): the other replicas' of a
  // chain-replicated shard, since whichever replica was the head wrote each snapshot.
  std::vector<std::string> read_roots;
  int keep_last = 3;                    // newest complete snapshots kept ...
  bool lower_metric_is_better = true;   // ... plus the best by metric
  absl::Duration test_delay_per_block;  // tests only: slows writes to widen crash windows
  // Restore "latest" from the newest snapshot that verifies, past damaged ones (saying
  // so); without it any damaged snapshot file under the root stops the restore.
  bool skip_damaged = false;
  // Where the stores live (not owned); null: RocksDB stores on the local file system.
  SnapshotStorage* storage = nullptr;
  // Every K-th snapshot is full, the others hold the sparse tables' changes since the one
  // before (snapshot_chain.h); 1: all full. K > 1 needs a shard whose sparse tables track
  // row versions (ShardOptions.track_row_versions); else each snapshot is full.
  int full_every = 1;
  // Opens this shard's store read-only too: Load works, Snapshot fails (tools that read a
  // running cluster's checkpoint, such as psctl export).
  bool read_only = false;
};

// Snapshot writes since this process started, for metrics.
struct SnapshotCounters {
  uint64_t completed = 0;
  uint64_t failed = 0;            // captures and writes that failed
  uint64_t refused = 0;           // requests for a step a BSP table had passed: nothing was taken
  double write_seconds_sum = 0;   // of the completed writes
  double last_write_seconds = 0;  // the last completed one's ...
  uint64_t last_bytes = 0;
  double last_pause_seconds = 0;         // ... and its longest capture pause
  double last_success_unix_seconds = 0;  // 0: none yet
  bool in_progress = false;
};

// The database directory of shard `shard_id` under `root`.
std::string ShardSnapshotDir(const std::string& root, uint32_t shard_id);

class Snapshotter {
 public:
  // Opens (creating) this shard's store, removing partial snapshots of a crash. DATA_LOSS
  // naming them when the store holds damaged snapshot files (unless skip_damaged).
  static absl::StatusOr<std::unique_ptr<Snapshotter>> Create(Shard* shard,
                                                             SnapshotterOptions options);
  ~Snapshotter();  // waits for a write in progress
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Captures every table at `request.step` (waiting until `deadline` for BSP tables to
  // reach it) and starts the background write. FAILED_PRECONDITION while another write
  // runs; ALREADY_EXISTS for a step already snapshotted.
  absl::StatusOr<SnapshotResponse> Snapshot(const SnapshotRequest& request, absl::Time deadline);
  absl::StatusOr<ListSnapshotsResponse> List() const;
  SnapshotStatusResponse Status() const;
  SnapshotCounters Counters() const;
  // Blocks until no write is in progress (bounded); for tools and tests.
  bool AwaitIdle(absl::Time deadline) const;

  // A snapshot read, verified whole, into a shard of its own.
  struct Loaded {
    int64_t step = -1;  // -1: "latest" and there is none
    std::unique_ptr<Shard> shard;
  };
  // Reads snapshot `which` ("latest" or a step number) from every shard directory under
  // the root, keeping the rows that map to this shard, into a new shard: every checksum
  // and spec is checked before the caller replaces anything. Changes nothing.
  absl::StatusOr<Loaded> Load(const std::string& which) const;
  // Replaces the shard's tables and workers with `loaded`'s. The caller ensures that no
  // other thread uses the shard (ShardAdminService::Restore).
  void Install(Loaded loaded);
  // Load then Install, before serving. Returns the step (-1: none).
  absl::StatusOr<int64_t> Restore(const std::string& which);
  // After a rollback to `step`: deletes this shard's snapshots of later steps, once no
  // write is in progress; DEADLINE_EXCEEDED naming the write still going after a minute,
  // or the store's error (what was deleted before it stays deleted). The steps deleted.
  absl::StatusOr<std::vector<int64_t>> DropAfter(int64_t step);

 private:
  Snapshotter(Shard* shard, SnapshotterOptions options, std::unique_ptr<SnapshotStorage> local,
              std::unique_ptr<SnapshotStore> store);
  uint64_t bytes_total() const;
  // Snapshot's parts. Begin: refuses while one is in progress or the step exists; else
  // marks one in progress (after the previous writer is joined).
  // Returns where the snapshot starts from (its tip reset when its step is gone).
  absl::StatusOr<ChainTip> Begin(int64_t step);
  struct Captured {
    std::vector<std::unique_ptr<TableImage>> images;
    absl::Duration longest_pause;
    uint64_t bytes = 0;
  };
  // Every table held at `step`, then captured; a table that cannot be ends it (Abandon).
  absl::StatusOr<Captured> CaptureAll(int64_t step, absl::Time deadline, const ChainTip& tip);
  static void Complete(const std::vector<Table*>& tables, Captured* captured);
  // Ends a snapshot that took nothing: releases the tables [held_from, held_to) still held
  // and counts it under `counter`. A refusal (a BSP table past the step) is part of the
  // coordinator's checkpoints in the normal course (a request that lands after the step; it
  // asks again): counted apart from failures, so that an alert on failed snapshots means a
  // failure (it fired once per shard on every healthy run), and not logged.
  absl::Status Abandon(const std::vector<Table*>& tables, size_t held_from, size_t held_to,
                       int64_t step, absl::Status status, uint64_t SnapshotCounters::*counter);
  // Hands the images to a background writer.
  void StartWrite(const SnapshotRequest& request, Captured captured, const ChainTip& tip);
  // Load's parts. What the roots hold: every shard directory's complete snapshots, by step
  // then shard (with the shard count each was taken with), the damaged files, and the steps
  // every shard has (restorable, oldest first).
  struct Catalog {
    std::vector<std::unique_ptr<SnapshotStore>> owned;  // other shards' stores
    struct Part {
      uint32_t num_shards;
      const SnapshotStore* store;
      std::vector<int64_t> chain;  // the steps to read, ChainOf's
    };
    std::map<int64_t, std::map<uint32_t, Part>> by_step;
    std::vector<std::string> damaged;
    std::vector<int64_t> restorable;
  };
  absl::StatusOr<Catalog> Survey() const;
  // One store's restorable snapshots into `c`: those whose chain it holds whole.
  absl::Status SurveyStore(const SnapshotStore* store, Catalog* c) const;
  // The steps `which` names, newest first (none: nothing to restore).
  absl::StatusOr<std::vector<int64_t>> Candidates(const std::string& which, const Catalog& c) const;
  absl::StatusOr<Loaded> LoadStep(int64_t step, const Catalog& c) const;
  // `keep`: the coordinator's retention (SnapshotRequest.keep_steps); empty: our own.
  void WriteInBackground(int64_t step, std::vector<std::unique_ptr<TableImage>> images,
                         SnapshotStore::WriteOptions options, std::vector<int64_t> keep);
  // After the snapshot of `step` is complete: the chain's new tip, and the tables forget
  // the changes it holds.
  void Advance(int64_t step, std::optional<int64_t> base, std::vector<ChainTip::Captured> tables);

  Shard* const shard_;
  const SnapshotterOptions options_;
  const std::unique_ptr<SnapshotStorage> local_;  // when options_.storage is null
  SnapshotStorage* const storage_;
  const std::unique_ptr<SnapshotStore> store_;
  std::atomic<uint64_t> bytes_written_{0};

  mutable absl::Mutex mu_;
  bool in_progress_ ABSL_GUARDED_BY(mu_) = false;
  int64_t current_step_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t bytes_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool capturing_ ABSL_GUARDED_BY(mu_) = false;  // in_progress_, the tables not yet captured
  int64_t last_complete_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t restored_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  ChainTip tip_ ABSL_GUARDED_BY(mu_);
  SnapshotCounters counters_ ABSL_GUARDED_BY(mu_);
  std::thread writer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
