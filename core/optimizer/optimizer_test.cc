#include "core/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::core {
namespace {

using Kind = OptimizerOptions::Kind;
using ::testing::HasSubstr;

using Vec = std::vector<double>;

// Five elements with positive, negative and zero starting weights.
const Vec kW0 = {1.0, -0.5, 0.25, 2.0, -1.5};
// Four steps of gradients: negative, zero (element 2 for three steps) and
// varying magnitudes, including sign flips.
const std::vector<Vec> kGrads = {
    {0.5, -1.0, 0.0, 2.0, -0.25},
    {0.1, -0.3, 0.0, -1.5, 0.75},
    {-0.2, 0.4, 0.0, 0.5, 1.25},
    {0.3, -0.6, 1.0, 0.0, -2.0},
};

// Weights and slots after a run, from either the library or a reference.
struct State {
  Vec w;
  std::vector<Vec> slots;
};

std::unique_ptr<Optimizer> MakeOrDie(const OptimizerOptions& options) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(options);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

// Runs the library optimizer over `grads` starting from `w0` in float32.
State RunLibrary(const OptimizerOptions& options, const Vec& w0, const std::vector<Vec>& grads) {
  std::unique_ptr<Optimizer> opt = MakeOrDie(options);
  if (opt == nullptr) return {};
  const size_t n = w0.size();
  std::vector<float> w(w0.begin(), w0.end());
  std::vector<std::vector<float>> slots(opt->num_slots());
  std::vector<float*> slot_ptrs;
  for (int k = 0; k < opt->num_slots(); ++k) {
    slots[k].assign(n, opt->slot_initial_value(k));
    slot_ptrs.push_back(slots[k].data());
  }
  int64_t step = 0;
  for (const Vec& g64 : grads) {
    std::vector<float> g(g64.begin(), g64.end());
    opt->Apply(w.data(), g.data(), slot_ptrs.data(), n, ++step);
  }
  State out{Vec(w.begin(), w.end()), {}};
  for (const auto& s : slots) out.slots.emplace_back(s.begin(), s.end());
  return out;
}

// Straightforward double-precision scalar references, written independently
// of the library. Each returns the final weights and slots.

State RefSgd(double lr, Vec w, const std::vector<Vec>& grads) {
  for (const Vec& g : grads)
    for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] - lr * g[i];
  return {w, {}};
}

State RefMomentum(double lr, double mu, bool nesterov, Vec w, const std::vector<Vec>& grads) {
  Vec v(w.size(), 0.0);
  for (const Vec& g : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      v[i] = mu * v[i] + g[i];
      const double d = nesterov ? g[i] + mu * v[i] : v[i];
      w[i] = w[i] - lr * d;
    }
  }
  return {w, {v}};
}

State RefAdagrad(double lr, double eps, double init, Vec w, const std::vector<Vec>& grads) {
  Vec acc(w.size(), init);
  for (const Vec& g : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      acc[i] = acc[i] + g[i] * g[i];
      w[i] = w[i] - lr * g[i] / (std::sqrt(acc[i]) + eps);
    }
  }
  return {w, {acc}};
}

State RefAdamW(double lr, double b1, double b2, double eps, double wd, Vec w,
               const std::vector<Vec>& grads) {
  Vec m(w.size(), 0.0), v(w.size(), 0.0);
  int t = 0;
  for (const Vec& g : grads) {
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = w[i] * (1.0 - lr * wd);
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1.0 - std::pow(b1, t));
      const double vhat = v[i] / (1.0 - std::pow(b2, t));
      w[i] = w[i] - lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  return {w, {m, v}};
}

State RefFtrl(double alpha, double beta, double l1, double l2, double init, Vec w,
              const std::vector<Vec>& grads) {
  Vec z(w.size(), 0.0), n(w.size(), init);
  for (const Vec& g : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      const double sigma = (std::sqrt(n[i] + g[i] * g[i]) - std::sqrt(n[i])) / alpha;
      z[i] += g[i] - sigma * w[i];
      n[i] += g[i] * g[i];
      if (std::fabs(z[i]) <= l1) {
        w[i] = 0.0;
      } else {
        const double sign = z[i] < 0 ? -1.0 : 1.0;
        w[i] = -(z[i] - sign * l1) / ((beta + std::sqrt(n[i])) / alpha + l2);
      }
    }
  }
  return {w, {z, n}};
}

