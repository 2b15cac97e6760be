// The CUDA backend's kernels (cuda_kernels.cu), launched by cuda_backend.cu. nvcc only.
// Every kernel sums in a fixed order (no atomics), so a given input gives the same bits
// run to run; one warp per row where a row is reduced.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pscluster::compute::cuda_kernels {

constexpr int kThreads = 256;           // threads per block for the element-wise kernels
constexpr unsigned kMaxBlocks = 65535;  // grid-stride loops cover the rest
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
inline unsigned BlocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}
constexpr int kSumLanes = 8;
constexpr int kSoftmaxWarps = 8;
constexpr int kRowWarps = 8;  // rows (warps) per block of the row kernels
inline unsigned RowBlocks(long long rows) {
  return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
}

__global__ void ScaleKernel(float* x, size_t n, float beta);

__global__ void AddRowVectorKernel(float* y, const float* bias, size_t total, int cols);

__global__ void ColumnSumsKernel(const float* x, int rows, int cols, float* out);

__global__ void ReluKernel(const float* x, float* y, size_t n);

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, size_t n);

__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int rows,
                                          int cols, float inv_rows, float* dlogits,
                                          double* row_loss, int* row_hit);

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n);

// c_i *= beta (beta == 0 writes zeros) for count m x n matrices of row length ldc.
__global__ void ScaleMatricesKernel(float* c, int m, int n, int ldc, long long stride_c, int count,
                                    float beta);

__global__ void LayerNormKernel(const float* x, const float* gamma, const float* beta, int rows,
                                int cols, float eps, float* y, float* mean, float* rstd);

__global__ void LayerNormBackwardKernel(const float* dy, const float* x, const float* gamma,
                                        const float* mean, const float* rstd, int rows, int cols,
                                        float* dx);

// dgamma[c] += sum over rows of dy * xhat, dbeta[c] += sum of dy: a thread per column, rows
// in order.
__global__ void LayerNormParamGradsKernel(const float* dy, const float* x, const float* mean,
                                          const float* rstd, int rows, int cols, float* dgamma,
                                          float* dbeta);

__global__ void GeluKernel(const float* x, float* y, size_t n);

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, size_t n);

// Row r of count * t rows is row i = r % t of its matrix: softmax over its first i + 1.
__global__ void CausalSoftmaxKernel(float* s, long long rows, int t);

__global__ void SoftmaxBackwardKernel(const float* p, const float* dp, float* ds, int rows,
                                      int cols);

__global__ void GatherRowsKernel(const float* table, int dim, const float* ids, int n, float* out);

// A block per table row: its threads take the row's columns and add, in order of i, every
// rows[i] whose id is this row. No atomics: the same bits every run.
__global__ void ScatterAddRowsKernel(const float* rows, int dim, const float* ids, int n,
                                     float* table);

}  // namespace pscluster::compute::cuda_kernels
