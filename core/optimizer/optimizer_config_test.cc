#include "core/optimizer/optimizer_config.h"

#include "gtest/gtest.h"

namespace pscluster::core {
namespace {

TEST(OptimizerConfigTest, ZeroFieldsMeanTheOptionsDefaults) {
  ps::OptimizerConfig c;
  c.set_kind(ps::OptimizerConfig::ADAM);
  c.set_learning_rate(0.5f);
  absl::StatusOr<OptimizerOptions> o = OptimizerOptionsFrom(c);
  ASSERT_TRUE(o.ok()) << o.status();
  const OptimizerOptions d;
  EXPECT_EQ(o->kind, OptimizerOptions::Kind::kAdam);
  EXPECT_EQ(o->learning_rate, 0.5f);
  EXPECT_EQ(o->beta1, d.beta1);
  EXPECT_EQ(o->beta2, d.beta2);
  EXPECT_EQ(o->epsilon, d.epsilon);
  EXPECT_EQ(o->ftrl_beta, d.ftrl_beta);
  EXPECT_EQ(o->lr_decay_rate, d.lr_decay_rate);
  EXPECT_EQ(o->momentum, 0.0f);  // zero is a value here, not "default"
}

TEST(OptimizerConfigTest, DefaultConfigCarriesEveryDefault) {
  const OptimizerOptions d;
  for (auto kind :
       {ps::OptimizerConfig::SGD, ps::OptimizerConfig::MOMENTUM, ps::OptimizerConfig::ADAGRAD,
        ps::OptimizerConfig::ADAM, ps::OptimizerConfig::ADAMW, ps::OptimizerConfig::FTRL}) {
    absl::StatusOr<OptimizerOptions> o = OptimizerOptionsFrom(DefaultOptimizerConfig(kind, 0.1f));
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->learning_rate, 0.1f);
    EXPECT_EQ(o->momentum, d.momentum);
    EXPECT_EQ(o->initial_accumulator, d.initial_accumulator);
    EXPECT_EQ(o->beta2, d.beta2);
    EXPECT_TRUE(MakeOptimizer(DefaultOptimizerConfig(kind, 0.1f)).ok());
  }
}

TEST(OptimizerConfigTest, UnknownKindIsRefusedNamingIt) {
  ps::OptimizerConfig c;
  c.set_kind(static_cast<ps::OptimizerConfig::Kind>(77));
  c.set_learning_rate(0.1f);
  absl::StatusOr<std::unique_ptr<Optimizer>> o = MakeOptimizer(c);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("77"), absl::string_view::npos) << o.status();
}

TEST(OptimizerConfigTest, BadValueIsRefusedByCreate) {
  ps::OptimizerConfig c = DefaultOptimizerConfig(ps::OptimizerConfig::MOMENTUM, 0.1f);
  c.set_momentum(1.5f);
  EXPECT_EQ(MakeOptimizer(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = DefaultOptimizerConfig(ps::OptimizerConfig::SGD, -1.0f);
  EXPECT_EQ(MakeOptimizer(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster::core
