// Models by name, for ps_worker --model and the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/embedding_mlp.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"

namespace pscluster::model {

struct ModelConfig {
  std::string name = "mlp";       // "mlp", "embedding" or "gpt"
  MlpOptions mlp;                 // name "mlp" (the stage fields are ignored: placements set them)
  EmbeddingMlpOptions embedding;  // name "embedding"
  GptOptions gpt;                 // name "gpt"
};

// INVALID_ARGUMENT for an unknown name (listing the known ones) or bad sizes.
absl::StatusOr<std::unique_ptr<ModelDef>> MakeModelDef(const ModelConfig& config, uint64_t seed);

}  // namespace pscluster::model
