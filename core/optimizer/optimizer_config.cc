#include "core/optimizer/optimizer_config.h"

#include "absl/strings/str_cat.h"

namespace pscluster::core {
namespace {

float OrDefault(float v, float d) { return v == 0.0f ? d : v; }

}  // namespace

absl::StatusOr<OptimizerOptions> OptimizerOptionsFrom(const ps::OptimizerConfig& c) {
  using Kind = OptimizerOptions::Kind;
  const OptimizerOptions d;  // the defaults
  OptimizerOptions o;
  switch (c.kind()) {
    case ps::OptimizerConfig::SGD:
      o.kind = Kind::kSgd;
      break;
    case ps::OptimizerConfig::MOMENTUM:
      o.kind = Kind::kMomentum;
      break;
    case ps::OptimizerConfig::ADAGRAD:
      o.kind = Kind::kAdagrad;
      break;
    case ps::OptimizerConfig::ADAM:
      o.kind = Kind::kAdam;
      break;
    case ps::OptimizerConfig::ADAMW:
      o.kind = Kind::kAdamW;
      break;
    case ps::OptimizerConfig::FTRL:
      o.kind = Kind::kFtrl;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("optimizer.kind ", c.kind(), " is unknown"));
  }
  o.learning_rate = c.learning_rate();
  o.momentum = c.momentum();
  o.nesterov = c.nesterov();
  o.beta1 = OrDefault(c.beta1(), d.beta1);
  o.beta2 = OrDefault(c.beta2(), d.beta2);
  o.epsilon = OrDefault(c.epsilon(), d.epsilon);
  o.weight_decay = c.weight_decay();
  o.initial_accumulator = c.initial_accumulator();
  o.l1 = c.l1();
  o.l2 = c.l2();
  o.ftrl_beta = OrDefault(c.ftrl_beta(), d.ftrl_beta);
  o.lr_decay_rate = OrDefault(c.lr_decay_rate(), d.lr_decay_rate);
  o.lr_decay_steps = c.lr_decay_steps();
  o.lr_warmup_steps = c.lr_warmup_steps();
  return o;
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const ps::OptimizerConfig& config) {
  absl::StatusOr<OptimizerOptions> options = OptimizerOptionsFrom(config);
  if (!options.ok()) return options.status();
  return Optimizer::Create(*options);
}

ps::OptimizerConfig DefaultOptimizerConfig(ps::OptimizerConfig::Kind kind, float learning_rate) {
  const OptimizerOptions d;
  ps::OptimizerConfig c;
  c.set_kind(kind);
  c.set_learning_rate(learning_rate);
  c.set_momentum(d.momentum);
  c.set_nesterov(d.nesterov);
  c.set_beta1(d.beta1);
  c.set_beta2(d.beta2);
  c.set_epsilon(d.epsilon);
  c.set_weight_decay(d.weight_decay);
  c.set_initial_accumulator(d.initial_accumulator);
  c.set_l1(d.l1);
  c.set_l2(d.l2);
  c.set_ftrl_beta(d.ftrl_beta);
  return c;
}

}  // namespace pscluster::core
