// A ParameterStore backed by a real one-shard ps::Shard in this process, no gRPC: PS-mode
// placements tested the way gloo tests collectives, ranks as threads. Every worker gets
// its own store over the same shard (registered on construction). The shard's tables,
// consistency clocks and optimizers are the production ones; what it skips is the wire
// (chunking, message limits). Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "client/ps/parameter_store.h"
#include "server/ps/table/shard.h"

namespace pscluster::testing {

class InProcessParameterStore final : public ParameterStore {
 public:
  // `shard` (not owned) must have num_shards 1 and outlive the store.
  InProcessParameterStore(ps::Shard* shard, int32_t worker_id,
                          absl::Duration timeout = absl::Seconds(60));

  absl::Status PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                             absl::Span<const absl::Span<float>> out) override;
  absl::Status PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<const float>> grads,
                                 absl::Span<const absl::Span<float>> out) override;
  absl::Status ExportDense(uint32_t table_id, int64_t step, absl::Span<float> values,
                           std::vector<absl::Span<float>> slots, int64_t* updates) override;
  absl::Status ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                           absl::Span<const float> values,
                           const std::vector<absl::Span<const float>>& slots) override;
  absl::Status PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<const float> grads) override;
  absl::Status PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<float> out) override;

 private:
  absl::Time Deadline() const { return absl::Now() + timeout_; }

  ps::Shard* const shard_;
  const int32_t worker_;
  const absl::Duration timeout_;
};

}  // namespace pscluster::testing
