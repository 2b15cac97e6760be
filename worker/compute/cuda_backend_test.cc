// The CUDA backend against the CPU backend: every primitive on odd sizes, then one MLP
// training step of the default model. Every test skips, printing why, where
// MakeCudaBackend fails (a build without --config=cuda, no driver, no GPU).
//
// Tolerances (GPU result vs CPU result, or vs a double reference where stated):
//   Gemm                 |gpu - cpu| <= 1e-4 * (1 + |cpu|)
//   AddRowVector, Relu,
//   ReluBackward         bit-identical (one float operation per element, or none)
//   ColumnSums           |gpu - exact| <= 1e-5 * (sum of |x| in the column) + 1e-6
//   SoftmaxCrossEntropy  loss within 1e-5 relative, gradient within 1e-6 absolute,
//                        correct count equal
//   Gpt ForwardBackward  as Mlp's, and bit-identical run to run
//   Mlp ForwardBackward  loss within 1e-4 * (1 + loss), correct count equal, each
//                        gradient tensor within 1e-3 of its largest CPU magnitude
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp.h"

namespace pscluster::compute {

#ifdef PSCLUSTER_CUDA_BACKEND
// Defined in cuda_backend.cu (no header yet): the first error the backend met.
absl::Status CudaBackendStatus(const Backend& backend);
#endif

namespace {

using Buffer = BackendBuffer;

std::vector<float> RandomVector(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Expects |got[i] - want[i]| <= tolerance(i) everywhere; reports the count and the first
// few offenders rather than one failure per element.
template <typename Tolerance>
void ExpectAllNear(const std::vector<float>& got, const std::vector<float>& want,
                   Tolerance tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= tolerance(i))) {  // NaN fails too
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                      << " (tolerance " << tolerance(i) << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

// Makes the CUDA backend or skips the test, printing why; then checks after each test
// that the backend recorded no error.
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = MakeCudaBackend(0);
    if (!made.ok()) {
      std::printf("SKIPPED (no GPU): %s\n", made.status().ToString().c_str());
      GTEST_SKIP() << made.status();
    }
    gpu_ = *std::move(made);
    cpu_ = MakeCpuBackend(1);
  }

  void TearDown() override {
#ifdef PSCLUSTER_CUDA_BACKEND
    if (gpu_ != nullptr) {
      EXPECT_TRUE(CudaBackendStatus(*gpu_).ok()) << CudaBackendStatus(*gpu_);
    }
#endif
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937_64 rng_{20240611};
};

TEST_F(CudaBackendTest, AllocReturnsZeroedDistinctMemoryAndRoundTripsData) {
  EXPECT_EQ(gpu_->name(), "cuda");
  {
    Buffer zeros(gpu_.get(), 100003);
    for (float x : zeros.ToHost()) ASSERT_EQ(x, 0.0f);
  }
  float* empty1 = gpu_->Alloc(0);
  float* empty2 = gpu_->Alloc(0);
  EXPECT_NE(empty1, nullptr);
  EXPECT_NE(empty1, empty2);
  gpu_->Free(empty1);
  gpu_->Free(empty2);
  gpu_->Free(nullptr);

  const std::vector<float> data = RandomVector(100003, rng_, 1e3f);
  Buffer buffer(gpu_.get(), data);
  EXPECT_TRUE(SameBits(buffer.ToHost(), data));
}

TEST_F(CudaBackendTest, GemmMatchesCpuForAllTransposesAlphaBetaAndOddSizes) {
  struct Shape {
    int m, n, k;
  };
  std::vector<Shape> shapes;
  for (int m : {1, 7, 33}) {
    for (int n : {1, 7, 33}) {
      for (int k : {1, 7, 33}) shapes.push_back({m, n, k});
    }
  }
  shapes.push_back({129, 65, 257});
  shapes.push_back({64, 10, 784});
  const float alpha = 0.75f, beta = -0.5f;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "trans_a=" << trans_a << " trans_b=" << trans_b
                                          << " m=" << s.m << " n=" << s.n << " k=" << s.k);
        const std::vector<float> a = RandomVector(static_cast<size_t>(s.m) * s.k, rng_);
        const std::vector<float> b = RandomVector(static_cast<size_t>(s.k) * s.n, rng_);
        const std::vector<float> c0 = RandomVector(static_cast<size_t>(s.m) * s.n, rng_);
        std::vector<float> results[2];
        Backend* backends[2] = {cpu_.get(), gpu_.get()};
        for (int i = 0; i < 2; ++i) {
          Buffer da(backends[i], a), db(backends[i], b), dc(backends[i], c0);
          backends[i]->Gemm(trans_a, trans_b, s.m, s.n, s.k, alpha, da.get(), db.get(), beta,
                            dc.get());
          results[i] = dc.ToHost();
        }
        const std::vector<float>& want = results[0];
        ExpectAllNear(
            results[1], want, [&](size_t i) { return 1e-4 * (1 + std::abs(want[i])); }, "c");
      }
    }
  }
}

