#include "worker/model/gpt.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/init/initializer.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace pscluster::model {
namespace {

// A model small enough for finite differences, with every size distinct so that a mixed-up
// dimension shows: 2 blocks, 2 heads of 4, context 5, 11 tokens.
GptOptions Tiny() {
  GptOptions o;
  o.layers = 2;
  o.heads = 2;
  o.width = 8;
  o.context = 5;
  o.vocab = 11;
  return o;
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch RandomBatch(const GptOptions& o, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  for (int i = 0; i < batch * o.context; ++i) {
    b.x.push_back(static_cast<float>(rng() % o.vocab));
    b.y.push_back(static_cast<int32_t>(rng() % o.vocab));
  }
  return b;
}

class GptTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = compute::MakeCpuBackend(1); }

  std::unique_ptr<Model> Make(const GptOptions& o, int max_batch, bool share = false) {
    auto def = MakeGptDef(o, 3);
    EXPECT_TRUE(def.ok()) << def.status();
    spec_ = (*def)->spec();
    InstanceOptions instance = WholeModel(max_batch);
    instance.share_layer_buffers = share;
    auto model = (*def)->Create(backend_.get(), instance);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(*model);
  }

  // The spec's initial values, with LayerNorm gammas and betas and the biases moved off 1
  // and 0 so that every term of the gradient matters.
  std::vector<std::vector<float>> Params() {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> jitter(-0.2f, 0.2f);
    std::vector<std::vector<float>> params;
    for (const TensorSpec& t : spec_.params) {
      params.emplace_back(t.size());
      core::InitDense(t.init, 0, absl::MakeSpan(params.back()));
      if (t.shape.size() == 1) {
        for (float& v : params.back()) v += jitter(rng);
      } else {  // weights at a scale where attention and GELU are far from linear
        for (float& v : params.back()) v *= 10.0f;
      }
    }
    return params;
  }

  static void Load(Model* m, const std::vector<std::vector<float>>& params) {
    for (size_t i = 0; i < params.size(); ++i) m->SetParam(static_cast<int>(i), params[i].data());
  }

  std::unique_ptr<compute::Backend> backend_;
  ModelSpec spec_;
};

