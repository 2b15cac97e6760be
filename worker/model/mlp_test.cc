#include "worker/model/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace pscluster::model {
namespace {

#define MLP_CONCAT_INNER(a, b) a##b
#define MLP_CONCAT(a, b) MLP_CONCAT_INNER(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                                      \
  auto MLP_CONCAT(result_, __LINE__) = (expr);                                               \
  ASSERT_TRUE(MLP_CONCAT(result_, __LINE__).ok()) << MLP_CONCAT(result_, __LINE__).status(); \
  lhs = std::move(MLP_CONCAT(result_, __LINE__)).value()

using Params = std::vector<std::vector<double>>;

// The MLP's mean loss and correct count in double, written out naively: the reference
// the backend-based model is checked against.
struct Reference {
  double loss = 0;
  int correct = 0;
};

Reference ReferenceForward(const std::vector<int>& layers, const Params& params,
                           const std::vector<float>& x, const std::vector<int32_t>& y) {
  const int batch = static_cast<int>(y.size());
  Reference result;
  for (int e = 0; e < batch; ++e) {
    std::vector<double> a(x.begin() + e * layers[0], x.begin() + (e + 1) * layers[0]);
    for (size_t i = 0; i + 1 < layers.size(); ++i) {
      const int in = layers[i], out = layers[i + 1];
      const std::vector<double>& w = params[2 * i];
      std::vector<double> z(params[2 * i + 1]);  // bias
      for (int o = 0; o < out; ++o) {
        for (int j = 0; j < in; ++j) z[o] += a[j] * w[j * out + o];
      }
      if (i + 2 < layers.size()) {
        for (double& v : z) v = std::max(v, 0.0);
      }
      a = std::move(z);
    }
    const int argmax = static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin());
    const double max = a[argmax];
    double sum = 0;
    for (double v : a) sum += std::exp(v - max);
    result.loss += std::log(sum) + max - a[y[e]];
    result.correct += argmax == y[e];
  }
  result.loss /= batch;
  return result;
}

Params ToDouble(const std::vector<std::vector<float>>& params) {
  Params out;
  for (const auto& p : params) out.emplace_back(p.begin(), p.end());
  return out;
}

class MlpTest : public ::testing::Test {
 protected:
  // Glorot weights with random (non-zero) biases, so every term of the forward matters.
  std::vector<std::vector<float>> RandomParams(const MlpOptions& options) {
    std::vector<std::vector<float>> params = Mlp::InitialParams(options, 42);
    std::uniform_real_distribution<float> dist(-0.3f, 0.3f);
    for (size_t i = 1; i < params.size(); i += 2) {
      for (float& b : params[i]) b = dist(rng_);
    }
    return params;
  }

  std::vector<float> RandomInputs(size_t n) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng_);
    return x;
  }

  std::vector<int32_t> RandomLabels(size_t n, int classes) {
    std::uniform_int_distribution<int32_t> dist(0, classes - 1);
    std::vector<int32_t> y(n);
    for (int32_t& v : y) v = dist(rng_);
    return y;
  }

  std::unique_ptr<Mlp> MakeMlp(const MlpOptions& options, int max_batch,
                               const std::vector<std::vector<float>>& params) {
    auto mlp = Mlp::Create(backend_.get(), options, max_batch);
    EXPECT_TRUE(mlp.ok()) << mlp.status();
    for (size_t i = 0; i < params.size(); ++i) (*mlp)->SetParam(i, params[i].data());
    return std::move(mlp).value();
  }

  // A batch of 5 for `options`, the model with its own buffers (the reference) after a step
  // on it, and the same model with shared layer buffers, loaded with nothing yet.
  struct SharedBuffersCase {
    std::vector<std::vector<float>> params;
    std::vector<float> x;
    std::vector<int32_t> y;
    std::unique_ptr<Mlp> reference;
    StepResult ref;
    std::unique_ptr<Mlp> shared;
  };
  SharedBuffersCase MakeSharedBuffersCase(MlpOptions options) {
    SharedBuffersCase c;
    c.params = RandomParams(options);
    c.x = RandomInputs(5 * options.layers.front());
    c.y = RandomLabels(5, options.layers.back());
    c.reference = MakeMlp(options, 5, c.params);
    absl::StatusOr<StepResult> ref = c.reference->ForwardBackward(c.x.data(), c.y.data(), 5);
    EXPECT_TRUE(ref.ok()) << ref.status();
    c.ref = ref.value_or(StepResult{});
    options.share_layer_buffers = true;
    c.shared = MakeMlp(options, 5, {});
    return c;
  }

  std::unique_ptr<compute::Backend> backend_ = compute::MakeCpuBackend(1);
  std::mt19937_64 rng_{1234};
};

