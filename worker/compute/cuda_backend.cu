// The CUDA compute backend: cuBLAS sgemm for matrix products, small kernels (cuda_kernels.cu) for
// the element-wise work and the softmax cross-entropy. Built only under --config=cuda (see
// cuda_backend_stub.cc for the other builds).
//
// Errors. Every cudaError_t and cublasStatus_t goes through CudaStatus / CublasStatus,
// which turn it into an UNAVAILABLE absl::Status naming the error and what was being
// done. MakeCudaBackend returns such a status when the device or cuBLAS cannot be set up.
// The Backend methods return void (or a float), so a failure there cannot be returned:
// the backend keeps the FIRST failure (CudaBackend::status(), printed once to stderr when
// it happens; read it with CudaBackendStatus below) and makes it visible through the
// interface instead of aborting:
//   - Alloc returns nullptr (Mlp::Create turns that into RESOURCE_EXHAUSTED);
//   - Download fills the host buffer with NaN, so nothing stale is mistaken for a result;
//   - SoftmaxCrossEntropy returns NaN and sets *correct to 0 (also, with an
//     INVALID_ARGUMENT recorded, for a label outside [0, cols), which the CPU backend
//     only asserts against).
// Kernel faults are asynchronous and surface at the next synchronising call (Download,
// SoftmaxCrossEntropy), which reports them the same way. CUDA treats such faults as sticky
// (every later call fails too), so the first error is the one worth keeping.
//
// Determinism: every kernel sums in a fixed order (no atomics), the loss is summed on the
// host in row order, and cuBLAS on one stream gives the same bits on the same GPU model
// and toolkit, so a given input gives bit-identical results run to run.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "worker/compute/backend.h"
#include "worker/compute/cuda_kernels.h"

namespace pscluster::compute {
namespace {

using ::pscluster::CudaStatus;
using namespace cuda_kernels;  // the kernels and their launch shapes

// The one cublasStatus_t -> absl::Status adapter: UNAVAILABLE "<what>: <name> (<text>)".
absl::Status CublasStatus(cublasStatus_t s, const std::string& what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(what + ": " + cublasGetStatusName(s) + " (" +
                                cublasGetStatusString(s) + ")");
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cublasHandle_t handle) : device_(device), handle_(handle) {}

  ~CudaBackend() override {
    if (!SelectDevice()) return;  // cannot even reach the device: leak rather than crash
    cudaFree(labels_);
    cudaFree(row_loss_);
    cudaFree(row_hit_);
    cublasDestroy(handle_);
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }

  // The first error any call met (OK if none): see the comment at the top of the file.
  absl::Status status() const { return status_; }

  float* Alloc(size_t n) override {
    if (!SelectDevice()) return nullptr;
    // Never zero bytes, so that every Alloc returns a distinct non-null pointer, as the
    // CPU backend's does.
    const size_t bytes = (n > 0 ? n : 1) * sizeof(float);
    void* p = nullptr;
    const std::string what = "cudaMalloc(" + std::to_string(bytes) + " bytes)";
    if (!Check(cudaMalloc(&p, bytes), what)) return nullptr;
    if (!Check(cudaMemset(p, 0, bytes), "cudaMemset after " + what)) {
      cudaFree(p);
      return nullptr;
    }
    return static_cast<float*>(p);
  }

  void Free(float* p) override {
    if (p == nullptr || !SelectDevice()) return;
    Check(cudaFree(p), "cudaFree");
  }