TEST_F(CudaBackendTest, GemmWithZeroBetaOverwritesNanAndEmptyInnerDimensionScalesByBeta) {
  const int m = 3, n = 5, k = 4;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a = RandomVector(m * k, rng_), b = RandomVector(k * n, rng_);
  Buffer da(gpu_.get(), a), db(gpu_.get(), b);
  Buffer dc(gpu_.get(), std::vector<float>(m * n, nan));
  gpu_->Gemm(false, false, m, n, k, 1.0f, da.get(), db.get(), 0.0f, dc.get());
  for (float x : dc.ToHost()) EXPECT_FALSE(std::isnan(x));

  Buffer scaled(gpu_.get(), std::vector<float>{1, 2, 3, 4, 5, 6});
  gpu_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 2.0f, scaled.get());
  EXPECT_EQ(scaled.ToHost(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  gpu_->Gemm(true, true, 2, 3, 0, 1.0f, nullptr, nullptr, 1.0f, scaled.get());
  EXPECT_EQ(scaled.ToHost(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  Buffer zeroed(gpu_.get(), std::vector<float>(6, nan));
  gpu_->Gemm(false, true, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, zeroed.get());
  EXPECT_EQ(zeroed.ToHost(), std::vector<float>(6, 0.0f));
}

TEST_F(CudaBackendTest, AddRowVectorMatchesCpuExactly) {
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {37, 19}, {301, 257}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const std::vector<float> y = RandomVector(static_cast<size_t>(rows) * cols, rng_);
    const std::vector<float> bias = RandomVector(cols, rng_);
    std::vector<float> results[2];
    Backend* backends[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) {
      Buffer dy(backends[i], y), dbias(backends[i], bias);
      backends[i]->AddRowVector(dy.get(), dbias.get(), rows, cols);
      results[i] = dy.ToHost();
    }
    EXPECT_TRUE(SameBits(results[1], results[0]));
  }
}

TEST_F(CudaBackendTest, ColumnSumsOverwritesOutputAndMatchesExactSumsDeterministically) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<int, int>>{{1, 1}, {3, 3}, {64, 10}, {1001, 37}, {13, 1025}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const std::vector<float> x = RandomVector(static_cast<size_t>(rows) * cols, rng_);
    std::vector<float> exact(cols);
    std::vector<double> abs_sum(cols);
    for (int c = 0; c < cols; ++c) {
      double sum = 0;
      for (int r = 0; r < rows; ++r) {
        sum += x[static_cast<size_t>(r) * cols + c];
        abs_sum[c] += std::abs(x[static_cast<size_t>(r) * cols + c]);
      }
      exact[c] = static_cast<float>(sum);
    }
    Buffer dx(gpu_.get(), x), out(gpu_.get(), std::vector<float>(cols, 100.0f));
    gpu_->ColumnSums(dx.get(), rows, cols, out.get());
    const std::vector<float> first = out.ToHost();
    ExpectAllNear(
        first, exact, [&](size_t c) { return 1e-5 * abs_sum[c] + 1e-6; }, "column sums");
    gpu_->ColumnSums(dx.get(), rows, cols, out.get());
    EXPECT_TRUE(SameBits(out.ToHost(), first)) << "not deterministic";
  }
  Buffer out(gpu_.get(), std::vector<float>(5, 100.0f));
  gpu_->ColumnSums(nullptr, 0, 5, out.get());
  EXPECT_EQ(out.ToHost(), std::vector<float>(5, 0.0f));
}

TEST_F(CudaBackendTest, ReluAndReluBackwardMatchCpuExactlyOutOfPlaceAndInPlace) {
  std::vector<float> x = RandomVector(100003, rng_);
  const std::vector<float> special = {-2, -0.0f, 0, 0.5f, 3, -1e-30f, 1e-30f, 7};
  std::copy(special.begin(), special.end(), x.begin());
  const std::vector<float> dy = RandomVector(x.size(), rng_);
  std::vector<float> relu[2], relu_in_place[2], back[2], back_in_place[2];
  Backend* backends[2] = {cpu_.get(), gpu_.get()};
  for (int i = 0; i < 2; ++i) {
    Backend* be = backends[i];
    Buffer dx(be, x), y(be, x.size()), ddy(be, dy), ddx(be, x.size());
    be->Relu(dx.get(), y.get(), x.size());
    relu[i] = y.ToHost();
    be->ReluBackward(y.get(), ddy.get(), ddx.get(), x.size());
    back[i] = ddx.ToHost();
    be->ReluBackward(y.get(), ddy.get(), ddy.get(), x.size());
    back_in_place[i] = ddy.ToHost();
    be->Relu(dx.get(), dx.get(), x.size());
    relu_in_place[i] = dx.ToHost();
  }
  EXPECT_TRUE(SameBits(relu[1], relu[0]));
  EXPECT_TRUE(SameBits(relu_in_place[1], relu[0]));
  EXPECT_TRUE(SameBits(back[1], back[0]));
  EXPECT_TRUE(SameBits(back_in_place[1], back[0]));
  for (float v : relu[1]) ASSERT_GE(v, 0.0f);
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesCpuLossGradientAndCorrectCount) {
  // cols 10 (the model's), 37 (one lane covers two columns), 100 (several) and 1.
  for (const auto& [rows, cols] :
       std::vector<std::pair<int, int>>{{1, 1}, {9, 7}, {67, 10}, {33, 37}, {5, 100}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const std::vector<float> logits = RandomVector(static_cast<size_t>(rows) * cols, rng_, 4.0f);
    std::vector<int32_t> labels(rows);
    for (int r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>(rng_() % cols);
    float loss[2];
    int correct[2];
    std::vector<float> grad[2];
    Backend* backends[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) {
      Buffer dz(backends[i], logits), dgrad(backends[i], logits.size());
      loss[i] = backends[i]->SoftmaxCrossEntropy(dz.get(), labels.data(), rows, cols, dgrad.get(),
                                                 &correct[i]);
      grad[i] = dgrad.ToHost();
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * (1 + std::abs(loss[0])));
    EXPECT_EQ(correct[1], correct[0]);
    ExpectAllNear(
        grad[1], grad[0], [](size_t) { return 1e-6; }, "dlogits");

    // In place (dlogits == logits), without the count, and without the gradient.
    Buffer dz(gpu_.get(), logits);
    const float in_place =
        gpu_->SoftmaxCrossEntropy(dz.get(), labels.data(), rows, cols, dz.get(), nullptr);
    EXPECT_EQ(in_place, loss[1]);
    EXPECT_TRUE(SameBits(dz.ToHost(), grad[1]));
    Buffer dz2(gpu_.get(), logits);
    int eval_correct = -1;
    const float eval =
        gpu_->SoftmaxCrossEntropy(dz2.get(), labels.data(), rows, cols, nullptr, &eval_correct);
    EXPECT_EQ(eval, loss[1]);  // deterministic
    EXPECT_EQ(eval_correct, correct[1]);
    EXPECT_TRUE(SameBits(dz2.ToHost(), logits));  // logits untouched
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyBreaksArgmaxTiesLikeCpuAndStaysFinite) {
  const std::vector<float> ties = {3,  1,  3,    // argmax 0 (first of the tie)
                                   0,  5,  5,    // argmax 1
                                   2,  2,  9,    // argmax 2
                                   -1, -1, -1};  // argmax 0
  const std::vector<int32_t> tie_labels = {0, 2, 2, 0};
  Buffer dties(gpu_.get(), ties);
  int correct = -1;
  gpu_->SoftmaxCrossEntropy(dties.get(), tie_labels.data(), 4, 3, nullptr, &correct);
  EXPECT_EQ(correct, 3);

  const std::vector<float> logits = {1000, -1000, 0, -1000, 1000, 1000};
  const std::vector<int32_t> labels = {0, 0};
  Buffer dz(gpu_.get(), logits), grad(gpu_.get(), 6);
  const float loss = gpu_->SoftmaxCrossEntropy(dz.get(), labels.data(), 2, 3, grad.get(), &correct);
  EXPECT_NEAR(loss, (2000 + std::log(2.0)) / 2, 1e-3);
  EXPECT_EQ(correct, 1);
  const std::vector<float> g = grad.ToHost();
  const std::vector<float> want = {0, 0, 0, -0.5f, 0.25f, 0.25f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(g[i], want[i], 1e-7) << i;

  EXPECT_EQ(gpu_->SoftmaxCrossEntropy(nullptr, nullptr, 0, 3, nullptr, &correct), 0.0f);
  EXPECT_EQ(correct, 0);
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyWithBadLabelReturnsNanInsteadOfCrashing) {
  auto other = MakeCudaBackend(0);  // its own backend: the fixture's must stay error-free
  ASSERT_TRUE(other.ok()) << other.status();
  Backend* be = other->get();
  Buffer dz(be, std::vector<float>{1, 2, 3});
  const std::vector<int32_t> labels = {3};
  int correct = -1;
  EXPECT_TRUE(
      std::isnan(be->SoftmaxCrossEntropy(dz.get(), labels.data(), 1, 3, nullptr, &correct)));
  EXPECT_EQ(correct, 0);
#ifdef PSCLUSTER_CUDA_BACKEND
  EXPECT_EQ(CudaBackendStatus(*be).code(), absl::StatusCode::kInvalidArgument)
      << CudaBackendStatus(*be);
  EXPECT_EQ(CudaBackendStatus(*cpu_).code(), absl::StatusCode::kInvalidArgument);
#endif
}

// Pre-activations of every layer of the MLP (x W + b), in double, for `batch` rows.
std::vector<std::vector<double>> ReferencePreActivations(
    const std::vector<int>& layers, const std::vector<std::vector<float>>& params,
    const std::vector<float>& x, int batch) {
  std::vector<std::vector<double>> pre;
  std::vector<double> in(x.begin(), x.end());
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    const int n_in = layers[l], n_out = layers[l + 1];
    const std::vector<float>& w = params[2 * l];
    const std::vector<float>& b = params[2 * l + 1];
    std::vector<double> out(static_cast<size_t>(batch) * n_out);
    for (int r = 0; r < batch; ++r) {
      for (int j = 0; j < n_out; ++j) out[r * n_out + j] = b[j];
      for (int i = 0; i < n_in; ++i) {
        const double xi = in[static_cast<size_t>(r) * n_in + i];
        for (int j = 0; j < n_out; ++j)
          out[r * n_out + j] += xi * w[static_cast<size_t>(i) * n_out + j];
      }
    }
    pre.push_back(out);
    in = out;
    if (l + 2 < layers.size()) {
      for (double& v : in) v = std::max(v, 0.0);
    }
  }
  return pre;
}

// Whether float rounding cannot flip any ReLU or argmax between backends: every hidden
// pre-activation is at least `margin` from 0 and every row's top two logits are at least
// `margin` apart. Otherwise the backends may legitimately disagree (a ReLU on or off for
// one example changes gradients far more than 1e-3), which would test the data, not the
// backend.
bool WellSeparated(const std::vector<int>& layers, const std::vector<std::vector<double>>& pre,
                   int batch, double margin) {
  for (size_t l = 0; l + 1 < pre.size(); ++l) {
    for (double v : pre[l]) {
      if (std::abs(v) < margin) return false;
    }
  }
  const int classes = layers.back();
  for (int r = 0; r < batch; ++r) {
    std::vector<double> row(pre.back().begin() + r * classes,
                            pre.back().begin() + (r + 1) * classes);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<double>());
    if (classes > 1 && row[0] - row[1] < margin) return false;
  }
  return true;
}

TEST_F(CudaBackendTest, MlpForwardBackwardMatchesCpuOnDefaultModel) {
  const model::MlpOptions options;  // 784-256-128-64-10
  const int batch = 64;
  const std::vector<std::vector<float>> params = model::Mlp::InitialParams(options, 7);
  // Pixel-like inputs in [0, 1) and labels, from the first seed whose forward pass keeps
  // every ReLU and argmax 1e-4 clear of rounding (see WellSeparated).
  std::vector<float> x(static_cast<size_t>(batch) * options.layers[0]);
  std::vector<int32_t> y(batch);
  bool found = false;
  uint64_t seed = 0;
  while (!found && ++seed <= 200) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (float& v : x) v = pixel(rng);
    for (int32_t& label : y) label = static_cast<int32_t>(rng() % options.layers.back());
    found = WellSeparated(options.layers, ReferencePreActivations(options.layers, params, x, batch),
                          batch, 1e-4);
  }
  ASSERT_TRUE(found) << "no data seed in 1..200 keeps the forward pass 1e-4 away from ties";

  struct Run {
    model::StepResult step;
    std::vector<std::vector<float>> grads;
  };
  auto run = [&](Backend* backend) -> Run {
    auto mlp = model::Mlp::Create(backend, options, batch);
    EXPECT_TRUE(mlp.ok()) << mlp.status();
    if (!mlp.ok()) return {};
    for (size_t i = 0; i < params.size(); ++i)
      (*mlp)->SetParam(static_cast<int>(i), params[i].data());
    auto step = (*mlp)->ForwardBackward(x.data(), y.data(), batch);
    EXPECT_TRUE(step.ok()) << step.status();
    Run out;
    if (step.ok()) out.step = *step;
    for (size_t i = 0; i < params.size(); ++i) {
      out.grads.emplace_back((*mlp)->params()[i].size);
      (*mlp)->GetGrad(static_cast<int>(i), out.grads.back().data());
    }
    return out;
  };
  const Run cpu = run(cpu_.get());
  const Run gpu = run(gpu_.get());
  ASSERT_EQ(cpu.grads.size(), params.size());
  ASSERT_EQ(gpu.grads.size(), params.size());
  std::printf("data seed %llu: loss cpu %.7f, cuda %.7f; correct cpu %d, cuda %d\n",
              static_cast<unsigned long long>(seed), cpu.step.loss, gpu.step.loss, cpu.step.correct,
              gpu.step.correct);
  EXPECT_NEAR(gpu.step.loss, cpu.step.loss, 1e-4 * (1 + std::abs(cpu.step.loss)));
  EXPECT_EQ(gpu.step.correct, cpu.step.correct);
  EXPECT_EQ(gpu.step.examples, batch);
  for (size_t i = 0; i < params.size(); ++i) {
    double scale = 0;
    for (float g : cpu.grads[i]) scale = std::max(scale, static_cast<double>(std::abs(g)));
    EXPECT_GT(scale, 0.0) << "param " << i << " has an all-zero CPU gradient";
    ExpectAllNear(
        gpu.grads[i], cpu.grads[i], [&](size_t) { return 1e-3 * scale; },
        "gradient of param " + std::to_string(i));
  }

  // The CUDA step is deterministic: a second run gives the same bits.
  const Run again = run(gpu_.get());
  EXPECT_EQ(again.step.loss, gpu.step.loss);
  for (size_t i = 0; i < params.size() && i < again.grads.size(); ++i) {
    EXPECT_TRUE(SameBits(again.grads[i], gpu.grads[i])) << "param " << i;
  }
}

TEST_F(CudaBackendTest, MlpEvaluateMatchesCpuOverSeveralChunks) {
  const model::MlpOptions options;
  const std::vector<std::vector<float>> params = model::Mlp::InitialParams(options, 11);
  const int count = 150;  // chunks of 64, 64 and 22
  std::vector<float> x(static_cast<size_t>(count) * options.layers[0]);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (float& v : x) v = pixel(rng_);
  std::vector<int32_t> y(count);
  for (int32_t& label : y) label = static_cast<int32_t>(rng_() % options.layers.back());
  model::StepResult results[2];
  Backend* backends[2] = {cpu_.get(), gpu_.get()};
  for (int b = 0; b < 2; ++b) {
    auto mlp = model::Mlp::Create(backends[b], options, 64);
    ASSERT_TRUE(mlp.ok()) << mlp.status();
    for (size_t i = 0; i < params.size(); ++i)
      (*mlp)->SetParam(static_cast<int>(i), params[i].data());
    auto result = (*mlp)->Evaluate(x.data(), y.data(), count);
    ASSERT_TRUE(result.ok()) << result.status();
    results[b] = *result;
  }
  EXPECT_NEAR(results[1].loss, results[0].loss, 1e-4 * (1 + std::abs(results[0].loss)));
  // Argmax near-ties are not screened out here, so allow one example to differ.
  EXPECT_NEAR(results[1].correct, results[0].correct, 1);
  EXPECT_EQ(results[1].examples, count);
}

// Every transformer kernel at once (LayerNorm, GELU, causal softmax and their backwards,
// batched GEMMs over heads, gathers and scatter-adds): a GPT step on both backends, and the
// CUDA step again for the same bits.
TEST_F(CudaBackendTest, GptForwardBackwardMatchesCpuAndIsDeterministic) {
  model::GptOptions options;
  options.layers = 2;
  options.heads = 4;
  options.width = 64;
  options.context = 33;  // odd: not a multiple of a warp
  const int batch = 3;
  auto def = model::MakeGptDef(options, 7);
  ASSERT_TRUE(def.ok()) << def.status();
  std::mt19937_64 rng(5);
  std::vector<float> x(static_cast<size_t>(batch) * options.context);
  std::vector<int32_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(rng() % options.vocab);
    y[i] = static_cast<int32_t>(rng() % options.vocab);
  }
  std::vector<std::vector<float>> params;
  for (const model::TensorSpec& t : (*def)->spec().params) {
    params.push_back(RandomVector(t.size(), rng, t.shape.size() == 1 ? 1.0f : 0.1f));
  }
  struct Run {
    model::StepResult step;
    std::vector<std::vector<float>> grads;
  };
  auto run = [&](Backend* backend) -> Run {
    auto gpt = (*def)->Create(backend, model::WholeModel(batch));
    EXPECT_TRUE(gpt.ok()) << gpt.status();
    if (!gpt.ok()) return {};
    for (size_t i = 0; i < params.size(); ++i)
      (*gpt)->SetParam(static_cast<int>(i), params[i].data());
    auto step = (*gpt)->ForwardBackward(x.data(), y.data(), batch);
    EXPECT_TRUE(step.ok()) << step.status();
    Run out;
    if (step.ok()) out.step = *step;
    for (size_t i = 0; i < params.size(); ++i) {
      out.grads.emplace_back(params[i].size());
      (*gpt)->GetGrad(static_cast<int>(i), out.grads.back().data());
    }
    return out;
  };
  const Run cpu = run(cpu_.get());
  const Run gpu = run(gpu_.get());
  ASSERT_EQ(gpu.grads.size(), params.size());
  std::printf("gpt loss cpu %.7f, cuda %.7f\n", cpu.step.loss, gpu.step.loss);
  EXPECT_NEAR(gpu.step.loss, cpu.step.loss, 1e-4 * (1 + std::abs(cpu.step.loss)));
  for (size_t i = 0; i < params.size(); ++i) {
    double scale = 0;
    for (float g : cpu.grads[i]) scale = std::max(scale, static_cast<double>(std::abs(g)));
    ExpectAllNear(
        gpu.grads[i], cpu.grads[i], [&](size_t) { return 1e-3 * scale + 1e-7; },
        (*def)->spec().params[i].name + " gradient");
  }
  const Run again = run(gpu_.get());
  EXPECT_EQ(again.step.loss, gpu.step.loss);
  for (size_t i = 0; i < params.size() && i < again.grads.size(); ++i) {
    EXPECT_TRUE(SameBits(again.grads[i], gpu.grads[i])) << (*def)->spec().params[i].name;
  }
}

}  // namespace
}  // namespace pscluster::compute