// ~1e-5 relative tolerance, with a floor of 1e-5 absolute near zero.
void ExpectClose(const Vec& actual, const Vec& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::max(1.0, std::fabs(expected[i])))
        << what << "[" << i << "]";
  }
}

void ExpectStateClose(const State& actual, const State& expected) {
  ExpectClose(actual.w, expected.w, "w");
  ASSERT_EQ(actual.slots.size(), expected.slots.size());
  for (size_t k = 0; k < actual.slots.size(); ++k) {
    ExpectClose(actual.slots[k], expected.slots[k], "slot" + std::to_string(k));
  }
}

OptimizerOptions Options(Kind kind) {
  OptimizerOptions o;
  o.kind = kind;
  return o;
}

TEST(SgdTest, MatchesReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kSgd);
  o.learning_rate = 0.1f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefSgd(0.1, kW0, kGrads));
}

TEST(SgdTest, ApplyWithNoElementsAndNoSlotsIsANoOp) {
  std::unique_ptr<Optimizer> opt = MakeOrDie(Options(Kind::kSgd));
  ASSERT_NE(opt, nullptr);
  opt->Apply(nullptr, nullptr, nullptr, 0, 1);
}

TEST(MomentumTest, PlainMatchesPyTorchReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kMomentum);
  o.learning_rate = 0.05f;
  o.momentum = 0.9f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefMomentum(0.05, 0.9, false, kW0, kGrads));
}

TEST(MomentumTest, NesterovMatchesPyTorchReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kMomentum);
  o.learning_rate = 0.05f;
  o.momentum = 0.8f;
  o.nesterov = true;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefMomentum(0.05, 0.8, true, kW0, kGrads));
}

TEST(MomentumTest, NesterovTakesALargerFirstStepThanPlain) {
  OptimizerOptions o = Options(Kind::kMomentum);
  o.learning_rate = 0.1f;
  o.momentum = 0.5f;
  const std::vector<Vec> one_step = {{1.0, 1.0, 1.0, 1.0, 1.0}};
  const State plain = RunLibrary(o, kW0, one_step);
  o.nesterov = true;
  const State nesterov = RunLibrary(o, kW0, one_step);
  // Plain: w -= 0.1 * 1; Nesterov: w -= 0.1 * (1 + 0.5 * 1).
  EXPECT_NEAR(plain.w[0], 0.9, 1e-6);
  EXPECT_NEAR(nesterov.w[0], 0.85, 1e-6);
}

TEST(AdagradTest, MatchesReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kAdagrad);
  o.learning_rate = 0.1f;
  o.initial_accumulator = 0.1f;
  o.epsilon = 1e-7f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefAdagrad(0.1, 1e-7, 0.1, kW0, kGrads));
}

TEST(AdagradTest, ZeroInitialAccumulatorMatchesReference) {
  OptimizerOptions o = Options(Kind::kAdagrad);
  o.learning_rate = 0.5f;
  o.initial_accumulator = 0.0f;
  o.epsilon = 1e-6f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefAdagrad(0.5, 1e-6, 0.0, kW0, kGrads));
}

TEST(AdamTest, BiasCorrectionMatchesReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kAdam);
  o.learning_rate = 0.01f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefAdamW(0.01, 0.9, 0.999, 1e-8, 0.0, kW0, kGrads));
}

TEST(AdamTest, NonDefaultBetasAndEpsilonMatchReference) {
  OptimizerOptions o = Options(Kind::kAdam);
  o.learning_rate = 0.2f;
  o.beta1 = 0.5f;
  o.beta2 = 0.75f;
  o.epsilon = 1e-3f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefAdamW(0.2, 0.5, 0.75, 1e-3, 0.0, kW0, kGrads));
}

