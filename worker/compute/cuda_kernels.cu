// The CUDA backend's kernels (cuda_kernels.h).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "worker/compute/cuda_kernels.h"

namespace pscluster::compute::cuda_kernels {

__global__ void ScaleKernel(float* x, size_t n, float beta) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] *= beta;
  }
}

__global__ void AddRowVectorKernel(float* y, const float* bias, size_t total, int cols) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % static_cast<size_t>(cols)];
  }
}

// Column sums with a (32 x kSumLanes) block per 32 columns: lane ty sums rows ty,
// ty + kSumLanes, ... of its column in order, then lane 0 adds the kSumLanes partials in
// order. Reads are coalesced along a row; the order of additions is fixed.

__global__ void ColumnSumsKernel(const float* x, int rows, int cols, float* out) {
  __shared__ float partial[kSumLanes][kWarp];
  const int col = blockIdx.x * kWarp + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += kSumLanes) {
      sum += x[static_cast<size_t>(r) * cols + col];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int lane = 0; lane < kSumLanes; ++lane) total += partial[lane][threadIdx.x];
    out[col] = total;
  }
}

__global__ void ReluKernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

// Softmax cross-entropy, one warp per row (kSoftmaxWarps rows per block). Per row: the
// argmax (first index of the maximum, as the CPU backend picks it), the max-subtracted
// sum of exponentials in double, the row's loss log(sum) - (z[label] - max) into
// row_loss[row], whether the argmax is the label into row_hit[row], and, with dlogits,
// (softmax - onehot(label)) / rows. The xor-butterfly reductions give every lane the same
// bits, in the same order every run. dlogits may alias logits: each element is read and
// then written by the same lane, and z[label] is read by all lanes before any write.

// Whether (v2, i2) beats (v1, i1) for the argmax: the larger value, then the smaller
// index. NaN counts as the largest value so that this is a total order and every lane
// ends the butterfly with the same winner (a NaN row gives a NaN loss either way).
__device__ bool ArgmaxBefore(float v2, int i2, float v1, int i1) {
  const bool nan2 = isnan(v2), nan1 = isnan(v1);
  if (nan2 != nan1) return nan2;
  if (nan2 || v2 == v1) return i2 < i1;
  return v2 > v1;
}

__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int rows,
                                          int cols, float inv_rows, float* dlogits,
                                          double* row_loss, int* row_hit) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kSoftmaxWarps + threadIdx.x / kWarp;
  if (row >= rows) return;  // uniform across the warp
  const float* z = logits + static_cast<size_t>(row) * cols;

  float best = -INFINITY;
  int best_index = INT_MAX;
  for (int c = lane; c < cols; c += kWarp) {
    const float v = z[c];
    if (best_index == INT_MAX || ArgmaxBefore(v, c, best, best_index)) {
      best = v;
      best_index = c;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, offset);
    const int other_index = __shfl_xor_sync(kFullMask, best_index, offset);
    if (ArgmaxBefore(other, other_index, best, best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  const float max = best;

  double sum = 0.0;
  for (int c = lane; c < cols; c += kWarp) sum += static_cast<double>(expf(z[c] - max));
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  }
  const int label = labels[row];
  const float label_shifted = z[label] - max;
  __syncwarp();  // every lane has read z[label] before any lane overwrites it below

  if (lane == 0) {
    row_loss[row] = log(sum) - static_cast<double>(label_shifted);
    row_hit[row] = best_index == label ? 1 : 0;
  }
  if (dlogits != nullptr) {
    float* d = dlogits + static_cast<size_t>(row) * cols;
    const float scale = static_cast<float>(1.0 / sum) * inv_rows;
    for (int c = lane; c < cols; c += kWarp) {
      float g = expf(z[c] - max) * scale;
      if (c == label) g -= inv_rows;
      d[c] = g;
    }
  }
}

// --- Transformer kernels. One warp per row where a row is reduced; sums in a fixed order
// (the xor butterfly), so results are the same bits run to run. ---

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

// c_i *= beta (beta == 0 writes zeros) for count m x n matrices of row length ldc.
__global__ void ScaleMatricesKernel(float* c, int m, int n, int ldc, long long stride_c, int count,
                                    float beta) {
  const size_t total = static_cast<size_t>(count) * m * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t mat = i / (static_cast<size_t>(m) * n), rest = i % (static_cast<size_t>(m) * n);
    float* p = c + mat * stride_c + (rest / n) * ldc + rest % n;
    *p = beta == 0.0f ? 0.0f : *p * beta;
  }
}

__device__ double WarpSum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

