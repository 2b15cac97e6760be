// A sparse embedding table: uint64 key -> float32 row of spec.dim values, for the keys that
// hash to this shard. A key without a row reads as the seeded initializer's row without
// being stored; an update stores the rows it touches, at most `max_rows` of them, unless
// the table's SparseRowPolicy keeps an id out until enough pushes carried it; the policy
// may also evict the rows no update touched for a while (row_lifecycle.h). On a shard with a
// disk tier (disk_tier.h) the rows the shard's RAM budget has no room for live on disk:
// a push brings the rows it updates back into RAM first, moving the coldest (oldest last
// update) out when the budget is passed; a pull reads rows where they are.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/ps/table/disk_tier.h"
#include "server/ps/table/row_lifecycle.h"
#include "server/ps/table/row_store.h"
#include "server/ps/table/sparse_grads.h"
#include "server/ps/table/table.h"

namespace pscluster::ps {

class SparseTable final : public Table {
 public:
  // `spec` must already be validated (ValidateTableSpec).
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(const TableSpec& spec,
                                                             uint32_t shard_id, uint32_t num_shards,
                                                             uint64_t max_rows = UINT64_MAX,
                                                             bool track_versions = false,
                                                             DiskTier* tier = nullptr);
  ~SparseTable() override;
  // The bytes one stored row takes (values, optimizer slots, key, bookkeeping).
  static uint64_t RowBytes(const TableSpec& spec, int num_slots, bool track_versions = false);

  // INVALID_ARGUMENT/OUT_OF_RANGE for a key of another shard or outside key_space.
  absl::Status CheckKeys(absl::Span<const uint64_t> keys) const;

  // Applies (ASP/SSP) or stages (BSP) one worker's gradient rows; duplicate keys are summed.
  // `grads` holds keys.size() * dim values. All or nothing: RESOURCE_EXHAUSTED when the new
  // rows would pass max_rows (with a disk tier: RAM rows), or a disk tier without the room
  // to move the rows the push needs; a non-finite gradient, or a finite one whose update would
  // make a row non-finite, is INVALID_ARGUMENT, or under skip_nonfinite dropped (*skipped):
  // a dropped push changes no row (values, optimizer slots, update counts) but is still the
  // worker's push of `step`, so its clock moves on and a BSP step completes without it.
  // A push in several parts (part of parts, parts > 1), in every mode: one push, its parts'
  // rows summed in arrival order, applied or staged and counted once all have come;
  // FAILED_PRECONDITION for a part already taken, INVALID_ARGUMENT for a part count that
  // differs from the step's earlier parts'. A part dropped under skip_nonfinite drops the
  // worker's whole push of the step.
  absl::Status Push(int32_t worker, int64_t step, absl::Span<const uint64_t> keys,
                    absl::Span<const float> grads, bool* skipped, uint32_t part = 0,
                    uint32_t parts = 1);

  // Copies the rows of `keys` into `out` (keys.size() * dim values); a key never pushed
  // reads as its initial row, and stores nothing. Call AwaitPullable first.
  absl::Status Read(absl::Span<const uint64_t> keys, absl::Span<float> out);

  // Restore, before serving: a row of a snapshot (dim * (1 + num_slots) floats). Rows of
  // keys this shard does not own are ignored, so old shards' rows can be offered to all.
  // RESOURCE_EXHAUSTED beyond max_rows.
  // `step`: the row's last update's step (eviction; ignored by a table that does not evict).
  absl::Status RestoreRow(uint64_t key, int64_t updates, const float* data, int64_t step = 0);
  // Restore: the admission counts of a snapshot's header (each old shard's, added up).
  absl::Status RestoreLifecycle(const TableSnapshotHeader& header);
  // Whether `key` has a stored row (restoring a chain: a newer link's row wins).
  bool HasRow(uint64_t key) const;

  // Incremental snapshots (a table made with track_versions): each row keeps the change
  // count of its last update, and the table the ids removed since the last complete
  // snapshot, so that Capture can copy only what changed since a version.
  void ForgetChangesThrough(uint64_t version) override;
  // At most this many removed ids are kept (or as many as the table has rows); past it
  // they are forgotten and the next snapshot is whole.
  static constexpr size_t kMaxRemovedKept = size_t{1} << 20;

 private:
  using Grads = SparseGrads;

  SparseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer, uint32_t shard_id,
              uint32_t num_shards, uint64_t max_rows, bool track_versions,
              std::unique_ptr<ColdRows> cold);
  // A key's row before any update: initializer values, then each slot's initial value.
  std::vector<float> InitialRow(uint64_t key) const;
  // A new row for `key`, which has none: its initial row (values, then optimizer slots).
  RowStore::Row NewRowLocked(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push in parts: the parts come so far, until the last (see parts_).
  struct Parts {
    uint32_t count = 0;
    std::set<uint32_t> got;
    bool skipped = false;   // a part was dropped: so is the whole push
    Grads grads;            // the parts' rows, summed in arrival order
    uint64_t new_rows = 0;  // rows of `grads` not stored, counted in staged_new_rows_
  };

  // What needs no lock: the part number, the gradient's length, the keys.
  absl::Status CheckRequest(absl::Span<const uint64_t> keys, absl::Span<const float> grads,
                            uint32_t part, uint32_t parts) const;
  // A part of a push in parts against its earlier parts (*so_far, null for the first).
  absl::Status CheckPartLocked(int32_t worker, int64_t step, uint32_t part, uint32_t parts,
                               Parts** so_far) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `grads` the earlier parts' rows of its keys (the sums the push will apply),
  // then checks them: the rows they would store (*new_rows), and that no row becomes non-finite
  // (*drop instead of INVALID_ARGUMENT under skip_nonfinite). Changes nothing stored.
  absl::Status CheckUpdateLocked(const Parts* so_far, Grads* grads, uint64_t* new_rows,
                                 bool* drop) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Keeps a checked part with the push's earlier parts (a dropped one forgets them all);
  // at the last part commits the push whole, or drops it whole, and records it.
  void TakePartLocked(int32_t worker, int64_t step, uint32_t part, uint32_t parts, Grads grads,
                      uint64_t new_rows, bool drop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stages (BSP) or applies (ASP/SSP) a whole checked push.
  void CommitLocked(int32_t worker, int64_t step, Grads grads, uint64_t new_rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when storing `new_rows` more rows (beside those stored and staged)
  // would pass max_rows.
  absl::Status CheckRoomLocked(uint64_t new_rows) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The first key whose row the update `grads` * g_scale would make non-finite, if any.
  const uint64_t* FirstOverflowLocked(const Grads& grads, float g_scale) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a sum of pushes checked one by one (`what`) would make a row non-finite after
  // all: then it is not applied, counted as dropped and said.
  bool SumOverflowsLocked(const Grads& sum, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the update of `step` that `pushes` pushes carried to the row of `key`, if it
  // has one or the policy admits it now.
  void ApplyLocked(uint64_t key, const float* grad, int64_t step, uint32_t pushes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyBspStepLocked(int64_t step) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The BSP step's pushes, summed and applied (unless the sum would overflow a row).
  void ApplyBspSumLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the updates of `step`: the policy's sweep of idle rows, when one is due.
  void EndUpdatesLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropWorkerLocked(int32_t worker) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PushInPartsLocked() const override ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !parts_.empty();
  }
  void FillInfoLocked(TableInfo* info) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FillStatsLocked(TableStats* stats) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t MemoryBytes(const TableInfo& info) const override;
  void CaptureLocked(TableImage* image) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The rows changed after version `since` and the ids removed after it.
  void CaptureChangesLocked(uint64_t since, TableImage* image) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // An evicted row's id, for the next incremental snapshot (tracking tables only).
  void RememberRemovedLocked(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The disk tier (sparse_table_tier.cc); each is a no-op without one.
  // Brings the rows of `grads` that are on disk into RAM; RESOURCE_EXHAUSTED (nothing
  // moved) when the disk has no room for the deletes.
  absl::Status PromoteLocked(const Grads& grads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the coldest rows to disk until `new_rows` more fit in the RAM budget, sparing the
  // rows of `current` and of the pushes waiting in pending_ and parts_. RESOURCE_EXHAUSTED
  // when the disk has no room and the budget would be passed.
  absl::Status MakeRoomLocked(uint64_t new_rows, const Grads* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves up to `n` of the coldest unspared rows to disk.
  absl::Status DemoteLocked(uint64_t n, const Grads* current) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The keys of the coldest `n` rows DemoteLocked may move (oldest last update first).
  std::vector<uint64_t> ColdestLocked(uint64_t n, const Grads* current) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool SparedLocked(uint64_t key, const Grads* current) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Tells the tier the RAM the rows take now.
  void ChargeRamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills out[missing[j]] from disk, or with the initial row where no row is stored.
  absl::Status ReadColdLocked(absl::Span<const uint64_t> keys, const std::vector<size_t>& missing,
                              absl::Span<float> out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Eviction of the rows on disk whose last update is at or before `upto`.
  void SweepColdLocked(int64_t upto) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the rows on disk (changed after `since`, if set) to a capture.
  void CaptureColdLocked(std::optional<uint64_t> since, TableImage* image) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Restore: a row into RAM, or onto disk where it already is.
  absl::Status RestoreRowLocked(uint64_t key, int64_t updates, const float* data, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t shard_id_;
  const uint32_t num_shards_;
  const size_t dim_;
  const uint64_t max_rows_;
  RowLifecycle lifecycle_ ABSL_GUARDED_BY(mu_);
  // Each row: dim values, then dim values per optimizer slot, and its update count (the
  // optimizer steps applied to it: bias correction); with eviction, its last update's step.
  RowStore rows_ ABSL_GUARDED_BY(mu_);
  // BSP: step -> worker -> its summed gradient rows, and per step the rows they would add
  // (counted per push: an upper bound).
  std::map<int64_t, std::map<int32_t, Grads>> pending_ ABSL_GUARDED_BY(mu_);
  // Pushes in parts, in every mode: step -> worker -> the parts come so far. Nothing of
  // them is stored, staged for a BSP step or counted as pushed before the last part.
  std::map<int64_t, std::map<int32_t, Parts>> parts_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, uint64_t> pending_new_rows_ ABSL_GUARDED_BY(mu_);
  uint64_t staged_new_rows_ ABSL_GUARDED_BY(mu_) = 0;
  // Incremental snapshots: the changes applied so far (each row's version is the count at
  // its last update), the ids removed with the count at their removal (ascending), and
  // the version from which that list is whole (past kMaxRemovedKept it starts again).
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<uint64_t, uint64_t>> removed_ ABSL_GUARDED_BY(mu_);
  uint64_t removed_known_from_ ABSL_GUARDED_BY(mu_) = 0;
  // The disk tier: this table's rows there (null: none), the bytes of RAM a row is charged,
  // what the tier was told this table's rows take, and the counters of TableStats.
  const std::unique_ptr<ColdRows> cold_;
  const uint64_t row_bytes_;
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<uint64_t> ram_hits_{0}, disk_reads_{0}, rows_to_disk_{0}, rows_from_disk_{0};
};

}  // namespace pscluster::ps