TEST(AdamTest, FirstStepMovesEachWeightByLearningRateAgainstGradientSign) {
  OptimizerOptions o = Options(Kind::kAdam);
  o.learning_rate = 0.01f;
  const State s = RunLibrary(o, kW0, {kGrads[0]});
  EXPECT_NEAR(s.w[0], 1.0 - 0.01, 1e-6);   // g > 0
  EXPECT_NEAR(s.w[1], -0.5 + 0.01, 1e-6);  // g < 0
  EXPECT_EQ(s.w[2], 0.25f);                // g == 0: unchanged
}

TEST(AdamTest, IgnoresWeightDecay) {
  OptimizerOptions o = Options(Kind::kAdam);
  o.learning_rate = 0.01f;
  const State without = RunLibrary(o, kW0, kGrads);
  o.weight_decay = 0.5f;
  const State with = RunLibrary(o, kW0, kGrads);
  EXPECT_EQ(with.w, without.w);
}

TEST(AdamWTest, DecoupledDecayMatchesReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kAdamW);
  o.learning_rate = 0.05f;
  o.weight_decay = 0.1f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefAdamW(0.05, 0.9, 0.999, 1e-8, 0.1, kW0, kGrads));
}

TEST(AdamWTest, ZeroGradientOnlyDecaysWeight) {
  OptimizerOptions o = Options(Kind::kAdamW);
  o.learning_rate = 0.1f;
  o.weight_decay = 0.5f;
  const State s = RunLibrary(o, kW0, {{0.0, 0.0, 0.0, 0.0, 0.0}});
  for (size_t i = 0; i < kW0.size(); ++i) {
    EXPECT_NEAR(s.w[i], kW0[i] * (1.0 - 0.1 * 0.5), 1e-7) << i;
  }
}

TEST(AdamWTest, ZeroDecayEqualsAdam) {
  OptimizerOptions o = Options(Kind::kAdamW);
  o.learning_rate = 0.01f;
  const State adamw = RunLibrary(o, kW0, kGrads);
  o.kind = Kind::kAdam;
  const State adam = RunLibrary(o, kW0, kGrads);
  EXPECT_EQ(adamw.w, adam.w);
}

TEST(FtrlTest, WithoutRegularizationMatchesReferenceOverFourSteps) {
  OptimizerOptions o = Options(Kind::kFtrl);
  o.learning_rate = 0.1f;
  o.ftrl_beta = 1.0f;
  o.initial_accumulator = 0.1f;
  ExpectStateClose(RunLibrary(o, kW0, kGrads), RefFtrl(0.1, 1.0, 0.0, 0.0, 0.1, kW0, kGrads));
}

TEST(FtrlTest, L1AndL2MatchReferenceAndDriveSomeWeightsExactlyToZero) {
  OptimizerOptions o = Options(Kind::kFtrl);
  o.learning_rate = 0.5f;
  o.ftrl_beta = 0.5f;
  o.l1 = 0.6f;
  o.l2 = 0.25f;
  o.initial_accumulator = 0.0f;
  const State actual = RunLibrary(o, kW0, kGrads);
  const State expected = RefFtrl(0.5, 0.5, 0.6, 0.25, 0.0, kW0, kGrads);
  ExpectStateClose(actual, expected);
  int zeros = 0, nonzeros = 0;
  for (size_t i = 0; i < kW0.size(); ++i) {
    if (expected.w[i] == 0.0) {
      EXPECT_EQ(actual.w[i], 0.0) << i;
      // Not a borderline case: |z| is clearly inside the l1 ball.
      EXPECT_LT(std::fabs(expected.slots[0][i]), 0.6 - 1e-3) << i;
      ++zeros;
    } else {
      EXPECT_NE(actual.w[i], 0.0) << i;
      ++nonzeros;
    }
  }
  EXPECT_GE(zeros, 1);
  EXPECT_GE(nonzeros, 1);
}

TEST(FtrlTest, ZeroGradientOnZeroWeightKeepsItZero) {
  OptimizerOptions o = Options(Kind::kFtrl);
  o.l1 = 0.01f;
  const State s = RunLibrary(o, {0.0, 0.0}, {{0.0, 0.0}, {0.0, 0.0}});
  EXPECT_EQ(s.w, (Vec{0.0, 0.0}));
}