__global__ void LayerNormKernel(const float* x, const float* gamma, const float* beta, int rows,
                                int cols, float eps, float* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float* xr = x + static_cast<size_t>(row) * cols;
  double sum = 0;
  for (int c = lane; c < cols; c += kWarp) sum += xr[c];
  const float mu = static_cast<float>(WarpSum(sum) / cols);
  double sq = 0;
  for (int c = lane; c < cols; c += kWarp) sq += static_cast<double>(xr[c] - mu) * (xr[c] - mu);
  const float rs = static_cast<float>(1.0 / sqrt(WarpSum(sq) / cols + eps));
  float* yr = y + static_cast<size_t>(row) * cols;
  for (int c = lane; c < cols; c += kWarp) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

__global__ void LayerNormBackwardKernel(const float* dy, const float* x, const float* gamma,
                                        const float* mean, const float* rstd, int rows, int cols,
                                        float* dx) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const size_t at = static_cast<size_t>(row) * cols;
  const float mu = mean[row], rs = rstd[row];
  double sum_g = 0, sum_gx = 0;
  for (int c = lane; c < cols; c += kWarp) {
    const float g = dy[at + c] * gamma[c];
    sum_g += g;
    sum_gx += static_cast<double>(g) * ((x[at + c] - mu) * rs);
  }
  const float mean_g = static_cast<float>(WarpSum(sum_g) / cols);
  const float mean_gx = static_cast<float>(WarpSum(sum_gx) / cols);
  for (int c = lane; c < cols; c += kWarp) {
    const float xhat = (x[at + c] - mu) * rs;
    dx[at + c] = rs * (dy[at + c] * gamma[c] - mean_g - xhat * mean_gx);
  }
}

// dgamma[c] += sum over rows of dy * xhat, dbeta[c] += sum of dy: a thread per column, rows
// in order.
__global__ void LayerNormParamGradsKernel(const float* dy, const float* x, const float* mean,
                                          const float* rstd, int rows, int cols, float* dgamma,
                                          float* dbeta) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float g = 0, b = 0;
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * cols + c;
    g += dy[at] * ((x[at] - mean[r]) * rstd[r]);
    b += dy[at];
  }
  dgamma[c] += g;
  dbeta[c] += b;
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__global__ void GeluKernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
}

// Row r of count * t rows is row i = r % t of its matrix: softmax over its first i + 1.
__global__ void CausalSoftmaxKernel(float* s, long long rows, int t) {
  const int lane = threadIdx.x % kWarp;
  const long long row = blockIdx.x * static_cast<long long>(kRowWarps) + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int i = static_cast<int>(row % t);
  float* r = s + row * t;
  float max = -INFINITY;
  for (int j = lane; j <= i; j += kWarp) max = fmaxf(max, r[j]);
  max = WarpMax(max);
  double sum = 0;
  for (int j = lane; j <= i; j += kWarp) sum += expf(r[j] - max);
  const float inv = static_cast<float>(1.0 / WarpSum(sum));
  for (int j = lane; j < t; j += kWarp) r[j] = j <= i ? expf(r[j] - max) * inv : 0.0f;
}

__global__ void SoftmaxBackwardKernel(const float* p, const float* dp, float* ds, int rows,
                                      int cols) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const size_t at = static_cast<size_t>(row) * cols;
  double dot = 0;
  for (int c = lane; c < cols; c += kWarp) dot += static_cast<double>(p[at + c]) * dp[at + c];
  const float d = static_cast<float>(WarpSum(dot));
  __syncwarp();  // every lane has read dp before any lane overwrites it (ds may alias dp)
  for (int c = lane; c < cols; c += kWarp) ds[at + c] = p[at + c] * (dp[at + c] - d);
}

__global__ void GatherRowsKernel(const float* table, int dim, const float* ids, int n, float* out) {
  const size_t total = static_cast<size_t>(n) * dim;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = static_cast<size_t>(ids[i / dim]);
    out[i] = table[row * dim + i % dim];
  }
}

// A block per table row: its threads take the row's columns and add, in order of i, every
// rows[i] whose id is this row. No atomics: the same bits every run.
__global__ void ScatterAddRowsKernel(const float* rows, int dim, const float* ids, int n,
                                     float* table) {
  const int row = blockIdx.x;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    float acc = table[static_cast<size_t>(row) * dim + c];
    for (int i = 0; i < n; ++i) {
      if (static_cast<int>(ids[i]) == row) acc += rows[static_cast<size_t>(i) * dim + c];
    }
    table[static_cast<size_t>(row) * dim + c] = acc;
  }
}

}  // namespace pscluster::compute::cuda_kernels
