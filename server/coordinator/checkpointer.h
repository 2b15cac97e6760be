// Cluster checkpoints driven by the coordinator: every N steps of the workers' global
// step, and whenever rank 0 reports a better validation metric, it asks every shard to
// snapshot the step the tables have reached, waits until every snapshot is durable, and
// only then records the checkpoint in its manifest (--data_dir/manifest.pb, written
// atomically, reloaded on restart) and in the cluster view. Workers save nothing: their
// data order is a function of (seed, step). Keeps the last K plus the best. The only
// initiator of snapshots: its own schedule (MaybeCheckpoint) and the Checkpoint RPC
// (CheckpointNow) both come here. Without a data_dir the manifest lives in memory only
// (the view still lists the checkpoints; a restart forgets them). Thread-safe: one
// checkpoint at a time.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/coordinator.pb.h"
#include "proto/ps.pb.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster {
class PsClient;
}

namespace pscluster::coord {

struct CheckpointerOptions {
  std::string data_dir;                 // the manifest lives here ("": in memory only)
  int64_t every_steps = 0;              // 0: only on a better metric
  bool higher_metric_is_better = true;  // test accuracy
  int keep_last = 3;
  absl::Duration timeout = absl::Minutes(10);  // capture and write of one checkpoint
  // Restore refuses (unless forced) while a client that is no ps_worker member (a Python
  // worker) pushed or pulled as a worker on some shard less than this long ago.
  absl::Duration client_active = absl::Seconds(5);
  Security security;  // how it calls the shards (it needs the admin token when they have one)
};

class Checkpointer {
 public:
  // Loads the manifest when one exists (and lists its checkpoints in the view).
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(ClusterState* cluster,
                                                              CheckpointerOptions options);

  // Checkpoints if one is due and the cluster is complete; OK when nothing was due.
  absl::Status MaybeCheckpoint();
  // Whether the coordinator checkpoints by itself (MaybeCheckpoint: with a data_dir).
  bool automatic() const { return !options_.data_dir.empty(); }
  // Checkpoints now (metric: the validation metric to file it under). FAILED_PRECONDITION
  // while the cluster is incomplete; a shard's failure is named in the error.
  absl::StatusOr<Checkpoint> CheckpointNow(std::optional<double> metric);

  std::vector<Checkpoint> checkpoints() const;

  // Rolls every shard back to checkpoint `step` (one of checkpoints()) and makes it the
  // newest: later checkpoints leave the manifest, their snapshots are deleted.
  // FAILED_PRECONDITION while workers are alive, or other clients push or pull as workers
  // (within options' client_active, or now), unless `force`. client_id: the caller's
  // ps-client-id (its own calls do not count).
  // deadline: the caller's (the shards' calls end before it).
  absl::StatusOr<Checkpoint> Restore(int64_t step, bool force, const std::string& client_id = "",
                                     absl::Time deadline = absl::InfiniteFuture());

 private:
  // FAILED_PRECONDITION naming the worker ids some client other than `client_id` pushed or
  // pulled as on some shard within client_active, or does now.
  absl::Status RefuseUnderActiveClients(PsClient& shards, const std::string& client_id);
  Checkpointer(ClusterState* cluster, CheckpointerOptions options);
  // At `at` (only there, once), or at the step the tables reached (CheckpointStep).
  absl::StatusOr<Checkpoint> CheckpointLocked(std::optional<double> metric,
                                              std::optional<int64_t> at = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckpointLocked's parts. Has the shards snapshot a step (*step): none answered when an
  // earlier checkpoint answers instead (the tables stand at or before the newest).
  absl::StatusOr<std::optional<Checkpoint>> SnapshotShards(
      const ClusterView& view, PsClient* shards, std::optional<int64_t> at,
      std::optional<double>* metric, int64_t* step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step an attempt aims at: `at`, or the one reached plus `ahead`.
  absl::StatusOr<std::optional<Checkpoint>> ChooseStep(PsClient* shards, std::optional<int64_t> at,
                                                       int64_t ahead, std::optional<double> metric,
                                                       int64_t* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request for `step`: its metric (*metric, or rank 0's measure of it) and retention.
  ps::SnapshotRequest RequestFor(const ClusterView& view, int64_t step,
                                 std::optional<double>* metric) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every shard wrote `step`: listed in the manifest and the view.
  absl::StatusOr<Checkpoint> File(const ClusterView& view, PsClient* shards, int64_t step,
                                  std::optional<double> metric) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Files `metric` under the checkpoint of `step` (which exists) and applies retention.
  absl::Status FileMetricLocked(int64_t step, double metric) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Files rank 0's newest metric under its step's checkpoint, or checkpoints there for a best.
  absl::Status TakeMetricLocked(const ClusterView& view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteManifest() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool Better(double a, double b) const;
  // The one retention policy: the checkpoints kept once one of `step` is added (the last
  // keep_last plus the best by metric), ascending; the shards are told to keep the same.
  std::vector<Checkpoint> Retained(int64_t step, std::optional<double> metric) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The policy on a list (ascending step): the last keep_last and the best by metric.
  std::vector<Checkpoint> Retain(std::vector<Checkpoint> all) const;

  ClusterState* const cluster_;
  const CheckpointerOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Checkpoint> checkpoints_ ABSL_GUARDED_BY(mu_);
  int64_t metric_step_seen_ ABSL_GUARDED_BY(mu_) = -1;  // rank 0's metric report acted on
};

}  // namespace pscluster::coord