TEST(OptimizerSlotsTest, NumSlotsPerKind) {
  EXPECT_EQ(MakeOrDie(Options(Kind::kSgd))->num_slots(), 0);
  EXPECT_EQ(MakeOrDie(Options(Kind::kMomentum))->num_slots(), 1);
  EXPECT_EQ(MakeOrDie(Options(Kind::kAdagrad))->num_slots(), 1);
  EXPECT_EQ(MakeOrDie(Options(Kind::kAdam))->num_slots(), 2);
  EXPECT_EQ(MakeOrDie(Options(Kind::kAdamW))->num_slots(), 2);
  EXPECT_EQ(MakeOrDie(Options(Kind::kFtrl))->num_slots(), 2);
}

TEST(OptimizerSlotsTest, OnlyAdagradAccumulatorAndFtrlNStartAtInitialAccumulator) {
  auto make = [](Kind kind) {
    OptimizerOptions o = Options(kind);
    o.initial_accumulator = 0.3f;
    return MakeOrDie(o);
  };
  EXPECT_EQ(make(Kind::kMomentum)->slot_initial_value(0), 0.0f);
  EXPECT_EQ(make(Kind::kAdagrad)->slot_initial_value(0), 0.3f);
  EXPECT_EQ(make(Kind::kAdam)->slot_initial_value(0), 0.0f);
  EXPECT_EQ(make(Kind::kAdam)->slot_initial_value(1), 0.0f);
  EXPECT_EQ(make(Kind::kAdamW)->slot_initial_value(0), 0.0f);
  EXPECT_EQ(make(Kind::kAdamW)->slot_initial_value(1), 0.0f);
  EXPECT_EQ(make(Kind::kFtrl)->slot_initial_value(0), 0.0f);  // z
  EXPECT_EQ(make(Kind::kFtrl)->slot_initial_value(1), 0.3f);  // n
}

TEST(OptimizerSlotsTest, DefaultInitialAccumulatorIsPointOne) {
  EXPECT_EQ(MakeOrDie(Options(Kind::kAdagrad))->slot_initial_value(0), 0.1f);
  EXPECT_EQ(MakeOrDie(Options(Kind::kFtrl))->slot_initial_value(1), 0.1f);
}

// One call over many elements (exercising vector bodies and tails) gives the
// same result as updating each element on its own, for every kind.
TEST(OptimizerApplyTest, LongVectorMatchesElementByElementUpdates) {
  constexpr size_t kN = 37;
  for (Kind kind :
       {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kAdamW, Kind::kFtrl}) {
    OptimizerOptions o = Options(kind);
    o.weight_decay = 0.01f;
    o.l1 = 0.001f;
    std::unique_ptr<Optimizer> opt = MakeOrDie(o);
    ASSERT_NE(opt, nullptr);
    const int ns = opt->num_slots();
    std::vector<float> wa(kN), wb(kN), g(kN);
    std::vector<std::vector<float>> sa(ns), sb(ns);
    for (size_t i = 0; i < kN; ++i) wa[i] = wb[i] = 0.1f * (i % 7) - 0.3f;
    for (int k = 0; k < ns; ++k) {
      sa[k].assign(kN, opt->slot_initial_value(k));
      sb[k] = sa[k];
    }
    for (int64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < kN; ++i) g[i] = 0.05f * ((i * step) % 5) - 0.1f;
      std::vector<float*> pa;
      for (auto& s : sa) pa.push_back(s.data());
      opt->Apply(wa.data(), g.data(), pa.data(), kN, step);
      for (size_t i = 0; i < kN; ++i) {
        std::vector<float*> pb;
        for (auto& s : sb) pb.push_back(s.data() + i);
        opt->Apply(wb.data() + i, g.data() + i, pb.data(), 1, step);
      }
    }
    EXPECT_EQ(wa, wb) << static_cast<int>(kind);
    EXPECT_EQ(sa, sb) << static_cast<int>(kind);
  }
}

