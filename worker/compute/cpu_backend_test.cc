#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace pscluster::compute {
namespace {

using Buffer = BackendBuffer;

std::vector<float> RandomVector(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Mean softmax cross-entropy in double, straight from the definition.
double ReferenceLoss(const std::vector<double>& logits, const std::vector<int32_t>& labels,
                     int cols) {
  const int rows = static_cast<int>(labels.size());
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    double max = logits[r * cols];
    for (int c = 1; c < cols; ++c) max = std::max(max, logits[r * cols + c]);
    double sum = 0;
    for (int c = 0; c < cols; ++c) sum += std::exp(logits[r * cols + c] - max);
    total += std::log(sum) + max - logits[r * cols + labels[r]];
  }
  return total / rows;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(1);
  std::mt19937_64 rng_{20240601};
};

TEST_F(CpuBackendTest, AllocReturnsZeroedMemoryAndFreeAcceptsNull) {
  EXPECT_EQ(backend_->name(), "cpu");
  Buffer buffer(backend_.get(), 1001);
  for (float x : buffer.ToHost()) EXPECT_EQ(x, 0.0f);
  backend_->Free(nullptr);
}

TEST_F(CpuBackendTest, GemmMatchesNaiveProductForAllTransposesAndOddSizes) {
  const int sizes[] = {1, 7, 33};
  const float alpha = 0.75f, beta = -0.5f;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (int m : sizes) {
        for (int n : sizes) {
          for (int k : sizes) {
            SCOPED_TRACE(::testing::Message() << "trans_a=" << trans_a << " trans_b=" << trans_b
                                              << " m=" << m << " n=" << n << " k=" << k);
            const std::vector<float> a = RandomVector(m * k, rng_);
            const std::vector<float> b = RandomVector(k * n, rng_);
            const std::vector<float> c0 = RandomVector(m * n, rng_);
            Buffer da(backend_.get(), a), db(backend_.get(), b), dc(backend_.get(), c0);
            backend_->Gemm(trans_a, trans_b, m, n, k, alpha, da.get(), db.get(), beta, dc.get());
            const std::vector<float> c = dc.ToHost();
            for (int i = 0; i < m; ++i) {
              for (int j = 0; j < n; ++j) {
                double dot = 0;
                for (int p = 0; p < k; ++p) {
                  const double aip = trans_a ? a[p * m + i] : a[i * k + p];
                  const double bpj = trans_b ? b[j * k + p] : b[p * n + j];
                  dot += aip * bpj;
                }
                const double want = alpha * dot + beta * c0[i * n + j];
                EXPECT_NEAR(c[i * n + j], want, 1e-5 * (1 + std::abs(want)));
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, GemmWithZeroBetaOverwritesNanInOutput) {
  const int m = 3, n = 5, k = 4;
  const std::vector<float> a = RandomVector(m * k, rng_), b = RandomVector(k * n, rng_);
  Buffer da(backend_.get(), a), db(backend_.get(), b);
  Buffer dc(backend_.get(), std::vector<float>(m * n, std::numeric_limits<float>::quiet_NaN()));
  backend_->Gemm(false, false, m, n, k, 1.0f, da.get(), db.get(), 0.0f, dc.get());
  for (float x : dc.ToHost()) EXPECT_FALSE(std::isnan(x));
}

TEST_F(CpuBackendTest, GemmWithEmptyInnerDimensionScalesOutputByBeta) {
  Buffer dc(backend_.get(), std::vector<float>{1, 2, 3, 4, 5, 6});
  backend_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 2.0f, dc.get());
  EXPECT_EQ(dc.ToHost(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
}

TEST_F(CpuBackendTest, AddRowVectorAddsBiasToEveryRow) {
  Buffer y(backend_.get(), std::vector<float>{1, 2, 3, 4, 5, 6});
  Buffer bias(backend_.get(), std::vector<float>{10, 20, 30});
  backend_->AddRowVector(y.get(), bias.get(), 2, 3);
  EXPECT_EQ(y.ToHost(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
}

TEST_F(CpuBackendTest, ColumnSumsOverwritesOutputWithSumOfEachColumn) {
  Buffer x(backend_.get(), std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  Buffer out(backend_.get(), std::vector<float>{100, 100, 100});
  backend_->ColumnSums(x.get(), 3, 3, out.get());
  EXPECT_EQ(out.ToHost(), (std::vector<float>{12, 15, 18}));
}

TEST_F(CpuBackendTest, ReluClampsNegativesOutOfPlaceAndInPlace) {
  const std::vector<float> in = {-2, -0.0f, 0, 0.5f, 3, -1e-30f, 7};
  const std::vector<float> want = {0, 0, 0, 0.5f, 3, 0, 7};
  Buffer x(backend_.get(), in), y(backend_.get(), in.size());
  backend_->Relu(x.get(), y.get(), in.size());
  EXPECT_EQ(y.ToHost(), want);
  backend_->Relu(x.get(), x.get(), in.size());
  EXPECT_EQ(x.ToHost(), want);
}

TEST_F(CpuBackendTest, ReluBackwardPassesGradientOnlyWhereOutputIsPositive) {
  const std::vector<float> y_host = {0, 1, 0, 2.5f, 0.1f};
  const std::vector<float> dy_host = {5, 6, 7, 8, 9};
  const std::vector<float> want = {0, 6, 0, 8, 9};
  Buffer y(backend_.get(), y_host), dy(backend_.get(), dy_host), dx(backend_.get(), 5);
  backend_->ReluBackward(y.get(), dy.get(), dx.get(), 5);
  EXPECT_EQ(dx.ToHost(), want);
  backend_->ReluBackward(y.get(), dy.get(), dy.get(), 5);
  EXPECT_EQ(dy.ToHost(), want);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyLossMatchesDoubleReference) {
  const int rows = 9, cols = 7;
  std::vector<float> logits = RandomVector(rows * cols, rng_);
  for (float& z : logits) z *= 4;
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 3) % cols;
  Buffer dz(backend_.get(), logits);
  const float loss =
      backend_->SoftmaxCrossEntropy(dz.get(), labels.data(), rows, cols, nullptr, nullptr);
  const double want =
      ReferenceLoss(std::vector<double>(logits.begin(), logits.end()), labels, cols);
  EXPECT_NEAR(loss, want, 1e-6 * (1 + want));
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyGradientMatchesFiniteDifferencesAndClosedForm) {
  const int rows = 5, cols = 6;
  std::vector<float> logits = RandomVector(rows * cols, rng_);
  for (float& z : logits) z *= 3;
  const std::vector<int32_t> labels = {0, 5, 2, 2, 3};
  Buffer dz(backend_.get(), logits), grad(backend_.get(), rows * cols);
  backend_->SoftmaxCrossEntropy(dz.get(), labels.data(), rows, cols, grad.get(), nullptr);
  const std::vector<float> g = grad.ToHost();

  std::vector<double> z(logits.begin(), logits.end());
  const double eps = 1e-6;
  for (int i = 0; i < rows * cols; ++i) {
    const double saved = z[i];
    z[i] = saved + eps;
    const double up = ReferenceLoss(z, labels, cols);
    z[i] = saved - eps;
    const double down = ReferenceLoss(z, labels, cols);
    z[i] = saved;
    EXPECT_NEAR(g[i], (up - down) / (2 * eps), 1e-6) << "logit " << i;
  }
  for (int r = 0; r < rows; ++r) {
    double max = z[r * cols], sum = 0;
    for (int c = 0; c < cols; ++c) max = std::max(max, z[r * cols + c]);
    for (int c = 0; c < cols; ++c) sum += std::exp(z[r * cols + c] - max);
    for (int c = 0; c < cols; ++c) {
      const double p = std::exp(z[r * cols + c] - max) / sum;
      const double want = (p - (c == labels[r] ? 1.0 : 0.0)) / rows;
      EXPECT_NEAR(g[r * cols + c], want, 1e-7) << "row " << r << " col " << c;
    }
  }
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyCountsRowsWhoseArgmaxIsTheLabel) {
  const std::vector<float> logits = {3,  1,  2,    // argmax 0
                                     0,  5,  1,    // argmax 1
                                     2,  2,  9,    // argmax 2
                                     -1, -3, -2};  // argmax 0
  const std::vector<int32_t> labels = {0, 2, 2, 1};
  Buffer dz(backend_.get(), logits);
  int correct = -1;
  backend_->SoftmaxCrossEntropy(dz.get(), labels.data(), 4, 3, nullptr, &correct);
  EXPECT_EQ(correct, 2);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyStaysFiniteForHugeLogits) {
  const std::vector<float> logits = {1000, -1000, 0, -1000, 1000, 1000};
  const std::vector<int32_t> labels = {0, 0};
  Buffer dz(backend_.get(), logits), grad(backend_.get(), 6);
  int correct = 0;
  const float loss =
      backend_->SoftmaxCrossEntropy(dz.get(), labels.data(), 2, 3, grad.get(), &correct);
  // Row 0: softmax is (1, 0, 0), loss 0. Row 1: label logit is 2000 below two maxima,
  // loss log(2) + 2000. Mean: (2000 + log 2) / 2.
  EXPECT_NEAR(loss, (2000 + std::log(2.0)) / 2, 1e-3);
  EXPECT_EQ(correct, 1);
  const std::vector<float> g = grad.ToHost();
  const std::vector<float> want = {0, 0, 0, -0.5f, 0.25f, 0.25f};
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(g[i])) << i;
    EXPECT_NEAR(g[i], want[i], 1e-7) << i;
  }
}

TEST(CpuBackendThreadsTest, BackendWithSeveralThreadsComputesTheSameProduct) {
  std::mt19937_64 rng(7);
  const int m = 64, n = 96, k = 80;
  const std::vector<float> a = RandomVector(m * k, rng), b = RandomVector(k * n, rng);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    std::unique_ptr<Backend> backend = MakeCpuBackend(threads);
    Buffer da(backend.get(), a), db(backend.get(), b), dc(backend.get(), m * n);
    backend->Gemm(false, false, m, n, k, 1.0f, da.get(), db.get(), 0.0f, dc.get());
    results.push_back(dc.ToHost());
  }
  for (int i = 0; i < m * n; ++i) EXPECT_NEAR(results[0][i], results[1][i], 1e-4) << i;
  MakeCpuBackend(1);  // leave OpenBLAS single-threaded for the other tests
}

// GELU and its derivative use a vectorisable exp (Cephes' polynomial) instead of libm's:
// within 1e-6 (absolute, and relative to |x| for large inputs) of the tanh formula in
// double over the whole range, saturating cleanly far out; the causal softmax the same.
TEST_F(CpuBackendTest, GeluAndCausalSoftmaxMatchDoubleReferences) {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.013f) x.push_back(v);
  for (float v : {-1e4f, -100.0f, 0.0f, 1e-20f, 100.0f, 1e4f}) x.push_back(v);
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  backend_->Gelu(x.data(), y.data(), x.size());
  backend_->GeluBackward(x.data(), ones.data(), dx.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], c = std::sqrt(2.0 / M_PI), u = c * (v + 0.044715 * v * v * v);
    const double t = std::tanh(u);
    const double want = 0.5 * v * (1 + t);
    const double dwant = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
    ASSERT_NEAR(y[i], want, 1e-6 * std::max(1.0, std::abs(v))) << "gelu(" << v << ")";
    ASSERT_NEAR(dx[i], dwant, 1e-6 * std::max(1.0, std::abs(v))) << "gelu'(" << v << ")";
  }
  const int t = 7;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
  std::vector<float> s(2 * t * t);
  for (float& v : s) v = dist(rng);
  const std::vector<float> in = s;
  backend_->CausalSoftmax(s.data(), 2, t);
  for (int r = 0; r < 2 * t; ++r) {
    const int i = r % t;
    double max = -1e30, sum = 0;
    for (int j = 0; j <= i; ++j) max = std::max(max, double{in[r * t + j]});
    for (int j = 0; j <= i; ++j) sum += std::exp(in[r * t + j] - max);
    for (int j = 0; j < t; ++j) {
      const double want = j <= i ? std::exp(in[r * t + j] - max) / sum : 0.0;
      ASSERT_NEAR(s[r * t + j], want, 1e-6) << "row " << r << " column " << j;
    }
  }
}

}  // namespace
}  // namespace pscluster::compute
