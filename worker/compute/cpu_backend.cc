// The CPU compute backend: OpenBLAS sgemm for matrix products, plain loops (left to the
// compiler's vectoriser, built with -O3) for the element-wise kernels.
#include <algorithm>
#include <cassert>
#include <cmath>
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
    for (size_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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

 private:
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
