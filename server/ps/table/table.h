// A table held by one shard: parameters, optimizer state next to them, and its consistency
// clock (consistency_clock.h). DenseTable and SparseTable add the storage; this class
// owns the lock, the waits, the snapshot hold/capture protocol and the counters.
//
// Thread-safe: every public method may be called concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/parking.h"
#include "core/optimizer/optimizer.h"
#include "core/optimizer/optimizer_config.h"
#include "core/tensor/non_finite.h"
#include "proto/ps.pb.h"
#include "proto/snapshot.pb.h"
#include "server/ps/table/consistency_clock.h"
#include "server/ps/table/staging_allocator.h"

namespace pscluster::ps {

// A table's state frozen at one step: what a snapshot stores.
struct TableImage {
  TableSnapshotHeader header;  // spec, range, clocks, step counts, num_slots, num_rows
  // DENSE: arrays[0] = values, arrays[1 + k] = optimizer slot k, each range-size floats.
  std::vector<StagingArray> arrays;
  // SPARSE: one entry per row; row_data holds dim * (1 + num_slots) floats per row.
  std::vector<uint64_t> keys;
  std::vector<int64_t> row_updates;
  std::vector<int64_t> row_steps;  // each row's last update's step, with header.row_steps()
  std::vector<float> row_data;
  // SPARSE with header.changes_only(): the ids whose rows went since the base.
  std::vector<uint64_t> removed;

  // Which table object and how far along its changes this is (a sparse table that tracks
  // versions: its change count), for the next incremental snapshot to start from.
  uint64_t incarnation = 0;
  uint64_t version = 0;
  // What Capture was asked for (CaptureSince), for the table's copy to read.
  std::optional<uint64_t> since;
  // Set by a copy that could not read everything (a sparse table's disk tier): the image
  // is incomplete and Capture returns this instead.
  absl::Status error;

  uint64_t bytes() const;
};

// What Capture copies of a sparse table that tracks versions: every row (nullopt), or only
// the changes after version `*since` (TableImage::removed, header.changes_only), if it still
// knows them all; otherwise every row.
using CaptureSince = std::optional<uint64_t>;

class Table {
 public:
  // Parked pulls are woken with UNAVAILABLE: the table they waited on is gone.
  virtual ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableSpec& spec() const { return spec_; }
  uint32_t id() const { return spec_.table_id(); }
  // Optimizer state arrays kept per value (SGD 0, momentum 1, Adam 2, ...).
  int num_slots() const { return optimizer_->num_slots(); }

  // Adds a worker to the set whose clocks bound consistency. Idempotent.
  void AddWorker(int32_t worker_id);
  // The worker left for good: applies the BSP steps that now have every push.
  void RemoveWorker(int32_t worker_id);

  // Blocks until `worker` may read at `step` under the table's consistency mode, or
  // returns DEADLINE_EXCEEDED naming the workers waited for (or Shutdown's `why`).
  // `cancelled` (if set) is asked every kCancelCheckEvery of waiting: true (the caller went
  // away) ends the wait with CANCELLED, so a cancelled call gives its thread back.
  absl::Status AwaitPullable(int64_t step, absl::Time deadline,
                             const std::function<bool()>& cancelled = nullptr);
  static constexpr absl::Duration kCancelCheckEvery = absl::Milliseconds(100);
  // AwaitPullable that never blocks: true when the pull may read now (counted as a pull,
  // having waited since `parked_since` unless that is InfinitePast). Else, before
  // `deadline`, parks `waiter` to be woken once it may (or the table shuts down) and returns
  // false; from `deadline` on, AwaitPullable's DEADLINE_EXCEEDED.
  absl::StatusOr<bool> PullableOrPark(int64_t step, absl::Time deadline,
                                      std::weak_ptr<Waiter> waiter,
                                      absl::Time parked_since = absl::InfinitePast());

  // Wakes every waiting pull with `why` (a restore, or the server shutting down); later
  // waits fail with it at once.
  void Shutdown(absl::Status why = ShuttingDown());
  static absl::Status ShuttingDown();  // UNAVAILABLE: the parameter server is shutting down

  TableInfo Info() const;
  TableStats Stats() const;
  std::map<int32_t, int64_t> Clocks() const;

  // Snapshot protocol. HoldStep: under BSP, the table will not apply step `step` until
  // Capture(step) or ReleaseStep(step); FAILED_PRECONDITION if it already has. (No-op for
  // ASP/SSP.) Holding every table before capturing any keeps a multi-table snapshot at one
  // step. Capture: copies the state while holding the lock (the only pause pushes see);
  // under BSP it first waits (until `deadline`) for step `step` to be reached, and it always
  // drops the hold. *pause is the time the lock was held for the copy.
  absl::Status HoldStep(int64_t step);
  void ReleaseStep(int64_t step);
  absl::StatusOr<std::unique_ptr<TableImage>> Capture(int64_t step, absl::Time deadline,
                                                      absl::Duration* pause,
                                                      CaptureSince since = std::nullopt);
  // Fills what Capture left to copy on write (a DenseTable under ASP/SSP captures only the
  // point in time, and copies its blocks as pushes first touch them or here, one block per
  // hold of the lock): call once on every image Capture returned, before using it. The
  // longest the lock was held for one block is in *pause.
  virtual void CompleteCapture(TableImage* image, absl::Duration* pause) {}
  // A snapshot of this table at `version` is complete: no later one will ask for changes
  // since an earlier version, so what the table keeps of them (removed ids) may go.
  virtual void ForgetChangesThrough(uint64_t version) {}
  // This table object, unlike any other of the process: a restore or state transfer that
  // replaces a table makes the next snapshot write it whole.
  uint64_t incarnation() const { return incarnation_; }

