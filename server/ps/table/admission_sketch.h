// How many pushes carried each id of a sparse table, in bounded memory, for admission
// (SparseRowPolicy.admit_after_pushes): a count-min sketch of kHashes rows of byte counters
// with conservative update (an add raises only the counters below the new count). It never
// counts an id low; it counts one high only when all its counters collide with busier ids.
// Counters stop at 255. Not thread-safe (the table's lock guards it).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pscluster::ps {

class AdmissionSketch {
 public:
  static constexpr int kHashes = 4;
  static constexpr uint32_t kMaxCount = 255;

  explicit AdmissionSketch(uint32_t counters_per_hash);

  // Counts `pushes` more pushes of `key`; returns its count after (at most kMaxCount).
  uint32_t Add(uint64_t key, uint32_t pushes);
  uint32_t Count(uint64_t key) const;

  // The counters, as a snapshot stores them.
  const std::string& counts() const { return counters_; }
  // Adds a snapshot's counters to these (each stopping at kMaxCount): a sketch of several
  // old shards' ids is the sum of theirs, as a restore into another shard count needs.
  // INVALID_ARGUMENT when `counts` is of another size; nothing changes then.
  absl::Status Merge(absl::string_view counts);
  uint64_t bytes() const { return counters_.size(); }

 private:
  size_t Slot(uint64_t key, int hash) const;

  const uint32_t width_;
  std::string counters_;  // kHashes rows of width_ counters
};

}  // namespace pscluster::ps
