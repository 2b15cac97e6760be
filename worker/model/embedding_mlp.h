// A small model with sparse inputs, for the embedding paths of every placement: the first
// `categorical` features of an example are bucketed into ids (feature c, value v ->
// c * buckets + bucket(v) over [range_lo, range_hi)), the rows of those ids in one
// embedding table "emb0" (dim floats each) are averaged, and an MLP reads
// [features, relu(mean row)]. Real enough to train (the ids carry the same information as
// the features), small enough for exact equivalence tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"

namespace pscluster::model {

struct EmbeddingMlpOptions {
  int features = 12;    // input width
  int categorical = 4;  // the first this many features become ids
  int buckets = 8;      // ids per categorical feature
  float range_lo = -2;  // values below go to bucket 0, at or above range_hi to the last
  float range_hi = 2;
  int dim = 4;  // embedding row width
  std::vector<int> hidden = {16};
  int classes = 3;
};

ModelSpec EmbeddingMlpSpec(const EmbeddingMlpOptions& options, uint64_t seed);

// INVALID_ARGUMENT for sizes < 1 or categorical > features.
absl::StatusOr<std::unique_ptr<ModelDef>> MakeEmbeddingMlpDef(const EmbeddingMlpOptions& options,
                                                              uint64_t seed);

}  // namespace pscluster::model
