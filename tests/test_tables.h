// Table specs and gradients shared by the multi-process tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/ps.pb.h"

namespace pscluster {

using ps::OptimizerConfig;
using ps::TableSpec;

// One config of every server-side optimizer (momentum twice: plain and Nesterov).
inline std::vector<OptimizerConfig> AllOptimizers() {
  std::vector<OptimizerConfig> out;
  auto add = [&](OptimizerConfig::Kind kind, float lr) {
    OptimizerConfig c;
    c.set_kind(kind);
    c.set_learning_rate(lr);
    out.push_back(c);
    return &out.back();
  };
  add(OptimizerConfig::SGD, 0.5f);
  add(OptimizerConfig::MOMENTUM, 0.1f)->set_momentum(0.9f);
  auto* nesterov = add(OptimizerConfig::MOMENTUM, 0.1f);
  nesterov->set_momentum(0.8f);
  nesterov->set_nesterov(true);
  add(OptimizerConfig::ADAGRAD, 0.1f)->set_initial_accumulator(0.1f);
  add(OptimizerConfig::ADAM, 0.01f);
  add(OptimizerConfig::ADAMW, 0.01f)->set_weight_decay(0.1f);
  auto* ftrl = add(OptimizerConfig::FTRL, 0.1f);
  ftrl->set_l1(0.05f);
  ftrl->set_l2(0.01f);
  ftrl->set_initial_accumulator(0.1f);
  return out;
}

// Gradient of worker w at step t for value i: varied signs and magnitudes.
inline float Grad(int w, int t, uint64_t i) {
  return std::sin(0.37f * i + 1.3f * t + 2.1f * w) * (1.0f + (i % 7)) - 0.25f * w;
}

inline TableSpec Spec(uint32_t id, TableSpec::Kind kind, const OptimizerConfig& opt) {
  TableSpec s;
  s.set_table_id(id);
  s.set_kind(kind);
  s.set_name(absl::StrCat("t", id));
  *s.mutable_optimizer() = opt;
  s.mutable_initializer()->set_kind(ps::InitializerConfig::UNIFORM);
  s.mutable_initializer()->set_scale(0.5f);
  s.mutable_initializer()->set_seed(1000 + id);
  return s;  // consistency BSP by default
}

}  // namespace pscluster