TEST_F(MlpTest, ParamsAreNamedAndSizedWeightThenBiasPerLayer) {
  auto mlp = Mlp::Create(backend_.get(), MlpOptions{{5, 7, 4, 3}}, 2);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const std::vector<Mlp::Param>& p = (*mlp)->params();
  ASSERT_EQ(p.size(), 6u);
  const char* names[] = {"fc0.weight", "fc0.bias",   "fc1.weight",
                         "fc1.bias",   "fc2.weight", "fc2.bias"};
  const size_t sizes[] = {35, 7, 28, 4, 12, 3};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(p[i].name, names[i]);
    EXPECT_EQ(p[i].size, sizes[i]);
  }
}

TEST_F(MlpTest, InitialParamsAreDeterministicGlorotUniformWithZeroBiases) {
  const MlpOptions options{{30, 20, 10}};
  const auto params = Mlp::InitialParams(options, 7);
  EXPECT_EQ(params, Mlp::InitialParams(options, 7));
  EXPECT_NE(params, Mlp::InitialParams(options, 8));
  ASSERT_EQ(params.size(), 4u);
  for (int i = 0; i < 2; ++i) {
    const int in = options.layers[i], out = options.layers[i + 1];
    const float limit = std::sqrt(6.0f / (in + out));
    ASSERT_EQ(params[2 * i].size(), static_cast<size_t>(in * out));
    double sum = 0;
    float max_abs = 0;
    for (float w : params[2 * i]) {
      EXPECT_LE(std::abs(w), limit);
      sum += w;
      max_abs = std::max(max_abs, std::abs(w));
    }
    EXPECT_NEAR(sum / (in * out), 0.0, 0.1 * limit);
    EXPECT_GT(max_abs, 0.9f * limit);
    EXPECT_EQ(params[2 * i + 1], std::vector<float>(out, 0.0f));
  }
}

TEST_F(MlpTest, GetParamReturnsWhatSetParamUploaded) {
  const MlpOptions options{{5, 7, 3}};
  const auto params = RandomParams(options);
  auto mlp = MakeMlp(options, 4, params);
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> got(params[i].size());
    mlp->GetParam(i, got.data());
    EXPECT_EQ(got, params[i]) << mlp->params()[i].name;
  }
}

TEST_F(MlpTest, ForwardBackwardLossAndCorrectMatchNaiveReference) {
  const MlpOptions options{{5, 7, 4, 3}};
  const auto params = RandomParams(options);
  auto mlp = MakeMlp(options, 6, params);
  const std::vector<float> x = RandomInputs(6 * 5);
  const std::vector<int32_t> y = RandomLabels(6, 3);
  auto result = mlp->ForwardBackward(x.data(), y.data(), 6);
  ASSERT_TRUE(result.ok()) << result.status();
  const Reference want = ReferenceForward(options.layers, ToDouble(params), x, y);
  EXPECT_NEAR(result->loss, want.loss, 1e-5 * (1 + want.loss));
  EXPECT_EQ(result->correct, want.correct);
  EXPECT_EQ(result->examples, 6);
}

TEST_F(MlpTest, GradientOfEveryParameterMatchesCentralFiniteDifferences) {
  const MlpOptions options{{5, 7, 4, 3}};
  const auto params = RandomParams(options);
  auto mlp = MakeMlp(options, 6, params);
  const std::vector<float> x = RandomInputs(6 * 5);
  const std::vector<int32_t> y = RandomLabels(6, 3);
  ASSERT_TRUE(mlp->ForwardBackward(x.data(), y.data(), 6).ok());

  Params reference = ToDouble(params);
  const double eps = 1e-6;
  int checked = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    std::vector<float> grad(params[p].size());
    mlp->GetGrad(p, grad.data());
    for (size_t j = 0; j < grad.size(); ++j) {
      const double saved = reference[p][j];
      reference[p][j] = saved + eps;
      const double up = ReferenceForward(options.layers, reference, x, y).loss;
      reference[p][j] = saved - eps;
      const double down = ReferenceForward(options.layers, reference, x, y).loss;
      reference[p][j] = saved;
      const double want = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[j], want, 1e-5 + 1e-4 * std::abs(want))
          << mlp->params()[p].name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 35 + 7 + 28 + 4 + 12 + 3);
}

