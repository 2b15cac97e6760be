// The CPU compute backend: OpenBLAS sgemm for matrix products, plain loops (left to the
// compiler's vectoriser, built with -O3) for the element-wise kernels.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "worker/compute/backend.h"

// Debian's cblas.h is an alternative that may point at netlib's header, which lacks
// openblas_set_num_threads; cblas-openblas.h is always OpenBLAS's own.
#if __has_include(<cblas-openblas.h>)
#include <cblas-openblas.h>
#else
#include <cblas.h>
#endif

namespace pscluster::compute {
namespace {

constexpr size_t kAlignment = 64;  // a cache line; also enough for AVX-512 loads

// exp(x) in plain arithmetic, so that loops over it vectorise (libm's expf and tanhf are
// scalar calls: they were a third of a GPT step's time). Cephes' expf: x = n ln2 + r with
// |r| <= ln2 / 2 (Cody-Waite), a degree-6 polynomial for e^r, n put into the exponent
// bits; within 2 ulp of expf over [-87, 88] (inputs beyond are clamped there).
inline float Exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// tanh(u) = 1 - 2 / (e^(2u) + 1): absolute error within a few float epsilons.
inline float Tanh(float u) { return 1.0f - 2.0f / (Exp(2.0f * u) + 1.0f); }

// Backend over host memory. Not thread-safe (like every Backend): one per training
// thread. OpenBLAS's thread count is process-wide, so the last backend created with
// threads > 0 sets it for all of them.
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  float* Alloc(size_t n) override {
    // aligned_alloc wants a size that is a multiple of the alignment; never zero, so
    // every Alloc returns a distinct pointer that Free accepts.
    size_t bytes = std::max<size_t>(n * sizeof(float), 1);
    bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (p != nullptr) std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }

  void Free(float* p) override { std::free(p); }

  void Upload(const float* host, float* buffer, size_t n) override {
    if (n > 0) std::memcpy(buffer, host, n * sizeof(float));
  }

  void Download(const float* buffer, float* host, size_t n) override {
    if (n > 0) std::memcpy(host, buffer, n * sizeof(float));
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
      // op(a) * op(b) is all zeros; BLAS rejects the zero leading dimensions this implies.
      ScaleInPlace(c, static_cast<size_t>(m) * n, beta);
      return;
    }
    const int lda = trans_a ? m : k;
    const int ldb = trans_b ? k : n;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
  }

