// Which parameter-server table holds which tensor of a model: the one place the layout
// rule lives. Dense tensor i of ModelSpec::params is table 1 + i, embedding table e is
// table 1 + params.size() + e; every table is named after its tensor, so a shard's tables
// read as the model's (DescribeTable, snapshots).
#pragma once

#include <cstdint>
#include <vector>

#include "proto/ps.pb.h"
#include "worker/model/model.h"

namespace pscluster::modes {

class ModelTables {
 public:
  explicit ModelTables(const model::ModelSpec& spec) : spec_(&spec) {}

  uint32_t dense(int param) const { return 1 + static_cast<uint32_t>(param); }
  uint32_t sparse(int embedding) const {
    return 1 + static_cast<uint32_t>(spec_->params.size() + embedding);
  }
  // The dense tables, in ModelSpec::params order.
  std::vector<uint32_t> dense_ids() const;

  // Every table of the model (dense ones first), to create on the shards.
  std::vector<ps::TableSpec> Specs(const ps::OptimizerConfig& optimizer,
                                   const ps::ConsistencyConfig& consistency) const;

 private:
  const model::ModelSpec* spec_;  // not owned
};

}  // namespace pscluster::modes