TEST(OptimizerApplyTest, ConcurrentApplyOnDisjointRangesIsSafe) {
  OptimizerOptions o = Options(Kind::kAdam);
  std::unique_ptr<Optimizer> opt = MakeOrDie(o);
  ASSERT_NE(opt, nullptr);
  constexpr size_t kPerThread = 64;
  constexpr int kThreads = 4;
  std::vector<float> w(kPerThread * kThreads, 1.0f);
  std::vector<float> g(w.size(), 0.5f), m(w.size(), 0.0f), v(w.size(), 0.0f);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const size_t off = t * kPerThread;
      float* slots[] = {m.data() + off, v.data() + off};
      for (int64_t step = 1; step <= 10; ++step) {
        opt->Apply(w.data() + off, g.data() + off, slots, kPerThread, step);
      }
    });
  }
  for (auto& th : threads) th.join();
  const State ref = RefAdamW(0.01, 0.9, 0.999, 1e-8, 0.0, {1.0}, std::vector<Vec>(10, Vec{0.5}));
  for (float wi : w) EXPECT_NEAR(wi, ref.w[0], 1e-5);
}

TEST(OptimizerCreateTest, AcceptsDefaultOptionsForEveryKind) {
  for (Kind kind :
       {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kAdamW, Kind::kFtrl}) {
    EXPECT_TRUE(Optimizer::Create(Options(kind)).ok()) << static_cast<int>(kind);
  }
}

TEST(OptimizerCreateTest, AcceptsBoundaryValues) {
  OptimizerOptions o;
  o.momentum = 0.0f;
  o.beta1 = 0.0f;
  o.beta2 = 0.0f;
  o.epsilon = 0.0f;
  o.initial_accumulator = 0.0f;
  o.ftrl_beta = 0.0f;
  for (Kind kind : {Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kFtrl}) {
    o.kind = kind;
    EXPECT_TRUE(Optimizer::Create(o).ok()) << static_cast<int>(kind);
  }
}

TEST(OptimizerCreateTest, NegativeLearningRateMessageNamesFieldAndValue) {
  OptimizerOptions o;
  o.learning_rate = -1.0f;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(o);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.status().message(), "learning_rate must be > 0, got -1");
}

TEST(OptimizerCreateTest, RejectsUnknownKind) {
  OptimizerOptions o;
  o.kind = static_cast<Kind>(42);
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(o);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opt.status().message(), HasSubstr("kind"));
}

struct BadOptionCase {
  std::string name;
  std::string field;
  std::function<void(OptimizerOptions&)> mutate;
};

class OptimizerCreateRejectsTest : public ::testing::TestWithParam<BadOptionCase> {};

TEST_P(OptimizerCreateRejectsTest, InvalidArgumentNamingTheField) {
  const BadOptionCase& c = GetParam();
  // Each bad value is rejected whatever kind is selected.
  for (Kind kind :
       {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kAdamW, Kind::kFtrl}) {
    OptimizerOptions o = Options(kind);
    c.mutate(o);
    absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(o);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << static_cast<int>(kind);
    EXPECT_THAT(opt.status().message(), HasSubstr(c.field));
  }
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

INSTANTIATE_TEST_SUITE_P(
    BadOptions, OptimizerCreateRejectsTest,
    ::testing::ValuesIn(std::vector<BadOptionCase>{
        {"ZeroLearningRate", "learning_rate", [](auto& o) { o.learning_rate = 0.0f; }},
        {"NegativeLearningRate", "learning_rate", [](auto& o) { o.learning_rate = -1.0f; }},
        {"NaNLearningRate", "learning_rate", [](auto& o) { o.learning_rate = kNaN; }},
        {"InfiniteLearningRate", "learning_rate", [](auto& o) { o.learning_rate = kInf; }},
        {"NegativeMomentum", "momentum", [](auto& o) { o.momentum = -0.1f; }},
        {"MomentumOne", "momentum", [](auto& o) { o.momentum = 1.0f; }},
        {"NaNMomentum", "momentum", [](auto& o) { o.momentum = kNaN; }},
        {"NegativeBeta1", "beta1", [](auto& o) { o.beta1 = -0.5f; }},
        {"Beta1One", "beta1", [](auto& o) { o.beta1 = 1.0f; }},
        {"NegativeBeta2", "beta2", [](auto& o) { o.beta2 = -0.5f; }},
        {"Beta2One", "beta2", [](auto& o) { o.beta2 = 1.0f; }},
        {"NegativeEpsilon", "epsilon", [](auto& o) { o.epsilon = -1e-8f; }},
        {"NegativeWeightDecay", "weight_decay", [](auto& o) { o.weight_decay = -0.01f; }},
        {"NegativeInitialAccumulator", "initial_accumulator",
         [](auto& o) { o.initial_accumulator = -0.1f; }},
        {"NegativeL1", "l1", [](auto& o) { o.l1 = -1.0f; }},
        {"NegativeL2", "l2", [](auto& o) { o.l2 = -1.0f; }},
        {"InfiniteL2", "l2", [](auto& o) { o.l2 = kInf; }},
        {"NegativeFtrlBeta", "ftrl_beta", [](auto& o) { o.ftrl_beta = -1.0f; }},
    }),
    [](const ::testing::TestParamInfo<BadOptionCase>& info) { return info.param.name; });

}  // namespace
// lr(t) = lr * rate^((t-1)/steps): with rate 0.5 and steps 2, updates 1..5 use
// lr * {1, 2^-0.5, 0.5, 2^-1.5, 0.25}; checked on SGD, where the step is lr(t) * g.
TEST(LearningRateDecayTest, SgdStepsShrinkExponentiallyWithTheUpdateCount) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kSgd;
  o.learning_rate = 0.8f;
  o.lr_decay_rate = 0.5f;
  o.lr_decay_steps = 2;
  auto opt = Optimizer::Create(o).value();
  for (int64_t t = 1; t <= 5; ++t) {
    float w = 0.0f;
    const float g = 1.0f;
    opt->Apply(&w, &g, nullptr, 1, t);
    const double expected = -0.8 * std::pow(0.5, (t - 1) / 2.0);
    EXPECT_NEAR(w, expected, 1e-6) << "update " << t;
  }
}

