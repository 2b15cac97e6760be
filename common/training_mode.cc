#include "common/training_mode.h"

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
