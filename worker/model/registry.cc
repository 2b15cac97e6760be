#include "worker/model/registry.h"

namespace pscluster::model {

absl::StatusOr<std::unique_ptr<ModelDef>> MakeModelDef(const ModelConfig& config, uint64_t seed) {
  if (config.name == "mlp") return MakeMlpDef(config.mlp, seed);
  if (config.name == "embedding") return MakeEmbeddingMlpDef(config.embedding, seed);
  if (config.name == "gpt") return MakeGptDef(config.gpt, seed);
  return absl::InvalidArgumentError("model '" + config.name +
                                    "' is unknown; use mlp, embedding or gpt");
}

}  // namespace pscluster::model