TEST_F(MlpTest, SmallerBatchAfterFullBatchGivesSameGradientsAsFreshModel) {
  const MlpOptions options{{5, 7, 4, 3}};
  const auto params = RandomParams(options);
  auto used = MakeMlp(options, 6, params);
  auto fresh = MakeMlp(options, 6, params);
  const std::vector<float> x = RandomInputs(6 * 5);
  const std::vector<int32_t> y = RandomLabels(6, 3);
  ASSERT_TRUE(used->ForwardBackward(x.data(), y.data(), 6).ok());
  auto a = used->ForwardBackward(x.data() + 5, y.data() + 1, 2);
  auto b = fresh->ForwardBackward(x.data() + 5, y.data() + 1, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);
  for (size_t p = 0; p < params.size(); ++p) {
    std::vector<float> ga(params[p].size()), gb(params[p].size());
    used->GetGrad(p, ga.data());
    fresh->GetGrad(p, gb.data());
    EXPECT_EQ(ga, gb) << used->params()[p].name;
  }
}

TEST_F(MlpTest, EvaluateCoversAllExamplesInChunksAndMatchesReference) {
  const MlpOptions options{{5, 7, 4, 3}};
  const auto params = RandomParams(options);
  auto mlp = MakeMlp(options, 6, params);
  const int count = 17;  // two full chunks and a partial one
  const std::vector<float> x = RandomInputs(count * 5);
  const std::vector<int32_t> y = RandomLabels(count, 3);
  auto result = mlp->Evaluate(x.data(), y.data(), count);
  ASSERT_TRUE(result.ok()) << result.status();
  const Reference want = ReferenceForward(options.layers, ToDouble(params), x, y);
  EXPECT_NEAR(result->loss, want.loss, 1e-5 * (1 + want.loss));
  EXPECT_EQ(result->correct, want.correct);
  EXPECT_EQ(result->examples, count);

  auto empty = mlp->Evaluate(x.data(), y.data(), 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->examples, 0);
  EXPECT_EQ(empty->loss, 0.0f);
}

TEST_F(MlpTest, PlainSgdSeparatesGaussianBlobs) {
  constexpr int kDim = 20, kClasses = 4, kExamples = 512, kBatch = 32, kSteps = 300;
  constexpr float kLearningRate = 0.1f;
  // Four blobs: centres drawn from N(0, 1) per coordinate, unit-variance noise around them.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres(kClasses * kDim);
  for (float& c : centres) c = normal(rng_);
  std::vector<float> x(kExamples * kDim);
  std::vector<int32_t> y(kExamples);
  for (int e = 0; e < kExamples; ++e) {
    y[e] = e % kClasses;
    for (int d = 0; d < kDim; ++d) x[e * kDim + d] = centres[y[e] * kDim + d] + normal(rng_);
  }

  const MlpOptions options{{kDim, 32, kClasses}};
  std::vector<std::vector<float>> params = Mlp::InitialParams(options, 99);
  auto mlp = MakeMlp(options, kBatch, params);
  auto before = mlp->Evaluate(x.data(), y.data(), kExamples);
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<float> grad;
  for (int step = 0; step < kSteps; ++step) {
    const int start = (step * kBatch) % kExamples;
    ASSERT_TRUE(mlp->ForwardBackward(x.data() + start * kDim, y.data() + start, kBatch).ok());
    for (size_t p = 0; p < params.size(); ++p) {
      grad.resize(params[p].size());
      mlp->GetGrad(p, grad.data());
      for (size_t j = 0; j < grad.size(); ++j) params[p][j] -= kLearningRate * grad[j];
      mlp->SetParam(p, params[p].data());
    }
  }

  auto after = mlp->Evaluate(x.data(), y.data(), kExamples);
  ASSERT_TRUE(after.ok()) << after.status();
  std::printf("SGD on blobs: loss %.4f -> %.4f, accuracy %d -> %d of %d\n", before->loss,
              after->loss, before->correct, after->correct, kExamples);
  EXPECT_LT(after->loss, 0.2f * before->loss) << "loss " << before->loss << " -> " << after->loss;
  EXPECT_GT(static_cast<double>(after->correct) / kExamples, 0.9)
      << "accuracy " << before->correct << " -> " << after->correct << " of " << kExamples;
}

