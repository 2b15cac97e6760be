// Pieces the placements share; not part of the modes' interface.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/modes/placement.h"

namespace pscluster::modes::internal {

// INVALID_ARGUMENT unless `state` has the model's tensors (and, given an optimizer, its
// number of slots per tensor).
absl::Status CheckState(const ModelState& state, const model::ModelSpec& spec,
                        const core::Optimizer* opt);
// One optimizer update of n elements (slots: one array per optimizer slot, its n floats
// from `offset` used).
void ApplyOptimizer(const core::Optimizer& opt, float* w, const float* g,
                    std::vector<std::vector<float>>& slots, size_t n, int64_t update,
                    size_t offset = 0);

// This rank's share of every global batch (the data-parallel order).
absl::StatusOr<data::BatchIterator> DataParallelBatches(const PlacementContext& ctx);
// The batch `it` serves at `step`.
void BatchAt(data::BatchIterator* it, int64_t step, data::Batch* out);

// An instance of the context's model with `options` (FAILED_PRECONDITION without a model).
absl::StatusOr<std::unique_ptr<model::Model>> NewModel(const PlacementContext& ctx,
                                                       const model::InstanceOptions& options);

absl::StatusOr<std::unique_ptr<Placement>> MakePsPlacement(const PlacementContext& ctx);
absl::StatusOr<std::unique_ptr<Placement>> MakeAllReducePlacement(const PlacementContext& ctx);
absl::StatusOr<std::unique_ptr<Placement>> MakeFsdpPlacement(const PlacementContext& ctx);
absl::StatusOr<std::unique_ptr<Placement>> MakePipelinePlacement(const PlacementContext& ctx);
absl::StatusOr<std::unique_ptr<Placement>> MakeTensorPlacement(const PlacementContext& ctx);

}  // namespace pscluster::modes::internal
