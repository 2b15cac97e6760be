#include "worker/modes/model_tables.h"

namespace pscluster::modes {

std::vector<uint32_t> ModelTables::dense_ids() const {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < spec_->params.size(); ++i) ids.push_back(dense(i));
  return ids;
}

std::vector<ps::TableSpec> ModelTables::Specs(const ps::OptimizerConfig& optimizer,
                                              const ps::ConsistencyConfig& consistency) const {
  std::vector<ps::TableSpec> specs;
  auto common = [&](uint32_t id, const std::string& name, const ps::InitializerConfig& init) {
    ps::TableSpec t;
    t.set_table_id(id);
    t.set_name(name);
    *t.mutable_optimizer() = optimizer;
    *t.mutable_consistency() = consistency;
    *t.mutable_initializer() = init;
    return t;
  };
  for (size_t i = 0; i < spec_->params.size(); ++i) {
    const model::TensorSpec& p = spec_->params[i];
    specs.push_back(common(dense(i), p.name, p.init));
    specs.back().set_size(p.size());
  }
  for (size_t e = 0; e < spec_->embeddings.size(); ++e) {
    const model::EmbeddingSpec& emb = spec_->embeddings[e];
    specs.push_back(common(sparse(e), emb.name, emb.init));
    specs.back().set_kind(ps::TableSpec::SPARSE);
    specs.back().set_dim(emb.dim);
    specs.back().set_key_space(emb.vocab);
  }
  return specs;
}

}  // namespace pscluster::modes
