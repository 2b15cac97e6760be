// A dense table's whole state over one shard's range, as it leaves (ExportState) and enters
// (ImportState) a shard: the collective modes' hand-over to and from the parameter server.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sharding.h"

namespace pscluster::ps {

// A dense table's full state over one shard's range, as DenseTable::ExportState returns it
// and ImportState installs it: slots[k] is optimizer slot k, laid out like values.
struct DenseState {
  Range range;
  int64_t updates = 0;  // optimizer updates applied (the step count of Adam's bias correction)
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

// Assembles a DenseState for one shard's range from chunks arriving in any order. Add
// rejects a chunk outside the range, with another slot count, or overlapping an earlier
// one; Finish rejects a range not fully covered. Errors are INVALID_ARGUMENT naming the
// indices. Not thread-safe.
class DenseStateBuilder {
 public:
  // Allocates the whole state up front.
  DenseStateBuilder(uint32_t table_id, Range range, int num_slots);
  DenseStateBuilder(const DenseStateBuilder&) = delete;
  DenseStateBuilder& operator=(const DenseStateBuilder&) = delete;

  // Copies a chunk for global indices [begin, begin + values.size()); `slots` holds
  // `num_slots` runs of values.size() floats, slot-major. An empty chunk must still start
  // inside the range (or at its end).
  absl::Status Add(uint64_t begin, absl::Span<const float> values, uint64_t num_slots,
                   absl::Span<const float> slots);
  // The assembled state with `updates`, or the first gap. Call once.
  absl::StatusOr<DenseState> Finish(int64_t updates);

 private:
  const uint32_t table_id_;
  DenseState state_;
  std::map<uint64_t, uint64_t> runs_;  // begin -> end of every non-empty chunk added
};

}  // namespace pscluster::ps