TEST_F(GptTest, SpecNamesShapesAndLayers) {
  GptOptions o = Tiny();
  Make(o, 1);
  ASSERT_EQ(spec_.params.size(), 2u + 12 * 2 + 2);
  EXPECT_EQ(spec_.params[0].name, "wte");
  EXPECT_EQ(spec_.params[2 + 12 + 2].name, "h1.attn.qkv.weight");
  EXPECT_EQ(spec_.params[2 + 12 + 2].shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(spec_.params.back().name, "lnf.beta");
  EXPECT_EQ(spec_.num_layers(), 4);  // embedding, 2 blocks, head
  EXPECT_EQ(spec_.layer_params[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(spec_.layer_params[3], (std::vector<int>{26, 27}));
  EXPECT_EQ(spec_.layer_reads[3], (std::vector<int>{0}));  // the head reads wte
  EXPECT_EQ(spec_.input_width, 5);
  EXPECT_EQ(spec_.label_width, 5);
  EXPECT_EQ(spec_.classes, 11);
}

TEST_F(GptTest, RejectsBadSizes) {
  GptOptions o = Tiny();
  o.heads = 3;  // 8 is not divisible by 3
  EXPECT_EQ(MakeGptDef(o, 1).status().code(), absl::StatusCode::kInvalidArgument);
  o = Tiny();
  o.context = 0;
  EXPECT_EQ(MakeGptDef(o, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every gradient against central differences of the loss along a random direction per
// tensor (float32 loss, so the tolerance is relative 2 %).
TEST_F(GptTest, GradientsMatchFiniteDifferences) {
  const GptOptions o = Tiny();
  auto model = Make(o, 3);
  auto params = Params();
  Load(model.get(), params);
  const Batch b = RandomBatch(o, 3, 5);
  auto base = model->ForwardBackward(b.x.data(), b.y.data(), 3);
  ASSERT_TRUE(base.ok()) << base.status();
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> grad(params[i].size());
    model->GetGrad(static_cast<int>(i), grad.data());
    std::vector<double> dir(params[i].size());
    double norm = 0, analytic = 0;
    for (double& v : dir) norm += (v = normal(rng)) * v;
    for (size_t k = 0; k < dir.size(); ++k) analytic += (dir[k] /= std::sqrt(norm)) * grad[k];
    const double eps = 1e-2;
    auto loss_at = [&](double sign) {
      std::vector<float> moved = params[i];
      for (size_t k = 0; k < moved.size(); ++k) moved[k] += static_cast<float>(sign * eps * dir[k]);
      model->SetParam(static_cast<int>(i), moved.data());
      auto r = model->Evaluate(b.x.data(), b.y.data(), 3);
      EXPECT_TRUE(r.ok());
      return static_cast<double>(r->loss);
    };
    const double numeric = (loss_at(1) - loss_at(-1)) / (2 * eps);
    model->SetParam(static_cast<int>(i), params[i].data());
    EXPECT_NEAR(analytic, numeric, 1e-3 + 0.02 * std::abs(numeric)) << spec_.params[i].name;
  }
}

TEST_F(GptTest, EvaluateMatchesTheTrainingLossAndCountsTokens) {
  const GptOptions o = Tiny();
  auto model = Make(o, 2);  // Evaluate runs 3 examples in chunks of 2
  Load(model.get(), Params());
  const Batch b = RandomBatch(o, 3, 7);
  auto eval = model->Evaluate(b.x.data(), b.y.data(), 3);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(eval->examples, 15);
  double total = 0;
  for (int e = 0; e < 3; ++e) {
    auto r = model->ForwardBackward(b.x.data() + e * 5, b.y.data() + e * 5, 1);
    ASSERT_TRUE(r.ok());
    total += r->loss;
  }
  EXPECT_NEAR(eval->loss, total / 3, 1e-5);
}

TEST_F(GptTest, SharedLayerBuffersGiveTheSameGradients) {
  const GptOptions o = Tiny();
  auto whole = Make(o, 2);
  auto shared = Make(o, 2, /*share=*/true);
  const auto params = Params();
  Load(whole.get(), params);
  const Batch b = RandomBatch(o, 2, 13);
  auto r = whole->ForwardBackward(b.x.data(), b.y.data(), 2);
  ASSERT_TRUE(r.ok());
  // FSDP's protocol: load a layer's tensors before it runs, read its gradient after.
  std::vector<std::vector<float>> grads(params.size());
  LayerHooks hooks;
  hooks.before = [&](int layer, bool) {
    for (int i : spec_.layer_params[layer]) shared->SetParam(i, params[i].data());
    return absl::OkStatus();
  };
  hooks.after_backward = [&](int layer) {
    for (int i : spec_.layer_params[layer]) {
      grads[i].resize(params[i].size());
      shared->GetGrad(i, grads[i].data());
    }
    return absl::OkStatus();
  };
  auto s = shared->ForwardBackward(b.x.data(), b.y.data(), 2, &hooks);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(r->loss, s->loss);
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> expected(params[i].size());
    whole->GetGrad(static_cast<int>(i), expected.data());
    EXPECT_EQ(expected, grads[i]) << spec_.params[i].name;
  }
}

TEST_F(GptTest, BadTokensAndLabelsAreRefused) {
  const GptOptions o = Tiny();
  auto model = Make(o, 1);
  Batch b = RandomBatch(o, 1, 3);
  b.x[2] = 11;  // == vocab
  auto r = model->ForwardBackward(b.x.data(), b.y.data(), 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("position 2"), std::string::npos) << r.status();
  b.x[2] = 1.5f;
  EXPECT_EQ(model->ForwardBackward(b.x.data(), b.y.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  b.x[2] = NAN;
  EXPECT_EQ(model->ForwardBackward(b.x.data(), b.y.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  b.x[2] = 1;
  b.y[4] = -1;
  EXPECT_EQ(model->Evaluate(b.x.data(), b.y.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->ForwardBackward(b.x.data(), b.y.data(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // over max_batch
}

// Two stages (embedding + block 0 | block 1 + head) over two micro-batches, each scaled by
// 1/2: the same loss and gradients as the whole model on the whole batch, wte's being the
// sum of the two stages' copies.
TEST_F(GptTest, PipelineStagesComposeToTheWholeModel) {
  const GptOptions o = Tiny();
  auto whole = Make(o, 4);
  auto def = MakeGptDef(o, 3);
  ASSERT_TRUE(def.ok());
  InstanceOptions first = WholeModel(2), second = WholeModel(2);
  first.end_layer = 2;
  second.first_layer = 2;
  first.slots = second.slots = 2;
  auto a = (*def)->Create(backend_.get(), first);
  auto b = (*def)->Create(backend_.get(), second);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const auto params = Params();
  Load(whole.get(), params);
  for (Model* stage : {a->get(), b->get()}) {
    for (size_t i = 0; i < stage->params().size(); ++i) {
      stage->SetParam(static_cast<int>(i), params[stage->params()[i].index].data());
    }
    stage->ZeroGrads();
  }
  EXPECT_TRUE((*a)->first_stage() && !(*a)->last_stage());
  EXPECT_EQ((*b)->params().front().name, "wte");  // the head's copy of the tied embedding
  const Batch batch = RandomBatch(o, 4, 21);
  auto want = whole->ForwardBackward(batch.x.data(), batch.y.data(), 4);
  ASSERT_TRUE(want.ok());
  const size_t acts = 2 * o.context * o.width;  // one micro-batch between the stages
  std::vector<float> out(2 * acts), dx(acts);
  double loss = 0;
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(
        (*a)->StageForward(m, batch.x.data() + m * 2 * o.context, 2, out.data() + m * acts).ok());
    ASSERT_TRUE((*b)->StageForward(m, out.data() + m * acts, 2, nullptr).ok());
  }
  for (int m = 0; m < 2; ++m) {
    auto r =
        (*b)->StageBackward(m, batch.y.data() + m * 2 * o.context, nullptr, 2, 0.5f, dx.data());
    ASSERT_TRUE(r.ok()) << r.status();
    loss += r->loss / 2;
    ASSERT_TRUE((*a)->StageBackward(m, nullptr, dx.data(), 2, 0.5f, nullptr).ok());
  }
  EXPECT_NEAR(loss, want->loss, 1e-6);
  std::vector<std::vector<float>> got(params.size());
  for (Model* stage : {a->get(), b->get()}) {
    for (size_t i = 0; i < stage->params().size(); ++i) {
      std::vector<float> g(stage->params()[i].size);
      stage->GetGrad(static_cast<int>(i), g.data());
      std::vector<float>& sum = got[stage->params()[i].index];
      sum.resize(g.size());
      for (size_t k = 0; k < g.size(); ++k) sum[k] += g[k];
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> expected(params[i].size());
    whole->GetGrad(static_cast<int>(i), expected.data());
    ASSERT_EQ(got[i].size(), expected.size()) << spec_.params[i].name;
    for (size_t k = 0; k < expected.size(); ++k) {
      ASSERT_NEAR(got[i][k], expected[k], 1e-5 + 1e-4 * std::abs(expected[k]))
          << spec_.params[i].name << " element " << k;
    }
  }
}

}  // namespace
}  // namespace pscluster::model
