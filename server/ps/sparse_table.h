// A sparse embedding table: uint64 key -> float32 row of spec.dim values, for the keys that
// hash to this shard. Rows are created on first touch from the seeded initializer.
#pragma once

#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/ps/table.h"

namespace pscluster::ps {

class SparseTable final : public Table {
 public:
  // `spec` must already be validated (ValidateTableSpec).
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(const TableSpec& spec,
                                                             uint32_t shard_id,
                                                             uint32_t num_shards);

  // INVALID_ARGUMENT/OUT_OF_RANGE for a key of another shard or outside key_space.
  absl::Status CheckKeys(absl::Span<const uint64_t> keys) const;

  // Applies (ASP/SSP) or stages (BSP) one worker's gradient rows; duplicate keys are summed.
  // `grads` holds keys.size() * dim values. All or nothing.
  absl::Status Push(int32_t worker, int64_t step, absl::Span<const uint64_t> keys,
                    absl::Span<const float> grads, bool* skipped);

  // Copies the rows of `keys` (created if missing) into `out` (keys.size() * dim values).
  // Call AwaitPullable first.
  absl::Status Read(absl::Span<const uint64_t> keys, absl::Span<float> out);

  // Restore, before serving: a row of a snapshot (dim * (1 + num_slots) floats). Rows of
  // keys this shard does not own are ignored, so old shards' rows can be offered to all.
  void RestoreRow(uint64_t key, int64_t updates, const float* data);

 private:
  struct Row {
    int64_t updates = 0;      // optimizer steps applied to this row (bias correction)
    std::vector<float> data;  // dim values, then dim values per optimizer slot
  };
  using Grads = std::map<uint64_t, std::vector<float>>;

  SparseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer, uint32_t shard_id,
              uint32_t num_shards);
  Row& RowLocked(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(uint64_t key, const std::vector<float>& grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyBspStepLocked(int64_t step) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillInfoLocked(TableInfo* info) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void CaptureLocked(TableImage* image) const override ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const uint32_t shard_id_;
  const uint32_t num_shards_;
  const size_t dim_;
  absl::flat_hash_map<uint64_t, Row> rows_ ABSL_GUARDED_BY(mu_);
  // BSP: step -> worker -> its summed gradient rows.
  std::map<int64_t, std::map<int32_t, Grads>> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
