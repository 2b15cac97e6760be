// A dense float32 tensor's slice [range.begin, range.end) held by one shard.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "server/ps/table/dense_state.h"
#include "server/ps/table/table.h"

namespace pscluster::ps {

// What a caller knows of a gradient's values, from scanning it chunk by chunk as it
// arrived (DenseTable::ScanChunk, while each chunk is hot in cache). A default one knows
// nothing: DenseTable::Push scans the gradient itself.
struct GradientScan {
  bool done = false;
  bool has_nonfinite = false;
  float max_abs = 0;  // the largest |value| (of a finite gradient)
};

class DenseTable final : public Table {
 public:
  // A run of gradient values for the table's local indices [at, at + grad.size()).
  struct Piece {
    uint64_t at;
    absl::Span<const float> grad;
  };

  // `spec` must already be validated (ValidateTableSpec). Initialises the values of `range`.
  static absl::StatusOr<std::unique_ptr<DenseTable>> Create(const TableSpec& spec, Range range);

  Range range() const { return range_; }

  // OUT_OF_RANGE unless [begin, begin + length) lies inside this shard's range.
  absl::Status CheckRange(uint64_t begin, uint64_t length) const;

  using Scanned = GradientScan;

  // Scans one chunk into *scanned: OK, or the non-finite error (global index
  // `first_index` + i) unless skip_nonfinite, in which case has_nonfinite is set.
  absl::Status ScanChunk(uint64_t first_index, absl::Span<const float> chunk,
                         Scanned* scanned) const;

  // Applies (ASP/SSP) or stages (BSP) one worker's gradient for `step`: the concatenation
  // of `chunks` covers [begin, begin + total). All or nothing: a rejected push changes
  // nothing. A gradient that is non-finite, or finite but would make a value or optimizer
  // slot non-finite, is INVALID_ARGUMENT naming the index, or dropped with *skipped set
  // under skip_nonfinite.
  absl::Status Push(int32_t worker, int64_t step, uint64_t begin,
                    const std::vector<absl::Span<const float>>& chunks, bool* skipped,
                    Scanned scanned = {});

  // Copy on write (see Cow below): the block a capture copies at a time, and the filling
  // of a capture (Table::CompleteCapture).
  static constexpr uint64_t kCowBlockValues = uint64_t{64} << 10;
  void CompleteCapture(TableImage* image, absl::Duration* pause) override;
  // On by default; off, a capture copies the whole state under the lock, as before copy
  // on write (bench/snapshot_throughput --cow_ab compares the two).
  void set_copy_on_write(bool on) {
    absl::MutexLock lock(&mu_);
    copy_on_write_ = on;
  }

  // One push of a PushAll: Push's arguments for one table.
  struct PushArgs {
    DenseTable* table;
    int32_t worker;
    int64_t step;
    uint64_t begin;
    absl::Span<const float> grad;
    Scanned scanned;
    bool* skipped;
  };
  // Every push, or none (a batch of pushes to distinct tables): every table is locked, in
  // id order, and every push checked, before any is applied. On an error, *refused is the
  // index of the push that was refused.
  // (It locks a set of tables known only at run time: no static lock analysis.)
  static absl::Status PushAll(const std::vector<PushArgs>& pushes,
                              size_t* refused) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Copies [begin, begin + out.size()) into `out`. Call AwaitPullable first.
  absl::Status Read(uint64_t begin, absl::Span<float> out) const;
  // The same into bytes at any alignment (a message being coded in place).
  absl::Status ReadBytes(uint64_t begin, uint64_t length, char* out) const;

  // Restore, before serving: the optimizer step count, and a block of a snapshot covering
  // global indices [begin, begin + n) laid out as values then each slot (n floats each);
  // the part inside this shard's range is copied, the rest ignored.
  void RestoreUpdates(int64_t updates);
  void RestoreBlock(uint64_t begin, uint64_t n, const float* block);