// Warmup times decay: lr(t) = lr * min(1, t/3) * rate^((t-1)/steps); updates 1..5 with
// rate 0.5 over 4 steps use lr * {1/3, 2/3 * 2^-0.25, 2^-0.5, 2^-0.75, 0.5}.
TEST(LearningRateDecayTest, WarmupRampsTheDecayedRateLinearly) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kSgd;
  o.learning_rate = 0.9f;
  o.lr_decay_rate = 0.5f;
  o.lr_decay_steps = 4;
  o.lr_warmup_steps = 3;
  auto opt = Optimizer::Create(o).value();
  for (int64_t t = 1; t <= 5; ++t) {
    float w = 0.0f;
    const float g = 1.0f;
    opt->Apply(&w, &g, nullptr, 1, t);
    const double expected = -0.9 * std::min(1.0, t / 3.0) * std::pow(0.5, (t - 1) / 4.0);
    EXPECT_NEAR(w, expected, 1e-6) << "update " << t;
    // What the workers' learning-rate gauge reports is the rate Apply used.
    EXPECT_FLOAT_EQ(ScheduledLearningRate(o, t), -w) << "update " << t;
  }
  o.lr_warmup_steps = -1;
  EXPECT_EQ(Optimizer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LearningRateDecayTest, AdamWDecayUsesTheDecayedRate) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kAdamW;
  o.learning_rate = 0.1f;
  o.weight_decay = 0.5f;
  o.lr_decay_rate = 0.25f;
  o.lr_decay_steps = 1;
  auto opt = Optimizer::Create(o).value();
  float w = 2.0f, g = 0.0f, m = 0.0f, v = 0.0f;
  float* slots[] = {&m, &v};
  opt->Apply(&w, &g, slots, 1, 3);  // lr(3) = 0.1 / 16; zero gradient: only the decay acts
  EXPECT_FLOAT_EQ(w, 2.0f * (1.0f - 0.1f / 16 * 0.5f));
}

TEST(LearningRateDecayTest, RejectsRateOutsideUnitIntervalAndNegativeSteps) {
  OptimizerOptions o;
  for (float rate : {0.0f, -0.5f, 1.5f}) {
    o.lr_decay_rate = rate;
    auto r = Optimizer::Create(o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("lr_decay_rate"));
  }
  o.lr_decay_rate = 0.5f;
  o.lr_decay_steps = -1;
  EXPECT_THAT(std::string(Optimizer::Create(o).status().message()), HasSubstr("lr_decay_steps"));
}

}  // namespace pscluster::core
