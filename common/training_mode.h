// The training-mode vocabulary shared by the coordinator, the workers and psctl: a mode's
// name, parsing a name, and which mode is in effect at a step given the switch schedule.
// Stateless and thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// Every training mode, in the enum's order.
inline constexpr TrainingMode kTrainingModes[] = {PS, ALLREDUCE, FSDP, PIPELINE, TENSOR};

// "ps", "allreduce", "fsdp", "pipeline", "tensor"; "unspecified" for anything else.
const char* ModeName(TrainingMode mode);

// The mode named `name` (ModeName's inverse); INVALID_ARGUMENT listing the valid names.
absl::StatusOr<TrainingMode> ParseMode(absl::string_view name);

// OK for PS, ALLREDUCE, FSDP, PIPELINE and TENSOR; INVALID_ARGUMENT (naming `what` and listing
// the valid ones) for UNSPECIFIED and values outside the enum (they arrive over the wire).
absl::Status CheckMode(absl::string_view what, TrainingMode mode);

// OK when a model with `limits` can train in `mode` over `workers` workers; else
// FAILED_PRECONDITION saying why (pipeline: at least one layer per worker; tensor: a model
// with tensor-parallel layers whose split divides by `workers`; fsdp, pipeline and tensor:
// no embedding tables yet). The placements check the same (worker/modes).
absl::Status CheckModeFits(TrainingMode mode, const ModeLimits& limits, int workers);

// A switch with at_step S is taken at the boundary before step S: step S already runs in
// the new mode. The switch in effect at `step` is the one with the highest at_step <= step
// among `switches` (any order); null when none is.
const SwitchRecord* SwitchInEffectAt(int64_t step, absl::Span<const SwitchRecord* const> switches);

// The mode step `step` runs in: the to_mode of SwitchInEffectAt, else `initial`.
TrainingMode ModeAt(int64_t step, TrainingMode initial,
                    absl::Span<const SwitchRecord* const> switches);

// ModeAt over a view's done and pending switches, from its initial_mode.
TrainingMode ModeAt(const ClusterView& view, int64_t step);

}  // namespace pscluster::coord
