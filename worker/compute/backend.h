// The compute backend a worker trains with: dense float32 linear algebra and the few
// kernels an MLP and a transformer need. CPU (OpenBLAS) and CUDA (cuBLAS + kernels)
// implement it; the model code is the same for both.
//
// Memory: buffers come from Alloc() and live where the backend computes (host memory for
// the CPU backend, device memory for CUDA); only Upload/Download cross. Matrices are
// row-major. A backend is not thread-safe: one per training thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster::compute {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // n floats, zeroed. Free(nullptr) is a no-op.
  virtual float* Alloc(size_t n) = 0;
  virtual void Free(float* p) = 0;
  virtual void Upload(const float* host, float* buffer, size_t n) = 0;
  virtual void Download(const float* buffer, float* host, size_t n) = 0;

  // c[m x n] = alpha * op(a) * op(b) + beta * c, where op(a) is m x k and op(b) is k x n;
  // op transposes when the flag is set (a is then stored k x m, b stored n x k).
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;
  // y[r][c] += bias[c] for a rows x cols matrix.
  virtual void AddRowVector(float* y, const float* bias, int rows, int cols) = 0;
  // out[c] = sum over r of x[r][c].
  virtual void ColumnSums(const float* x, int rows, int cols, float* out) = 0;
  // y = max(x, 0); in place allowed.
  virtual void Relu(const float* x, float* y, size_t n) = 0;
  // dx = dy where y > 0, else 0 (y is the ReLU output); in place (dx == dy) allowed.
  virtual void ReluBackward(const float* y, const float* dy, float* dx, size_t n) = 0;
  // Mean softmax cross-entropy of logits (rows x cols) against host labels in [0, cols);
  // writes d(mean loss)/d(logits) into dlogits (may be null for evaluation) and the number
  // of rows whose argmax equals the label into *correct (may be null). Returns the loss.
  virtual float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                    float* dlogits, int* correct) = 0;

  // --- What a transformer needs besides the above (worker/model/gpt). ---

  // y = x, n floats within the backend's memory.
  virtual void Copy(const float* x, float* y, size_t n) = 0;
  // y += alpha * x.
  virtual void Axpy(float alpha, const float* x, float* y, size_t n) = 0;
  // `count` products c_i = alpha * op(a_i) * op(b_i) + beta * c_i (sizes as in Gemm), where
  // a_i = a + i * stride_a and so on, and lda, ldb, ldc are the row lengths as stored (>= the
  // columns of the stored matrix): sub-matrices of wider ones, as attention heads are.
  virtual void GemmBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                           int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                           int count) = 0;
  // Per row of x (rows x cols): y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var +
  // eps) with the biased variance; mean and rstd (rows floats each) are kept for the backward.
  virtual void LayerNorm(const float* x, const float* gamma, const float* beta, int rows, int cols,
                         float eps, float* y, float* mean, float* rstd) = 0;
  // The backward of LayerNorm: dx is written; dgamma and dbeta are ADDED to (sums over rows).
  virtual void LayerNormBackward(const float* dy, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, int rows, int cols,
                                 float* dx, float* dgamma, float* dbeta) = 0;
  // GELU, tanh approximation (GPT-2's; PyTorch's gelu(approximate="tanh")); in place allowed.
  virtual void Gelu(const float* x, float* y, size_t n) = 0;
  // dx = dy * gelu'(x); in place (dx == dy) allowed.
  virtual void GeluBackward(const float* x, const float* dy, float* dx, size_t n) = 0;
  // In place over `count` square t x t matrices: row i becomes the softmax of its first
  // i + 1 entries, the rest 0 (causal attention).
  virtual void CausalSoftmax(float* s, int count, int t) = 0;
  // Per row of the softmax output p (rows x cols): ds = p * (dp - sum(p * dp)); in place
  // (ds == dp) allowed.
  virtual void SoftmaxBackward(const float* p, const float* dp, float* ds, int rows, int cols) = 0;
  // out[i] = table[ids[i]] (rows of dim floats); ids are n whole numbers held as floats in
  // [0, table rows): the caller checks them.
  virtual void GatherRows(const float* table, int dim, const float* ids, int n, float* out) = 0;
  // table[ids[i]] += rows[i] for a table of table_rows rows, summed in order of i for every
  // row of the table (deterministic).
  virtual void ScatterAddRows(const float* rows, int dim, const float* ids, int n, float* table,
                              int table_rows) = 0;
};

// A backend buffer, freed when it goes out of scope; optionally filled from host data.
class BackendBuffer {
 public:
  BackendBuffer(Backend* backend, const std::vector<float>& host)
      : backend_(backend), size_(host.size()), data_(backend->Alloc(host.size())) {
    backend_->Upload(host.data(), data_, size_);
  }
  BackendBuffer(Backend* backend, size_t n)
      : backend_(backend), size_(n), data_(backend->Alloc(n)) {}
  ~BackendBuffer() { backend_->Free(data_); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  float* get() { return data_; }
  size_t size() const { return size_; }
  std::vector<float> ToHost() const {
    std::vector<float> host(size_);
    backend_->Download(data_, host.data(), size_);
    return host;
  }

 private:
  Backend* backend_;
  size_t size_;
  float* data_;
};

// OpenBLAS sgemm + plain loops. `threads` sets OpenBLAS's thread count (0: leave it).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 1);

// cuBLAS + CUDA kernels on `device`. UNAVAILABLE, with the reason, when this binary was
// built without --config=cuda or no GPU is usable.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device = 0);

}  // namespace pscluster::compute
