// What PS-mode training needs of the parameter server: dense tensors and embedding rows
// in and out at a step, and a table's whole state for mode switches. PsClient implements
// it over gRPC; server/ps/testing's InProcessParameterStore over a real in-process shard
// (no gRPC), for tests. Each instance acts for one worker. Implementations are
// thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pscluster {

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  // Dense tables `tables[i]` read into / pushed from the whole tensor data[i] (see PsClient
  // for the consistency each call waits for).
  virtual absl::Status PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                     absl::Span<const absl::Span<float>> out) = 0;
  // This step's gradients out, then step + 1's values into `out` (out may alias grads).
  virtual absl::Status PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                         absl::Span<const absl::Span<const float>> grads,
                                         absl::Span<const absl::Span<float>> out) = 0;

  // A dense table's whole state at `step` (values, one buffer per optimizer slot, update
  // count), and installing one as the state before `step`.
  virtual absl::Status ExportDense(uint32_t table_id, int64_t step, absl::Span<float> values,
                                   std::vector<absl::Span<float>> slots, int64_t* updates) = 0;
  virtual absl::Status ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                                   absl::Span<const float> values,
                                   const std::vector<absl::Span<const float>>& slots) = 0;

  // Rows of `keys` (keys.size() * dim values, row-major, in key order).
  virtual absl::Status PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<const float> grads) = 0;
  virtual absl::Status PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<float> out) = 0;
};

}  // namespace pscluster
