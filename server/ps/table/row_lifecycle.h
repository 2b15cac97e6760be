// Which rows a sparse table keeps (TableSpec.rows, a SparseRowPolicy): whether an id with
// no row gets one (admission, its pushes counted in an AdmissionSketch), when the table
// sweeps out the rows no update touched for evict_after_steps steps, and how many rows
// each let in, kept out and swept. The table asks it under its lock, where its updates
// apply: once per BSP step (a push per worker that carried the id), or per push under
// ASP/SSP. So a BSP run keeps the same rows every time, and so does every replica.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "proto/ps.pb.h"
#include "proto/snapshot.pb.h"
#include "server/ps/table/admission_sketch.h"

namespace pscluster::ps {

class RowLifecycle {
 public:
  // The policy must be valid (ValidateRowPolicy).
  explicit RowLifecycle(const SparseRowPolicy& policy);

  // Rows carry the step of their last update (for eviction).
  bool tracks_steps() const { return evict_after_ > 0; }
  // Admission counts pushes: the table tells Admit how many carried an id.
  bool counts_pushes() const { return sketch_ != nullptr; }
  // `pushes` more pushes carried `key`, which has no row: whether it gets one now.
  bool Admit(uint64_t key, uint32_t pushes);
  // After the updates of `step`: when the table sweeps now, the newest step a row's last
  // update may be at for the sweep to remove it.
  std::optional<int64_t> SweepAt(int64_t step);
  void Evicted(uint64_t rows) { evicted_ += rows; }

  void FillStats(TableStats* stats) const;
  // The sketch's counters into a snapshot's header (admission_counts), and back: a restore
  // adds the counters of every header it reads (old shards of another shard count).
  void Capture(TableSnapshotHeader* header) const;
  absl::Status Restore(const TableSnapshotHeader& header);
  // The sketch's bytes.
  uint64_t bytes() const { return sketch_ ? sketch_->bytes() : 0; }

 private:
  const uint32_t admit_after_;
  const uint64_t evict_after_;
  const int64_t sweep_every_;
  std::unique_ptr<AdmissionSketch> sketch_;  // null: every id gets a row at once
  int64_t last_sweep_ = -1;
  uint64_t admitted_ = 0, not_admitted_ = 0, evicted_ = 0;
};

// The bytes of the admission sketch a table of this policy keeps (0: none).
uint64_t AdmissionSketchBytes(const SparseRowPolicy& policy);

// INVALID_ARGUMENT naming the field for a policy out of its bounds, or one on a dense table.
absl::Status ValidateRowPolicy(const TableSpec& spec);

}  // namespace pscluster::ps
