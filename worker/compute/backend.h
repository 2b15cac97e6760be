// The compute backend a worker trains with: dense float32 linear algebra and the few
// element-wise kernels an MLP needs. CPU (OpenBLAS) and CUDA (cuBLAS + kernels)
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