  // State transfer between training modes. ExportState: INVALID_ARGUMENT for step < 0;
  // waits (until `deadline`) until the table is readable at `step`, like a pull at `step`
  // (BSP: steps < `step` applied; FAILED_PRECONDITION if `step` itself is applied already),
  // then copies values, slots and update count under the lock. Gradients already pushed
  // for `step` or later are not part of the state.
  absl::StatusOr<DenseState> ExportState(int64_t step, absl::Time deadline);
  // An empty builder for this shard's range and optimizer slots.
  DenseStateBuilder StateBuilder() const;
  // Replaces values, slots and update count with `state` and restarts consistency at
  // `step` (Table::ResetClocksLocked), dropping every gradient staged but not applied.
  // All or nothing: INVALID_ARGUMENT, changing nothing, unless step >= 0, updates >= 0,
  // state.range is this shard's range, it holds num_slots() slots of range-size and every
  // value is finite. The swap under the lock is O(1); validation runs before it.
  absl::Status ImportState(int64_t step, DenseState state);

 private:
  DenseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer, Range range);
  // Applies the optimizer to each piece (a gradient for local index `at` on), spread over
  // threads when large.
  void ApplyLocked(const std::vector<Piece>& pieces, uint64_t total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push checked against what needs no lock (range, non-finite values).
  struct Prepared {
    int32_t worker;
    int64_t step;
    std::vector<Piece> pieces;
    uint64_t total = 0;
    bool finite = true;
    float max_abs = 0;           // the largest |gradient| when finite
    uint64_t over = UINT64_MAX;  // set by CheckLocked: the first index it would overflow
  };
  absl::StatusOr<Prepared> Prepare(int32_t worker, int64_t step, uint64_t begin,
                                   const std::vector<absl::Span<const float>>& chunks,
                                   Scanned scanned) const;
  // What depends on the state: the worker's clock, and updates that would overflow.
  absl::Status CheckLocked(Prepared* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies or stages a checked push (or counts it skipped).
  void CommitLocked(const Prepared& p, bool* skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyBspStepLocked(int64_t step) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first local index the update with gradient `pieces` * g_scale would make
  // non-finite (value or slot), or UINT64_MAX; changes nothing.
  // `max_abs`: the largest |gradient| when known (below the threshold where an update
  // could overflow, no value needs a closer look), +Inf when not.
  uint64_t FirstOverflowLocked(const std::vector<Piece>& pieces, uint64_t total, float g_scale,
                               float max_abs) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FillInfoLocked(TableInfo* info) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t MemoryBytes(const TableInfo& info) const override;
  void PrepareImage(TableImage* image) const override;
  void CaptureLocked(TableImage* image) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Copy on write (ASP/SSP; under BSP the capture's step is applied whole right after it,
  // so every block would be copied at once anyway): the capture records the point in time
  // and the image's blocks fill as mutations first touch them (CopyBlocksLocked, before
  // the change) or in CompleteCapture.
  struct Cow {
    TableImage* image = nullptr;
    std::vector<bool> copied;  // per block of kCowBlockValues
    uint64_t left = 0;         // blocks not yet copied
  };
  void BeginCaptureLocked(TableImage* image) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before [at, at + n) (local indices) changes: copies its blocks not yet copied.
  void CopyBlocksLocked(uint64_t at, uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CopyBlockLocked(uint64_t block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Range range_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::optional<Cow> cow_ ABSL_GUARDED_BY(mu_);  // a capture being filled
  bool copy_on_write_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<std::vector<float>> slots_ ABSL_GUARDED_BY(mu_);
  int64_t updates_ ABSL_GUARDED_BY(mu_) = 0;  // optimizer steps applied (Adam bias correction)
  // BSP: step -> worker -> gradient over the whole range (zeros where not pushed).
  std::map<int64_t, std::map<int32_t, std::vector<float>>> pending_ ABSL_GUARDED_BY(mu_);
  // BSP: staging buffers of applied steps, kept for the next ones (a fresh one is zeroed
  // and, at this size, page-faulted in by the kernel on every push).
  std::vector<std::vector<float>> spare_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