  void AddRowVector(float* y, const float* bias, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* row = y + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  void ColumnSums(const float* x, int rows, int cols, float* out) override {
    std::fill(out, out + std::max(cols, 0), 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += row[c];
    }
  }

  void Relu(const float* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }

  void ReluBackward(const float* y, const float* dy, float* dx, size_t n) override {
    // dy[i] read whatever y[i] is: a load under the condition keeps GCC from vectorising,
    // and the branch it then takes is mispredicted about half the time (~7 ns an element).
    for (size_t i = 0; i < n; ++i) {
      const float d = dy[i];
      dx[i] = y[i] > 0.0f ? d : 0.0f;
    }
  }

  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int* correct) override {
    int hits = 0;
    double total_loss = 0.0;
    const float inv_rows = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<size_t>(r) * cols;
      const int label = labels[r];
      assert(label >= 0 && label < cols);
      // Subtracting the row max keeps exp() in (0, 1]: no overflow for any finite logits.
      int argmax = 0;
      for (int c = 1; c < cols; ++c) {
        if (z[c] > z[argmax]) argmax = c;
      }
      const float max = z[argmax];
      const float label_shifted = z[label] - max;  // read before d (which may alias z)
      // With dlogits, the unnormalised exp(z - max) are kept there for the gradient.
      float* d = dlogits != nullptr ? dlogits + static_cast<size_t>(r) * cols : nullptr;
      double sum = 0.0;
      for (int c = 0; c < cols; ++c) {
        const float e = std::exp(z[c] - max);
        if (d != nullptr) d[c] = e;
        sum += e;
      }
      // -log softmax(z)[label] = log(sum) - (z[label] - max).
      total_loss += std::log(sum) - static_cast<double>(label_shifted);
      if (argmax == label) ++hits;
      if (d != nullptr) {
        // d(mean loss)/dz = (softmax(z) - onehot(label)) / rows.
        const float scale = static_cast<float>(1.0 / sum) * inv_rows;
        for (int c = 0; c < cols; ++c) d[c] *= scale;
        d[label] -= inv_rows;
      }
    }
    if (correct != nullptr) *correct = hits;
    return rows > 0 ? static_cast<float>(total_loss / rows) : 0.0f;
  }

  void Copy(const float* x, float* y, size_t n) override {
    if (n > 0 && x != y) std::memmove(y, x, n * sizeof(float));
  }

  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void GemmBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float beta,
                   float* c, int ldc, int64_t stride_c, int count) override {
    if (m <= 0 || n <= 0) return;
    for (int i = 0; i < count; ++i) {
      float* ci = c + i * stride_c;
      if (k <= 0) {
        for (int r = 0; r < m; ++r) ScaleInPlace(ci + static_cast<size_t>(r) * ldc, n, beta);
        continue;
      }
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a + i * stride_a, lda,
                  b + i * stride_b, ldb, beta, ci, ldc);
    }
  }

  void LayerNorm(const float* x, const float* gamma, const float* beta, int rows, int cols,
                 float eps, float* y, float* mean, float* rstd) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * cols;
      float* yr = y + static_cast<size_t>(r) * cols;
      double sum = 0, sq = 0;
      for (int c = 0; c < cols; ++c) sum += xr[c];
      const float mu = static_cast<float>(sum / cols);
      for (int c = 0; c < cols; ++c) sq += static_cast<double>(xr[c] - mu) * (xr[c] - mu);
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / cols + eps));
      for (int c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
      mean[r] = mu;
      rstd[r] = rs;
    }
  }

  void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, int rows, int cols, float* dx, float* dgamma,
                         float* dbeta) override {
    // With xhat = (x - mean) * rstd and g = dy * gamma:
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    for (int r = 0; r < rows; ++r) {
      const float* dyr = dy + static_cast<size_t>(r) * cols;
      const float* xr = x + static_cast<size_t>(r) * cols;
      float* dxr = dx + static_cast<size_t>(r) * cols;
      const float mu = mean[r], rs = rstd[r];
      double sum_g = 0, sum_gx = 0;
      for (int c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mu) * rs;
        const float g = dyr[c] * gamma[c];
        sum_g += g;
        sum_gx += static_cast<double>(g) * xhat;
        dgamma[c] += dyr[c] * xhat;
        dbeta[c] += dyr[c];
      }
      const float mean_g = static_cast<float>(sum_g / cols);
      const float mean_gx = static_cast<float>(sum_gx / cols);
      for (int c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mu) * rs;
        dxr[c] = rs * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
      }
    }
  }

  void Gelu(const float* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + Tanh(kGeluC * (v + kGeluA * v * v * v)));
    }
  }

  void GeluBackward(const float* x, const float* dy, float* dx, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float t = Tanh(kGeluC * (v + kGeluA * v * v * v));
      const float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
  }

  void CausalSoftmax(float* s, int count, int t) override {
    for (int m = 0; m < count; ++m) {
      for (int i = 0; i < t; ++i) {
        float* row = s + (static_cast<size_t>(m) * t + i) * t;
        float max = row[0];
        for (int j = 1; j <= i; ++j) max = std::max(max, row[j]);
        float sum = 0;
        for (int j = 0; j <= i; ++j) row[j] = Exp(row[j] - max);  // vectorised
        for (int j = 0; j <= i; ++j) sum += row[j];
        const float inv = 1.0f / sum;
        for (int j = 0; j <= i; ++j) row[j] *= inv;
        for (int j = i + 1; j < t; ++j) row[j] = 0.0f;
      }
    }
  }

  void SoftmaxBackward(const float* p, const float* dp, float* ds, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      const float* pr = p + static_cast<size_t>(r) * cols;
      const float* dpr = dp + static_cast<size_t>(r) * cols;
      float* dsr = ds + static_cast<size_t>(r) * cols;
      float dot = 0;
      for (int c = 0; c < cols; ++c) dot += pr[c] * dpr[c];
      for (int c = 0; c < cols; ++c) dsr[c] = pr[c] * (dpr[c] - dot);
    }
  }

  void GatherRows(const float* table, int dim, const float* ids, int n, float* out) override {
    for (int i = 0; i < n; ++i) {
      const size_t row = static_cast<size_t>(ids[i]);
      std::memcpy(out + static_cast<size_t>(i) * dim, table + row * dim, dim * sizeof(float));
    }
  }

  void ScatterAddRows(const float* rows, int dim, const float* ids, int n, float* table,
                      int table_rows) override {
    for (int i = 0; i < n; ++i) {
      assert(ids[i] >= 0 && ids[i] < table_rows);
      float* to = table + static_cast<size_t>(ids[i]) * dim;
      const float* from = rows + static_cast<size_t>(i) * dim;
      for (int c = 0; c < dim; ++c) to[c] += from[c];
    }
  }

 private:
  static constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float kGeluA = 0.044715f;

  // x *= beta, with beta == 0 writing zeros whatever x held (the BLAS convention).
  static void ScaleInPlace(float* x, size_t n, float beta) {
    if (beta == 0.0f) {
      std::fill(x, x + n, 0.0f);
    } else if (beta != 1.0f) {
      for (size_t i = 0; i < n; ++i) x[i] *= beta;
    }
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
  return std::make_unique<CpuBackend>();
}

}  // namespace pscluster::compute
