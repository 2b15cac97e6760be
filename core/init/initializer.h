// Deterministic parameter initialisation: every value is a function of (seed, position)
// only, so a row or range initialises identically whichever shard, order or thread does it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace pscluster::core {

// INVALID_ARGUMENT naming the field for a non-finite value/scale or a negative scale.
absl::Status ValidateInitializer(const ps::InitializerConfig& config);

// Fills out[i] with the value for global dense index first_index + i.
void InitDense(const ps::InitializerConfig& config, uint64_t first_index, absl::Span<float> out);

// Fills the `out.size()` values of sparse row `key`.
void InitSparseRow(const ps::InitializerConfig& config, uint64_t key, absl::Span<float> out);

}  // namespace pscluster::core
