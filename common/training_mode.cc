#include "common/training_mode.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pscluster::coord {
namespace {

constexpr char kValid[] = "ps, allreduce, fsdp, pipeline or tensor";

}  // namespace

const char* ModeName(TrainingMode mode) {
  switch (mode) {
    case PS:
      return "ps";
    case ALLREDUCE:
      return "allreduce";
    case FSDP:
      return "fsdp";
    case PIPELINE:
      return "pipeline";
    case TENSOR:
      return "tensor";
    default:
      return "unspecified";
  }
}

absl::StatusOr<TrainingMode> ParseMode(absl::string_view name) {
  for (TrainingMode m : kTrainingModes) {
    if (name == ModeName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("mode '", name, "' is unknown; use one of ", kValid));
}

absl::Status CheckMode(absl::string_view what, TrainingMode mode) {
  for (TrainingMode m : kTrainingModes) {
    if (mode == m) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " ", static_cast<int>(mode),
                                                 " is not a training mode; use one of ", kValid));
}

absl::Status CheckModeFits(TrainingMode mode, const ModeLimits& limits, int workers) {
  const std::string& model = limits.model();
  if (limits.embedding_tables() && (mode == FSDP || mode == PIPELINE || mode == TENSOR)) {
    return absl::FailedPreconditionError(absl::StrCat(
        ModeName(mode), " mode does not support models with embedding tables yet (the ", model,
        " model has some): use ps"));
  }
  if (mode == PIPELINE && limits.micro_batches() > 0 && limits.batch_size() > 0 &&
      (limits.batch_size() * workers) % limits.micro_batches() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pipeline mode splits the global batch of ", limits.batch_size() * workers,
        " examples into --micro_batches=", limits.micro_batches(), ", which does not divide it"));
  }
  if (mode == PIPELINE && workers > limits.layers()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pipeline mode needs at least one layer per worker: the ", model,
                     " model has ", limits.layers(), " layers, the cluster ", workers, " workers"));
  }
  if (mode == TENSOR && limits.max_tensor_parallel() < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor mode needs a model with tensor-parallel layers (gpt); the ", model,
                     " model has none"));
  }
  if (mode == TENSOR && (workers < 1 || limits.max_tensor_parallel() % workers != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor mode over ", workers, " workers: the ", model, " model splits over worker counts ",
        "dividing ", limits.max_tensor_parallel(), " (its heads and vocabulary)"));
  }
  return absl::OkStatus();
}

const SwitchRecord* SwitchInEffectAt(int64_t step, absl::Span<const SwitchRecord* const> switches) {
  const SwitchRecord* in_effect = nullptr;
  for (const SwitchRecord* r : switches) {
    if (r->at_step() <= step && (in_effect == nullptr || r->at_step() > in_effect->at_step())) {
      in_effect = r;
    }
  }
  return in_effect;
}

TrainingMode ModeAt(int64_t step, TrainingMode initial,
                    absl::Span<const SwitchRecord* const> switches) {
  const SwitchRecord* r = SwitchInEffectAt(step, switches);
  return r == nullptr ? initial : r->to_mode();
}

TrainingMode ModeAt(const ClusterView& view, int64_t step) {
  std::vector<const SwitchRecord*> all;
  for (const SwitchRecord& r : view.switches()) all.push_back(&r);
  for (const SwitchRecord& r : view.pending_switches()) all.push_back(&r);
  return ModeAt(step, view.initial_mode(), all);
}

}  // namespace pscluster::coord