  void Upload(const float* host, float* buffer, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    Check(cudaMemcpy(buffer, host, n * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy host to device (" + std::to_string(n) + " floats)");
  }

  void Download(const float* buffer, float* host, size_t n) override {
    if (n == 0) return;
    // cudaMemcpy to pageable memory waits for all earlier work on the legacy default
    // stream (every kernel and cuBLAS call here), so this synchronises.
    if (!SelectDevice() ||
        !Check(cudaMemcpy(host, buffer, n * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy device to host (" + std::to_string(n) + " floats)")) {
      std::fill(host, host + n, std::numeric_limits<float>::quiet_NaN());
    }
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m <= 0 || n <= 0 || !SelectDevice()) return;
    const size_t mn = static_cast<size_t>(m) * n;
    if (k <= 0) {
      // op(a) * op(b) is all zeros; cuBLAS rejects the zero leading dimensions this
      // implies. beta == 0 writes zeros whatever c held (the BLAS convention).
      if (beta == 0.0f) {
        Check(cudaMemset(c, 0, mn * sizeof(float)), "cudaMemset (Gemm with k = 0)");
      } else if (beta != 1.0f) {
        ScaleKernel<<<BlocksFor(mn), kThreads>>>(c, mn, beta);
        Check(cudaGetLastError(), "ScaleKernel launch");
      }
      return;
    }
    // cuBLAS is column-major, and a row-major matrix read column-major is its transpose.
    // So compute C^T (n x m, column-major, ld n) = op(B)^T * op(A)^T: B goes first with
    // its own flag, then A, and m and n swap. The leading dimensions are the row lengths
    // as stored: a is m x k (or k x m when transposed), b is k x n (or n x k).
    const int lda = trans_a ? m : k;
    const int ldb = trans_b ? k : n;
    Check(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta,
                      c, n),
          "cublasSgemm(m=" + std::to_string(m) + ", n=" + std::to_string(n) +
              ", k=" + std::to_string(k) + ")");
  }

  void AddRowVector(float* y, const float* bias, int rows, int cols) override {
    if (rows <= 0 || cols <= 0 || !SelectDevice()) return;
    const size_t total = static_cast<size_t>(rows) * cols;
    AddRowVectorKernel<<<BlocksFor(total), kThreads>>>(y, bias, total, cols);
    Check(cudaGetLastError(), "AddRowVectorKernel launch");
  }

  void ColumnSums(const float* x, int rows, int cols, float* out) override {
    if (cols <= 0 || !SelectDevice()) return;
    const int safe_rows = rows > 0 ? rows : 0;  // no rows: the kernel writes zeros
    const dim3 block(kWarp, kSumLanes);
    const unsigned blocks = static_cast<unsigned>((cols + kWarp - 1) / kWarp);
    ColumnSumsKernel<<<blocks, block>>>(x, safe_rows, cols, out);
    Check(cudaGetLastError(), "ColumnSumsKernel launch");
  }

  void Relu(const float* x, float* y, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    ReluKernel<<<BlocksFor(n), kThreads>>>(x, y, n);
    Check(cudaGetLastError(), "ReluKernel launch");
  }

  void ReluBackward(const float* y, const float* dy, float* dx, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    ReluBackwardKernel<<<BlocksFor(n), kThreads>>>(y, dy, dx, n);
    Check(cudaGetLastError(), "ReluBackwardKernel launch");
  }

  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int* correct) override {
    constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
    if (correct != nullptr) *correct = 0;
    if (rows <= 0) return 0.0f;
    if (cols <= 0) {
      Record(absl::InvalidArgumentError("SoftmaxCrossEntropy: cols = " + std::to_string(cols)));
      return kNan;
    }
    // The kernel would read out of bounds with a bad label: check on the host, where the
    // labels are anyway (the CPU backend asserts instead).
    for (int r = 0; r < rows; ++r) {
      if (labels[r] < 0 || labels[r] >= cols) {
        Record(absl::InvalidArgumentError(
            "SoftmaxCrossEntropy: label " + std::to_string(labels[r]) + " of row " +
            std::to_string(r) + " is outside [0, " + std::to_string(cols) + ")"));
        return kNan;
      }
    }
    if (!SelectDevice() || !EnsureScratch(rows)) return kNan;
    if (!Check(cudaMemcpy(labels_, labels, rows * sizeof(int32_t), cudaMemcpyHostToDevice),
               "cudaMemcpy labels host to device")) {
      return kNan;
    }
    const float inv_rows = 1.0f / static_cast<float>(rows);
    const unsigned blocks = static_cast<unsigned>((rows + kSoftmaxWarps - 1) / kSoftmaxWarps);
    SoftmaxCrossEntropyKernel<<<blocks, kSoftmaxWarps * kWarp>>>(
        logits, labels_, rows, cols, inv_rows, dlogits, row_loss_, row_hit_);
    if (!Check(cudaGetLastError(), "SoftmaxCrossEntropyKernel launch")) return kNan;
    // These copies wait for the kernel (and everything before it).
    host_loss_.resize(rows);
    host_hit_.resize(rows);
    if (!Check(
            cudaMemcpy(host_loss_.data(), row_loss_, rows * sizeof(double), cudaMemcpyDeviceToHost),
            "cudaMemcpy per-row losses device to host") ||
        !Check(cudaMemcpy(host_hit_.data(), row_hit_, rows * sizeof(int), cudaMemcpyDeviceToHost),
               "cudaMemcpy per-row hits device to host")) {
      return kNan;
    }
    double total = 0.0;
    int hits = 0;
    for (int r = 0; r < rows; ++r) {  // fixed order: deterministic
      total += host_loss_[r];
      hits += host_hit_[r];
    }
    if (correct != nullptr) *correct = hits;
    return static_cast<float>(total / rows);
  }

  void Copy(const float* x, float* y, size_t n) override {
    if (n == 0 || x == y || !SelectDevice()) return;
    Check(cudaMemcpy(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice),
          "cudaMemcpy device to device (" + std::to_string(n) + " floats)");
  }

  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    AxpyKernel<<<BlocksFor(n), kThreads>>>(alpha, x, y, n);
    Check(cudaGetLastError(), "AxpyKernel launch");
  }

