// The wire optimizer config (proto/ps.proto OptimizerConfig) <-> Optimizer. The defaults
// live once, in OptimizerOptions (optimizer.h): a config's zero beta1/beta2/epsilon/
// ftrl_beta/lr_decay_rate means that default, and DefaultOptimizerConfig writes the
// defaults of the fields whose zero is a meaningful value (momentum, initial_accumulator).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/optimizer/optimizer.h"
#include "proto/ps.pb.h"

namespace pscluster::core {

// Validated options for `config`: INVALID_ARGUMENT for an unknown kind or a value
// Optimizer::Create refuses (naming the field).
absl::StatusOr<OptimizerOptions> OptimizerOptionsFrom(const ps::OptimizerConfig& config);

// OptimizerOptionsFrom, then Optimizer::Create.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const ps::OptimizerConfig& config);

// A config of `kind` at `learning_rate` with every other field at OptimizerOptions'
// default (what a user who names only the kind expects: momentum 0.9, Adagrad's
// accumulator 0.1, ...).
ps::OptimizerConfig DefaultOptimizerConfig(ps::OptimizerConfig::Kind kind, float learning_rate);

}  // namespace pscluster::core