  // State transfer to a joining replica: the whole state as it is now, copied under the
  // lock. UNAVAILABLE while a BSP step has some workers' pushes but is not applied, or a
  // push in parts has some of its parts (those gradients are in no image): try again once
  // it is.
  absl::StatusOr<std::unique_ptr<TableImage>> CaptureNow();

  // Restore: consistency state from a snapshot header (before serving).
  void RestoreClocks(const TableSnapshotHeader& header);

  // CRC-32C of everything a snapshot would hold (spec, clocks, values, optimizer state,
  // rows), read without side effects: equal before and after an operation that changed
  // nothing (tests and fuzzing check that failed requests change nothing).
  uint32_t Fingerprint() const;
  // The same of an image CaptureNow made (a state transfer's, computed outside the lock).
  static uint32_t FingerprintOf(const TableImage& image);

 protected:
  Table(TableSpec spec, std::unique_ptr<core::Optimizer> optimizer);

  // Push bookkeeping, in this order under mu_: CheckPushLocked (stale, duplicate or
  // too-far-ahead steps) before touching state, then RecordPushLocked, which advances the
  // worker's clock and, under BSP, applies every step all workers have pushed.
  absl::Status CheckPushLocked(int32_t worker, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordPushLocked(int32_t worker, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From the spec (const), so it needs no lock.
  bool bsp() const { return spec_.consistency().mode() == ConsistencyConfig::BSP; }
  // The number of workers whose gradients a BSP step sums (at least 1).
  size_t num_workers_locked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return std::max<size_t>(1, clock_.clocks().size());
  }

  // BSP: sums the gradients pending for `step` in worker-id order, applies them, frees them.
  virtual void ApplyBspStepLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // The worker left for good: what the table holds of its unfinished pushes goes.
  virtual void DropWorkerLocked(int32_t worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}
  // Whether a push in parts has some of its parts taken: they are in no image.
  virtual bool PushInPartsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return false; }
  virtual void FillInfoLocked(TableInfo* info) const ABSL_SHARED_LOCKS_REQUIRED(mu_) = 0;
  // The counters a kind of table keeps under mu_ (a sparse table's admission and eviction).
  virtual void FillStatsLocked(TableStats* stats) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {}
  // Bytes of values and optimizer state held (TableStats.memory_bytes).
  virtual uint64_t MemoryBytes(const TableInfo& info) const = 0;
  // Allocates (and page-faults) the image's buffers before the lock is taken, so the
  // pause is only the copy.
  virtual void PrepareImage(TableImage* image) const {}
  // Copies values, optimizer state and step counts into `image` (header.spec/clocks set).
  virtual void CaptureLocked(TableImage* image) const ABSL_SHARED_LOCKS_REQUIRED(mu_) = 0;
  // Capture's copy: CaptureLocked unless the table copies on write (CompleteCapture).
  virtual void BeginCaptureLocked(TableImage* image) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CaptureLocked(image);
  }

  // State transfer (DenseTable::ExportState). Waits like AwaitPullable until the table is
  // readable at `step`, keeping mu_ held on return so the caller copies exactly that state;
  // under BSP also FAILED_PRECONDITION when step `step` is already applied (that state is
  // gone). Does not count as a pull.
  absl::Status AwaitStateLocked(int64_t step, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // State transfer (DenseTable::ImportState): consistency restarts at `step` as if every
  // registered worker had pushed exactly the steps before it and (BSP) all were applied:
  // clocks = step, applied_steps = step, no step pushed beyond. Holds taken for a snapshot
  // stay. Pulls waiting for `step` proceed once mu_ is released.
  void ResetClocksLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    clock_.Reset(step);
    WakeParkedLocked();
  }

  // Error helpers that also count the rejection.
  absl::Status Reject(absl::Status status) const;
  absl::Status NonFinite(float value, uint64_t index) const;
  // INVALID_ARGUMENT: the update would make the value at `index` (or its slots) non-finite.
  absl::Status Overflow(uint64_t index) const;
  // Gradients of at most this magnitude cannot overflow an update (see FirstOverflow).
  float LargeGradientThreshold() const;

  mutable absl::Mutex mu_;
  const TableSpec spec_;
  const std::unique_ptr<core::Optimizer> optimizer_;

  mutable std::atomic<uint64_t> pushes_{0}, pulls_{0}, bytes_pushed_{0}, bytes_pulled_{0},
      rows_pushed_{0}, rows_pulled_{0}, nonfinite_skipped_{0}, rejected_{0};
  // Pull waits and staleness (TableStats): updated under mu_, read by Stats without it.
  std::atomic<uint64_t> pulls_waited_{0}, pull_wait_nanos_{0}, staleness_sum_{0}, staleness_max_{0};

 private:
  // Waits (mu_ held) until PullableLocked(step); DEADLINE_EXCEEDED names `what` and the
  // workers waited for, shutdown_why_ on shutdown.
  absl::Status AwaitPullableLocked(int64_t step, absl::Time deadline, absl::string_view what,
                                   const std::function<bool()>& cancelled = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP: applies, in order, every step that all workers have pushed, stopping before a
  // step a capture is waiting for.
  void DrainBspLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After every change to clock_: wakes the parked pulls it now lets read.
  void WakeParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a pull (`what`) at `step` waits for: the mode and the workers behind.
  std::string WaitedForLocked(int64_t step, absl::string_view what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A pull that waited since `since` (InfinitePast: it did not wait), and one that reads.
  void CountWaitLocked(absl::Time since) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountPullLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t incarnation_;
  ConsistencyClock clock_ ABSL_GUARDED_BY(mu_);
  absl::Status shutdown_why_ ABSL_GUARDED_BY(mu_);  // Shutdown's
  Waiters<int64_t> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