  void GemmBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float beta,
                   float* c, int ldc, int64_t stride_c, int count) override {
    if (m <= 0 || n <= 0 || count <= 0 || !SelectDevice()) return;
    if (k <= 0) {
      if (beta == 1.0f) return;
      ScaleMatricesKernel<<<BlocksFor(static_cast<size_t>(count) * m * n), kThreads>>>(
          c, m, n, ldc, stride_c, count, beta);
      Check(cudaGetLastError(), "ScaleMatricesKernel launch");
      return;
    }
    // Row-major as in Gemm: C^T = op(B)^T * op(A)^T, B first, m and n swapped.
    Check(cublasSgemmStridedBatched(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                    stride_b, a, lda, stride_a, &beta, c, ldc, stride_c, count),
          "cublasSgemmStridedBatched(m=" + std::to_string(m) + ", n=" + std::to_string(n) +
              ", k=" + std::to_string(k) + ", count=" + std::to_string(count) + ")");
  }

  void LayerNorm(const float* x, const float* gamma, const float* beta, int rows, int cols,
                 float eps, float* y, float* mean, float* rstd) override {
    if (rows <= 0 || cols <= 0 || !SelectDevice()) return;
    LayerNormKernel<<<RowBlocks(rows), kRowWarps * kWarp>>>(x, gamma, beta, rows, cols, eps, y,
                                                            mean, rstd);
    Check(cudaGetLastError(), "LayerNormKernel launch");
  }