TEST_F(MlpTest, CreateRejectsTooFewLayersNonPositiveSizesAndMaxBatch) {
  EXPECT_EQ(Mlp::Create(backend_.get(), MlpOptions{{5}}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create(backend_.get(), MlpOptions{{}}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create(backend_.get(), MlpOptions{{5, 0, 3}}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create(backend_.get(), MlpOptions{{5, 3, -1}}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create(backend_.get(), MlpOptions{{5, 3}}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create(nullptr, MlpOptions{{5, 3}}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mlp::Create(backend_.get(), MlpOptions{{1, 1}}, 1).ok());
}

TEST_F(MlpTest, ForwardBackwardAndEvaluateRejectBadBatchesAndLabels) {
  const MlpOptions options{{5, 4, 3}};
  auto mlp = MakeMlp(options, 4, RandomParams(options));
  const std::vector<float> x = RandomInputs(5 * 5);
  std::vector<int32_t> y = {0, 1, 2, 0, 1};
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp->Evaluate(x.data(), y.data(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  y[2] = 3;
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mlp->Evaluate(x.data(), y.data(), 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  y[2] = -1;
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(mlp->ForwardBackward(x.data(), y.data(), 2).ok());
}

TEST_F(MlpTest, TwoStagesOverMicroBatchesGiveTheWholeBatchGradients) {
  const MlpOptions whole{{6, 5, 4, 3, 3}};
  const std::vector<std::vector<float>> params = RandomParams(whole);
  const int batch = 8, micro = 4, micro_batches = batch / micro;
  const std::vector<float> x = RandomInputs(batch * 6);
  const std::vector<int32_t> y = RandomLabels(batch, 3);
  auto reference = MakeMlp(whole, batch, params);
  ASSERT_OK_AND_ASSIGN(StepResult ref, reference->ForwardBackward(x.data(), y.data(), batch));

  MlpOptions first = whole, second = whole;
  first.end_layer = 2;
  second.first_layer = 2;
  first.slots = second.slots = micro_batches;
  auto a = MakeMlp(first, micro, {params.begin(), params.begin() + 4});
  auto b = MakeMlp(second, micro, {params.begin() + 4, params.end()});
  ASSERT_EQ(a->params().size(), 4u);
  EXPECT_EQ(b->params()[0].name, "fc2.weight");
  EXPECT_TRUE(a->first_stage() && !a->last_stage() && b->last_stage() && !b->first_stage());
  a->ZeroGrads();
  b->ZeroGrads();
  std::vector<float> act(micro * 4), dact(micro * 4);
  double loss = 0;
  for (int m = 0; m < micro_batches; ++m) {  // all forwards, then all backwards (GPipe order)
    ASSERT_TRUE(a->StageForward(m, x.data() + m * micro * 6, micro, act.data()).ok());
    ASSERT_TRUE(b->StageForward(m, act.data(), micro, nullptr).ok());
  }
  for (int m = micro_batches - 1; m >= 0; --m) {
    ASSERT_OK_AND_ASSIGN(StepResult r, b->StageBackward(m, y.data() + m * micro, nullptr, micro,
                                                        1.0f / micro_batches, dact.data()));
    loss += r.loss / micro_batches;
    ASSERT_TRUE(a->StageBackward(m, nullptr, dact.data(), micro, 1.0f / micro_batches, nullptr)
                    .status()
                    .ok());
  }
  EXPECT_NEAR(loss, ref.loss, 1e-5);
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> want(params[i].size()), got(params[i].size());
    reference->GetGrad(i, want.data());
    (i < 4 ? a.get() : b.get())->GetGrad(i % 4, got.data());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_NEAR(got[k], want[k], 1e-5f * (1 + std::fabs(want[k])))
          << "param " << i << " [" << k << "]";
    }
  }
}

// Hooks for a model with shared layer buffers: `before` loads layer l's weight and bias
// (params 2l and 2l + 1) and records each call in `calls`.
LayerHooks LoadingHooks(Mlp* shared, const std::vector<std::vector<float>>& params,
                        std::vector<std::pair<int, bool>>* calls) {
  LayerHooks hooks;
  hooks.before = [shared, &params, calls](int layer, bool backward) {
    calls->emplace_back(layer, backward);
    shared->SetParam(2 * layer, params[2 * layer].data());
    shared->SetParam(2 * layer + 1, params[2 * layer + 1].data());
    return absl::OkStatus();
  };
  return hooks;
}

TEST_F(MlpTest, SharedLayerBuffersWithHooksGiveBitwiseTheSameGradients) {
  const SharedBuffersCase c = MakeSharedBuffersCase({{7, 6, 5, 3}});
  EXPECT_EQ(c.shared->ForwardBackward(c.x.data(), c.y.data(), 5).status().code(),
            absl::StatusCode::kFailedPrecondition);  // needs hooks
  std::vector<std::vector<float>> grads(c.params.size());
  std::vector<std::pair<int, bool>> calls;
  LayerHooks hooks = LoadingHooks(c.shared.get(), c.params, &calls);
  hooks.after_backward = [&](int layer) {
    for (int k : {2 * layer, 2 * layer + 1}) {
      grads[k].resize(c.params[k].size());
      c.shared->GetGrad(k, grads[k].data());
    }
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(StepResult r, c.shared->ForwardBackward(c.x.data(), c.y.data(), 5, &hooks));
  EXPECT_EQ(r.loss, c.ref.loss);
  // No load for the first layer's backward: without an input gradient it reads no parameter
  // (the loaded buffer holds layer 1's then, and the gradients are still the reference's).
  EXPECT_EQ(calls, (std::vector<std::pair<int, bool>>{
                       {0, false}, {1, false}, {2, false}, {2, true}, {1, true}}));
  for (size_t i = 0; i < c.params.size(); ++i) {
    std::vector<float> want(c.params[i].size());
    c.reference->GetGrad(i, want.data());
    EXPECT_EQ(grads[i], want) << "param " << i;
  }
  hooks.before = [](int layer, bool) {
    return absl::UnavailableError(absl::StrCat("gather of layer ", layer, " failed"));
  };
  EXPECT_EQ(c.shared->ForwardBackward(c.x.data(), c.y.data(), 5, &hooks).status().message(),
            "gather of layer 0 failed");
}

// With an input gradient the first layer's backward reads W, and asks for it.
TEST_F(MlpTest, SharedLayerBuffersLoadTheFirstLayerForAnInputGradient) {
  MlpOptions options{{7, 6, 3}};
  options.input_gradient = true;
  const SharedBuffersCase c = MakeSharedBuffersCase(options);
  std::vector<std::pair<int, bool>> calls;
  LayerHooks hooks = LoadingHooks(c.shared.get(), c.params, &calls);
  ASSERT_OK_AND_ASSIGN(StepResult r, c.shared->ForwardBackward(c.x.data(), c.y.data(), 5, &hooks));
  EXPECT_EQ(r.loss, c.ref.loss);
  EXPECT_EQ(calls,
            (std::vector<std::pair<int, bool>>{{0, false}, {1, false}, {1, true}, {0, true}}));
  std::vector<float> want(5 * 7), got(5 * 7);
  c.reference->GetInputGrad(want.data(), 5);
  c.shared->GetInputGrad(got.data(), 5);
  EXPECT_EQ(got, want);
}

TEST_F(MlpTest, StageRangeAndSlotsAreValidated) {
  MlpOptions options{{5, 4, 3}};
  options.first_layer = 2;
  EXPECT_EQ(Mlp::Create(backend_.get(), options, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.first_layer = 1;
  options.slots = 0;
  EXPECT_EQ(Mlp::Create(backend_.get(), options, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.slots = 2;
  ASSERT_OK_AND_ASSIGN(auto stage, Mlp::Create(backend_.get(), options, 4));
  std::vector<float> x(4 * 4);
  EXPECT_EQ(stage->StageForward(2, x.data(), 4, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> y(4);
  EXPECT_EQ(stage->ForwardBackward(x.data(), y.data(), 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stage->Evaluate(x.data(), y.data(), 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pscluster::model