  void LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, int rows, int cols, float* dx, float* dgamma,
                         float* dbeta) override {
    if (rows <= 0 || cols <= 0 || !SelectDevice()) return;
    LayerNormParamGradsKernel<<<BlocksFor(cols), kThreads>>>(dy, x, mean, rstd, rows, cols, dgamma,
                                                             dbeta);
    Check(cudaGetLastError(), "LayerNormParamGradsKernel launch");
    LayerNormBackwardKernel<<<RowBlocks(rows), kRowWarps * kWarp>>>(dy, x, gamma, mean, rstd, rows,
                                                                    cols, dx);
    Check(cudaGetLastError(), "LayerNormBackwardKernel launch");
  }

  void Gelu(const float* x, float* y, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    GeluKernel<<<BlocksFor(n), kThreads>>>(x, y, n);
    Check(cudaGetLastError(), "GeluKernel launch");
  }

  void GeluBackward(const float* x, const float* dy, float* dx, size_t n) override {
    if (n == 0 || !SelectDevice()) return;
    GeluBackwardKernel<<<BlocksFor(n), kThreads>>>(x, dy, dx, n);
    Check(cudaGetLastError(), "GeluBackwardKernel launch");
  }

  void CausalSoftmax(float* s, int count, int t) override {
    if (count <= 0 || t <= 0 || !SelectDevice()) return;
    const long long rows = static_cast<long long>(count) * t;
    CausalSoftmaxKernel<<<RowBlocks(rows), kRowWarps * kWarp>>>(s, rows, t);
    Check(cudaGetLastError(), "CausalSoftmaxKernel launch");
  }

  void SoftmaxBackward(const float* p, const float* dp, float* ds, int rows, int cols) override {
    if (rows <= 0 || cols <= 0 || !SelectDevice()) return;
    SoftmaxBackwardKernel<<<RowBlocks(rows), kRowWarps * kWarp>>>(p, dp, ds, rows, cols);
    Check(cudaGetLastError(), "SoftmaxBackwardKernel launch");
  }

  void GatherRows(const float* table, int dim, const float* ids, int n, float* out) override {
    if (n <= 0 || dim <= 0 || !SelectDevice()) return;
    GatherRowsKernel<<<BlocksFor(static_cast<size_t>(n) * dim), kThreads>>>(table, dim, ids, n,
                                                                            out);
    Check(cudaGetLastError(), "GatherRowsKernel launch");
  }

  void ScatterAddRows(const float* rows, int dim, const float* ids, int n, float* table,
                      int table_rows) override {
    if (n <= 0 || dim <= 0 || table_rows <= 0 || !SelectDevice()) return;
    ScatterAddRowsKernel<<<static_cast<unsigned>(table_rows), kThreads>>>(rows, dim, ids, n, table);
    Check(cudaGetLastError(), "ScatterAddRowsKernel launch");
  }

 private:
  // Records the first failure; true when `s` is OK.
  bool Record(absl::Status s) {
    if (s.ok()) return true;
    if (status_.ok()) {
      status_ = s;
      std::fprintf(stderr, "CUDA backend (device %d): first error: %s\n", device_,
                   s.ToString().c_str());
    }
    return false;
  }
  bool Check(cudaError_t e, const std::string& what) {
    return e == cudaSuccess || Record(CudaStatus(e, what));
  }
  bool Check(cublasStatus_t s, const std::string& what) {
    return s == CUBLAS_STATUS_SUCCESS || Record(CublasStatus(s, what));
  }

  // The current device is per host thread; make it ours should this backend be used from
  // a thread other than the one that created it.
  bool SelectDevice() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device_) return true;
    return Check(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  }

  // Device scratch for SoftmaxCrossEntropy (labels, per-row losses and hits), grown to
  // `rows`.
  bool EnsureScratch(int rows) {
    if (rows <= scratch_rows_) return true;
    cudaFree(labels_);
    cudaFree(row_loss_);
    cudaFree(row_hit_);
    labels_ = nullptr;
    row_loss_ = nullptr;
    row_hit_ = nullptr;
    scratch_rows_ = 0;
    const size_t n = static_cast<size_t>(rows);
    if (!Check(cudaMalloc(&labels_, n * sizeof(int32_t)), "cudaMalloc (labels)") ||
        !Check(cudaMalloc(&row_loss_, n * sizeof(double)), "cudaMalloc (per-row losses)") ||
        !Check(cudaMalloc(&row_hit_, n * sizeof(int)), "cudaMalloc (per-row hits)")) {
      return false;
    }
    scratch_rows_ = rows;
    return true;
  }

  const int device_;
  cublasHandle_t handle_;
  absl::Status status_;
  int scratch_rows_ = 0;
  int32_t* labels_ = nullptr;
  double* row_loss_ = nullptr;
  int* row_hit_ = nullptr;
  std::vector<double> host_loss_;
  std::vector<int> host_hit_;
};

}  // namespace

// The first error `backend` (made by MakeCudaBackend) met, OK if none; INVALID_ARGUMENT
// for another kind of backend. Only in --config=cuda builds, and not in backend.h (whose
// interface is fixed): declare it where needed, as cuda_backend_test.cc does, until it
// gets a header of its own.
absl::Status CudaBackendStatus(const Backend& backend);

absl::Status CudaBackendStatus(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError("CudaBackendStatus: backend " + backend.name() +
                                      " is not a CUDA backend");
  }
  return cuda->status();
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  const std::string on_device = std::to_string(device);
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + on_device + ")");
      !s.ok()) {
    return s;
  }
  cublasHandle_t handle = nullptr;
  if (absl::Status s = CublasStatus(cublasCreate(&handle), "cublasCreate on device " + on_device);
      !s.ok()) {
    return s;
  }
  // Plain FP32 products (no TF32 or other reduced-precision shortcuts), so results track
  // the CPU backend's; this is also cuBLAS's default, set here to not depend on it.
  if (absl::Status s = CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                                    "cublasSetMathMode on device " + on_device);
      !s.ok()) {
    cublasDestroy(handle);
    return s;
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, handle));
}

}  // namespace pscluster::compute
